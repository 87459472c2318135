"""RMSNorm, alone and after a residual add, as one Triton kernel forward and one backward.

Forward reads each row once and writes the normed row (and, after an add, the sum); backward reads the row,
its gradient and the sum's own gradient once and writes the input's gradient, while each program adds its
rows' share of the weight's gradient into one float32 row, summed over programs at the end. Math in float32
(the weight included), one rounding to the input's dtype, as `F.rms_norm` over `x.float()` does. In an
8 x 2048 step on an H200 the norms took 8.8 ms as inductor's kernels, 5.0 as these (the forward at its
bandwidth floor, the backward at two thirds of it); benchmarks/specforge_compare.py has the figures.

Runs on CUDA, or under Triton's interpreter (TRITON_INTERPRET=1), which is how the tests check it;
elsewhere the torch formula. Torch custom ops, so torch.compile keeps them whole.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

try:
    import triton  # type: ignore[import-not-found,unused-ignore]
    import triton.language as tl  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # a CPU-only install: the torch formula serves
    triton = None

MAX_WIDTH = 16384  # one program holds a whole row in registers
PROGRAMS_PER_SM = 8  # backward's programs: each walks its rows one at a time and writes one partial row

INTERPRETING = triton is not None and bool(triton.knobs.runtime.interpret)


def available(device: torch.device) -> bool:
    return triton is not None and (device.type == "cuda" or INTERPRETING)


def formula(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x.float(), weight.shape, weight.float(), eps).to(x.dtype)


def _fused(x: torch.Tensor) -> bool:
    return available(x.device) and x.shape[-1] <= MAX_WIDTH


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [..., H] with weight [H], in x's dtype."""
    if not _fused(x):
        return formula(x, weight, eps)
    out: torch.Tensor = _norm_op(x.reshape(-1, x.shape[-1]), weight, eps)
    return out.view(x.shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, RMSNorm of that sum) for x and residual [N, H] of one dtype."""
    if not _fused(x) or x.dim() != 2 or x.dtype != residual.dtype:
        total = x + residual
        return total, formula(total, weight, eps)
    total, out = _add_norm_op(x, residual, weight, eps)
    return total, out


if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _rmsnorm_fwd_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        x_ptr, residual_ptr, total_ptr, w_ptr, out_ptr, rstd_ptr, width, eps, ADD: tl.constexpr, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < width
        offsets = row * width + cols
        x = tl.load(x_ptr + offsets, mask=inside, other=0.0)
        if ADD:  # in float32, rounded to the inputs' dtype once, as torch's add is
            x = (x.to(tl.float32) + tl.load(residual_ptr + offsets, mask=inside, other=0.0).to(tl.float32)).to(x.dtype)
            tl.store(total_ptr + offsets, x, mask=inside)
        x = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / width + eps)
        w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + offsets, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=inside)
        tl.store(rstd_ptr + row, rstd)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _rmsnorm_bwd_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        grad_ptr, total_grad_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, rows, width, rows_per_program,
        ADD: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        program = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        inside = cols < width
        w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        first = program.to(tl.int64) * rows_per_program  # 64-bit offsets past 2**31 elements
        for row in range(first, tl.minimum(first + rows_per_program, rows)):
            offsets = row * width + cols
            x = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
            grad = tl.load(grad_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
            rstd = tl.load(rstd_ptr + row)
            normed = x * rstd
            w_grad = w * grad
            dx = (w_grad - normed * (tl.sum(w_grad * normed, axis=0) / width)) * rstd
            if ADD:  # the sum's own gradient (its later uses) joins the norm's
                dx += tl.load(total_grad_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
            tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=inside)
            dw += grad * normed
        tl.store(dw_ptr + program.to(tl.int64) * width + cols, dw, mask=inside)


def _forward(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the sum, or x itself without a residual; the normed rows; each row's 1/rms in float32)."""
    x = x.contiguous()
    rows, width = x.shape
    total = x if residual is None else torch.empty_like(x)
    out = torch.empty_like(x)
    rstd = x.new_empty(rows, dtype=torch.float32)
    if rows:
        _rmsnorm_fwd_kernel[(rows,)](
            x,
            x if residual is None else residual.contiguous(),
            total,
            weight.contiguous(),
            out,
            rstd,
            width,
            eps,
            ADD=residual is not None,
            BLOCK=triton.next_power_of_2(width),
            num_warps=_warps(width),
        )
    return total, out, rstd


