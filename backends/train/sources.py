"""Where a training's batches come from: an extraction's shards (offline), or the target itself (online,
`backends.train.online`). The loop sees only this interface."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from backends.ahead import background
from backends.eagle3_contract import Manifest
from backends.train.data import Batch, Layout, ShardReader, Split, train_batches, val_batches


class Source(Protocol):
    """Samples split into training and held-out ones, and the batches of each."""

    manifest: Manifest

    @property
    def train_samples(self) -> int: ...

    @property
    def val_samples(self) -> int: ...

    def describe(self) -> str:
        """What the batches come from, for the run's first line."""
        ...

    def token_streams(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(input_ids, loss_mask) of every training sample: the draft vocabulary is chosen from them."""
        ...

    def train_batches(self, layout: Layout, epoch: int, seed: int, skip: int) -> Generator[Batch, None, None]:
        """This process's batches of one epoch after `skip` samples (a function of seed and epoch)."""
        ...

    def val_batches(self, layout: Layout) -> Generator[Batch, None, None]:
        """This process's share of the held-out samples; every process gets as many batches."""
        ...


@dataclass
class ShardSource:
    """An extraction folder: shards read one ahead in a background thread."""

    manifest: Manifest
    reader: ShardReader
    split: Split

    @property
    def train_samples(self) -> int:
        return self.split.train_samples

    @property
    def val_samples(self) -> int:
        return self.split.val_samples

    def describe(self) -> str:
        return f"{len(self.manifest.shards)} shards"

    def token_streams(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.reader.token_streams(self.split.train)

    def train_batches(self, layout: Layout, epoch: int, seed: int, skip: int) -> Generator[Batch, None, None]:
        return background(train_batches(self.reader, self.split, layout, epoch, seed, skip))

    def val_batches(self, layout: Layout) -> Generator[Batch, None, None]:
        return background(val_batches(self.reader, self.split, layout))
