"""Attention of the training-time test (TTT), as SpecForge computes it.

At TTT step k the query at position t attends to the step-0 keys of positions
0..t (causal: the prefix whose target features the draft saw) and to its own
position's keys of steps 1..k (the draft's chain of own predictions for this
position), one softmax over both. That is the picture at serving time: the
draft's KV cache over the prefix plus the chain it drafted.

Two implementations of the same function: `eager` (SpecForge's formula; any
device, used on CPU and as the reference) and `flex` (the keys of all steps
concatenated, with a block mask; fast on GPU through torch.compile; PyTorch has
no flex backward on CPU). Padding is on the right, so under the causal mask a
real query never sees a padded key: no key-padding mask is needed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention


def _expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def eager_ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """q [B, heads, T, d]; keys/values: one [B, kv_heads, T, d] per step so far (the current one last)."""
    seq = q.shape[2]
    groups = q.shape[1] // keys[0].shape[1]
    scale = q.shape[-1] ** -0.5
    scores = (q @ _expand_kv(keys[0], groups).transpose(-1, -2)) * scale
    causal = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    diagonal = [(q * _expand_kv(k, groups)).sum(-1, keepdim=True) * scale for k in keys[1:]]
    probs = torch.softmax(torch.cat([scores, *diagonal], dim=-1).float(), dim=-1).to(q.dtype)
    out = probs[..., :seq] @ _expand_kv(values[0], groups)
    for j, v in enumerate(values[1:]):
        out = out + probs[..., seq + j : seq + j + 1] * _expand_kv(v, groups)
    return out


@functools.cache  # one per (padded length, step): bounded by the run's lengths
def ttt_block_mask(seq_len: int, step: int, device: str) -> BlockMask:
    """The mask of step `step` over the keys of steps 0..step concatenated (length (step+1)*seq_len)."""

    def mask(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        block, pos = kv // seq_len, kv % seq_len
        return ((block == 0) & (pos <= q)) | ((block > 0) & (pos == q))

    return create_block_mask(mask, None, None, seq_len, (step + 1) * seq_len, device=device)


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    # Eager flex_attention materialises the scores; compiled, it is one fused kernel.
    return cast(Callable[..., torch.Tensor], torch.compile(flex_attention, dynamic=False))


def flex_ttt_attention(
    q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], block_mask: BlockMask
) -> torch.Tensor:
    k = torch.cat(keys, dim=2) if len(keys) > 1 else keys[0]
    v = torch.cat(values, dim=2) if len(values) > 1 else values[0]
    eager = torch.compiler.is_compiling() or not q.is_cuda
    fn = cast(Callable[..., torch.Tensor], flex_attention) if eager else _compiled_flex()
    return fn(q, k, v, block_mask=block_mask, enable_gqa=True)
