"""Hidden-state data: the train/validation split, shard streaming and batches.

The held-out split is the last `val_samples` samples in manifest order, so it
is known from the manifest alone and never changes with the seed. Training
reads whole shards (the contract's `read_shard`), one ahead in a background
thread, in a seeded order: shards shuffled, then samples within each shard.
The order of an epoch is a function of (seed, epoch), so a resumed run skips
what it had consumed without loading it. Batches are right-padded.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from backends.eagle3_contract import ContractError, Manifest, read_shard

Sample = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Span:
    """Samples [start, end) of the manifest's shard number `shard`."""

    shard: int
    start: int
    end: int


@dataclass(frozen=True)
class Split:
    train: list[Span]
    val: list[Span]

    @property
    def train_samples(self) -> int:
        return sum(s.end - s.start for s in self.train)

    @property
    def val_samples(self) -> int:
        return sum(s.end - s.start for s in self.val)


def default_val_samples(total: int) -> int:
    """5% of the data, at least 1 and at most 1000 samples."""
    return max(1, min(1000, total // 20))


def split_samples(manifest: Manifest, val_samples: int) -> Split:
    total = sum(s.samples for s in manifest.shards)
    if not 0 <= val_samples < total:
        raise ContractError(f"cannot hold out {val_samples} of {total} samples for validation")
    train, val = [], []
    first_val = total - val_samples
    seen = 0
    for index, shard in enumerate(manifest.shards):
        cut = min(max(first_val - seen, 0), shard.samples)
        if cut > 0:
            train.append(Span(index, 0, cut))
        if cut < shard.samples:
            val.append(Span(index, cut, shard.samples))
        seen += shard.samples
    return Split(train=train, val=val)


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] int64
    loss_mask: torch.Tensor  # [B, T] bool
    attention_mask: torch.Tensor  # [B, T] bool: real (not padding) tokens
    hidden_state: torch.Tensor  # [B, T, H]
    aux_hidden_states: torch.Tensor  # [B, T, num_aux*H]

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())

    def prefix(self, length: int) -> Batch:
        """The batch's first `length` positions, contiguous as a collated batch is (a compiled step guards on
        its inputs' strides)."""
        return Batch(*(getattr(self, field.name)[:, :length].contiguous() for field in fields(self)))

    def to(self, device: torch.device, dtype: torch.dtype) -> Batch:
        """On `device`, with the hidden states in the compute dtype."""
        return Batch(
            input_ids=self.input_ids.to(device, non_blocking=True),
            loss_mask=self.loss_mask.to(device, non_blocking=True),
            attention_mask=self.attention_mask.to(device, non_blocking=True),
            hidden_state=self.hidden_state.to(device, dtype, non_blocking=True),
            aux_hidden_states=self.aux_hidden_states.to(device, dtype, non_blocking=True),
        )


def padded_length(lengths: Iterable[int], pad_multiple: int) -> int:
    """The length a batch of samples of `lengths` is right-padded to: the longest, rounded up to `pad_multiple`."""
    return -(-max(lengths) // pad_multiple) * pad_multiple


def collate(samples: list[Sample], pad_multiple: int = 1, max_length: int | None = None) -> Batch:
    """Right-pad to the longest sample (rounded up to `pad_multiple`), truncating at `max_length`."""
    lengths = [min(len(s["input_ids"]), max_length or len(s["input_ids"])) for s in samples]
    seq = padded_length(lengths, pad_multiple)

    def stacked(name: str) -> torch.Tensor:
        rows = [s[name][:n] for s, n in zip(samples, lengths, strict=True)]
        return torch.stack([F.pad(x, (0, 0) * (x.dim() - 1) + (0, seq - len(x))) for x in rows])

    return Batch(
        input_ids=stacked("input_ids").long(),
        loss_mask=stacked("loss_mask").bool(),
        attention_mask=torch.arange(seq).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1),
        hidden_state=stacked("hidden_state"),
        aux_hidden_states=stacked("aux_hidden_states"),
    )


