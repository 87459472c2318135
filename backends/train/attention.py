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


# Flex attention's tile (create_block_mask's default). On the GPU the trainer pads lengths to a multiple of it
# (loop.pad_multiple), so each TTT step's keys start on a tile: the block tables below follow from the length alone.
FLEX_BLOCK = 128


def _tile_mask(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """The TTT mask inside the tiles `_ttt_tables` lists as partial, the only ones flex's kernels evaluate it
    on: the causal diagonal tile of step 0's keys (kv <= q) and, at steps >= 1, the tile holding position q's
    own key (the same offset in the tile). It reads no length, so a graph that calls it is not tied to one,
    and costs a bitwise and where the exact mask divides by the length. Eager flex evaluates the mask
    everywhere, so only compiled flex on the GPU gets it (ttt_block_mask)."""
    return (kv <= q) | (kv % FLEX_BLOCK == q % FLEX_BLOCK)


def _ttt_tables(seq_len: int, step: int, device: str | torch.device) -> BlockMask:
    """The block mask of step `step` for a length that is a multiple of FLEX_BLOCK, written down from the
    pattern: n tiles a step, query tile i reads step 0's tiles 0..i-1 whole and, in part, tile i of every
    step. Only arithmetic on the length: under torch.compile a symbolic length stays symbolic."""
    n = seq_len // FLEX_BLOCK
    kv_tiles = (step + 1) * n

    def tiles(count: int) -> torch.Tensor:
        return torch.arange(count, device=device, dtype=torch.int32)

    rows, cols, q_cols = tiles(n)[:, None], tiles(kv_tiles)[None, :], tiles(n)[None, :]
    kv_rows = tiles(kv_tiles)[:, None]
    # Past each row's count the entries are never read; they are kept in range all the same.
    partial = (rows + n * cols) % kv_tiles  # tile i of each step, step 0's first
    full = cols.expand(n, kv_tiles)  # step 0's tiles 0..i-1
    own = kv_rows % n  # a key tile's one partial query tile: its own offset
    after = (own + 1 + q_cols) % n  # the later query tiles, which read step 0's key tile whole
    in_step0 = kv_rows.squeeze(1) < n

    def table(counts: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return counts.to(torch.int32)[None, None].contiguous(), indices[None, None].contiguous()

    kv_count, kv_index = table(torch.full((n,), step + 1, device=device), partial)
    full_count, full_index = table(rows.squeeze(1), full)
    q_count, q_index = table(torch.ones(kv_tiles, device=device), own.expand(kv_tiles, n))
    full_q_count, full_q_index = table(torch.where(in_step0, n - 1 - own.squeeze(1), 0), after)
    return BlockMask(
        seq_lengths=(seq_len, kv_tiles * FLEX_BLOCK),
        kv_num_blocks=kv_count,
        kv_indices=kv_index,
        full_kv_num_blocks=full_count,
        full_kv_indices=full_index,
        q_num_blocks=q_count,
        q_indices=q_index,
        full_q_num_blocks=full_q_count,
        full_q_indices=full_q_index,
        BLOCK_SIZE=(FLEX_BLOCK, FLEX_BLOCK),
        mask_mod=_tile_mask,
    )


def ttt_block_mask(seq_len: int, step: int, device: str | torch.device) -> BlockMask:
    """The mask of step `step` over the keys of steps 0..step concatenated (length (step+1)*seq_len). Under
    torch.compile `seq_len` may be symbolic: on the GPU, one graph serves every multiple of FLEX_BLOCK."""
    if seq_len % FLEX_BLOCK or torch.device(device).type != "cuda":
        return _exact_block_mask(seq_len, step, str(device))
    if torch.compiler.is_compiling():
        return _ttt_tables(seq_len, step, device)
    return _cached_tables(seq_len, step, str(device))


@functools.cache  # one per (padded length, step): bounded by the run's lengths
def _cached_tables(seq_len: int, step: int, device: str) -> BlockMask:
    return _ttt_tables(seq_len, step, device)


@functools.cache
def _exact_block_mask(seq_len: int, step: int, device: str) -> BlockMask:
    """Any length (the tests' short ones): the mask evaluated everywhere, its tiles found from that."""

    def mask(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        block, pos = kv // seq_len, kv % seq_len
        return ((block == 0) & (pos <= q)) | ((block > 0) & (pos == q))

    return create_block_mask(mask, None, None, seq_len, (step + 1) * seq_len, device=device)


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    # Eager flex_attention materialises the scores; compiled, it is one fused kernel. Dynamic: the tables'
    # mask reads no length, so one kernel serves every length and step (evaluation, and runs without --compile).
    return cast(Callable[..., torch.Tensor], torch.compile(flex_attention, dynamic=True))


def flex_ttt_attention(
    q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], block_mask: BlockMask
) -> torch.Tensor:
    k = torch.cat(keys, dim=2) if len(keys) > 1 else keys[0]
    v = torch.cat(values, dim=2) if len(values) > 1 else values[0]
    eager = torch.compiler.is_compiling() or not q.is_cuda
    fn = cast(Callable[..., torch.Tensor], flex_attention) if eager else _compiled_flex()
    return fn(q, k, v, block_mask=block_mask, enable_gqa=True)
