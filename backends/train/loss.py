"""The training-time-test loss and accuracy, as SpecForge and EAGLE compute them.

At TTT step k, draft position t predicts token x_{t+2+k}; its target is the
target's distribution at position j = t+1+k restricted to the draft vocabulary
(softmax over those logits). A position counts when the predicted token is a
loss token (loss_mask[t+2+k] == 1; the last position of a sample has no next
token and never counts). The loss is soft cross-entropy, averaged over the
counted positions whose target argmax is in the draft vocabulary (SpecForge's
position mask); step k weighs 0.8**k. Accuracy at step k is unconditional
(true tokens fed in) and has every counted position in its denominator, so a
target argmax outside the draft vocabulary is a miss, as it is when serving.

The definition computes that from every step's full logits (`ttt_loss` in
tests/train_reference.py, which the tests hold this module to). The trainer
computes the same numbers from the lm_head's input (`fused_ttt_loss`):
only the rows in the loss get logits at all (a row outside it adds nothing to the
loss, and an out-of-vocabulary one is a miss whatever the draft predicts), a few
thousand rows at a time, and each row's log-softmax, cross-entropy, argmax and
gradient come from one pass of a kernel over its logits, so no [B, T, vocab]
float32 tensor is ever made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from backends.train.step_rows import StepRows, step_rows
from backends.train.target import TeacherRows

try:
    import triton  # type: ignore[import-not-found,unused-ignore]
    import triton.language as tl  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # a CPU-only install: the torch formula serves
    triton = None

STEP_DECAY = 0.8
# Rows of the lm_head computed at once: their [rows, draft_vocab] logits are the largest tensor of the loss
# (8 GiB at a draft vocabulary of 32,000). A batch of 16K tokens at TTT 7 fits in one chunk, whose lm_head
# gradient is then one product, accumulated in float32 inside it over every row (8 x 2048 on an H200:
# 37,190 tokens/s; chunks of 64K rows 36,932, of 32K 36,633: products, each cast to float32 and added).
HEAD_CHUNK_ROWS = 131072
SOFT_CE_BLOCK = 4096  # columns a kernel program reads at a time


@dataclass
class LossParts:
    """Everything one batch contributes, as device tensors (no host sync)."""

    loss: torch.Tensor  # scalar, sum over k of 0.8**k * ploss[k]
    ploss: torch.Tensor  # [K] mean cross-entropy per step
    ce_sum: torch.Tensor  # [K] summed cross-entropy over the positions in the loss
    in_loss: torch.Tensor  # [K] positions in the loss (loss token, target argmax in the draft vocab)
    correct: torch.Tensor  # [K] positions where the draft's argmax is the target's
    counted: torch.Tensor  # [K] loss-token positions (accuracy denominator)


def step_masks(loss_mask: torch.Tensor, in_vocab: torch.Tensor, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per TTT step k, over draft positions t < T-1-k (those whose target position t+1+k
    exists): (counted: the predicted token is a loss token, in_loss: and the target's
    argmax is in the draft vocabulary), each [B, T-1-k] bool."""
    seq = loss_mask.shape[1]
    predicted = F.pad(loss_mask, (0, steps + 2))  # loss_mask of the token each position predicts
    masks = []
    for k in range(steps):
        n = max(seq - 1 - k, 0)
        counted = predicted[:, 2 + k : 2 + k + n]
        masks.append((counted, counted & in_vocab[:, 1 + k : 1 + k + n]))
    return masks


def pairs_in_loss(masks: list[tuple[torch.Tensor, torch.Tensor]], seq: int) -> torch.Tensor:
    """[K, B, T] bool: the (TTT step, draft position) pairs in the loss, step_masks' in_loss over every position."""
    return torch.stack([F.pad(in_, (0, seq - in_.shape[1])) for _, in_ in masks])


@dataclass
class LossRows:
    """The (TTT step k, draft position t) pairs in the loss, step by step, in position order,
    and the rows the draft computes for them."""

    hidden: torch.Tensor  # [N] int64: the pair's row of the draft's output (plan.output)
    target: torch.Tensor  # [N] int64: the teacher's row of position t+1+k
    step: torch.Tensor  # [N] int64: k
    in_loss: torch.Tensor  # [K] rows of each step
    counted: torch.Tensor  # [K] loss-token positions of each step (accuracy denominators)
    plan: StepRows  # which rows each step of the draft computes


def loss_rows(loss_mask: torch.Tensor, teacher: TeacherRows, steps: int) -> LossRows:
    """Which rows the loss reads and the draft computes (one host sync: how many)."""
    batch, seq = loss_mask.shape
    masks = step_masks(loss_mask, teacher.in_vocab, steps)
    in_loss = pairs_in_loss(masks, seq)
    # Queued before step_rows waits for its counts, which neither needs (step_rows says why).
    counted = torch.stack([counts.sum() for counts, _ in masks])
    in_loss_per_step = in_loss.sum((1, 2))
    plan = step_rows(in_loss)
    step, position = plan.read // (batch * seq), plan.read % (batch * seq)
    # The target position t+1+k of the same sample: t < T-1-k keeps it inside the sample.
    target = teacher.row.flatten()[position + 1 + step]
    return LossRows(
        hidden=plan.output.flatten()[plan.read],
        target=target,
        step=step,
        in_loss=in_loss_per_step,
        counted=counted,
        plan=plan,
    )


