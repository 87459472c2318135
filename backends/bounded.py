"""Bounds on what one `status` reply carries, so that no run store makes it too large to send.

A run's fields are cut where they are large (a command line of megabytes, an error quoting one),
each cut marked where it happened (`… (N more bytes)`) and named in the run's `truncated`; the
whole run comes from `status RUN` (the `run_info` request). Runs that would take the reply past
its budget are left out, the oldest ended ones first, and counted in `omitted`.
"""

from __future__ import annotations

import json
import math
from typing import Any, cast

from backends.protocol import TERMINAL_STATES, RunInfo

ARG_BYTES = 1024  # one argument, one environment name or value
ARGV_BYTES = 8 * 1024  # a run's whole command line
ENV_BYTES = 4 * 1024  # all of a run's environment overrides
TEXT_BYTES = 2 * 1024  # any other text: name, error, phase, a diagnosis's line
ITEMS = 32  # entries of any other list or object (stack dumps, diagnoses)
DEPTH = 4  # nesting of any other list or object
STATUS_BYTES = 4 * 1024 * 1024  # all runs of one status reply together


def utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def cut(text: str, limit: int) -> str:
    """`text` if it fits in `limit` bytes of UTF-8, else its head and `… (N more bytes)`."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    head = data[:limit].decode("utf-8", "ignore")  # a character cut in two is dropped whole
    return f"{head}… ({len(data) - utf8_size(head)} more bytes)"


def _cut_list(items: list[str], budget: int) -> list[str]:
    kept: list[str] = []
    used = 0
    for i, item in enumerate(items):
        if used >= budget:
            rest = items[i:]
            kept.append(f"… ({len(rest)} more, {sum(utf8_size(r) for r in rest)} more bytes)")
            break
        kept.append(cut(item, min(ARG_BYTES, budget - used)))
        used += utf8_size(kept[-1])
    return kept


def _cut_env(env: dict[str, str], budget: int) -> dict[str, str]:
    kept: dict[str, str] = {}
    used = 0
    items = list(env.items())
    for i, (name, value) in enumerate(items):
        if used >= budget:
            rest = items[i:]
            size = sum(utf8_size(n) + utf8_size(v) for n, v in rest)
            kept["…"] = f"({len(rest)} more variables, {size} more bytes)"
            break
        short_name, short_value = cut(name, ARG_BYTES), cut(value, ARG_BYTES)
        kept[short_name] = short_value
        used += utf8_size(short_name) + utf8_size(short_value)
    return kept


def _bound(value: Any, depth: int = DEPTH) -> Any:
    """Any other value: text cut, lists and objects shortened and flattened, non-finite numbers null."""
    if isinstance(value, str):
        return cut(value, TEXT_BYTES)
    if isinstance(value, float) and not math.isfinite(value):
        return None  # not JSON, and no time or count is infinite
    if isinstance(value, list):
        return [_bound(v, depth - 1) for v in value[-ITEMS:]] if depth else "…"
    if isinstance(value, dict):
        return {cut(str(k), TEXT_BYTES): _bound(v, depth - 1) for k, v in list(value.items())[:ITEMS]} if depth else "…"
    return value


def bounded_info(info: RunInfo) -> RunInfo:
    """`info` with every field within its bound; `truncated` names the fields that were cut."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key == "argv" and isinstance(value, list):
            out[key] = _cut_list([str(a) for a in value], ARGV_BYTES)
        elif key == "env" and isinstance(value, dict):
            out[key] = _cut_env({str(k): str(v) for k, v in value.items()}, ENV_BYTES)
        elif key == "truncated":
            out[key] = value
        else:
            out[key] = _bound(value)
    out["truncated"] = [key for key in info if key != "truncated" and out[key] != info[key]]  # type: ignore[literal-required]
    return cast(RunInfo, out)


def within_budget(runs: list[RunInfo], budget: int = STATUS_BYTES) -> tuple[list[RunInfo], int]:
    """The runs that fit in `budget` bytes of JSON, live ones first and then the newest, in their
    order; and how many were left out."""
    sizes = [len(json.dumps(run)) for run in runs]
    ranked = sorted(range(len(runs)), key=lambda i: (runs[i]["state"] not in TERMINAL_STATES, runs[i]["id"]))
    kept: set[int] = set()
    used = 0
    for i in reversed(ranked):
        if used + sizes[i] > budget:
            break
        kept.add(i)
        used += sizes[i]
    return [run for i, run in enumerate(runs) if i in kept], len(runs) - len(kept)
