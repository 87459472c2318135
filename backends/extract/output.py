"""The extraction's output folder: shards, a progress record, and the manifest at the end.

    OUT/shard-00000.safetensors ...   written by eagle3_contract.write_safetensors
    OUT/progress.json                 settings + finished shards, rewritten after each shard
    OUT/manifest.json                 written once, when every shard is done

Shard k holds the chats [k * shard_size, (k + 1) * shard_size) of the dataset
(less those with no assistant token left after truncation, or that the chat
template cannot render; counted by reason in the record), so a restart with
the same settings knows which chats a finished shard covers and skips them. A
finished shard is trusted when its file still has the recorded size; the first
one that does not is extracted again, with everything after it. A folder made
with other settings is refused rather than mixed.

The manifest's `content_hash` is the SHA-256 of one line per shard, in order:
the file name, a space, the hex SHA-256 of the file, a newline. Each file's
SHA-256 is taken from its bytes as they are written, not read back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.eagle3_contract import MANIFEST, SHARD_PATTERN, Manifest, ShardInfo, write_safetensors
from backends.fileio import atomic_write_json

if TYPE_CHECKING:
    import torch

PROGRESS = "progress.json"
PROGRESS_VERSION = 1


class OutputError(Exception):
    """The output folder cannot be used for this extraction; the message says what to do."""


@dataclass
class Settings:
    """Everything that changes the content of the output; a resume must match all of it."""

    target: str
    target_config_sha256: str
    aux_layer_ids: list[int]
    max_length: int
    data: str
    data_sha256: str
    limit: int | None
    dtype: str
    shard_size: int
    backend: str
    chat_template_sha256: str


@dataclass
class ShardRecord:
    index: int
    file: str | None  # None when every chat of the range was dropped
    first_chat: int
    end_chat: int
    samples: int
    tokens: int
    bytes: int = 0
    sha256: str = ""
    dropped: dict[str, int] = field(default_factory=dict)


@dataclass
class Progress:
    settings: Settings
    chats: int
    shards: list[ShardRecord] = field(default_factory=list)
    skipped_lines: dict[str, int] = field(default_factory=dict)
    complete: bool = False
    version: int = PROGRESS_VERSION

    @property
    def next_chat(self) -> int:
        return self.shards[-1].end_chat if self.shards else 0

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def dropped(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for shard in self.shards:
            for reason, count in shard.dropped.items():
                total[reason] = total.get(reason, 0) + count
        return total

    def save(self, out: Path) -> None:
        atomic_write_json(out / PROGRESS, asdict(self))


def content_hash(shards: list[ShardRecord]) -> str:
    lines = "".join(f"{s.file} {s.sha256}\n" for s in shards if s.file is not None)
    return hashlib.sha256(lines.encode()).hexdigest()


def _load_progress(path: Path) -> Progress:
    try:
        data: Any = json.loads(path.read_bytes())
        if data.get("version") != PROGRESS_VERSION:
            raise OutputError(f"{path} is from another version of the extractor; use a new --out")
        return Progress(
            settings=Settings(**data["settings"]),
            chats=data["chats"],
            shards=[ShardRecord(**s) for s in data["shards"]],
            skipped_lines=data.get("skipped_lines", {}),
            complete=data.get("complete", False),
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise OutputError(f"{path} cannot be read ({exc}); use a new --out or delete the folder") from None


def _differences(old: Settings, new: Settings) -> str:
    def short(value: object) -> str:
        text = json.dumps(value)
        return text[:13] + '..."' if isinstance(value, str) and len(value) == 64 else text

    changed = [
        f"{name} {short(before)} -> {short(after)}"
        for name, before in asdict(old).items()
        if (after := asdict(new)[name]) != before
    ]
    return ", ".join(changed)


def open_output(out: Path, settings: Settings, chats: int) -> tuple[Progress, list[str]]:
    """The progress to continue from (fresh, resumed, or complete), and notes on what was found."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out} exists and is not a folder")
    progress_path = out / PROGRESS
    if not progress_path.exists():
        if out.exists() and any(out.iterdir()):
            raise OutputError(f"--out {out} is not empty and holds no extraction progress; choose a new folder")
        out.mkdir(parents=True, exist_ok=True)
        return Progress(settings=settings, chats=chats), []
    progress = _load_progress(progress_path)
    if progress.settings != settings:
        raise OutputError(
            f"--out {out} was made with different settings ({_differences(progress.settings, settings)}); "
            "use a new --out, or the same settings to resume"
        )
    notes: list[str] = []
    for position, shard in enumerate(progress.shards):
        if shard.file is None:
            continue
        path = out / shard.file
        size = path.stat().st_size if path.is_file() else -1
        if size != shard.bytes:
            state = "is missing" if size < 0 else f"has {size} bytes, not {shard.bytes}"
            notes.append(f"{shard.file} {state}: extracting again from shard {shard.index}")
            del progress.shards[position:]
            progress.complete = False
            break
    if progress.complete and not (out / MANIFEST).is_file():
        progress.complete = False
    if not progress.complete:
        # A manifest from before would describe shards about to be rewritten.
        (out / MANIFEST).unlink(missing_ok=True)
    return progress, notes


def remove_if_empty(out: Path) -> None:
    """Remove an --out folder that holds nothing (an extraction that failed before its first shard)."""
    with contextlib.suppress(OSError):  # not there, or not empty: nothing to undo
        out.rmdir()


def save_shard(out: Path, shard: ShardRecord, tensors: Mapping[str, torch.Tensor] | None) -> ShardRecord:
    """Write a shard's file (none when every chat of its range was dropped) and fill in its name, size and
    SHA-256."""
    if tensors is not None:
        shard.file = SHARD_PATTERN.format(index=shard.index)
        shard.bytes, shard.sha256 = write_safetensors(out / shard.file, {name: [t] for name, t in tensors.items()})
    return shard


def record_shard(out: Path, progress: Progress, shard: ShardRecord) -> None:
    """Add the next finished shard, sealed, and save the progress."""
    progress.shards.append(shard)
    progress.save(out)


def finish(out: Path, progress: Progress, manifest: Manifest) -> Manifest:
    """Fill the manifest's counts and hash from the progress, write it atomically, and mark the progress complete."""
    manifest.shards = [
        ShardInfo(file=s.file, samples=s.samples, tokens=s.tokens) for s in progress.shards if s.file is not None
    ]
    manifest.samples = progress.samples
    manifest.tokens = progress.tokens
    manifest.content_hash = content_hash(progress.shards)
    manifest.validate()
    atomic_write_json(out / MANIFEST, manifest.to_json())
    progress.complete = True
    progress.save(out)
    return manifest