if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _soft_ce_kernel(  # type: ignore[no-untyped-def,unused-ignore]
        logits_ptr,
        logits_stride,
        teacher_ptr,
        teacher_stride,
        lse_ptr,
        argmax_ptr,
        target_ptr,
        scale_ptr,
        ce_ptr,
        hit_ptr,
        vocab,
        WRITE_GRAD: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """One row: cross-entropy, argmax hit and (in place of the logits) the gradient. Training reads the
        logits twice and the teacher's row once: the logsumexp first, then the gradient, p.x and the mass of
        p (its rounded probabilities' sum, which ce needs: the logits' large terms cancel in it). The
        gradient, softmax * mass - p, takes the mass as 1: it is within float32's rounding of it, far
        below the bf16 the gradient is stored in."""
        row = tl.program_id(0).to(tl.int64)
        target = tl.load(target_ptr + row)
        logits_ptr += row * logits_stride
        teacher_ptr += target * teacher_stride
        teacher_lse = tl.load(lse_ptr + target)
        top = float("-inf")
        total = 0.0
        mass = 0.0
        dot = 0.0
        best = float("-inf")
        best_at = 0
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < vocab
            x = tl.load(logits_ptr + cols, mask=inside, other=float("-inf")).to(tl.float32)
            block_top = tl.max(x, 0)
            new_top = tl.maximum(top, block_top)
            total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), 0)
            top = new_top
            block_at = start + tl.argmax(x, 0)
            better = block_top > best
            best_at = tl.where(better, block_at, best_at)
            best = tl.where(better, block_top, best)
            if not WRITE_GRAD:  # evaluation: one pass
                p = tl.exp(tl.load(teacher_ptr + cols, mask=inside, other=float("-inf")).to(tl.float32) - teacher_lse)
                mass += tl.sum(p, 0)
                dot += tl.sum(tl.where(inside, p * x, 0.0), 0)
        lse = top + tl.log(total)
        tl.store(hit_ptr + row, (best_at == tl.load(argmax_ptr + target)).to(tl.int8))
        if WRITE_GRAD:
            scale = tl.load(scale_ptr + row)
            for start in range(0, vocab, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                inside = cols < vocab
                x = tl.load(logits_ptr + cols, mask=inside, other=0.0).to(tl.float32)
                p = tl.exp(tl.load(teacher_ptr + cols, mask=inside, other=float("-inf")).to(tl.float32) - teacher_lse)
                mass += tl.sum(p, 0)
                dot += tl.sum(p * x, 0)
                grad = (tl.exp(x - lse) - p) * scale
                tl.store(logits_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=inside)
        tl.store(ce_ptr + row, lse * mass - dot)


def _soft_ce_triton(
    logits: torch.Tensor, teacher: TeacherRows, target: torch.Tensor, scale: torch.Tensor, grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, vocab = logits.shape
    ce = torch.empty(rows, dtype=torch.float32, device=logits.device)
    hit = torch.empty(rows, dtype=torch.int8, device=logits.device)
    if rows:
        _soft_ce_kernel[(rows,)](
            logits,
            logits.stride(0),
            teacher.logits,
            teacher.logits.stride(0),
            teacher.lse,
            teacher.argmax,
            target,
            scale,
            ce,
            hit,
            vocab,
            WRITE_GRAD=grad,
            BLOCK=SOFT_CE_BLOCK,
            num_warps=8,
        )
    return ce, hit.bool()


def _soft_ce_torch(
    logits: torch.Tensor, teacher: TeacherRows, target: torch.Tensor, scale: torch.Tensor, grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.float()
    p = torch.exp(teacher.logits.index_select(0, target).float() - teacher.lse[target, None])
    lse = torch.logsumexp(x, dim=-1)
    mass = p.sum(-1)
    ce = lse * mass - (p * x).sum(-1)
    hit = logits.argmax(-1) == teacher.argmax[target]
    if grad:
        logits.copy_((torch.exp(x - lse[:, None]) * mass[:, None] - p) * scale[:, None])
    return ce, hit


def _soft_ce(
    logits: torch.Tensor, teacher: TeacherRows, target: torch.Tensor, scale: torch.Tensor, grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of logits [C, V] against teacher rows `target` [C]: (cross-entropy [C] float32,
    argmax hit [C] bool); with `grad`, logits are overwritten with d(sum(scale * ce))/dlogits."""
    fn = _soft_ce_triton if triton is not None and logits.is_cuda else _soft_ce_torch
    return fn(logits, teacher, target, scale, grad)


class _HeadLoss(torch.autograd.Function):
    """sum over rows of scale * soft cross-entropy of lm_head(hidden[rows]), in row chunks; the
    gradients come out of the forward pass (the logits are never kept) and are scaled in backward."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        rows: torch.Tensor,
        scale: torch.Tensor,
        teacher: TeacherRows,
        target: torch.Tensor,
        unit_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        grad = any(ctx.needs_input_grad[:2])
        head = weight.to(hidden.dtype)
        count, width = len(rows), hidden.shape[1]
        ce = torch.empty(count, dtype=torch.float32, device=hidden.device)
        hit = torch.empty(count, dtype=torch.bool, device=hidden.device)
        # One row more, of zeros: backward lays the gradient out over hidden's rows by one gather (_spread).
        d_rows = hidden.new_empty(count + 1, width) if grad else None
        d_weight: torch.Tensor | None = None
        for start in range(0, count, HEAD_CHUNK_ROWS):
            end = min(start + HEAD_CHUNK_ROWS, count)
            x = hidden.index_select(0, rows[start:end])
            logits = x @ head.T
            ce[start:end], hit[start:end] = _soft_ce(logits, teacher, target[start:end], scale[start:end], grad)
            if d_rows is not None:
                torch.mm(logits, head, out=d_rows[start:end])
                part = (logits.T @ x).float()
                d_weight = part if d_weight is None else d_weight.add_(part)
        if d_rows is not None:
            d_rows[count].zero_()
        ctx.mark_non_differentiable(ce, hit)
        ctx.grads = (d_rows, d_weight)
        ctx.rows, ctx.hidden_shape, ctx.weight_like, ctx.unit_grad = rows, hidden.shape, weight, unit_grad
        return (ce * scale).sum(), ce, hit

    @staticmethod
    def backward(ctx: Any, d_loss: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
        d_rows, d_weight = ctx.grads
        wants_hidden, wants_weight = ctx.needs_input_grad[:2]
        d_hidden = _spread(d_rows, ctx.rows, ctx.hidden_shape[0]) if d_rows is not None and wants_hidden else None
        made = [g for g in (d_hidden, d_weight if wants_weight else None) if g is not None]
        if ctx.unit_grad:
            # The gradients made in forward are final; the caller's promise is checked on the device, no sync.
            torch._assert_async(d_loss == 1, "fused_ttt_loss(unit_grad=True): the loss's gradient is not 1")
        elif made:
            _scale(made, d_loss)
        d_weight_out = None
        if wants_weight:
            like = ctx.weight_like
            d_weight_out = torch.zeros_like(like) if d_weight is None else d_weight.to(like.dtype)
        return d_hidden, d_weight_out, None, None, None, None, None


def _scale(tensors: list[torch.Tensor], factor: torch.Tensor) -> None:
    """In place, by a 0-dim tensor: torch's multi-tensor kernel reads it once, where `x.mul_(factor)`
    broadcast it through an unvectorised kernel (1.4 ms for 1 GB of bf16 on an H200, three times the copy)."""
    torch._foreach_mul_(tensors, factor.to(tensors[0].dtype))


def _spread(d_rows: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    """[count, H]: row rows[i] is d_rows[i], every other row zero (d_rows' last row, of zeros): one gather,
    which reads and writes each row once, where zeros and a scatter wrote the rows in the loss twice."""
    where = torch.full((count,), len(rows), dtype=torch.int64, device=rows.device)
    where[rows] = torch.arange(len(rows), device=rows.device)
    return d_rows.index_select(0, where)


def fused_ttt_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    teacher: TeacherRows,
    rows: LossRows,
    denominators: torch.Tensor | None = None,
    decay: float = STEP_DECAY,
    unit_grad: bool = False,
) -> LossParts:
    """The TTT loss of the logits hidden @ weight.T, computed on the rows in the loss only.

    hidden [rows, H]: the lm_head's input at the rows the draft computed (rows.plan); weight [draft_vocab, H].
    `unit_grad`: the caller backpropagates the loss itself, with gradient 1 (`torch.autograd.backward(loss)`),
    so the gradients computed in forward are final: backward skips scaling them by it (a pass over the
    lm_head's input rows and weight: 1 ms of an 8 x 2048 step on an H200).
    """
    steps = len(rows.in_loss)
    counts = rows.in_loss.clamp_min(1).float() if denominators is None else denominators
    weights = decay ** torch.arange(steps, device=hidden.device, dtype=torch.float32) / counts
    loss, ce, hit = _HeadLoss.apply(  # type: ignore[no-untyped-call]
        hidden, weight, rows.hidden, weights[rows.step], teacher, rows.target, unit_grad
    )
    ce_sum = torch.zeros(steps, dtype=torch.float32, device=hidden.device).index_add_(0, rows.step, ce)
    correct = torch.zeros(steps, dtype=torch.int64, device=hidden.device).index_add_(0, rows.step, hit.long())
    return LossParts(
        loss=loss,
        ploss=ce_sum / counts,
        ce_sum=ce_sum,
        in_loss=rows.in_loss,
        correct=correct,
        counted=rows.counted,
    )


def simulated_accept_length(acc: Sequence[float]) -> float:
    """Sum over k of prod_{j<=k} acc_j: drafted tokens accepted per verification, without the bonus token."""
    total, running = 0.0, 1.0
    for a in acc:
        running *= a
        total += running
    return total
