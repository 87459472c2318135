"""The data contract between extraction, training, `doctor` and serving.

One place for: the aux-layer id conventions, the extraction manifest, the
hidden-state shard layout, and the SGLang-layout draft config and weight names
that our trainer writes. Pure Python; torch and safetensors are imported only by
the shard functions that need them.

Aux layer ids, everywhere in this project unless a name says otherwise, use the
"output of layer X (0-based)" convention: id X is HF `hidden_states[X + 1]`.
SGLang's draft config field uses the same convention (and captures at the input
of layer X + 1); speculators counts inputs to layers (its id = ours + 1).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
SHARD_PATTERN = "shard-{index:05d}.safetensors"
# Tensors of one shard: samples concatenated along tokens, split by sample_offsets.
SHARD_TENSORS = ("input_ids", "loss_mask", "hidden_state", "aux_hidden_states", "sample_offsets")

SGLANG_DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"
DEFAULT_DRAFT_VOCAB = 32000


class ContractError(ValueError):
    """Data, manifest or config that break the contract; the message says how."""


def default_aux_layers(num_layers: int) -> list[int]:
    """The default three layers (outputs of 1, L//2-1, L-4), as SpecForge and SGLang use."""
    if num_layers < 5:
        raise ContractError(f"a target with {num_layers} layers is too shallow for the default aux layers (need >= 5)")
    return [1, num_layers // 2 - 1, num_layers - 4]


def sglang_capture_inputs(aux_ids: list[int]) -> list[int]:
    """The layers at whose input SGLang captures for config ids `aux_ids` (Llama family)."""
    return [i + 1 for i in aux_ids]


def speculators_to_ours(ids: list[int]) -> list[int]:
    return [i - 1 for i in ids]


def ours_to_speculators(ids: list[int]) -> list[int]:
    return [i + 1 for i in ids]


def hf_hidden_state_index(aux_id: int) -> int:
    """Index into HF `output_hidden_states` (0 = embeddings) for an aux id."""
    return aux_id + 1


@dataclass
class ShardInfo:
    file: str
    samples: int
    tokens: int


@dataclass
class Manifest:
    """What an extraction produced, so that training and doctor can check against it."""

    target_path: str
    architecture: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str
    aux_layer_ids: list[int]
    tokenizer: str
    chat_template: str | None
    max_length: int
    samples: int = 0
    tokens: int = 0
    shards: list[ShardInfo] = field(default_factory=list)
    content_hash: str = ""
    version: int = MANIFEST_VERSION
    aux_convention: str = "output_of_layer"
    # What computed the states: "hf" (transformers) or "sglang", and that package's version.
    backend: str = "hf"
    backend_version: str = ""
    # The chats the states came from (a file's path, or "demo") and the SHA-256 of what was read of them:
    # an online training's checkpoints record them, so that --resume refuses other data.
    data: str = ""
    data_sha256: str = ""

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: object) -> Manifest:
        if not isinstance(data, dict):
            raise ContractError("manifest.json is not a JSON object")
        try:
            shards = [ShardInfo(**s) for s in data.get("shards", [])]
            manifest = Manifest(**{**data, "shards": shards})
        except TypeError as exc:
            raise ContractError(f"manifest.json has missing or unexpected fields: {exc}") from None
        manifest.validate()
        return manifest

    def validate(self) -> None:
        if self.version != MANIFEST_VERSION:
            raise ContractError(f"manifest version {self.version} is not {MANIFEST_VERSION}; re-run the extraction")
        if self.aux_convention != "output_of_layer":
            raise ContractError(f"unknown aux id convention {self.aux_convention!r}")
        ints = {"num_layers": self.num_layers, "hidden_size": self.hidden_size, "vocab_size": self.vocab_size}
        for name, value in ints.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ContractError(f"manifest {name} must be a positive integer, not {value!r}")
        # The last layer's output is never captured: SGLang would capture it at the
        # input of a layer that does not exist, and HF hands it over already normed.
        last = self.num_layers - 2
        if not self.aux_layer_ids or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= last for i in self.aux_layer_ids
        ):
            raise ContractError(f"manifest aux_layer_ids {self.aux_layer_ids!r} must be layer ids within 0..{last}")


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ContractError(f"{path} does not exist: is {directory} an extraction output folder?") from None
    except (OSError, ValueError) as exc:
        raise ContractError(f"{path} cannot be read as JSON: {exc}") from None
    return Manifest.from_json(data)


def sglang_draft_config(
    *,
    hidden_size: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    head_dim: int,
    vocab_size: int,
    draft_vocab_size: int,
    target_hidden_size: int,
    aux_layer_ids: list[int],
    max_position_embeddings: int,
    rms_norm_eps: float = 1e-5,
    rope_theta: float = 500000.0,
    rope_scaling: dict[str, Any] | None = None,
    hidden_act: str = "silu",
    torch_dtype: str = "bfloat16",
) -> dict[str, Any]:
    """config.json for a one-layer EAGLE-3 draft in the SGLang/SpecForge layout."""
    return {
        "architectures": [SGLANG_DRAFT_ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "hidden_act": hidden_act,
        "rms_norm_eps": rms_norm_eps,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": max_position_embeddings,
        "vocab_size": vocab_size,
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": target_hidden_size,
        "tie_word_embeddings": False,
        "bias": False,
        "torch_dtype": torch_dtype,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids), "use_aux_hidden_state": True},
    }


# Weight names of the SGLang layout (checkpoint keys; the embedding is optional:
# SGLang replaces it with the target's).
SGLANG_LAYER_PREFIX = "midlayer."
SPECULATORS_LAYER_PREFIX = "layers.0."
SGLANG_DRAFT_WEIGHTS = (
    "fc.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
)


