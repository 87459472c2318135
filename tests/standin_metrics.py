"""The stand-in's /metrics (`tests/sglang_standin.py --enable-metrics`): SGLang 0.5.23's series, written as
SGLang writes them.

REAL: the exposition format (prometheus_client's own writer, which SGLang serves through), the series' names, their
labels and the latency histograms' buckets (sglang/srt/observability/metrics_collector.py; compare
tests/sglang_output/metrics_*_0.5.23.txt, captured from the real server). The figures are the stand-in's: each
decode line it prints sets the gauges to that line's figures and finishes one request (its first token after
TTFT_S, its tokens ITL_S apart).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

# REAL: the scheduler's gauges carry these labels, the tokenizer's histograms the first two.
LABELS = {"engine_type": "unified", "model_name": "standin", "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
REQUEST_LABELS = {"engine_type": "unified", "model_name": "standin"}
# 0.5.23's default buckets.
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100)
TTFT_S = 0.15  # every request's, so the scraped median lies in the (0.1, 0.2] bucket
ITL_S = 0.012  # ... and in (0.010, 0.015]
TOKENS_PER_REQUEST = 4


class StandinMetrics:
    """The registry the stand-in serves at /metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

        def gauge(name: str) -> Gauge:
            return Gauge(f"sglang:{name}", name, labelnames=list(LABELS), registry=self.registry)

        self.gauges = {
            name: gauge(name)
            for name in (
                "num_running_reqs", "num_queue_reqs", "gen_throughput", "cache_hit_rate", "token_usage",
                "spec_accept_length", "spec_accept_rate",
            )
        }  # fmt: skip
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labelnames=[*REQUEST_LABELS, "is_streaming"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labelnames=list(REQUEST_LABELS),
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )

    def decoded(self, *, running: int, token_usage: float, accept_len: float, accept_rate: float, gen: float) -> None:
        """One decode line's figures, as SGLang's scheduler logs them to its gauges at the same moment."""
        figures = {
            "num_running_reqs": running, "num_queue_reqs": 0, "gen_throughput": gen, "cache_hit_rate": 0.0,
            "token_usage": token_usage, "spec_accept_length": accept_len, "spec_accept_rate": accept_rate,
        }  # fmt: skip
        for name, value in figures.items():
            self.gauges[name].labels(**LABELS).set(value)
        self.ttft.labels(**REQUEST_LABELS, is_streaming="false").observe(TTFT_S)
        for _ in range(TOKENS_PER_REQUEST - 1):
            self.itl.labels(**REQUEST_LABELS).observe(ITL_S)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
