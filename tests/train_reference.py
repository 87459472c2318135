"""The definitions the trainer's fast paths are held to: the teacher's targets at every position,
over the whole target vocabulary, and the TTT loss from every step's full logits (as the trainer
computed them before it read only the rows in the loss)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from backends.train.loss import STEP_DECAY, LossParts, step_masks
from backends.train.target import Teacher


@dataclass
class TeacherTargets:
    """Per position j of a batch: the target's distribution over the draft vocabulary
    for the token after x_j, and whether the target's own argmax is in that vocabulary."""

    probs: torch.Tensor  # [B, T, draft_vocab] float32
    in_vocab: torch.Tensor  # [B, T] bool


@torch.no_grad()
def teacher_targets(teacher: Teacher, hidden_state: torch.Tensor) -> TeacherTargets:
    """Every position of hidden_state [B, T, H]."""
    batch, seq, width = hidden_state.shape
    logits, _, _, in_vocab = teacher.draft_logits(hidden_state.reshape(-1, width))
    probs = torch.softmax(logits.float(), dim=-1)
    return TeacherTargets(probs=probs.view(batch, seq, -1), in_vocab=in_vocab.view(batch, seq))


def ttt_loss(
    logits: Sequence[torch.Tensor],
    targets: TeacherTargets,
    loss_mask: torch.Tensor,
    denominators: torch.Tensor | None = None,
    decay: float = STEP_DECAY,
) -> LossParts:
    """logits: one [B, T, draft_vocab] per step; loss_mask [B, T] bool (zeros on padding).

    `denominators` [K] replaces this batch's own position counts in the means: with
    several processes, the global count divided by the number of processes, so that
    DDP's gradient average weighs every position of the global batch alike.
    """
    ce_sums, in_loss, correct, counted, plosses = [], [], [], [], []
    masks = step_masks(loss_mask, targets.in_vocab, len(logits))
    for k, (step_logits, (counts, in_)) in enumerate(zip(logits, masks, strict=True)):
        n = counts.shape[1]
        probs = targets.probs[:, 1 + k : 1 + k + n]
        logp = torch.log_softmax(step_logits[:, :n].float(), dim=-1)
        ce_sum = (-(probs * logp).sum(-1) * in_).sum()
        n_in = in_.sum()
        plosses.append(ce_sum / (n_in.clamp_min(1) if denominators is None else denominators[k]))
        ce_sums.append(ce_sum.detach())
        in_loss.append(n_in)
        with torch.no_grad():
            hits = (step_logits[:, :n].argmax(-1) == probs.argmax(-1)) & in_
            correct.append(hits.sum())
            counted.append(counts.sum())
    ploss = torch.stack(plosses)
    weights = decay ** torch.arange(len(logits), device=ploss.device, dtype=ploss.dtype)
    return LossParts(
        loss=(weights * ploss).sum(),
        ploss=ploss.detach(),
        ce_sum=torch.stack(ce_sums),
        in_loss=torch.stack(in_loss),
        correct=torch.stack(correct),
        counted=torch.stack(counted),
    )
