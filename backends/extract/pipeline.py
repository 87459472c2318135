"""The shard loop: chats through the target in batches of similar length, shards saved in the background.

`run_pipeline` extracts shards on the target in the calling thread while
`writers` threads save the previous ones (concatenation, serialisation, disk,
hash: host work that is slower than a small target's forward pass, measured on
the H200), and records each saved shard in order from the calling thread. At
most `writers` shards wait to be saved, which bounds host memory. The benchmark
times this same loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from backends.extract import capture
from backends.extract.template import TokenizedChat

if TYPE_CHECKING:
    import torch

Row = dict[str, "torch.Tensor"]
Saved = TypeVar("Saved")


@dataclass
class ShardJob:
    """One shard to extract: the chats [first_chat, end_chat) less those dropped, by reason."""

    index: int
    first_chat: int
    end_chat: int
    samples: list[TokenizedChat]
    dropped: dict[str, int]


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped longest first so that each padded batch holds at most `batch_tokens` (or one sample)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for index in order:
        # Longest first: a batch's width is the length of its first sample.
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


def extract_shard(capturer: capture.Capturer, samples: list[TokenizedChat], batch_tokens: int) -> list[Row]:
    """The shard's sample dicts (the contract's write_shard input), in the samples' order."""
    import torch

    rows: list[Row | None] = [None] * len(samples)
    for batch in length_batches([len(s.input_ids) for s in samples], batch_tokens):
        states = capturer.capture([samples[i].input_ids for i in batch])
        for index, state in zip(batch, states, strict=True):
            rows[index] = {
                "input_ids": torch.tensor(samples[index].input_ids, dtype=torch.int64),
                "loss_mask": torch.tensor(samples[index].loss_mask, dtype=torch.int8),
                "hidden_state": state.hidden_state,
                "aux_hidden_states": state.aux_hidden_states,
            }
    return [row for row in rows if row is not None]


def run_pipeline(
    capturer: capture.Capturer,
    jobs: Iterable[ShardJob],
    batch_tokens: int,
    save: Callable[[ShardJob, list[Row]], Saved],
    record: Callable[[Saved], None],
    writers: int = 1,
) -> None:
    """Extract every job's shard, `save` it in a writer thread, and `record` what `save` returned, in job order.

    An error stops the loop and is raised, after the shards already being saved are recorded (so that a
    restart skips them).
    """
    pending: deque[Future[Saved]] = deque()
    with ThreadPoolExecutor(max_workers=writers, thread_name_prefix="shard-writer") as pool:
        try:
            for job in jobs:
                rows = extract_shard(capturer, job.samples, batch_tokens)
                if len(pending) == writers:
                    record(pending.popleft().result())
                pending.append(pool.submit(save, job, rows))
        finally:
            while pending:
                record(pending.popleft().result())
