"""SGLang 0.5.23's own `calculate_metrics` (sglang/benchmark/serving.py, what `bench_serving` prints) on recorded
bench traces, in the real-SGLang tier's interpreter: `python tests/bench_serving_tier.py < cases.json` prints one
JSON list, each case's BenchmarkMetrics as a dict. One process for every case: importing SGLang takes seconds.

A case is {"duration_s", "accept_length", "requests": [{"ok", "start_s", "ttft_s", "latency_s", "gaps_s",
"chunk_tokens", "output_len", "prompt_len"}]}: what our bench recorded of each request. Each gap's chunk is given to
bench_serving as that many words, and its tokenizer is one that counts words, so its retokenized ITL spreads each
gap over the same tokens ours does.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import types
from typing import Any

# bench_serving's dataset loaders import Hugging Face's `datasets`, which the tier does not install and which
# calculate_metrics never uses.
STUB = types.ModuleType("datasets")
STUB.load_dataset = None  # type: ignore[attr-defined]
sys.modules.setdefault("datasets", STUB)
# sglang is not in the test venv: mypy must not need it
SERVING = importlib.import_module("sglang.benchmark.serving")
COMMON = importlib.import_module("sglang.benchmark.datasets.common")


class WordTokenizer:
    """A tokenizer whose tokens are words: a chunk of n words is n tokens."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return text.split()


def metrics(case: dict[str, Any]) -> dict[str, Any]:
    rows, outputs = [], []
    for r in case["requests"]:
        rows.append(COMMON.DatasetRow(prompt="p", prompt_len=r["prompt_len"], output_len=r["output_len"]))
        chunks = ["t " * n for n in r["chunk_tokens"]]
        outputs.append(
            SERVING.RequestFuncOutput(
                generated_text="t " + "".join(chunks),
                success=r["ok"],
                latency=r["latency_s"],
                ttft=r["ttft_s"],
                itl=r["gaps_s"],
                text_chunks=chunks,
                prompt_len=r["prompt_len"],
                output_len=r["output_len"],
                start_time=r["start_s"],
            )
        )
    found, _ = SERVING.calculate_metrics(
        rows, outputs, case["duration_s"], WordTokenizer(), "sglang-oai-chat", accept_length=case["accept_length"]
    )
    return {k: float(v) for k, v in dataclasses.asdict(found).items()}


if __name__ == "__main__":
    print(json.dumps([metrics(case) for case in json.load(sys.stdin)]))