def write_shard(path: Path, samples: list[dict[str, torch.Tensor]]) -> ShardInfo:
    """Write samples (each: input_ids [T], loss_mask [T], hidden_state [T,H],
    aux_hidden_states [T, n_aux*H]) as one shard, atomically."""
    import torch

    if not samples:
        raise ContractError("a shard needs at least one sample")
    lengths = [int(s["input_ids"].shape[0]) for s in samples]
    write_safetensors(
        path,
        {
            "input_ids": [s["input_ids"].to(torch.int64) for s in samples],
            "loss_mask": [s["loss_mask"].to(torch.int8) for s in samples],
            "hidden_state": [s["hidden_state"] for s in samples],
            "aux_hidden_states": [s["aux_hidden_states"] for s in samples],
            "sample_offsets": [torch.tensor(list(itertools.accumulate(lengths, initial=0)), dtype=torch.int64)],
        },
    )
    return ShardInfo(file=path.name, samples=len(samples), tokens=sum(lengths))


# safetensors' name of each dtype a shard may hold, and its rank: the library stores tensors by rank,
# highest first, then by name (its Dtype enum's order), which this writer follows byte for byte.
SAFETENSORS_DTYPES: dict[str, tuple[str, int]] = {
    "bool": ("BOOL", 0),
    "uint8": ("U8", 1),
    "int8": ("I8", 2),
    "int16": ("I16", 3),
    "float16": ("F16", 4),
    "bfloat16": ("BF16", 5),
    "int32": ("I32", 6),
    "float32": ("F32", 7),
    "float64": ("F64", 8),
    "int64": ("I64", 9),
}
# Bytes per write(2); each is handed to the disk once written.
WRITE_CHUNK = 64 << 20


def write_safetensors(path: Path, tensors: Mapping[str, Sequence[torch.Tensor]]) -> tuple[int, str]:
    """Write a safetensors file, each tensor the concatenation of its pieces along the first dimension, and
    return (its size in bytes, the SHA-256 of its bytes), hashed as they are written.

    The bytes are those safetensors' `save_file` writes for the concatenated tensors, without building
    them: the header, then each piece straight from its memory in large writes. Atomic and durable (a
    temporary file, fsync, rename): a shard recorded as finished is on the disk.
    """
    entries: list[tuple[int, str, str, list[int], Sequence[torch.Tensor]]] = []
    for name, pieces in tensors.items():
        if not pieces:
            raise ContractError(f"{name}: no tensor to write")
        first = pieces[0]
        kind = SAFETENSORS_DTYPES.get(str(first.dtype).removeprefix("torch."))
        if kind is None:
            raise ContractError(f"{name}: safetensors shards do not hold {first.dtype}")
        if len(pieces) > 1 and any(
            p.dtype != first.dtype or p.dim() == 0 or p.shape[1:] != first.shape[1:] for p in pieces
        ):
            raise ContractError(f"{name}: pieces differ in dtype or in all but their first dimension")
        shape = [sum(int(p.shape[0]) for p in pieces), *first.shape[1:]] if first.dim() else []
        entries.append((kind[1], name, kind[0], shape, pieces))
    entries.sort(key=lambda entry: (-entry[0], entry[1]))
    header: dict[str, object] = {}
    offset = 0
    for _, name, dtype, shape, pieces in entries:
        nbytes = sum(p.numel() * p.element_size() for p in pieces)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    prefix = memoryview(struct.pack("<Q", len(text)) + text)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb", buffering=0) as fh:
            sha256 = _write_hashed(fh.fileno(), [prefix, *(_raw_bytes(p) for *_, pieces in entries for p in pieces)])
            os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(prefix) + offset, sha256


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes in row-major order, without a copy when it is a contiguous CPU tensor."""
    import torch

    flat = tensor.detach().reshape(-1).cpu()
    return flat.view(torch.uint8).numpy().data


def _write_hashed(fd: int, parts: list[memoryview]) -> str:
    """Write `parts` one after the other to `fd`; the hex SHA-256 of what was written."""
    digest = hashlib.sha256()

    def hash_parts() -> None:
        for data in parts:
            digest.update(data)

    # Hashing costs about as much as writing, and both release the GIL on large buffers: side by side, a
    # shard takes the longer of the two, not their sum.
    hasher = threading.Thread(target=hash_parts, name="shard-hash")
    hasher.start()
    try:
        offset = 0
        for data in parts:
            for start in range(0, len(data), WRITE_CHUNK):
                chunk = data[start : start + WRITE_CHUNK]
                size = len(chunk)
                while chunk:
                    chunk = chunk[os.write(fd, chunk) :]
                if hasattr(os, "posix_fadvise"):  # Linux: send the chunk to the disk now, not all at the fsync
                    os.posix_fadvise(fd, offset, size, os.POSIX_FADV_DONTNEED)
                offset += size
    finally:
        hasher.join()
    return digest.hexdigest()


def read_shard(path: Path) -> list[dict[str, torch.Tensor]]:
    """The samples of one shard, as views into its tensors."""
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    missing = [k for k in SHARD_TENSORS if k not in tensors]
    if missing:
        raise ContractError(f"{path.name} lacks {', '.join(missing)}; it is not a shard of this project")
    offsets = tensors["sample_offsets"].tolist()
    return [
        {name: tensors[name][start:end] for name in SHARD_TENSORS if name != "sample_offsets"}
        for start, end in itertools.pairwise(offsets)
    ]
