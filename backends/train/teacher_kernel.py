"""The teacher's per-row statistics as one Triton kernel: one read of a row's logits.

From the draft vocabulary's logits [R, draft_vocab] and the rest's [R, V - draft_vocab] (two products of
the target's lm_head, the first written straight into the logits the loss keeps) the kernel gives each
row's logsumexp over the draft columns, their argmax, and whether the target's argmax over the whole
vocabulary lies among them (a tie goes to the smaller target id, as argmax over the whole vocabulary
does). The torch formula (target.Teacher, on CPU) takes seven passes over the draft columns (a float32
copy, max, subtract, exp, sum, argmax, gather) and two over the rest; here each column is read once.

Runs on CUDA, or under Triton's interpreter (TRITON_INTERPRET=1), which is how the tests check it.
"""

from __future__ import annotations

import torch

try:
    import triton  # type: ignore[import-not-found,unused-ignore]
    import triton.language as tl  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # a CPU-only install: target.Teacher's torch formula serves
    triton = None

BLOCK = 4096  # columns a program reads at a time


# Triton reads TRITON_INTERPRET when imported; read here once, not in a traced function (a graph break there).
INTERPRETING = triton is not None and bool(triton.knobs.runtime.interpret)


def available(device: torch.device) -> bool:
    return triton is not None and (device.type == "cuda" or INTERPRETING)


if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _row_stats_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        draft_ptr,
        draft_stride,
        other_ptr,
        other_stride,
        draft_ids_ptr,
        other_ids_ptr,
        lse_ptr,
        argmax_ptr,
        in_vocab_ptr,
        size,
        other_size,
        BLOCK: tl.constexpr,
    ):
        """One row: online max, sum of exponentials and first argmax over the draft columns, max and first
        argmax over the others."""
        row = tl.program_id(0).to(tl.int64)
        draft_ptr += row * draft_stride
        other_ptr += row * other_stride
        top = float("-inf")
        total = 0.0
        best_at = 0
        for start in range(0, size, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(draft_ptr + cols, mask=cols < size, other=float("-inf")).to(tl.float32)
            block_top = tl.max(x, 0)
            new_top = tl.maximum(top, block_top)
            total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), 0)
            best_at = tl.where(block_top > top, start + tl.argmax(x, 0), best_at)
            top = new_top
        other_top = float("-inf")
        other_at = 0
        for start in range(0, other_size, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(other_ptr + cols, mask=cols < other_size, other=float("-inf")).to(tl.float32)
            block_top = tl.max(x, 0)
            other_at = tl.where(block_top > other_top, start + tl.argmax(x, 0), other_at)
            other_top = tl.maximum(other_top, block_top)
        smaller_id = tl.load(draft_ids_ptr + best_at) < tl.load(other_ids_ptr + other_at, mask=other_size > 0, other=0)
        inside = (top > other_top) | ((top == other_top) & smaller_id)
        tl.store(lse_ptr + row, top + tl.log(total))
        tl.store(argmax_ptr + row, best_at)
        tl.store(in_vocab_ptr + row, inside.to(tl.int8))


def row_stats(
    draft: torch.Tensor,
    other: torch.Tensor,
    draft_ids: torch.Tensor,
    other_ids: torch.Tensor,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    """Into `out` = (lse [R] float32, argmax [R] int64, in_vocab [R] bool): the statistics of the rows of
    draft [R, draft_vocab] and other [R, V - draft_vocab] logits (each contiguous along the vocabulary),
    whose columns are the target ids draft_ids and other_ids."""
    lse, argmax, in_vocab = out
    rows = draft.shape[0]
    if rows == 0:
        return
    _row_stats_kernel[(rows,)](
        draft,
        draft.stride(0),
        other,
        other.stride(0) if other.shape[1] else 0,
        draft_ids,
        other_ids,
        lse,
        argmax,
        in_vocab.view(torch.int8),
        draft.shape[1],
        other.shape[1],
        BLOCK=BLOCK,
        num_warps=8,
    )
