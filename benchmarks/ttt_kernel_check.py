"""The TTT attention kernel on the GPU: checked against the eager formula, timed against compiled flex.

    python -m benchmarks.ttt_kernel_check [--batch 1,8] [--seq 2048,1000,512] [--time-seq 2048] [--sweep [--best F]]

Every (batch, seq, TTT step k = 0..--ttt-1) at the Llama-3.1-8B draft's attention shape (32 heads, 8 kv
heads, head_dim 128; bf16; [B, T, heads, d], seen as [B, heads, T, d] by eager and flex and as packed rows,
one at every position, by the kernel):
the kernel's output and its q, k and v gradients (of every step) against eager_ttt_attention in float32 on
the same inputs, as max ||x - ref|| / ||ref|| (goal <= 1e-2; compiled flex's own error is shown beside it).
At the --time-seq lengths it times the kernel's forward and backward against flex_ttt_attention with
ttt_block_mask, compiled as the trainer compiles it (triton.testing.do_bench, median ms); --flex-steps
limits which k flex is timed at (each shape compiles apart). --sweep first times a few tile choices of
each of the kernel's three kernels at one shape (the figures behind ttt_kernel.CONFIGS); --best writes the
fastest to a file, checks and times with them, and benchmarks.specforge_compare --tiles takes that file. Prints
a table last; --results appends one JSON line per row. (Registers and spills at no device time:
benchmarks.ttt_kernel_build.)

Work counted per call (forward): 4 * B * H * d * (T(T+1)/2 + kT) flops; backward 2.5x that.

Measured on an H200 (2026-12-04, torch 2.11.0, triton 3.6.0, `--batch 8,1 --seq 2048,1000 --flex-steps 0,6`): every
shape within 2.5e-3 of float32 eager, as flex is. 8 x 2048, ms kernel/flex (flex compiled dynamic, on the block
tables written from the length): forward k=0 0.70/0.90, k=6 1.02/2.56; backward k=0 2.13/3.55, k=6 3.43/7.87.
1 x 2048: forward k=0 0.15/0.15, k=6 0.16/0.37; backward k=0 0.40/0.70, k=6 0.59/1.23. In the compiled train
step (benchmarks.train_throughput, 8 x 2048, --attention triton, before dO.O moved into the dQ kernel): 34,953
tokens/s, 30.4 GiB. Those figures are of the kernel before it took packed rows through row maps (2026-12-05,
not yet run on a GPU: no device was lent that session).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from dataclasses import astuple, replace
from pathlib import Path
from typing import Any

import torch
from torch._functorch import config as functorch_config

from backends.train import ttt_kernel
from backends.train.attention import eager_ttt_attention, flex_ttt_attention, ttt_block_mask
from backends.train.ttt_kernel import Blocks, ttt_attention
from benchmarks._common import print_table

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
GOAL = 1e-2


def inputs(
    batch: int, seq: int, steps: int, gen: torch.Generator
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """q and one key and value tensor per step, bf16, in the trainer's layout (model._over_batch)."""

    def one(heads: int) -> torch.Tensor:
        x = torch.randn(batch, seq, heads, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
        return x.transpose(1, 2).requires_grad_()

    return one(HEADS), [one(KV_HEADS) for _ in range(steps)], [one(KV_HEADS) for _ in range(steps)]


Attention = Callable[[torch.Tensor, list[torch.Tensor], list[torch.Tensor]], torch.Tensor]


@functools.cache
def every_row(batch: int, seq: int) -> torch.Tensor:
    return torch.arange(batch * seq, dtype=torch.int32, device="cuda").view(batch, seq)


def kernel(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """The kernel on a batch every position of which has a row (a near-all-loss batch), its packed rows
    views of the [B, T, heads, d] tensors: the same function as eager and flex on [B, heads, T, d]."""
    batch, heads, seq, dim = q.shape
    rows = every_row(batch, seq)

    def packed(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).reshape(batch * seq, x.shape[1], dim)

    out = ttt_attention(packed(q), rows, [packed(k) for k in keys], [packed(v) for v in values], [rows] * len(keys))
    return out.view(batch, seq, heads, dim).transpose(1, 2)


def flex_for(seq: int, step: int) -> Attention:
    mask = ttt_block_mask(seq, step, "cuda")
    return lambda q, keys, values: flex_ttt_attention(q, keys, values, mask)


def outputs_and_grads(
    fn: Attention, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], grad: torch.Tensor
) -> list[torch.Tensor]:
    out = fn(q, keys, values)
    return [out.detach(), *torch.autograd.grad(out, [q, *keys, *values], grad)]


def rel_error(results: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    worst = 0.0
    for got, ref in zip(results, reference, strict=True):
        if not torch.isfinite(got).all():
            return float("inf")
        worst = max(worst, float((got.float() - ref).norm() / ref.norm()))
    return worst


def check(
    fn: Attention, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], grad: torch.Tensor
) -> float:
    as_float = [x.detach().float().requires_grad_() for x in (q, *keys, *values)]
    steps = len(keys)
    reference = outputs_and_grads(
        eager_ttt_attention, as_float[0], as_float[1 : 1 + steps], as_float[1 + steps :], grad.float()
    )
    error = rel_error(outputs_and_grads(fn, q, keys, values, grad), reference)
    del reference, as_float
    return error


def time_ms(
    fn: Attention, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], grad: torch.Tensor
) -> tuple[float, float]:
    """Median ms of the forward, and of the backward alone (autograd over a kept graph)."""
    from triton.testing import do_bench

    forward = do_bench(lambda: fn(q, keys, values), warmup=25, rep=100, return_mode="median")
    out = fn(q, keys, values)
    leaves = [q, *keys, *values]
    backward = do_bench(
        lambda: torch.autograd.grad(out, leaves, grad, retain_graph=True), warmup=25, rep=100, return_mode="median"
    )
    return float(forward), float(backward)


