"""The draft vocabulary: d2t and t2d from the token frequencies of the training data.

The draft predicts only the `draft_vocab_size` most frequent target tokens
among those the loss counts (loss_mask == 1). Ids are kept sorted. When the data
has fewer distinct tokens, the rest is filled with the smallest unused ids, so
that d2t always has draft_vocab_size entries (SGLang builds its hot-token table
from d2t's length and the lm_head's rows).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass
class VocabMap:
    d2t: torch.Tensor  # [draft_vocab] int64 offsets: target id = draft id + d2t[draft id]
    t2d: torch.Tensor  # [vocab] bool: target id is in the draft vocabulary
    distinct: int | None  # distinct loss tokens seen in the data (None: read from a checkpoint)

    @property
    def draft_ids(self) -> torch.Tensor:
        """The target id of each draft id."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t


def token_frequencies(samples: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int) -> torch.Tensor:
    """Counts [vocab] of the tokens where loss_mask == 1, over (input_ids, loss_mask) pairs."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for ids, mask in samples:
        counts += torch.bincount(ids[mask.bool()].long(), minlength=vocab_size)[:vocab_size]
    return counts


def build_vocab_map(counts: torch.Tensor, draft_vocab_size: int) -> VocabMap:
    vocab = len(counts)
    if not 0 < draft_vocab_size <= vocab:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} must be in 1..{vocab}")
    # Stable sort: among equal counts the smaller id wins, so the map is deterministic.
    order = torch.sort(counts, descending=True, stable=True).indices
    distinct = int((counts > 0).sum())
    chosen = order[: min(distinct, draft_vocab_size)]
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    if len(chosen) < draft_vocab_size:
        unused = (~t2d).nonzero().squeeze(1)[: draft_vocab_size - len(chosen)]
        t2d[unused] = True
    ids = t2d.nonzero().squeeze(1)
    return VocabMap(d2t=ids - torch.arange(draft_vocab_size), t2d=t2d, distinct=distinct)
