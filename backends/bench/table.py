"""A bench's figures as a table with bench_serving's names and units, one column per result, so one bench reads
like `bench_serving`'s summary and two drafts' benches sit side by side (`bench --compare`). Stdlib and protocol
only: the console draws it too."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Figures = Mapping[str, Any]
LATENCIES = (("E2E Latency", "e2e_ms"), ("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"))
STATS = (("Mean", "mean"), ("Median", "median"), ("P95", "p95"), ("P99", "p99"), ("Max", "max"))
ACCEPT_STATS = ("min", "p5", "median", "p95", "max")


def _number(digits: int) -> Callable[[object], str]:
    def shown(value: object) -> str:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "n/a"
        return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"

    return shown


def _figure(key: str, digits: int = 2) -> Callable[[Figures], str]:
    return lambda f: _number(digits)(f.get(key))


def _stat(key: str, stat: str, digits: int = 2) -> Callable[[Figures], str]:
    return lambda f: _number(digits)((f.get(key) or {}).get(stat))


def _requests(f: Figures) -> str:
    failed = f.get("errors", 0) + f.get("cut", 0)
    return f"{f.get('ok', 0)}" + (f" ({failed} failed)" if failed else "")


ROWS: tuple[tuple[str, Callable[[Figures], str]], ...] = (
    ("Successful requests:", _requests),
    ("Benchmark duration (s):", _figure("duration_s")),
    ("Total input tokens:", _figure("input_tokens")),
    ("Total generated tokens:", _figure("output_tokens")),
    ("Request throughput (req/s):", _figure("request_s")),
    ("Input token throughput (tok/s):", _figure("input_tok_s")),
    ("Output token throughput (tok/s):", _figure("output_tok_s")),
    ("Total token throughput (tok/s):", _figure("total_tok_s")),
    ("Concurrency:", _figure("concurrency")),
    ("Accept length:", _figure("accept_len")),
    *((f"Accept length per request, {stat}:", _stat("accept_len_per_request", stat)) for stat in ACCEPT_STATS),
    *((f"{stat} {what} (ms):", _stat(key, s)) for what, key in LATENCIES for stat, s in STATS),
)


def figures_table(columns: Sequence[tuple[Sequence[str], Figures]]) -> list[str]:
    """Heading lines, then one line per figure: a column per (its heading lines, figures), right-aligned."""
    cells = [[show(f) for _, f in columns] for _, show in ROWS]
    depth = max(len(heads) for heads, _ in columns)
    heads = [[*h, *[""] * (depth - len(h))] for h, _ in columns]
    widths = [max(*(len(h) for h in heads[i]), *(len(row[i]) for row in cells)) for i in range(len(columns))]
    label = max(len(name) for name, _ in ROWS)

    def line(name: str, values: Sequence[str]) -> str:
        return (f"{name:<{label}}" + "".join(f"  {v:>{w}}" for v, w in zip(values, widths, strict=True))).rstrip()

    return [
        *(line("", [h[depth_i] for h in heads]) for depth_i in range(depth)),
        *(line(name, row) for (name, _), row in zip(ROWS, cells, strict=True)),
    ]
