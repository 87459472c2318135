"""The training step's fused elementwise kernels on the GPU, each against what it replaced: checked, then timed.

    python -m benchmarks.fused_kernels_check [--rows 16384]

At the Llama-3.1-8B draft's shapes (hidden 4096, MLP 14336, target vocabulary 128,256, draft 32,000; bf16):
- SiLU(gate) * up over the fused gate-up product (backends/train/swiglu.py), forward and forward + backward,
  against the eager formula and the formula through torch.compile (what the compiled step fused before);
  relative error of the output and gate-up's gradient against the formula in float32.
- RMSNorm after a residual add (backends/train/rmsnorm.py), as the draft's post-attention norm: the sum and
  the normed rows, the gradients of x, the residual and the weight, against the formula eager and compiled.
- The teacher's row statistics (backends/train/teacher_kernel.py) in Teacher.draft_logits (products
  included), against the torch formula it replaced: the same logits, argmaxes and in-vocabulary flags,
  logsumexp's relative error.
Timing: triton.testing.do_bench, median ms. Bytes each must move at least, over the ~4.3 TB/s this H200
copies at (read + write counted), give the floor beside each. Prints a table last; --results appends JSON.

Measured on an H200 (2026-12-04, torch 2.11, triton 3.6, 16,384 rows), ms forward / forward + backward:
SiLU * up eager 1.22 / 3.32, compiled formula 0.83 / 3.58, Triton kernels 0.34 / 0.91 (floor 0.33 / 0.87),
every one within 2.4e-3 of float64; add + RMSNorm eager 0.560 / 1.380, compiled formula 0.209 / 0.735,
Triton kernels 0.136 / 1.062 (floor 0.125 / 0.281; the backward walks each program's rows one at a time),
each within 2.4e-3; teacher rows 32.8 (torch formula) -> 27.2 (fused; floor 22.8, the
products at 790 TFLOP/s and one read of the logits), the same logits, argmaxes and flags. What the step
gained: benchmarks/specforge_compare.py's docstring.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from backends.train import rmsnorm, teacher_kernel
from backends.train.swiglu import silu_mul
from backends.train.target import Teacher
from benchmarks._common import print_table

HIDDEN, INTERMEDIATE, VOCAB, DRAFT_VOCAB = 4096, 14336, 128256, 32000
COPY_BYTES_PER_S = 4.3e12


def bench(fn: Callable[[], Any]) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def formula(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_rows(rows: int, gen: torch.Generator) -> list[list[str]]:
    gate_up = torch.randn(rows, 2 * INTERMEDIATE, device="cuda", generator=gen).bfloat16().requires_grad_()
    grad = torch.randn(rows, INTERMEDIATE, device="cuda", generator=gen).bfloat16()
    exact = gate_up.detach().double().requires_grad_()
    ref_out = formula(exact)
    (ref_grad,) = torch.autograd.grad(ref_out, exact, grad.double())
    element = rows * INTERMEDIATE * 2  # bytes of one [rows, I] bf16 tensor
    floors = (3 * element / COPY_BYTES_PER_S * 1e3, 8 * element / COPY_BYTES_PER_S * 1e3)
    compiled = torch.compile(formula, dynamic=True)
    out_rows = []
    for name, fn in (("eager formula", formula), ("compiled formula", compiled), ("Triton kernels", silu_mul)):
        out = fn(gate_up)
        (d_gate_up,) = torch.autograd.grad(out, gate_up, grad)
        err = max(
            float((out.double() - ref_out).norm() / ref_out.norm()),
            float((d_gate_up.double() - ref_grad).norm() / ref_grad.norm()),
        )

        def forward(fn: Callable[[torch.Tensor], torch.Tensor] = fn) -> None:
            with torch.no_grad():
                fn(gate_up)

        def both(fn: Callable[[torch.Tensor], torch.Tensor] = fn) -> None:
            torch.autograd.grad(fn(gate_up), gate_up, grad)

        timed = [f"{bench(forward):.3f}", f"{bench(both):.3f}"]
        out_rows.append([f"SiLU * up, {name}", *timed, f"{floors[0]:.3f} / {floors[1]:.3f}", f"{err:.1e}"])
    return out_rows


def norm_formula(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    total = x + residual
    return total, rmsnorm.formula(total, weight, 1e-5)


def norm_rows(rows: int, gen: torch.Generator) -> list[list[str]]:
    """RMSNorm after a residual add, as the draft's post-attention norm runs: the sum and the normed rows
    out, both with a gradient (the sum's later uses), the weight's gradient summed over the rows."""
    x, residual, grad, total_grad = (
        torch.randn(rows, HIDDEN, device="cuda", generator=gen).bfloat16() for _ in range(4)
    )
    weight = (1 + 0.1 * torch.randn(HIDDEN, device="cuda", generator=gen)).requires_grad_()
    x.requires_grad_()
    residual.requires_grad_()
    leaves = [x, residual, weight]
    exact = [t.detach().double().requires_grad_() for t in leaves]
    ref_total = exact[0] + exact[1]
    ref_out = F.rms_norm(ref_total, (HIDDEN,), exact[2], 1e-5)
    ref = [ref_total, ref_out, *torch.autograd.grad((ref_total, ref_out), exact, (total_grad.double(), grad.double()))]
    element = rows * HIDDEN * 2
    floors = (4 * element / COPY_BYTES_PER_S * 1e3, 9 * element / COPY_BYTES_PER_S * 1e3)  # bwd: 3 reads, 2 writes
    compiled = torch.compile(norm_formula, dynamic=True)

    def kernel(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rmsnorm.add_rms_norm(x, residual, weight, 1e-5)

    out_rows = []
    for name, fn in (("eager formula", norm_formula), ("compiled formula", compiled), ("Triton kernels", kernel)):
        total, out = fn(x, residual, weight)
        got = [total, out, *torch.autograd.grad((total, out), leaves, (total_grad, grad))]
        err = max(float((a.double() - b).norm() / b.norm()) for a, b in zip(got, ref, strict=True))

        def forward(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] = fn) -> None:
            with torch.no_grad():
                fn(x, residual, weight)

        def both(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] = fn) -> None:
            torch.autograd.grad(fn(x, residual, weight), leaves, (total_grad, grad))

        timed = [f"{bench(forward):.3f}", f"{bench(both):.3f}"]
        out_rows.append([f"add + RMSNorm, {name}", *timed, f"{floors[0]:.3f} / {floors[1]:.3f}", f"{err:.1e}"])
    return out_rows


def teacher_rows(rows: int, gen: torch.Generator) -> list[list[str]]:
    lm_head = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5).bfloat16()
    draft_ids = torch.randperm(VOCAB, device="cuda", generator=gen)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool, device="cuda")
    t2d[draft_ids] = True
    teacher = Teacher(lm_head, draft_ids, t2d)
    hidden = torch.randn(rows, HIDDEN, device="cuda", generator=gen).bfloat16()
    fused = teacher.draft_logits(hidden)
    available = teacher_kernel.available
    teacher_kernel.available = lambda device: False
    try:
        torch_formula = teacher.draft_logits(hidden)
        before = bench(lambda: teacher.draft_logits(hidden))
    finally:
        teacher_kernel.available = available
    after = bench(lambda: teacher.draft_logits(hidden))
    same = all(torch.equal(a, b) for a, b in ((fused[0], torch_formula[0]), (fused[2], torch_formula[2])))
    same = same and torch.equal(fused[3], torch_formula[3])
    err = float((fused[1] - torch_formula[1]).norm() / torch_formula[1].norm())
    product_ms = 2 * rows * HIDDEN * VOCAB / 790e12 * 1e3
    floor = product_ms + rows * VOCAB * 2 / COPY_BYTES_PER_S * 1e3
    verdict = f"{err:.1e}" + ("" if same else " (argmax/flags differ)")
    return [
        ["teacher rows, torch formula", f"{before:.3f}", "-", f"{floor:.3f}", "-"],
        ["teacher rows, fused kernel", f"{after:.3f}", "-", f"{floor:.3f}", verdict],
    ]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fused_kernels_check", description=__doc__)
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--results", type=Path, help="append one JSON line per row to this file")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = silu_rows(args.rows, gen) + norm_rows(args.rows, gen) + teacher_rows(args.rows, gen)
    headers = ("kernel", "forward ms", "fwd + bwd ms", "floor ms (fwd / both)", "rel. error")
    if args.results is not None:
        with args.results.open("a") as fh:
            for row in rows:
                fh.write(json.dumps(dict(zip(headers, row, strict=True))) + "\n")
    print_table(rows, headers=headers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
