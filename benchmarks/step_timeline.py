"""Where a training step's wall time goes: its kernels, the device's idle time inside and between steps (and
what the host was doing meanwhile), and the step's host syncs with the line of ours that made each.

    PYTHONPATH=. python -m benchmarks.step_timeline                 # on the H200: 8 x 2048, compiled and plain
    PYTHONPATH=. python -m benchmarks.step_timeline --tiny          # CPU smoke run (no syncs, no device gaps)

benchmarks.kernel_groups profiles one step after a wait for the device, so a step's time that falls
between its last kernel and the next step's first one is not in its figures; here several steps run back
to back under the profiler, as the timed steps do, and every gap of at least 0.2 ms is shown with the
host's innermost operation at its start. Each variant is timed with Python's collector as it is and with
every object alive after the warm-up frozen out of its reach (gc.freeze: compilation leaves hundreds of
thousands of objects that each full collection walks). With OUT set, the profiled steps' Chrome trace goes
to OUT/timeline-VARIANT.json.gz.

Measured on H200s (2026-12-04, torch 2.11), 8 x 2048 compiled: before (63eb9b2's trainer) 450 ms a step,
its kernels 446.5 and the device idle 4.5 a step, 2.3 of it from step_rows' count to the compiled
forward's first kernel and 0.9 from the teacher's row count to its first product; after the kernel and
host-side changes (another machine) 444 ms, 436.1 and 3.7 (1.75 and 1.1). Plain: 481 ms. The collector
costs nothing here (gc.freeze: the same step times). Sync debug mode reports three syncs compiled, two
plain: the third is on the autograd thread and the trace shows no host wait there.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import os
import shutil
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from backends.train import distributed
from backends.train.data import Batch
from backends.train.trainer import Trainer
from benchmarks._common import print_table
from benchmarks._device_timing import synchronize, timed_calls
from benchmarks.train_throughput import LLAMA_31_8B, TINY, make_trainer, synthetic_batch

SHOWN_GAP_MS = 0.2
OURS = ("backends/train/", "benchmarks/")


def sync_sites(step: Callable[[], Any]) -> Counter[str]:
    """Each host sync of one call of `step` (CUDA's sync debug mode warns on each), by the innermost line of
    ours on the stack when it warned."""
    sites: Counter[str] = Counter()

    def record(*_: Any, **__: Any) -> None:
        frames = [f for f in traceback.extract_stack() if any(part in f.filename for part in OURS)]
        ours = [f for f in frames if "step_timeline" not in f.filename]
        sites[f"{ours[-1].filename.split('/')[-1]}:{ours[-1].lineno} {ours[-1].line}" if ours else "?"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sites


def timeline(step: Callable[[], Any], steps: int, device: torch.device, trace: Path | None) -> dict[str, Any]:
    """`steps` calls back to back under the profiler: the device's span per step, its kernels per step, and
    its idle gaps (ms, host operation at the gap's start) over the whole span."""
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    if trace is not None:
        raw = trace.with_suffix("")
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(trace, "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
    kernels: list[tuple[float, float, str]] = []
    host: list[tuple[float, float, str]] = []
    for event in prof.events():
        span = (event.time_range.start, event.time_range.end, event.name)
        (host if event.device_type == DeviceType.CPU else kernels).append(span)
    kernels.sort()
    busy = sum(end - start for start, end, _ in kernels)
    gaps: list[tuple[float, str, str]] = []
    busy_until = kernels[0][1]
    for start, end, name in kernels[1:]:
        if start - busy_until >= SHOWN_GAP_MS * 1e3:
            gaps.append(((start - busy_until) / 1e3, name, innermost(host, busy_until)))
        busy_until = max(busy_until, end)
    span_ms = (busy_until - kernels[0][0]) / 1e3
    return {"span_ms": span_ms / steps, "kernels_ms": busy / 1e3 / steps, "gaps": gaps}


def innermost(host: list[tuple[float, float, str]], at: float) -> str:
    """The shortest host operation running at time `at`, and the longest (the call it sits in)."""
    around = sorted((end - start, name) for start, end, name in host if start <= at <= end)
    if not around:
        return "-"
    return around[0][1] if len(around) == 1 else f"{around[0][1]} in {around[-1][1]}"


def measure(trainer: Trainer, batch: Batch, args: argparse.Namespace, trace: Path | None) -> dict[str, Any]:
    device = trainer.ctx.device
    step = lambda: trainer.train_step(batch)  # noqa: E731
    warm = timed_calls(step, args.warmup, 1, device).warmup_s
    as_is = timed_calls(step, 0, args.steps, device).call_s
    gc.freeze()
    frozen = timed_calls(step, 0, args.steps, device).call_s
    gc.unfreeze()
    result: dict[str, Any] = {"warmup_s": warm, "step_ms": as_is * 1e3, "step_ms_gc_frozen": frozen * 1e3}
    if device.type == "cuda":
        result["syncs"] = sync_sites(step)
        result.update(timeline(step, args.traced, device, trace))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_timeline", description=__doc__)
    parser.add_argument("--tiny", action="store_true", help="a tiny draft, for a CPU smoke run")
    parser.add_argument("--shape", default=None, help="BATCHxSEQ; default 8x2048 (tiny: 2x64)")
    parser.add_argument("--variants", default="compiled,plain", help="comma list of compiled, plain")
    parser.add_argument("--ttt", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="timed steps, each way")
    parser.add_argument("--traced", type=int, default=3, help="steps run back to back under the profiler")
    args = parser.parse_args()
    ctx = distributed.init()
    cfg = TINY if args.tiny else LLAMA_31_8B
    size, seq = (int(n) for n in (args.shape or ("2x64" if args.tiny else "8x2048")).split("x"))
    batch = synthetic_batch(cfg, size, seq, ctx.device, torch.Generator(device=ctx.device).manual_seed(2))
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    options = argparse.Namespace(ttt=args.ttt, batch_size=size, attention="auto")
    rows = []
    for variant in args.variants.split(","):
        started = time.perf_counter()
        trainer = make_trainer(cfg, options, variant == "compiled", ctx)
        trace = out / f"timeline-{variant}.json.gz" if out is not None else None
        r = measure(trainer, batch, args, trace)
        print(f"{variant}, {size} x {seq} ({time.perf_counter() - started:.0f} s):", flush=True)
        for site, count in r.get("syncs", {}).items():
            print(f"  host sync x{count} at {site}")
        for ms, before, doing in r.get("gaps", []):
            print(f"  idle {ms:7.2f} ms before {before[:50]}; host in {doing[:90]}")
        span, kernels = r.get("span_ms", float("nan")), r.get("kernels_ms", float("nan"))
        idle = sum(ms for ms, _, _ in r.get("gaps", [])) / args.traced
        syncs = str(sum(r.get("syncs", {}).values()))
        times = (r["step_ms"], r["step_ms_gc_frozen"], span, kernels, idle)
        rows.append([variant, *(f"{t:.1f}" for t in times), syncs])
        del trainer
        gc.collect()
    headers = ("variant", "step ms", "gc frozen", "device span/step", "kernels/step", "gaps>0.2ms/step", "syncs")
    print_table(rows, headers=headers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
