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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from backends.train.target import TeacherTargets

STEP_DECAY = 0.8


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


def loss_counts(loss_mask: torch.Tensor, in_vocab: torch.Tensor, steps: int) -> torch.Tensor:
    """[K] positions in the loss of each step."""
    return torch.stack([in_loss.sum() for _, in_loss in step_masks(loss_mask, in_vocab, steps)])


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


def simulated_accept_length(acc: Sequence[float]) -> float:
    """Sum over k of prod_{j<=k} acc_j: drafted tokens accepted per verification, without the bonus token."""
    total, running = 0.0, 1.0
    for a in acc:
        running *= a
        total += running
    return total
