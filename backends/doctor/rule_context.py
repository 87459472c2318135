"""What every rule sees of one draft: its files, SGLang's view of its config, the target and the manifest."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backends.doctor.draft_config import Geometry
from backends.doctor.reading import DraftFiles, Target
from backends.eagle3_contract import Manifest


@dataclass
class Context:
    files: DraftFiles
    view: dict[str, Any]
    geo: Geometry | None
    target: Target | None
    manifest: Manifest | None
    context_length: int | None
    options: frozenset[str] = field(default_factory=frozenset)