def tflops(batch: int, seq: int, step: int, ms: float, factor: float = 1.0) -> float:
    flops = 4 * batch * HEADS * HEAD_DIM * (seq * (seq + 1) / 2 + step * seq) * factor
    return flops / ms / 1e9


def use_tiles(path: Path) -> None:
    """Set head_dim 128's tiles to those a --best file names (written by a sweep): how the sweep's choice is
    timed in the train step (benchmarks.specforge_compare --tiles) before it is written into CONFIGS."""
    chosen = {part: Blocks(*numbers) for part, numbers in json.loads(path.read_text()).items()}
    ttt_kernel.CONFIGS[HEAD_DIM] = replace(ttt_kernel.CONFIGS[HEAD_DIM], **chosen)


def sweep(gen: torch.Generator, best: Path | None) -> list[list[str]]:
    """Each kernel's tile choices at 8 x 2048, TTT step 6 (the most registers), the others at their defaults;
    the fastest of each written to `best` (JSON, as use_tiles reads it) and used from then on."""
    batch, seq, step = 8, 2048, 6
    q, keys, values = inputs(batch, seq, step + 1, gen)
    grad = torch.randn_like(q)
    default = ttt_kernel.CONFIGS[HEAD_DIM]
    variants: dict[str, list[Blocks]] = {
        # Run 1 (8 x 2048, step 3, triton 3.6, H200): forward 64/64/4/3 0.84 ms (128/64/8/3 0.88); backward
        # 3.65 ms with key_grads 64/64/4/2 (32/128/8/3 4.53), query_grads 64/64/4/2 saving 0.4 ms more.
        "forward": [
            Blocks(64, 64, 4, 3),
            Blocks(64, 64, 8, 3),
            Blocks(64, 64, 8, 2),
            Blocks(128, 64, 8, 3),
            Blocks(64, 128, 8, 3),
        ],
        "key_grads": [Blocks(64, 64, 4, 2), Blocks(64, 64, 8, 2), Blocks(64, 128, 8, 2), Blocks(32, 64, 4, 3)],
        "query_grads": [Blocks(64, 64, 4, 2), Blocks(64, 64, 8, 3), Blocks(64, 64, 8, 2), Blocks(128, 64, 8, 2)],
    }
    rows = []
    fastest: dict[str, tuple[float, Blocks]] = {}
    for part, choices in variants.items():
        for blocks in choices:
            ttt_kernel.CONFIGS[HEAD_DIM] = replace(default, **{part: blocks})
            try:
                fwd, bwd = time_ms(kernel, q, keys, values, grad)
                rows.append([part, str(blocks), f"{fwd:.3f}", f"{bwd:.3f}"])
            except Exception as exc:  # a tile that does not fit (shared memory, registers) is reported, not fatal
                rows.append([part, str(blocks), "failed", type(exc).__name__])
                continue
            finally:
                print(rows[-1], flush=True)
            # The forward's tiles move the forward alone; each backward kernel's move the backward.
            ms = fwd if part == "forward" else bwd
            if part not in fastest or ms < fastest[part][0]:
                fastest[part] = (ms, blocks)
    ttt_kernel.CONFIGS[HEAD_DIM] = default
    if best is not None:
        best.write_text(json.dumps({part: astuple(blocks) for part, (_, blocks) in fastest.items()}))
        use_tiles(best)
        print(f"fastest tiles, used from here on: {best.read_text()}", flush=True)
    return rows


