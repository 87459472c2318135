"""Reading what doctor checks, without raising for any content.

The draft folder (config.json, and of the weight files SGLang loads, `weight_files`:
safetensors headers and the small `d2t` vector, or `.bin`/`.pt` files through a
memory map), the target's config and embedding header, and the extraction manifest.
"""

from __future__ import annotations

import array
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.doctor.codes import finding
from backends.doctor.config_values import first_architecture, positive_int
from backends.doctor.layer_names import layer_spelling
from backends.doctor.weight_files import WeightFiles, WeightFilesError, weight_files
from backends.eagle3_contract import MANIFEST, ContractError, Manifest, read_manifest
from backends.protocol import Finding
from backends.safetensors_header import (
    INDEX_FILE,
    HeaderError,
    TensorInfo,
    read_checkpoint,
    read_header,
    read_index,
)
from backends.sglang import facts

if TYPE_CHECKING:
    import torch

MAX_D2T_BYTES = 64 * 2**20
_ARRAY_CODES = {"I8": "b", "U8": "B", "I16": "h", "U16": "H", "I32": "i", "U32": "I", "I64": "q", "U64": "Q"}


@dataclass(frozen=True)
class TensorMeta:
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]


@dataclass
class DraftFiles:
    root: Path
    config: dict[str, Any]
    tensors: dict[str, TensorMeta]
    weights: str  # "safetensors" | "bin" | "pt"
    format: str  # "sglang" | "speculators" | "eagle-bin" | "unknown"
    read_ints: Callable[[str], list[int] | None]  # values of a small integer tensor
    loaded: WeightFiles  # the files these tensors come from, as SGLang picks them


def read_json_object(path: Path) -> dict[str, Any] | str:
    """The JSON object in `path`, or why it is not one."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path} cannot be read: {exc.strerror or exc}"
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return f"{path} is not JSON: {exc}"
    if not isinstance(data, dict):
        return f"{path} holds a JSON {type(data).__name__}, not an object"
    return data


def read_draft(path: Path) -> tuple[DraftFiles | None, list[Finding]]:
    """Config, tensor names/shapes and format of a draft folder (or of the folder of a weights file), read from
    the files SGLang loads (`weight_files`); leftovers beside them are a warning and never read."""
    root = path.parent if path.is_file() else path
    if not root.is_dir():
        return None, [finding("draft-not-found", "error", f"{path} is not a folder or a file", "check the path")]
    config = read_json_object(root / "config.json")
    if isinstance(config, str):
        code = "draft-not-found" if not (root / "config.json").exists() else "config-unreadable"
        return None, [finding(code, "error", f"draft config: {config}", "every draft needs its config.json")]
    try:
        chosen = weight_files(root)
    except WeightFilesError as exc:
        fix = "copy the missing shard(s) again" if (root / INDEX_FILE).is_file() else "point at the checkpoint folder"
        return None, [finding("draft-not-found", "error", str(exc), fix)]
    found: list[Finding] = []
    try:
        if chosen.kind == "safetensors":
            infos, duplicates = _read_safetensors(chosen.files)
            tensors = {n: TensorMeta(i.dtype, i.shape) for n, i in infos.items()}
            files = DraftFiles(root, config, tensors, "safetensors", "", lambda n: _safetensors_ints(infos[n]), chosen)
        else:
            files, duplicates = _read_bin(config, chosen)
    except HeaderError as exc:
        return None, [finding("weights-unreadable", "error", str(exc), "re-save or re-copy the checkpoint")]
    found += _duplicates_finding(duplicates)
    if chosen.leftovers:
        names = ", ".join(f.name for f in chosen.leftovers)
        found.append(
            finding(
                "weights-leftover",
                "warning",
                f"SGLang never loads {names} from {root}: it loads {chosen.describe()}",
                "move the leftover file(s) out of the draft folder, so no one takes them for the weights",
            )
        )
    files.format = detect_format(config, files.tensors, files.weights)
    return files, found


# A tensor in two loaded files: name -> (dtype, shape) of each copy, in load order, with its file.
Duplicates = dict[str, list[tuple[str, str, tuple[int, ...]]]]


def _read_safetensors(paths: tuple[Path, ...]) -> tuple[dict[str, TensorInfo], Duplicates]:
    """Every tensor of the files, as SGLang feeds them in order: a later file's copy of a name is the one served."""
    infos: dict[str, TensorInfo] = {}
    duplicates: Duplicates = {}
    for path in paths:
        for name, info in read_header(path).items():
            if name in infos:
                first = infos[name]
                duplicates.setdefault(name, [(first.file.name, first.dtype, first.shape)])
                duplicates[name].append((path.name, info.dtype, info.shape))
            infos[name] = info
    return infos, duplicates


def _duplicates_finding(duplicates: Duplicates) -> list[Finding]:
    if not duplicates:
        return []
    shapes = {n: {shape for _, _, shape in copies} for n, copies in duplicates.items()}
    clash = sorted(n for n, s in shapes.items() if len(s) > 1)
    name = (clash or sorted(duplicates))[0]
    copies = duplicates[name]
    where = " and ".join(f"{file} {list(shape)}" for file, _, shape in copies)
    count = f"{len(duplicates)} tensor(s) are in more than one file SGLang loads, e.g. {name} in {where}"
    if clash:
        return [
            finding(
                "weights-duplicated",
                "error",
                f"{count}: SGLang loads every copy, and the one of the wrong shape crashes its loader at startup",
                "remove the stale file (or give the shards an index that leaves it out)",
            )
        ]
    return [
        finding(
            "weights-duplicated",
            "warning",
            f"{count}: SGLang loads every copy in file-name order and serves the last ({copies[-1][0]})",
            "remove the stale file (or give the shards an index that leaves it out)",
        )
    ]


