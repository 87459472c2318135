"""Which rows each TTT step computes: those that reach the loss, and step 0's keys.

A row is position t of sample b, numbered b*T + t. At a TTT step k >= 1 the
row of position t serves its own chain only: its output feeds step k+1 at
position t, and its key and value are read only by position t's queries at
later steps (attention.py). So it is needed exactly when the loss reads
position t at step k or at a later one. Step 0's keys and values are every
later query's causal prefix: step 0 projects them for each position up to the
last needed one of its sample, and runs the rest of the layer (query,
attention, MLP) on the needed rows only.

Prompt tokens and right padding, outside the loss, then cost step 0's
projection at most; SpecForge computes every row at every step. What the loss
reads is unchanged, so the numbers are the same as computing every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepRows:
    """The rows of a batch [B, T] that each step computes, and where the draft's output keeps them:
    the output is every step's computed rows, step after step, each step's in row order."""

    batch: int
    seq: int
    keys: torch.Tensor  # step 0's rows that project keys and values (each sample's prefix up to its last needed row)
    rows: list[torch.Tensor]  # per step, the rows run through the whole layer; step k+1's are among step k's
    inputs: list[torch.Tensor]  # where rows[0] sit in keys, and rows[k] in rows[k-1] (k >= 1)
    # Per step, for the rows it projects (keys at step 0, rows[k] after): the RoPE position t+k, and the
    # row of the token x_{t+1+k} in the steps' extended token window [B, T-1+steps] (model.extend_tokens).
    positions: list[torch.Tensor]
    tokens: list[torch.Tensor]
    output: torch.Tensor  # [K, B*T] int64: a (step, row)'s index in the output, -1 where not computed
    read: torch.Tensor  # the (step k, row) pairs the loss reads, as k*B*T + row, in that order
    # [1+K, B, T] int32: each position's place among step 0's keys (where[0]) and among rows[k] (where[1+k]),
    # -1 where it has none: how the TTT kernel finds a position's packed row (ttt_kernel.ttt_attention).
    where: torch.Tensor

    @property
    def steps(self) -> int:
        return len(self.rows)

    def track_sizes(self) -> None:
        """Tell torch.compile that the row counts change from batch to batch (one graph for all), and the
        length: `output` is [K, B*T] (the compiled step reads neither it nor `read`, but copies the plan)."""
        for index in (self.keys, *self.rows, *self.inputs, *self.positions, *self.tokens, self.read):
            torch._dynamo.maybe_mark_dynamic(index, 0)
        torch._dynamo.maybe_mark_dynamic(self.output, 1)
        torch._dynamo.maybe_mark_dynamic(self.where, 2)


def step_rows(in_loss: torch.Tensor) -> StepRows:
    """The plan for in_loss [K, B, T] bool, the (step, position) pairs the loss reads (K >= 1).
    One host sync: how many rows there are."""
    steps, batch, seq = in_loss.shape
    size = batch * seq
    read = in_loss.flatten(1)
    # Needed at step k: read by the loss at step k or later (the chain goes on).
    needed = read.flip(0).cumsum(0).flip(0) > 0
    # Step 0's keys: every position up to the last needed one of its sample (needed[0]: at any step).
    keys = needed[0].view(batch, seq).flip(1).cumsum(1).flip(1) > 0
    # One row each: step 0's keys, every step's needed rows, every step's rows in the loss.
    masks = torch.cat([keys.view(1, size), needed, read])
    counted = masks.sum(1)
    projected = 1 + steps  # keys and needed: the rows each step projects, and computes
    # What needs no count is queued before the host waits for the counts: after the wait the device idles
    # until the host has queued the rest and the step's first layer (4 ms of an 8 x 2048 step on an H200,
    # profiled).
    rank = masks[:projected].long().cumsum(1) - 1  # a row's place among its mask's rows
    offsets = (counted[1:projected].cumsum(0) - counted[1:projected])[:, None]
    output = torch.where(needed, rank[1:] + offsets, -1)
    where = torch.where(masks[:projected], rank, -1).int().view(projected, batch, seq)
    counts = counted.tolist()
    found = torch.nonzero_static(masks.flatten(), size=sum(counts)).squeeze(1)
    sizes = counts[:projected]
    computed = found[: sum(sizes)]
    mask, row = computed // size, computed % size
    step = (mask - 1).clamp_min(0)
    position = row % seq + step
    token = row // seq * (seq - 1 + steps) + position
    # rows[k] sit in the mask before theirs: keys for rows[0], rows[k-1] for rows[k].
    inside = rank.flatten()[computed[sizes[0] :] - size]
    rows = list(torch.split(row, sizes))
    # The rows each step projects: step 0 its keys (mask 0), step k its rows[k] (mask 1+k); step 0's
    # needed rows (mask 1) are among its keys.
    positions, tokens = (list(torch.split(t, sizes)) for t in (position, token))
    return StepRows(
        batch=batch,
        seq=seq,
        keys=rows[0],
        rows=rows[1:],
        inputs=list(torch.split(inside, sizes[1:])),
        positions=positions[:1] + positions[2:],
        tokens=tokens[:1] + tokens[2:],
        output=output,
        read=found[sum(sizes) :] - projected * size,
        where=where,
    )