def _backward(
    grad: torch.Tensor, total_grad: torch.Tensor | None, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x's gradient, the sum's gradient added where given; the weight's, in its dtype)."""
    grad = grad.contiguous()
    rows, width = grad.shape
    dx = torch.empty_like(x)
    if x.device.type == "cuda":
        programs = PROGRAMS_PER_SM * torch.cuda.get_device_properties(x.device).multi_processor_count
    else:
        programs = 4
    programs = max(1, min(programs, rows))
    partial = grad.new_empty(programs, width, dtype=torch.float32)
    if rows:
        per_program = triton.cdiv(rows, programs)
        _rmsnorm_bwd_kernel[(programs,)](
            grad,
            grad if total_grad is None else total_grad.contiguous(),
            x,
            weight.contiguous(),
            rstd,
            dx,
            partial,
            rows,
            width,
            per_program,
            ADD=total_grad is not None,
            BLOCK=triton.next_power_of_2(width),
            num_warps=_warps(width),
        )
    else:
        partial.zero_()
    return dx, partial.sum(0).to(weight.dtype)


def _warps(width: int) -> int:
    return 4 if width <= 1024 else 8 if width <= 4096 else 16


@torch.library.custom_op("eagle3::rms_norm", mutates_args=())
def _norm_forward_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    _, out, rstd = _forward(x, None, weight, eps)
    return out, rstd


@torch.library.custom_op("eagle3::add_rms_norm", mutates_args=())
def _add_norm_forward_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward(x, residual, weight, eps)


@torch.library.custom_op("eagle3::rms_norm_backward", mutates_args=())
def _backward_op(
    grad: torch.Tensor, total_grad: torch.Tensor | None, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return _backward(grad, total_grad, x, weight, rstd)


@_norm_forward_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), x.new_empty(x.shape[0], dtype=torch.float32)


@_add_norm_forward_op.register_fake
def _(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x), x.new_empty(x.shape[0], dtype=torch.float32)


@_backward_op.register_fake
def _(
    grad: torch.Tensor, total_grad: torch.Tensor | None, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(weight)


# Plain RMSNorm: the input and 1/rms kept for backward. With the add: the sum kept in the input's place.


def _norm_setup(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor, float], output: Any) -> None:
    ctx.save_for_backward(inputs[0], inputs[1], output[1])


def _norm_backward(ctx: Any, grad: torch.Tensor, _rstd_grad: Any) -> tuple[torch.Tensor, torch.Tensor, None]:
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _backward_op(grad, None, x, weight, rstd)
    return dx, dw, None


def _add_norm_setup(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float], output: Any) -> None:
    ctx.save_for_backward(output[0], inputs[2], output[2])


def _add_norm_backward(
    ctx: Any, total_grad: torch.Tensor | None, grad: torch.Tensor, _rstd_grad: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
    total, weight, rstd = ctx.saved_tensors
    dx, dw = _backward_op(grad, total_grad, total, weight, rstd)
    return dx, dx, dw, None


_norm_forward_op.register_autograd(_norm_backward, setup_context=_norm_setup)
_add_norm_forward_op.register_autograd(_add_norm_backward, setup_context=_add_norm_setup)


def _norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out: torch.Tensor = _norm_forward_op(x, weight, eps)[0]
    return out


def _add_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    total, out, _ = _add_norm_forward_op(x, residual, weight, eps)
    return total, out
