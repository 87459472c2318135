"""Reading what doctor checks, without raising for any content.

The draft folder (config.json, safetensors headers, the small `d2t` vector, an
original-EAGLE `pytorch_model.bin` through a memory map), the target's config
and embedding header, and the extraction manifest.
"""

from __future__ import annotations

import array
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.doctor.codes import finding
from backends.doctor.config_values import first_architecture, positive_int
from backends.doctor.layer_names import layer_spelling
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
    weights: str  # "safetensors" | "bin"
    format: str  # "sglang" | "speculators" | "eagle-bin" | "unknown"
    read_ints: Callable[[str], list[int] | None]  # values of a small integer tensor


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
    """Config, tensor names/shapes and format of a draft folder (or of the folder of a weights file)."""
    root = path.parent if path.is_file() else path
    if not root.is_dir():
        return None, [finding("draft-not-found", "error", f"{path} is not a folder or a file", "check the path")]
    config = read_json_object(root / "config.json")
    if isinstance(config, str):
        code = "draft-not-found" if not (root / "config.json").exists() else "config-unreadable"
        return None, [finding(code, "error", f"draft config: {config}", "every draft needs its config.json")]
    bin_path = root / "pytorch_model.bin"
    has_safetensors = (root / INDEX_FILE).is_file() or any(root.glob("*.safetensors"))
    try:
        if has_safetensors:
            infos = read_checkpoint(root)
            tensors = {n: TensorMeta(i.dtype, i.shape) for n, i in infos.items()}
            files = DraftFiles(root, config, tensors, "safetensors", "", lambda n: _safetensors_ints(infos[n]))
        elif bin_path.is_file():
            files = _read_bin(root, config, bin_path)
        else:
            msg = f"{root} has no model.safetensors, {INDEX_FILE} or pytorch_model.bin"
            return None, [finding("draft-not-found", "error", msg, "point doctor at the checkpoint folder")]
    except HeaderError as exc:
        return None, [finding("weights-unreadable", "error", str(exc), "re-save or re-copy the checkpoint")]
    files.format = detect_format(config, files.tensors, files.weights)
    return files, []


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


def _read_bin(root: Path, config: dict[str, Any], path: Path) -> DraftFiles:
    import torch  # only original-EAGLE drafts need it; importing it costs seconds

    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise HeaderError(f"{path}: torch.load(mmap=True, weights_only=True) failed: {exc}") from None
    if isinstance(state, dict) and len(state) == 1 and isinstance(next(iter(state.values())), dict):
        state = next(iter(state.values()))  # {"state_dict": {...}} or {"module": {...}}
    if not isinstance(state, dict):
        raise HeaderError(f"{path}: holds a {type(state).__name__}, not a state dict")
    tensors = {str(k): v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if len(tensors) != len(state):
        others = sorted(str(k) for k, v in state.items() if not isinstance(v, torch.Tensor))
        raise HeaderError(f"{path}: entries that are not tensors: {', '.join(others[:5])}")
    metas = {k: TensorMeta(_TORCH_DTYPES.get(str(v.dtype), str(v.dtype)), tuple(v.shape)) for k, v in tensors.items()}

    def ints(name: str) -> list[int] | None:
        value = tensors[name]
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            return None
        return [int(x) for x in value.flatten().tolist()]

    return DraftFiles(root, config, metas, "bin", "", ints)


def detect_format(config: Mapping[str, Any], tensors: Mapping[str, TensorMeta], weights: str) -> str:
    names = list(tensors)
    has_midlayer = any(layer_spelling(n) == "midlayer.*" for n in names)
    has_layers = any(layer_spelling(n) == "layers.N.*" for n in names)
    archs = config.get("architectures")
    sglang_arch = isinstance(archs, list) and any(a in (facts.LLAMA_DRAFT, facts.MLA_DRAFT) for a in archs)
    if "speculators_config" in config or "speculators_model_type" in config:
        return "speculators"
    if weights == "bin":
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
