"""The MLP's SiLU(gate) * up, over its fused gate-up product, as one Triton kernel forward and one backward.

Forward reads gate and up once and writes the product; backward reads the product's gradient and gate-up
once and writes gate-up's gradient, both halves, in place of the split, the SiLU, the multiply, their
backwards and the concatenation of the two gradients (PyTorch's eager ops: about 16 passes over an
[N, intermediate] tensor; inductor's fused kernels: 7, but its backward ran at half the H200's
bandwidth). Only gate-up is kept for backward, as inductor keeps it, where eager kept SiLU(gate) too.
Math in float32, one rounding to the output's dtype.

Runs on CUDA, or under Triton's interpreter (TRITON_INTERPRET=1), which is how the tests check it;
elsewhere `silu_mul` is the torch formula. A torch custom op, so torch.compile keeps it whole.
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

BLOCK = 2048  # columns of one row a program takes


# Triton reads TRITON_INTERPRET when imported; read here once, not in a traced function (a graph break there).
INTERPRETING = triton is not None and bool(triton.knobs.runtime.interpret)


def available(device: torch.device) -> bool:
    return triton is not None and (device.type == "cuda" or INTERPRETING)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of gate_up [N, 2I] = cat(gate, up) along its last dimension: [N, I]."""
    if available(gate_up.device) and gate_up.dim() == 2:
        out: torch.Tensor = _forward_op(gate_up)
        return out
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _silu_mul_kernel(gate_up_ptr, out_ptr, width, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        gate_up_ptr += row * 2 * width
        gate = tl.load(gate_up_ptr + cols, mask=inside).to(tl.float32)
        up = tl.load(gate_up_ptr + width + cols, mask=inside).to(tl.float32)
        out = gate * tl.sigmoid(gate) * up
        tl.store(out_ptr + row * width + cols, out.to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _silu_mul_backward_kernel(grad_ptr, gate_up_ptr, d_gate_up_ptr, width, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        gate_up_ptr += row * 2 * width
        d_gate_up_ptr += row * 2 * width
        grad = tl.load(grad_ptr + row * width + cols, mask=inside).to(tl.float32)
        gate = tl.load(gate_up_ptr + cols, mask=inside).to(tl.float32)
        up = tl.load(gate_up_ptr + width + cols, mask=inside).to(tl.float32)
        sig = tl.sigmoid(gate)
        silu = gate * sig
        d_gate = grad * up * (sig + silu * (1.0 - sig))  # d silu / d gate = sig * (1 + gate * (1 - sig))
        dtype = d_gate_up_ptr.dtype.element_ty
        tl.store(d_gate_up_ptr + cols, d_gate.to(dtype), mask=inside)
        tl.store(d_gate_up_ptr + width + cols, (grad * silu).to(dtype), mask=inside)


def _grid(rows: int, width: int) -> tuple[int, int]:
    return rows, triton.cdiv(width, BLOCK)


@torch.library.custom_op("eagle3::silu_mul", mutates_args=())
def _forward_op(gate_up: torch.Tensor) -> torch.Tensor:
    gate_up = gate_up.contiguous()
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty(rows, width)
    if rows:
        _silu_mul_kernel[_grid(rows, width)](gate_up, out, width, BLOCK=BLOCK, num_warps=8)
    return out


@torch.library.custom_op("eagle3::silu_mul_backward", mutates_args=())
def _backward_op(grad: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    grad, gate_up = grad.contiguous(), gate_up.contiguous()
    rows, width = grad.shape
    d_gate_up = torch.empty_like(gate_up)
    if rows:
        _silu_mul_backward_kernel[_grid(rows, width)](grad, gate_up, d_gate_up, width, BLOCK=BLOCK, num_warps=8)
    return d_gate_up


@_forward_op.register_fake
def _(gate_up: torch.Tensor) -> torch.Tensor:
    return gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)


@_backward_op.register_fake
def _(grad: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(gate_up)


def _setup_context(ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[0])


def _backward_rule(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    (gate_up,) = ctx.saved_tensors
    d_gate_up: torch.Tensor = _backward_op(grad, gate_up)
    return d_gate_up


_forward_op.register_autograd(_backward_rule, setup_context=_setup_context)
