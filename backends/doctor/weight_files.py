"""Which weight files SGLang loads from a draft folder, picked as SGLang 0.5.23's DefaultModelLoader picks them.

With the default load format (`auto`) its `_prepare_weights` globs `*.safetensors`, else `*.bin`, else `*.pt`
(the first pattern that matches anything wins; its glob skips hidden files). Safetensors: when
`model.safetensors.index.json` exists, only the files its weight_map names are read, and a named file that is
not there stops the server at startup; without an index every file is read (unless the folder holds exactly a
`consolidated.safetensors` and a `model.safetensors`: then the latter). `.bin`/`.pt`: every file but the
training files it knows (`training_args.bin`, `optimizer.pt`, ...); `pytorch_model.bin.index.json` is never
read. The files are read in name order. Every other `.safetensors` or `.bin` file in the folder is a leftover:
never loaded, whatever it holds. A `.pt` SGLang does not read is not called one (trainers keep their state in
`.pt` files beside the weights, ours `training_state.pt`).

doctor's static reader, its dry-load, `convert` and the pre-launch gate all read the draft through `weight_files`.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path

from backends.safetensors_header import INDEX_FILE, SINGLE_FILE

# In SGLang's order of preference.
PATTERNS = ("*.safetensors", "*.bin", "*.pt")
# SGLang's filter_files_not_needed_for_inference: dropped from a .bin/.pt load, never weights.
NOT_WEIGHTS = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")
_CONSOLIDATED = "consolidated.safetensors"


class WeightFilesError(ValueError):
    """SGLang would find no weights, or stop at startup over the index; the message says which file and why."""


@dataclass(frozen=True)
class WeightFiles:
    root: Path
    kind: str  # "safetensors" | "bin" | "pt": how SGLang reads them
    files: tuple[Path, ...]  # what SGLang loads, in its order
    leftovers: tuple[Path, ...]  # weight files beside them that SGLang never opens
    index: Path | None  # the safetensors index that chose them

    def describe(self) -> str:
        """Which files, in words: `model-00001-of-00002.safetensors, ... (as model.safetensors.index.json names)`."""
        names = ", ".join(f.name for f in self.files)
        return names + (f" (as {self.index.name} names them)" if self.index else "")


def _glob(root: Path, pattern: str) -> list[str]:
    """SGLang's glob, on the same string it builds (dotfiles skipped, directories matched)."""
    return glob.glob(os.path.join(glob.escape(str(root)), pattern))


def _index_shards(index: Path) -> set[str]:
    """The weight_map's files, joined to the folder as SGLang joins them (no normalisation)."""
    try:
        weight_map = json.loads(index.read_bytes())["weight_map"]
        shards = {os.path.join(str(index.parent), s) for s in weight_map.values()}
    except OSError as exc:
        raise WeightFilesError(f"{index} cannot be read: {exc.strerror or exc}") from None
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        raise WeightFilesError(
            f"{index} has no 'weight_map' object of tensor name -> file name (SGLang would fail to start)"
        ) from None
    return shards


def weight_files(draft: Path) -> WeightFiles:
    """The files SGLang loads from `draft` (a folder, or a file in it) and the leftovers beside them."""
    root = draft.parent if draft.is_file() else draft
    found: list[str] = []
    kind = ""
    for pattern in PATTERNS:
        found = _glob(root, pattern)
        if found:
            kind = pattern.removeprefix("*.")
            break
    index: Path | None = None
    if not found:
        raise WeightFilesError(f"{root} has no .safetensors, .bin or .pt weights (SGLang would fail to start)")
    if kind == "safetensors":
        if (root / INDEX_FILE).is_file():
            index = root / INDEX_FILE
            named = _index_shards(index)
            missing = sorted(os.path.basename(f) for f in named if not os.path.isfile(f))
            if missing:
                raise WeightFilesError(
                    f"{index} names {len(missing)} shard file(s) missing from {root}: {', '.join(missing)} "
                    "(SGLang would fail to start)"
                )
            chosen = [f for f in found if f in named]
        elif len(found) == 2 and sorted(found)[0].endswith(_CONSOLIDATED) and sorted(found)[1].endswith(SINGLE_FILE):
            chosen = [sorted(found)[1]]
        else:
            chosen = found
    else:
        chosen = [f for f in found if not f.endswith(NOT_WEIGHTS)]
    if not chosen:
        skipped = ", ".join(sorted(os.path.basename(f) for f in found))
        raise WeightFilesError(
            f"{root} has no weights SGLang loads: only {skipped}, which it skips as training files "
            "(SGLang would fail to start)"
        )
    loaded = set(chosen)
    beside = {f for p in PATTERNS[:2] for f in _glob(root, p)} - loaded
    leftovers = sorted(f for f in beside if not f.endswith(NOT_WEIGHTS) and os.path.isfile(f))
    return WeightFiles(root, kind, tuple(Path(f) for f in sorted(chosen)), tuple(map(Path, leftovers)), index)
