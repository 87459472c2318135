"""A run's stored bench results as lines, one per bench (wrapped between its figures when a width is given), for
`status RUN` and the console's detail panel."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from console.render import clock

INDENT = "  "


def _ms(spread: Mapping[str, float] | None) -> str:
    return "n/a" if not spread else f"{spread['p50']:.0f}/{spread['p99']:.0f} ms"


def bench_fields(result: Mapping[str, Any]) -> list[str]:
    """`11-30 10:00:00`, `accept 2.67`, `340 tok/s`, `TTFT 48/51 ms`, `ITL 2/3 ms`, `6/6 ok`, `chat c2 m8` (p50/p99;
    the api, the concurrency and the most tokens per answer)."""
    f, s = result.get("figures") or {}, result.get("settings") or {}
    accept, rate = f.get("accept_len"), f.get("output_tok_s")
    done = f.get("ok", 0)
    total = done + f.get("errors", 0) + f.get("cut", 0)
    return [
        clock(result.get("t")),
        f"accept {'n/a' if accept is None else f'{accept:.2f}'}",
        f"{'n/a' if rate is None else f'{rate:.0f}'} tok/s",
        f"TTFT {_ms(f.get('ttft_ms'))}",
        f"ITL {_ms(f.get('itl_ms'))}",
        f"{done}/{total} ok",
        f"{s.get('api', '?')} c{s.get('concurrency', '?')} m{s.get('max_tokens', '?')}",
    ]


def _packed(fields: list[str], width: int | None) -> list[str]:
    """The fields two spaces apart, a new line (indented under the first) before one that would pass `width`."""
    lines = [INDENT + fields[0]]
    for field in fields[1:]:
        if width is not None and len(lines[-1]) + 2 + len(field) > width:
            lines.append(INDENT * 2 + field)
        else:
            lines[-1] += "  " + field
    return lines


def bench_lines(results: Sequence[Mapping[str, Any]] | None, width: int | None = None) -> list[str]:
    """A heading and the latest results, newest last; nothing when the run has none."""
    if not results:
        return []
    return ["bench (TTFT and ITL p50/p99):", *(line for r in results for line in _packed(bench_fields(r), width))]
