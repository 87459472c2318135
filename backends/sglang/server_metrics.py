"""SGLang's own metrics (`--enable-metrics`, `GET /metrics`), read as a serve run's metric rows.

The names are SGLang 0.5.23's (sglang/srt/observability/metrics_collector.py); 0.5.5 has the same ones for
these series. Gauges are the scheduler's last logged figures, one sample per DP rank (attention-TP rank 0 only):
counts add up across ranks, ratios are averaged. A queue count's per-priority breakdown (`priority="N"`) repeats
the total and is left out. Latency histograms become percentiles of the requests finished since the previous
scrape (a scrape with none gives no value), interpolated within their buckets as Prometheus's
`histogram_quantile` does. The exposition is parsed by prometheus_client's parser: a line it refuses is skipped,
the rest still counts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from backends.protocol import Metric


def missing_parser() -> str | None:
    """Why this host cannot parse an exposition (prometheus_client is not installed), else None. The parser is
    imported only where metrics are read: its imports (~70 ms) would slow every command of the CLI."""
    try:
        import prometheus_client.parser  # noqa: F401
    except ImportError as exc:  # an agent host without its dependencies: the watch says server metrics are off
        return f"prometheus_client is not installed ({exc})"
    return None


def _families(text: str) -> list[Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return list(text_string_to_metric_families(text))


ENABLE_FLAG = "--enable-metrics"  # a store_true flag in 0.5.5 and 0.5.23
PATH = "/metrics"  # on the server's own host and port


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


# SGLang's gauge -> (our name, how its ranks' samples combine).
GAUGES: dict[str, tuple[str, Callable[[list[float]], float]]] = {
    "sglang:spec_accept_length": (Metric.ACCEPT_LEN, _mean),
    "sglang:spec_accept_rate": (Metric.ACCEPT_RATE, _mean),
    "sglang:gen_throughput": (Metric.GEN_THROUGHPUT, sum),
    "sglang:num_running_reqs": (Metric.RUNNING_REQ, sum),
    "sglang:num_queue_reqs": (Metric.QUEUE_REQ, sum),
    "sglang:token_usage": (Metric.TOKEN_USAGE, _mean),
    "sglang:cache_hit_rate": (Metric.CACHE_HIT_RATE, _mean),
}
# Without speculative decoding SGLang sets these to 0, where no accept length exists (it is at least 1).
SPECULATIVE = frozenset({Metric.ACCEPT_LEN, Metric.ACCEPT_RATE})
# SGLang's histogram -> {quantile: our name}.
HISTOGRAMS: dict[str, dict[float, str]] = {
    "sglang:time_to_first_token_seconds": {0.5: Metric.TTFT_P50, 0.99: Metric.TTFT_P99},
    "sglang:inter_token_latency_seconds": {0.5: Metric.ITL_P50, 0.99: Metric.ITL_P99},
    "sglang:e2e_request_latency_seconds": {0.5: Metric.E2E_P50},
}
NAMES = frozenset(
    [*(name for name, _ in GAUGES.values()), *(name for names in HISTOGRAMS.values() for name in names.values())]
)
BREAKDOWN_LABEL = "priority"

Buckets = dict[float, float]  # upper bound (le) -> cumulative count


def metrics_url(argv: list[str], health_url: str) -> str | None:
    """/metrics beside the health URL when the command turns SGLang's metrics on; None otherwise."""
    if not any(arg == ENABLE_FLAG or arg.startswith(ENABLE_FLAG + "=") for arg in argv):
        return None
    parts = urlsplit(health_url)
    return f"{parts.scheme}://{parts.netloc}{PATH}" if parts.scheme in ("http", "https") and parts.netloc else None


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of each sample prometheus_client reads in the text; a line it refuses
    (the parser stops at the first) is skipped by reading the text again line by line."""
    try:
        families = _families(text)
    except Exception:  # the parser's errors on malformed text are of several types (ValueError, IndexError...)
        yield from _line_by_line(text)
        return
    for family in families:
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def _line_by_line(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    for line in text.splitlines():
        if line.startswith("#"):
            continue  # HELP and TYPE: the samples are read by their own names
        try:
            families = _families(line + "\n")
        except Exception:  # as above: this line is not a sample
            continue
        for family in families:
            for sample in family.samples:
                yield sample.name, sample.labels, sample.value


def quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile of a histogram's cumulative buckets, linear within the bucket that holds it (the largest
    finite bound when it falls in +Inf's); None when the buckets hold no observation."""
    ordered = sorted(buckets.items())
    total = max((count for _, count in ordered), default=0.0)
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        count = max(count, below)  # cumulative counts never fall; a text that says otherwise is read as flat
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


@dataclass
class ServerMetrics:
    """One server's /metrics read scrape after scrape: each scrape's row (the histograms' previous buckets are
    kept, so that percentiles are those of the requests finished in between)."""

    names: frozenset[str] = NAMES
    _previous: dict[str, Buckets] = field(default_factory=dict)

    def unavailable(self) -> str | None:
        """Why this host cannot read the metrics (its parser is not installed), else None."""
        return missing_parser()

    def row(self, text: str) -> dict[str, float]:
        """The metric row of one exposition: the series SGLang has set so far (none before its first batch)."""
        gauges: dict[str, list[float]] = defaultdict(list)
        histograms: dict[str, Buckets] = defaultdict(lambda: defaultdict(float))
        for name, labels, value in samples(text):
            if not math.isfinite(value) or labels.get(BREAKDOWN_LABEL):
                continue
            histogram = name.removesuffix("_bucket")
            if name in GAUGES:
                gauges[name].append(value)
            elif histogram != name and histogram in HISTOGRAMS and (bound := _bound(labels.get("le", ""))) is not None:
                histograms[histogram][bound] += value
        row = {GAUGES[name][0]: GAUGES[name][1](values) for name, values in gauges.items()}
        if not row.get(Metric.ACCEPT_LEN):
            for name in SPECULATIVE:
                row.pop(name, None)
        for name, buckets in histograms.items():
            row.update(self._percentiles(name, dict(buckets)))
        return {name: round(value, 6) for name, value in row.items() if math.isfinite(value)}

    def _percentiles(self, name: str, buckets: Buckets) -> Iterable[tuple[str, float]]:
        previous = self._previous.get(name, {})
        self._previous[name] = buckets
        since = {bound: count - previous.get(bound, 0.0) for bound, count in buckets.items()}
        if any(count < 0 for count in since.values()):
            since = buckets  # fewer than before: the server restarted, its counts began again
        for q, ours in HISTOGRAMS[name].items():
            value = quantile(q, since)
            if value is not None:
                yield ours, value


def _bound(text: str) -> float | None:
    try:
        bound = float(text)
    except ValueError:
        return None
    return None if math.isnan(bound) else bound
