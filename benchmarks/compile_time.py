"""How long a compiled run takes to reach full speed, on a Llama-3.1-8B-shaped draft (benchmarks.train_throughput's).

    PYTHONPATH=. python -m benchmarks.compile_time --cache /tmp/cache --label cold          # on the H200
    PYTHONPATH=. python -m benchmarks.compile_time --cache /tmp/cache --label warm          # the relaunch
    PYTHONPATH=. python -m benchmarks.compile_time --tiny --sweep 8,16,24 --rate-lengths 16  # CPU smoke run

One process is one start of a run: the trainer's compiled step (TTT 7, batch 1, synthetic features) on a
first batch of --first tokens, then one step at each length of --sweep (a run over chats of those padded
lengths), then tokens/s at each of --rate-lengths. It reports the seconds from the process's start (--started,
the shell's clock) to the end of the first step, the first step alone (the compilation), the slowest sweep step
(a length that compiled again would stand out) and how many graphs dynamo compiled. --cache is the inductor
and Triton cache folder (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR): a second process on the same folder is a
relaunch of the same run. Run on a checkout of an older commit (PYTHONPATH), it times that commit's trainer.

Measured on one H200 (torch 2.11, triton 3.6, 2026-12-04; attention: the TTT Triton kernel, which `auto` picks),
first batch 2048, then one step at each of the 64 lengths 128, 256, .., 8192:
  one graph, mix-order reduction non-strict: 87 s from the process's start to the end of the first step (74 s
    of it the step's compilation); all 64 lengths done 97 s after the start, the slowest of them 0.26 s (8192):
    no length compiled again; 16,800 / 30,700 / 30,865 tokens/s at 512 / 2048 / 8192; a relaunch on the same
    cache 16 s to the end of its first step (FX graph and AOTAutograd cache hits, no miss).
  with inductor's strict mix-order thresholds (before trainer.keep_one_graph): 4 graphs (the thresholds were
    guards on the row counts, each recompile ~30 s); 19,929 / 31,081 / 30,852 tokens/s, each length in a graph
    the thresholds had left unfused, as the committed setting (fusion off) leaves every one; relaunch 18 s.
  the commit before (02d3a6c, a graph per padded length): 92 s to the end of the first step (78 s compiling),
    then about as long again for each new padded length (16 to cover 128..2048: ~21 minutes; 64 for
    128..8192: ~83 minutes); 31,473 tokens/s at 2048 (the dynamic graph: 31,081, 1.2% slower). First losses
    71.46212 (per length) and 71.46214 (dynamic): the same graph's arithmetic.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_time", description=__doc__)
    parser.add_argument("--tiny", action="store_true", help="a tiny draft, for a CPU smoke run")
    parser.add_argument("--cache", type=Path, required=True, help="the compile cache folder")
    parser.add_argument("--started", type=float, help="the process's start, seconds since the epoch (default: now)")
    parser.add_argument("--first", type=int, default=2048, help="the first batch's length")
    parser.add_argument("--sweep", default="", help="comma list of lengths, one step each, after the first")
    parser.add_argument("--rate-lengths", default="2048", help="comma list of lengths to time")
    parser.add_argument("--steps", type=int, default=5, help="timed steps at each rate length")
    parser.add_argument("--label", default="", help="a name for this process in the results")
    args = parser.parse_args()
    started = args.started or time.time()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(args.cache)
    os.environ["TRITON_CACHE_DIR"] = str(args.cache / "triton")

    import torch
    from torch._dynamo.utils import counters

    from backends.train import distributed
    from benchmarks._device_timing import synchronize, timed_calls
    from benchmarks.train_throughput import LLAMA_31_8B, TINY, make_trainer, synthetic_batch

    ctx = distributed.init()
    cfg = TINY if args.tiny else LLAMA_31_8B
    options = argparse.Namespace(ttt=7, batch_size=1, attention="auto")
    trainer = make_trainer(cfg, options, True, ctx)
    gen = torch.Generator(device=ctx.device).manual_seed(2)

    def timed_step(length: int) -> tuple[float, float]:
        """(seconds, loss) of one step on a fresh batch."""
        batch = synthetic_batch(cfg, 1, length, ctx.device, gen)
        synchronize(ctx.device)
        begun = time.perf_counter()
        loss = float(trainer.train_step(batch)[0])
        return time.perf_counter() - begun, loss

    result: dict[str, Any] = {"label": args.label, "torch": torch.__version__, "attention": trainer.attention}
    # The first loss is the same batch and weights in every process: a check of one graph against another.
    result["first_step_s"], result["first_loss"] = timed_step(args.first)
    result["start_to_first_step_s"] = time.time() - started
    sweep = [int(n) for n in args.sweep.split(",") if n]
    if sweep:
        times = [timed_step(n)[0] for n in sweep]
        result["sweep_lengths"] = f"{sweep[0]}..{sweep[-1]} ({len(sweep)})"
        result["sweep_slowest_s"], result["sweep_slowest_at"] = max(zip(times, sweep, strict=True))
        result["start_to_sweep_end_s"] = time.time() - started
    for length in (int(n) for n in args.rate_lengths.split(",") if n):
        batch = synthetic_batch(cfg, 1, length, ctx.device, gen)
        timing = timed_calls(functools.partial(trainer.train_step, batch), 2, args.steps, ctx.device)
        result[f"tokens_per_s_{length}"] = batch.tokens / timing.call_s
    result["graphs"] = counters["stats"]["unique_graphs"]
    result["fxgraph_cache"] = {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
    result["autograd_cache"] = {k: v for k, v in counters["aot_autograd"].items() if "cache" in k}
    if ctx.device.type == "cuda":
        result["peak_mem_gb"] = torch.cuda.max_memory_allocated(ctx.device) / 2**30
    print(json.dumps(result), flush=True)
    if os.environ.get("OUT"):
        with (Path(os.environ["OUT"]) / "compile_time.jsonl").open("a") as fh:
            fh.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