def table_row(row: dict[str, Any]) -> list[str]:
    def cell(key: str, fmt: str = "{:.3f}") -> str:
        return fmt.format(row[key]) if key in row else "-"

    def ratio(part: str) -> str:
        flex, kernel = row.get(f"flex_{part}_ms"), row.get(f"kernel_{part}_ms")
        return f"{flex / kernel:.2f}" if flex and kernel else "-"

    speed = "-"
    if "kernel_fwd_ms" in row:
        batch, seq, step = row["batch"], row["seq"], row["step"]
        fwd, bwd = tflops(batch, seq, step, row["kernel_fwd_ms"]), tflops(batch, seq, step, row["kernel_bwd_ms"], 2.5)
        speed = f"{fwd:.0f}/{bwd:.0f}"
    return [
        *(str(row[k]) for k in ("batch", "seq", "step")),
        cell("err_kernel", "{:.1e}"),
        cell("err_flex", "{:.1e}"),
        cell("kernel_fwd_ms"),
        cell("flex_fwd_ms"),
        ratio("fwd"),
        cell("kernel_bwd_ms"),
        cell("flex_bwd_ms"),
        ratio("bwd"),
        speed,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ttt_kernel_check", description=__doc__)
    parser.add_argument("--batch", default="1,8", help="comma list of batch sizes")
    parser.add_argument("--seq", default="2048,1000,512", help="comma list of lengths checked")
    parser.add_argument("--time-seq", default="2048", help="comma list of lengths also timed")
    parser.add_argument("--ttt", type=int, default=7, help="TTT steps: k = 0..ttt-1")
    parser.add_argument("--flex-steps", default="0,3,6", help="the k at which flex is timed too (compiles per shape)")
    parser.add_argument("--sweep", action="store_true", help="time tile choices first")
    parser.add_argument("--results", type=Path, help="append one JSON line per row to this file")
    parser.add_argument("--best", type=Path, help="with --sweep: write the fastest tiles here, and check with them")
    args = parser.parse_args()
    import triton

    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    # The backward is timed again and again over one kept graph, which compiled flex refuses while it
    # donates its buffers (a saving for one backward per forward, as in training).
    functorch_config.donated_buffer = False
    if args.sweep:
        print_table(sweep(gen, args.best), ("kernel", "tiles", "fwd ms", "bwd ms"))
    flex_steps = {int(k) for k in args.flex_steps.split(",") if k}
    timed = {int(s) for s in args.time_seq.split(",") if s}
    headers = (
        "B",
        "T",
        "k",
        "err kernel",
        "err flex",
        "kernel fwd",
        "flex fwd",
        "fwd x",
        "kernel bwd",
        "flex bwd",
        "bwd x",
        "kernel TFLOP/s f/b",
    )
    rows: list[list[str]] = []
    started = time.perf_counter()
    for batch in (int(b) for b in args.batch.split(",")):
        for seq in (int(s) for s in args.seq.split(",")):
            for step in range(args.ttt):
                q, keys, values = inputs(batch, seq, step + 1, gen)
                grad = torch.randn_like(q)
                row: dict[str, Any] = {
                    "batch": batch,
                    "seq": seq,
                    "step": step,
                    "err_kernel": check(kernel, q, keys, values, grad),
                }
                with_flex = seq in timed and step in flex_steps
                if with_flex:
                    row["err_flex"] = check(flex_for(seq, step), q, keys, values, grad)
                if seq in timed:
                    row["kernel_fwd_ms"], row["kernel_bwd_ms"] = time_ms(kernel, q, keys, values, grad)
                if with_flex:
                    row["flex_fwd_ms"], row["flex_bwd_ms"] = time_ms(flex_for(seq, step), q, keys, values, grad)

                rows.append(table_row(row))
                print(" ".join(rows[-1]), f"({time.perf_counter() - started:.0f} s)", flush=True)
                if args.results is not None:
                    with args.results.open("a") as fh:
                        fh.write(json.dumps(row) + "\n")
                del q, keys, values, grad
    print()
    print_table(rows, headers)
    worst = max(float(r[3]) for r in rows)
    print(f"worst relative error of the kernel {worst:.2e} (goal <= {GOAL:.0e}): {'ok' if worst <= GOAL else 'FAILED'}")


if __name__ == "__main__":
    main()