def _safetensors_ints(info: TensorInfo) -> list[int] | None:
    code = _ARRAY_CODES.get(info.dtype)
    if code is None or info.nbytes > MAX_D2T_BYTES:
        return None
    with info.file.open("rb") as fh:
        fh.seek(info.offset)
        raw = fh.read(info.nbytes)
    values = array.array(code)
    values.frombytes(raw[: len(raw) - len(raw) % values.itemsize])
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


_TORCH_DTYPES = {
    "torch.float32": "F32",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.float64": "F64",
    "torch.int64": "I64",
    "torch.int32": "I32",
    "torch.int16": "I16",
    "torch.int8": "I8",
    "torch.uint8": "U8",
    "torch.bool": "BOOL",
}


def _read_bin(config: dict[str, Any], chosen: WeightFiles) -> tuple[DraftFiles, Duplicates]:
    """`.bin`/`.pt` files as SGLang reads them: torch.load(weights_only=True) of each, every entry fed by name."""
    import torch  # only these drafts need it; importing it costs seconds

    tensors: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    duplicates: Duplicates = {}
    for path in chosen.files:
        state = load_state(path)
        for name, value in state.items():
            if name in tensors:
                first = tensors[name]
                duplicates.setdefault(name, [(origin[name], str(first.dtype), tuple(first.shape))])
                duplicates[name].append((path.name, str(value.dtype), tuple(value.shape)))
            tensors[name], origin[name] = value, path.name
    metas = {k: TensorMeta(_TORCH_DTYPES.get(str(v.dtype), str(v.dtype)), tuple(v.shape)) for k, v in tensors.items()}

    def ints(name: str) -> list[int] | None:
        value = tensors[name]
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            return None
        return [int(x) for x in value.flatten().tolist()]

    return DraftFiles(chosen.root, config, metas, chosen.kind, "", ints, chosen), duplicates


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one `.bin`/`.pt` file, memory-mapped, or HeaderError. An original-EAGLE file that nests them
    (`{"state_dict": {...}}`) is unwrapped."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise HeaderError(f"{path}: torch.load(mmap=True, weights_only=True) failed: {exc}") from None
    if isinstance(state, dict) and len(state) == 1 and isinstance(next(iter(state.values())), dict):
        state = next(iter(state.values()))  # {"state_dict": {...}} or {"module": {...}}
    if not isinstance(state, dict):
        raise HeaderError(f"{path}: holds a {type(state).__name__}, not a state dict")
    others = sorted(str(k) for k, v in state.items() if not isinstance(v, torch.Tensor))
    if others:
        raise HeaderError(f"{path}: entries that are not tensors: {', '.join(others[:5])}")
    return {str(k): v for k, v in state.items()}


def detect_format(config: Mapping[str, Any], tensors: Mapping[str, TensorMeta], weights: str) -> str:
    names = list(tensors)
    has_midlayer = any(layer_spelling(n) == "midlayer.*" for n in names)
    has_layers = any(layer_spelling(n) == "layers.N.*" for n in names)
    archs = config.get("architectures")
    sglang_arch = isinstance(archs, list) and any(a in (facts.LLAMA_DRAFT, facts.MLA_DRAFT) for a in archs)
    if "speculators_config" in config or "speculators_model_type" in config:
        return "speculators"
    if weights != "safetensors" and not sglang_arch:
        return "eagle-bin" if has_midlayer else "unknown"
    if has_midlayer or (has_layers and sglang_arch):
        return "sglang"
    return "unknown"


@dataclass
class Target:
    path: Path
    architecture: str | None
    num_layers: int | None
    hidden: int | None
    vocab: int | None
    context_length: int


def read_target(path: Path) -> tuple[Target | None, list[Finding]]:
    config = read_json_object(path / "config.json")
    if isinstance(config, str):
        return None, [finding("target-unreadable", "error", f"target config: {config}", "check --target")]
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    target = Target(
        path=path,
        architecture=first_architecture(config),
        num_layers=positive_int(text.get("num_hidden_layers")),
        hidden=positive_int(text.get("hidden_size")),
        vocab=positive_int(text.get("vocab_size")) or positive_int(config.get("vocab_size")),
        context_length=facts.derived_context_length(text),
    )
    found: list[Finding] = []
    if target.hidden is None or target.vocab is None:
        # Only then are the (possibly huge) target's headers worth reading.
        try:
            embed = [i for n, i in _embedding_header(path).items() if n.endswith("embed_tokens.weight")]
        except HeaderError as exc:
            embed = []
            found.append(finding("target-unreadable", "warning", f"target weights: {exc}"))
        if len(embed) == 1 and len(embed[0].shape) == 2:
            target.vocab = target.vocab or embed[0].shape[0]
            target.hidden = target.hidden or embed[0].shape[1]
    return target, found


def _embedding_header(path: Path) -> dict[str, TensorInfo]:
    """The header that holds the embedding: one shard's when an index names it, else all."""
    if (path / INDEX_FILE).is_file():
        shards = {s for n, s in read_index(path / INDEX_FILE).items() if n.endswith("embed_tokens.weight")}
        if len(shards) == 1:
            return read_header(path / shards.pop())
    return read_checkpoint(path)


def read_data(path: Path) -> tuple[Manifest | None, list[Finding]]:
    if not (path / MANIFEST).exists():
        msg = f"{path} has no {MANIFEST}: the aux layers the draft was trained on are unknown"
        fix = "pass the extraction folder this draft was trained from, or re-run the extraction with eagle3-console"
        return None, [finding("manifest-missing", "warning", msg, fix)]
    try:
        return read_manifest(path), []
    except ContractError as exc:
        return None, [finding("manifest-invalid", "error", str(exc), "re-run the extraction")]
