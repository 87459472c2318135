"""Typed values out of untrusted config.json content: anything of another type reads as None."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def int_list(value: object) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


def first_architecture(config: Mapping[str, Any]) -> str | None:
    """The first entry of `architectures`, when it is a string."""
    archs = config.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
