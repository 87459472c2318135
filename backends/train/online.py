"""Online training: the target runs in the training job and hands the draft its hidden states batch by batch.

No hidden state touches the disk: for a 70B target the aux and final states are about 64 KB a token
(terabytes for a corpus) where the chats are megabytes. The chats are tokenized at the start with the target's
chat template exactly as the extraction does (same loss mask, same truncation), and kept in --out so that a
resume reads them instead (`backends.train.chats`). The last `val` samples are held out; an epoch's order is
a seeded shuffle, cut into batches of similar lengths (`--batch-order grouped`, the default: the target's
forward pads each batch to its longest chat), so a resumed run skips what it consumed from (epoch, samples in
epoch) alone. The manifest the checkpoints carry records the data's hash and the order, and a resume on other
data, or in another order, is refused.

Placement in one process: `replicate` (the target on the training GPU beside the draft), or `spread` (its
layers over every visible GPU, transformers' device_map "auto", as `extract --device auto` does, for a target
larger than one GPU; the draft trains on the first). `auto` spreads when more than one GPU is visible and the
target's weights exceed a third of one GPU's memory.

Placement under torchrun (one process per GPU; the draft is data-parallel as offline, DDP or FSDP):
- `replicate`: every process holds the whole target and runs it on its own rows: no traffic, but the target
  must fit on one GPU beside the draft;
- `tp`: the target is tensor-parallel over all the processes (transformers' tp_plan "auto": each holds 1/N
  of its weights). Every process runs it on the whole global batch, which each one knows (the order is a
  function of the seed), and keeps its own rows: the same FLOPs per GPU as `replicate`, plus the
  all-reduces, for 1/N of the memory.
`auto` takes `tp` when the target's weights exceed a third of one GPU's memory.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import torch

from backends.eagle3_contract import MANIFEST, ContractError, Manifest
from backends.extract import capture
from backends.extract.cli import UsageError, choose_layers
from backends.train.chats import DEFAULT_MAX_LENGTH, Chats, Samples
from backends.train.data import GROUPED, RANDOM, Batch, Layout, Span, epoch_order, length_grouped, padded_length
from backends.train.distributed import Dist
from backends.train.errors import TrainError, TrainingFailed
from backends.train.options import TrainOptions
from backends.train.target import TargetConfig

# `auto` shards the target once its weights pass this share of one GPU's memory.
REPLICATE_SHARE = 1 / 3


def online_manifest(options: TrainOptions, target: TargetConfig, chats: Chats, device_type: str) -> Manifest:
    """The contract an extraction would have written for these chats: the checkpoints carry it, and doctor
    checks an online-trained draft against it as against an extraction's."""
    try:
        aux_ids = choose_layers(options.layers, target.num_layers)
    except UsageError as exc:
        raise TrainError(str(exc)) from None
    manifest = Manifest(
        target_path=str(options.target.resolve()),
        architecture=target.architecture,
        num_layers=target.num_layers,
        hidden_size=target.hidden_size,
        vocab_size=target.vocab_size,
        dtype=capture.resolve_dtype("auto", device_type),
        aux_layer_ids=aux_ids,
        tokenizer=str(options.target.resolve()),
        chat_template=chats.tokenizer.template,
        max_length=options.max_length or DEFAULT_MAX_LENGTH,
        samples=len(chats.samples),
        tokens=len(chats.samples.ids),
        backend="hf",
        backend_version=importlib.metadata.version("transformers"),
        data=chats.name,
        data_sha256=chats.sha256,
    )
    try:
        manifest.validate()
    except ContractError as exc:
        raise TrainError(str(exc)) from None
    return manifest