class ShardReader:
    """Loads shards of one extraction folder and checks them against its manifest."""

    def __init__(self, directory: Path, manifest: Manifest) -> None:
        self.directory = directory
        self.manifest = manifest

    def load(self, index: int) -> list[Sample]:
        from safetensors import SafetensorError

        info = self.manifest.shards[index]
        path = self.directory / info.file
        try:
            samples = read_shard(path)
        except FileNotFoundError:
            raise ContractError(f"{path} is listed in manifest.json but does not exist") from None
        except (OSError, SafetensorError) as exc:
            raise ContractError(f"{path} is not a readable shard: {exc}") from None
        self._check(info.file, samples, info.samples)
        return samples

    def _check(self, name: str, samples: list[Sample], expected: int) -> None:
        m = self.manifest
        if len(samples) != expected:
            raise ContractError(f"{name} holds {len(samples)} samples but manifest.json says {expected}")
        if not samples:
            return
        first = samples[0]
        widths = (first["hidden_state"].shape[-1], first["aux_hidden_states"].shape[-1])
        if widths != (m.hidden_size, m.num_aux * m.hidden_size):
            raise ContractError(
                f"{name} has hidden_state width {widths[0]} and aux_hidden_states width {widths[1]}, but the "
                f"manifest says hidden size {m.hidden_size} with {m.num_aux} aux layers "
                f"(expected {m.hidden_size} and {m.num_aux * m.hidden_size})"
            )
        top = max(int(s["input_ids"].max()) for s in samples if len(s["input_ids"]))
        if top >= m.vocab_size:
            raise ContractError(f"{name} has token id {top}, outside the vocabulary of {m.vocab_size}")

    def samples(self, order: list[tuple[int, list[int]]]) -> Iterator[Sample]:
        """The samples of (shard, [indices in shard]) groups, in order, one shard read ahead."""
        if not order:
            return
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(self.load, order[0][0])
            for n, (_, indices) in enumerate(order):
                shard = pending.result()
                if n + 1 < len(order):
                    pending = pool.submit(self.load, order[n + 1][0])
                for i in indices:
                    yield shard[i]

    def token_streams(self, spans: list[Span]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(input_ids, loss_mask) of each sample, reading only those tensors (cheap: no hidden states)."""
        from safetensors import SafetensorError, safe_open

        for span in spans:
            path = self.directory / self.manifest.shards[span.shard].file
            try:
                with safe_open(str(path), framework="pt") as handle:
                    ids, mask, offsets = (handle.get_tensor(n) for n in ("input_ids", "loss_mask", "sample_offsets"))
            except FileNotFoundError:
                raise ContractError(f"{path} is listed in manifest.json but does not exist") from None
            except (OSError, SafetensorError) as exc:
                raise ContractError(f"{path} is not a readable shard: {exc}") from None
            bounds = offsets.tolist()
            for i in range(span.start, span.end):
                yield ids[bounds[i] : bounds[i + 1]], mask[bounds[i] : bounds[i + 1]]


def epoch_order(spans: list[Span], epoch: int, seed: int) -> list[tuple[int, list[int]]]:
    rng = random.Random(f"eagle3-train/{seed}/{epoch}")
    order = [(s.shard, list(range(s.start, s.end))) for s in spans]
    rng.shuffle(order)
    for _, indices in order:
        rng.shuffle(indices)
    return order


# How an epoch's samples become batches (--batch-order): online, `grouped` by length (the default) or `random`;
# offline always `random` (a shard is read whole). Every checkpoint records it: a resume skips what was
# consumed in that order.
GROUPED, RANDOM = "grouped", "random"
# Global batches whose samples are sorted together by length: enough that each batch finds neighbours of its
# length (little padding), few enough that a batch still mixes samples from across the corpus.
GROUP_BATCHES = 64


def length_grouped(indices: list[int], lengths: list[int], global_batch: int, seed: int, epoch: int) -> list[int]:
    """`indices` (shuffled) as whole global batches of similar lengths, in an order that is a function of
    (seed, epoch) and the global batch.

    Every GROUP_BATCHES batches' worth is sorted by length and cut into batches, and then all the epoch's
    batches are shuffled, so that the loss curve shows no length trend. The last partial batch is dropped
    before sorting, as the random order drops it: the same samples are trained on either way.
    """
    usable = indices[: len(indices) - len(indices) % global_batch]
    span = global_batch * GROUP_BATCHES
    batches = []
    for start in range(0, len(usable), span):
        chunk = sorted(usable[start : start + span], key=lengths.__getitem__)
        batches += [chunk[i : i + global_batch] for i in range(0, len(chunk), global_batch)]
    random.Random(f"eagle3-train/{seed}/{epoch}/batches").shuffle(batches)
    return [i for batch in batches for i in batch]


def skip_samples(order: list[tuple[int, list[int]]], skip: int) -> list[tuple[int, list[int]]]:
    """The order without its first `skip` samples; whole shards are dropped unread."""
    rest = []
    for shard, indices in order:
        if skip >= len(indices):
            skip -= len(indices)
            continue
        rest.append((shard, indices[skip:]))
        skip = 0
    return rest


@dataclass(frozen=True)
class Layout:
    """How samples become batches: per-process batch size, processes, padding."""

    batch_size: int
    world: int = 1
    rank: int = 0
    pad_multiple: int = 1
    max_length: int | None = None

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world


def train_batches(
    reader: ShardReader, split: Split, layout: Layout, epoch: int, seed: int, skip: int
) -> Iterator[Batch]:
    """This process's batches of one epoch after `skip` samples; the last partial global batch is dropped."""
    group: list[Sample] = []
    for sample in reader.samples(skip_samples(epoch_order(split.train, epoch, seed), skip)):
        group.append(sample)
        if len(group) == layout.global_batch:
            mine = group[layout.rank * layout.batch_size : (layout.rank + 1) * layout.batch_size]
            yield collate(mine, layout.pad_multiple, layout.max_length)
            group = []


def val_batches(reader: ShardReader, split: Split, layout: Layout) -> Iterator[Batch]:
    """This process's share of the held-out samples (every world-th one), all of them, in order.

    Every process gets the same number of batches (FSDP needs each forward on
    every rank): a process one sample short adds a copy with no loss tokens.
    """
    order = [(s.shard, list(range(s.start, s.end))) for s in split.val]
    share = -(-split.val_samples // layout.world)
    group: list[Sample] = []
    taken = 0
    for n, sample in enumerate(reader.samples(order)):
        if n % layout.world == layout.rank:
            group.append(sample)
            taken += 1
        elif taken < share and n == split.val_samples - 1:
            group.append({**sample, "loss_mask": torch.zeros_like(sample["loss_mask"])})
            taken += 1
        if len(group) == layout.batch_size:
            yield collate(group, layout.pad_multiple, layout.max_length)
            group = []
    if group:
        yield collate(group, layout.pad_multiple, layout.max_length)
