"""A bench's figures from its requests' timings, with SGLang 0.5.23's `bench_serving` definitions
(sglang/benchmark/serving.py, `calculate_metrics`), so that the two read the same on the same requests:

- request, input, output and total throughput: completed requests, their prompt tokens, their completion tokens
  (the server's counts), and both, over the timed duration (warm-up excluded);
- TTFT: from a request's send to its first chunk with text; E2E latency: from its send to its last line;
- TPOT: (E2E - TTFT) / (completion tokens - 1), for requests of 2 tokens or more;
- ITL per token: each gap between text chunks spread over the tokens of the chunk that ends it (what
  `bench_serving` does when speculative decoding puts several tokens in a chunk; it retokenizes the chunk's text,
  we read the server's running `usage.completion_tokens`, the same count without a tokenizer);
- concurrency: the requests' summed E2E latency over the duration;
- each latency's mean, median, p95, p99 (numpy's linear percentiles) and max, in milliseconds.

What only we add: the acceptance length of each request (SGLang's completion tokens over its verify steps) and
their distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from backends.bench.stream import Outcome
from backends.protocol import AcceptSpread, BenchFigures, LatencyStats

DIGITS = 3  # milliseconds to the microsecond


def quantile(ordered: Sequence[float], q: float) -> float:
    """numpy.percentile's default (linear between the closest ranks) of sorted values, q in 0..1."""
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_stats(seconds: Sequence[float]) -> LatencyStats | None:
    """Mean, median, p95, p99 and max in milliseconds; None for no values."""
    if not seconds:
        return None
    ordered = sorted(seconds)

    def ms(value: float) -> float:
        return round(1000 * value, DIGITS)

    return {
        "mean": ms(math.fsum(ordered) / len(ordered)),
        "median": ms(quantile(ordered, 0.5)),
        "p95": ms(quantile(ordered, 0.95)),
        "p99": ms(quantile(ordered, 0.99)),
        "max": ms(ordered[-1]),
    }


def itl_per_token(outcome: Outcome) -> list[float]:
    """Each gap between text chunks, once per token of the chunk that ends it, divided among them."""
    spread: list[float] = []
    for index, gap in enumerate(outcome.gaps_s):
        tokens = outcome.chunk_tokens[index] if index < len(outcome.chunk_tokens) else 1
        tokens = max(tokens, 1)  # a chunk the server counted no new token for still ended a gap
        spread += [gap / tokens] * tokens
    return spread


def accept_lengths(outcomes: Sequence[Outcome]) -> list[float]:
    """Each request's acceptance length: its completion tokens over its verify steps (SGLang's own counts)."""
    return [o.completion_tokens / o.verify_ct for o in outcomes if o.verify_ct and o.completion_tokens is not None]


def accept_spread(lengths: Sequence[float]) -> AcceptSpread | None:
    if not lengths:
        return None
    ordered = sorted(lengths)

    def r(value: float) -> float:
        return round(value, DIGITS)

    return {
        "min": r(ordered[0]),
        "p5": r(quantile(ordered, 0.05)),
        "median": r(quantile(ordered, 0.5)),
        "p95": r(quantile(ordered, 0.95)),
        "max": r(ordered[-1]),
        "mean": r(math.fsum(ordered) / len(ordered)),
    }


def figures(outcomes: Sequence[Outcome], duration_s: float) -> BenchFigures:
    """The bench's figures over the requests that streamed to their end, in `duration_s` (the timed part)."""
    done = [o for o in outcomes if o.ok]
    output = sum(o.tokens for o in done)
    prompt = sum(o.prompt_tokens or 0 for o in done)
    verified = [o for o in done if o.verify_ct and o.completion_tokens is not None]
    steps = sum(o.verify_ct or 0 for o in verified)
    accepted = sum(o.completion_tokens or 0 for o in verified)
    timed = duration_s > 0 and bool(done)

    def rate(amount: float) -> float | None:
        return round(amount / duration_s, DIGITS) if timed else None

    ttfts = [o.ttft_s for o in done if o.ttft_s is not None]
    return {
        "ok": len(done),
        "errors": sum(o.error is not None for o in outcomes),
        "cut": sum(o.cut is not None for o in outcomes),
        "input_tokens": prompt,
        "output_tokens": output,
        "duration_s": round(duration_s, DIGITS),
        "request_s": rate(len(done)),
        "input_tok_s": rate(prompt),
        "output_tok_s": rate(output),
        "total_tok_s": rate(prompt + output),
        "concurrency": rate(math.fsum(o.latency_s for o in done)),
        "accept_len": round(accepted / steps, DIGITS) if steps else None,
        "accept_len_per_request": accept_spread(accept_lengths(done)),
        "ttft_ms": latency_stats(ttfts),
        "tpot_ms": latency_stats([(o.latency_s - (o.ttft_s or 0.0)) / (o.tokens - 1) for o in done if o.tokens > 1]),
        "itl_ms": latency_stats([gap for o in done for gap in itl_per_token(o)]),
        "e2e_ms": latency_stats([o.latency_s for o in done]),
    }