def check_same_data(checkpoint: Path, manifest: Manifest) -> None:
    """A resume continues the data position of `checkpoint`'s run: refuse data or layers other than its own."""
    try:
        recorded = json.loads((checkpoint / MANIFEST).read_bytes())
    except FileNotFoundError:
        return  # a checkpoint from before checkpoints carried their manifest
    except (OSError, ValueError) as exc:
        raise TrainError(f"{checkpoint / MANIFEST} cannot be read: {exc}") from None
    changes = [
        f"{name} {recorded.get(name)!r} -> {now!r}"
        for name, now in (
            ("data_sha256", manifest.data_sha256),
            ("content_hash", manifest.content_hash),
            ("aux_layer_ids", manifest.aux_layer_ids),
            ("max_length", manifest.max_length),
        )
        if recorded.get(name, now) != now
    ]
    if changes:
        raise TrainError(
            f"{checkpoint} was trained on other data ({', '.join(changes)}): resume with the same --data and "
            "settings, or choose another --out"
        )


def choose_placement(requested: str, ctx: Dist, target: Path) -> str:
    """`requested`, checked against the process count, or what `auto` means here."""
    if requested == "tp" and ctx.world == 1:
        raise TrainError("--target-placement tp needs torchrun (one process per GPU); one process can spread")
    if requested == "spread" and ctx.world > 1:
        raise TrainError("--target-placement spread is for one process; under torchrun use tp or replicate")
    if requested != "auto":
        return requested
    if ctx.device.type != "cuda":
        return "replicate"
    weights = sum(f.stat().st_size for f in target.glob("*.safetensors"))
    if weights <= torch.cuda.get_device_properties(ctx.device).total_memory * REPLICATE_SHARE:
        return "replicate"
    if ctx.world > 1:
        return "tp"
    return "spread" if torch.cuda.device_count() > 1 else "replicate"


