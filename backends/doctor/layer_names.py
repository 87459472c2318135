"""How checkpoints name decoder-layer tensors (`midlayer.*` or `layers.N.*`), and one spelling for both."""

from __future__ import annotations

import re
from collections.abc import Iterable

LAYER = re.compile(r"^(?:model\.)?(?:midlayer|layers\.(\d+))\.(.+)$")


def layer_spelling(name: str) -> str:
    """ "midlayer.*" or "layers.N.*" for a decoder-layer tensor, "" for any other."""
    match = LAYER.match(name)
    if not match:
        return ""
    return "layers.N.*" if match.group(1) is not None else "midlayer.*"


def canonical(name: str) -> str:
    """A checkpoint name with the layout's spelling removed: layer 0 is `layers.0.` either way."""
    match = LAYER.match(name)
    if match:
        return f"layers.{match.group(1) or 0}.{match.group(2)}"
    return name.removeprefix("model.")


def canonical_names(names: Iterable[str]) -> dict[str, str]:
    """Each canonical name, with the checkpoint name it stands for."""
    return {canonical(n): n for n in names}
