"""The chats of an online run, tokenized: flat tensors, and a copy in the run's --out folder.

Tokenizing a million chats takes minutes, and every start did it again, resumes included. The copy
(`tokenized-chats.safetensors`, private to its owner) names what it was made from: the data's SHA-256, the
tokenizer itself, its special tokens, the chat template, --max-length and --limit. A start whose inputs are the
same reads it; any other tokenizes anew and replaces it, and so does a start that finds it unreadable.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from backends.extract.cli import ExtractFailed, UsageError, load_chat_tokenizer, tokenize_chats
from backends.extract.data import DEMO, DataError, load_dataset
from backends.extract.template import ChatTokenizer
from backends.fileio import atomic_write_bytes
from backends.train.errors import TrainError, TrainingFailed
from backends.train.options import TrainOptions

DEFAULT_MAX_LENGTH = 2048
CACHE = "tokenized-chats.safetensors"
# Bumped whenever the tokenization itself changes (the loss mask, truncation), so older copies are not read.
CACHE_FORMAT = "1"


@dataclass
class Samples:
    """The tokenized chats, flat (a corpus of Python int lists would take gigabytes): sample i is
    ids[offsets[i]:offsets[i + 1]]."""

    ids: torch.Tensor  # int32
    loss_mask: torch.Tensor  # int8
    offsets: list[int]
    dropped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.offsets[i], self.offsets[i + 1]
        return self.ids[start:end], self.loss_mask[start:end]

    @functools.cached_property
    def lengths(self) -> list[int]:
        """Each sample's tokens (computed once: batching reads them every epoch and evaluation)."""
        return [self.offsets[i + 1] - self.offsets[i] for i in range(len(self))]


# Chats tokenized at a time: their Python lists are flattened into tensors before the next ones are made.
TOKENIZE_CHUNK = 1024


def tokenize(chat_tokenizer: ChatTokenizer, chats: list[list[dict[str, str]]], max_length: int) -> Samples:
    """The chats that keep an assistant token within `max_length` (as the extraction keeps them), flat."""
    ids: list[torch.Tensor] = []
    masks: list[torch.Tensor] = []
    offsets = [0]
    dropped: dict[str, int] = {}
    for start in range(0, len(chats), TOKENIZE_CHUNK):
        kept, reasons = tokenize_chats(chat_tokenizer, chats[start : start + TOKENIZE_CHUNK], max_length)
        for reason, count in reasons.items():
            dropped[reason] = dropped.get(reason, 0) + count
        for sample in kept:
            ids.append(torch.tensor(sample.input_ids, dtype=torch.int32))
            masks.append(torch.tensor(sample.loss_mask, dtype=torch.int8))
            offsets.append(offsets[-1] + len(sample.input_ids))
    flat = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int32)
    return Samples(flat, torch.cat(masks) if masks else torch.zeros(0, dtype=torch.int8), offsets, dropped)


@dataclass
class Chats:
    """The chat tokenizer, the samples, and what they were made from."""

    tokenizer: ChatTokenizer
    samples: Samples
    name: str  # demo, or the data file's absolute path
    sha256: str  # of the data
    key: str  # of everything the samples were made from (the copy's name for them)
    from_copy: bool  # read from the --out folder's copy, not tokenized now


def cache_key(chat_tokenizer: ChatTokenizer, data_sha256: str, max_length: int, limit: int | None) -> str:
    tokenizer = chat_tokenizer.tokenizer
    parts = (
        CACHE_FORMAT,
        data_sha256,
        tokenizer.backend_tokenizer.to_str(),
        json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str),
        chat_tokenizer.template,
        str(max_length),
        str(limit),
    )
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


def read_copy(path: Path, key: str) -> Samples | None:
    """The samples `path` holds when they were made from `key`; None when it is missing or made otherwise."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as copy:
            meta = copy.metadata() or {}
            if meta.get("key") != key:
                return None
            ids, mask, offsets = (copy.get_tensor(name) for name in ("ids", "loss_mask", "offsets"))
            dropped = {str(k): int(v) for k, v in json.loads(meta.get("dropped", "{}")).items()}
    except FileNotFoundError:
        return None
    except (OSError, SafetensorError, ValueError, TypeError) as exc:
        print(f"data: {path} cannot be read ({exc}); tokenizing again", flush=True)
        return None
    return Samples(ids, mask, offsets.tolist(), dropped)


def keep_copy(out: Path, chats: Chats) -> None:
    """OUT/tokenized-chats.safetensors, private and written atomically (fileio's temp file, fsync, rename; the
    file is serialised in memory first, about 5 bytes a token). It only spares a resume some minutes: a disk that
    refuses it (full, read-only) is said in one line, and training goes on."""
    from safetensors.torch import save

    path = out / CACHE
    samples = chats.samples
    tensors = {"ids": samples.ids, "loss_mask": samples.loss_mask, "offsets": torch.tensor(samples.offsets)}
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, save(tensors, {"key": chats.key, "dropped": json.dumps(samples.dropped)}))
    except OSError as exc:
        print(f"data: cannot keep the tokenized chats in {path} ({exc}); a resume will tokenize them again", flush=True)
        return
    size = path.stat().st_size / 2**20
    print(f"data: tokenized chats kept in {path} ({size:,.1f} MiB) for a resume", flush=True)


def load_chats(options: TrainOptions) -> Chats:
    """The chats of --data tokenized with the target's template, from the --out folder's copy when it is theirs;
    or TrainError."""
    spec = str(options.data)
    if spec != DEMO and not options.data.is_file():
        raise TrainError(f"--data {spec}: no such file (with --online, a JSONL file of chats, or demo)")
    try:
        chat_tokenizer = load_chat_tokenizer(options.target, options.chat_template)
    except (UsageError, ExtractFailed) as exc:  # both mean a bad --target or --chat-template here: exit 2
        raise TrainError(str(exc)) from None
    try:
        dataset = load_dataset(spec, options.limit)
    except DataError as exc:
        raise TrainingFailed(str(exc)) from None
    if dataset.skipped:
        print(f"data: {dataset.skip_summary()}", flush=True)
    started = time.perf_counter()
    max_length = options.max_length or DEFAULT_MAX_LENGTH
    key = cache_key(chat_tokenizer, dataset.sha256, max_length, options.limit)
    samples = read_copy(options.out / CACHE, key)
    from_copy = samples is not None
    if samples is None:
        samples = tokenize(chat_tokenizer, dataset.chats, max_length)
    how = f"read from {options.out / CACHE}" if from_copy else "tokenized"
    dropped = ", ".join(f"{count} {reason}" for reason, count in samples.dropped.items())
    print(
        f"data: {len(samples)} of {len(dataset.chats)} chats from {dataset.source} {how} "
        f"({len(samples.ids):,} tokens, {time.perf_counter() - started:.1f} s)"
        + (f"; dropped {dropped}" if dropped else ""),
        flush=True,
    )
    name = DEMO if spec == DEMO else str(options.data.resolve())
    return Chats(chat_tokenizer, samples, name, dataset.sha256, key, from_copy)