def load_target_model(path: Path, ctx: Dist, placement: str, dtype: str) -> Any:
    """The target in eval mode: whole on this process's device, or tensor-parallel over every process."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # The run's log is read by people and the console, not redrawn in a terminal.
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        if placement == "tp":
            try:
                from transformers.distributed.configuration_utils import DistributedConfig

                parallel: dict[str, Any] = {"distributed_config": DistributedConfig(tp_plan="auto")}
            except (ImportError, TypeError):  # transformers before DistributedConfig took the plan
                parallel = {"tp_plan": "auto"}
            model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), **parallel)
        else:
            model = capture.load_target(path, "auto" if placement == "spread" else str(ctx.device), dtype)
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        advice = "; try --target-placement replicate" if placement == "tp" else ""
        raise TrainingFailed(f"cannot load the target from {path} ({placement}): {exc}{advice}") from None
    model.requires_grad_(False)
    return model.eval()


class OnlineSource:
    """Batches whose hidden states the target computes as they are needed, on the training device."""

    def __init__(self, manifest: Manifest, samples: Samples, val_samples: int, pad_id: int, order: str) -> None:
        if not 0 <= val_samples < len(samples):
            raise TrainError(f"cannot hold out {val_samples} of {len(samples)} samples for validation")
        self.manifest = manifest
        self.samples = samples
        self.first_val = len(samples) - val_samples
        self.pad_id = pad_id
        self.order = order
        self.model: Any = None
        self.placement = "replicate"
        self.ctx: Dist | None = None

    @property
    def train_samples(self) -> int:
        return self.first_val

    @property
    def val_samples(self) -> int:
        return len(self.samples) - self.first_val

    def attach(self, model: Any, placement: str, ctx: Dist) -> None:
        self.model, self.placement, self.ctx = model, placement, ctx

    def describe(self) -> str:
        return f"online from {self.manifest.data}, target {self.placement}"

    def token_streams(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(self.first_val):
            yield self.samples.get(i)

    def epoch_indices(self, global_batch: int, epoch: int, seed: int, order: str | None = None) -> list[int]:
        """The training samples of one epoch in the order (this source's unless given) they are batched,
        `global_batch` at a time."""
        indices = [i for _, group in epoch_order([Span(0, 0, self.first_val)], epoch, seed) for i in group]
        if (order or self.order) == GROUPED:
            return length_grouped(indices, self.samples.lengths, global_batch, seed, epoch)
        return indices

    def padding_share(self, layout: Layout, seed: int, order: str | None = None) -> float:
        """The share of the tokens the target runs on that are padding, over the first epoch in `order`."""
        lengths = self.samples.lengths
        indices = self.epoch_indices(layout.global_batch, 0, seed, order)
        indices = indices[: len(indices) - len(indices) % layout.global_batch]
        rows = layout.global_batch if self.placement == "tp" else layout.batch_size
        computed = sum(
            rows * padded_length((lengths[i] for i in indices[start : start + rows]), layout.pad_multiple)
            for start in range(0, len(indices), rows)
        )
        return 1 - sum(lengths[i] for i in indices) / computed if computed else 0.0

    def describe_order(self, layout: Layout, seed: int) -> str:
        """How the batches are drawn and what the target's forward spends on padding, for the run's log."""
        share = f"the target's forward runs on {self.padding_share(layout, seed):.0%} padding"
        if self.order != GROUPED:
            return f"batches in random order: {share}"
        return f"batches grouped by length: {share} (in random order: {self.padding_share(layout, seed, RANDOM):.0%})"

    def train_batches(self, layout: Layout, epoch: int, seed: int, skip: int) -> Generator[Batch, None, None]:
        indices = self.epoch_indices(layout.global_batch, epoch, seed)[skip:]
        for start in range(0, len(indices) - layout.global_batch + 1, layout.global_batch):
            group = indices[start : start + layout.global_batch]
            ranks = [
                [(i, True) for i in group[r * layout.batch_size : (r + 1) * layout.batch_size]]
                for r in range(layout.world)
            ]
            yield self._batch(ranks, layout)

    def val_batches(self, layout: Layout) -> Generator[Batch, None, None]:
        """Every world-th held-out sample per process (as offline), shortest first: the metrics are sums over
        the samples, so their order changes only how much the target pads. A process one short adds a copy that
        counts no loss tokens, so that all run the target (and, under FSDP, the draft) as often."""
        held = sorted(range(self.first_val, len(self.samples)), key=self.samples.lengths.__getitem__)
        share = -(-len(held) // layout.world)
        ranks = []
        for r in range(layout.world):
            mine = [(i, True) for i in held[r :: layout.world]]
            ranks.append(mine + [(held[-1], False)] * (share - len(mine)))
        for start in range(0, share, layout.batch_size):
            yield self._batch([rows[start : start + layout.batch_size] for rows in ranks], layout)

    def _batch(self, ranks: list[list[tuple[int, bool]]], layout: Layout) -> Batch:
        """This process's rows of one step; under `tp` the target runs on every process's rows."""
        mine = ranks[layout.rank]
        rows = [row for r in ranks for row in r] if self.placement == "tp" else mine
        first = sum(len(r) for r in ranks[: layout.rank]) if self.placement == "tp" else 0
        pairs = [self.samples.get(i) for i, _ in rows]
        lengths = [len(ids) for ids, _ in pairs]
        width = padded_length(lengths, layout.pad_multiple)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        loss_mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for n, ((ids, mask), (_, counts)) in enumerate(zip(pairs, rows, strict=True)):
            input_ids[n, : len(ids)] = ids
            loss_mask[n, : len(ids)] = mask.bool() & counts
        attention = torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
        hidden, aux = capture.forward_states(self.model, input_ids, attention.long(), self.manifest.aux_layer_ids)
        own = slice(first, first + len(mine))
        if self.ctx is None:
            raise RuntimeError("OnlineSource.attach() the target before asking for batches")
        keep = attention[own].to(self.ctx.device).unsqueeze(-1)
        # Outside inference mode, so that the draft may save them for its backward; zeros on padding as offline.
        return Batch(
            input_ids=input_ids[own],
            loss_mask=loss_mask[own],
            attention_mask=attention[own],
            hidden_state=hidden[own].to(self.ctx.device) * keep,
            aux_hidden_states=aux[own].to(self.ctx.device) * keep,
        )
