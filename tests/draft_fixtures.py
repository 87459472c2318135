"""Tiny EAGLE-3 drafts and targets on disk, in every layout doctor and convert meet.

Sizes are tiny (hidden 64, vocab 256) but the files are real: safetensors files
written byte for byte (tensor data is deterministic, d2t holds real offsets),
config.json files as the trainers write them, a target with a sharded index and
sparse shards, an extraction manifest. `DraftSpec` describes one draft; tests
change a field or two to inject exactly one fault.
"""

from __future__ import annotations

import array
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from backends.eagle3_contract import Manifest, sglang_draft_config
from backends.safetensors_header import DTYPE_BYTES, INDEX_FILE

HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 128
VOCAB = 256
DRAFT_VOCAB = 64
TARGET_LAYERS = 12
AUX_IDS = [1, 5, 8]  # the defaults for 12 layers: outputs of 1, L//2-1, L-4
CONTEXT = 4096
TARGET_ARCH = "LlamaForCausalLM"

Shape = tuple[int, ...]
# name -> (dtype, shape, data or None for deterministic filler)
TensorSpec = dict[str, tuple[str, Shape, bytes | None]]


def safetensors_bytes(tensors: TensorSpec, metadata: Mapping[str, str] | None = None) -> bytes:
    """A complete safetensors file."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    chunks: list[bytes] = []
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        size = math.prod(shape) * DTYPE_BYTES[dtype]
        payload = data if data is not None else bytes((offset + i) % 251 for i in range(size))
        assert len(payload) == size, name
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        chunks.append(payload)
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(chunks)


def int64_bytes(values: list[int]) -> bytes:
    return array.array("q", values).tobytes()


@dataclass
class DraftSpec:
    """One draft; the defaults make a good SpecForge-style draft for the fixture target."""

    hidden: int = HIDDEN
    target_hidden: int = HIDDEN
    fc_in: int | None = None  # default: len(aux_ids) x target_hidden (3 when no ids)
    layer: str = "midlayer"  # "midlayer" or "layers.0"
    num_layers: int = 1
    vocab: int = VOCAB
    draft_vocab: int = DRAFT_VOCAB
    head_rows: int | None = None  # default draft_vocab
    aux_ids: list[int] | None = field(default_factory=lambda: list(AUX_IDS))
    d2t: list[int] | None = None  # default: draft id i -> target id 2i
    max_position_embeddings: int = CONTEXT
    drop: tuple[str, ...] = ()  # tensor names to leave out
    extra: TensorSpec = field(default_factory=dict)
    config_changes: dict[str, Any] = field(default_factory=dict)  # value None deletes the key
    with_embedding: bool = False

    def config(self) -> dict[str, Any]:
        config = sglang_draft_config(
            hidden_size=self.hidden,
            intermediate_size=INTERMEDIATE,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            head_dim=HEAD_DIM,
            vocab_size=self.vocab,
            draft_vocab_size=self.draft_vocab,
            target_hidden_size=self.target_hidden,
            aux_layer_ids=self.aux_ids or [],
            max_position_embeddings=self.max_position_embeddings,
        )
        config["num_hidden_layers"] = self.num_layers
        if self.aux_ids is None:
            del config["eagle_config"]
        for key, value in self.config_changes.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        return config

    def tensors(self) -> TensorSpec:
        h, q, kv = self.hidden, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        fc_in = self.fc_in or len(self.aux_ids or AUX_IDS) * self.target_hidden
        d2t = self.d2t if self.d2t is not None else list(range(self.draft_vocab))
        spec: TensorSpec = {
            "fc.weight": ("BF16", (h, fc_in), None),
            "norm.weight": ("BF16", (h,), None),
            "lm_head.weight": ("BF16", (self.head_rows or self.draft_vocab, h), None),
            "d2t": ("I64", (len(d2t),), int64_bytes(d2t)),
            "t2d": ("BOOL", (self.vocab,), None),
        }
        if self.with_embedding:
            spec["embed_tokens.weight"] = ("BF16", (self.vocab, h), None)
        for i in range(self.num_layers):
            prefix = self.layer if i == 0 else f"layers.{i}"
            width = 2 * h if i == 0 else h
            spec |= {
                f"{prefix}.self_attn.q_proj.weight": ("BF16", (q, width), None),
                f"{prefix}.self_attn.k_proj.weight": ("BF16", (kv, width), None),
                f"{prefix}.self_attn.v_proj.weight": ("BF16", (kv, width), None),
                f"{prefix}.self_attn.o_proj.weight": ("BF16", (h, q), None),
                f"{prefix}.mlp.gate_proj.weight": ("BF16", (INTERMEDIATE, h), None),
                f"{prefix}.mlp.up_proj.weight": ("BF16", (INTERMEDIATE, h), None),
                f"{prefix}.mlp.down_proj.weight": ("BF16", (h, INTERMEDIATE), None),
                f"{prefix}.input_layernorm.weight": ("BF16", (h,), None),
                f"{prefix}.hidden_norm.weight": ("BF16", (h,), None),
                f"{prefix}.post_attention_layernorm.weight": ("BF16", (h,), None),
            }
        for name in self.drop:
            del spec[name]
        return spec | self.extra

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.config(), indent=2))
        (folder / "model.safetensors").write_bytes(safetensors_bytes(self.tensors(), {"format": "pt"}))
        return folder


def good_draft(folder: Path, **changes: Any) -> Path:
    return replace(DraftSpec(), **changes).write(folder)


def corrupt_header(draft: Path) -> Path:
    """Cut the draft's model.safetensors inside its header (as an interrupted copy leaves it)."""
    weights = draft / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:40])
    return draft


def speculators_config(spec: DraftSpec) -> dict[str, Any]:
    """config.json as speculators writes it: layer config nested, ids counted as layer inputs."""
    return {
        "architectures": ["Eagle3DraftModel"],
        "model_type": "speculators",
        "speculators_model_type": "eagle3",
        "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "target"}},
        "transformer_layer_config": {
            "model_type": "llama",
            "hidden_size": spec.hidden,
            "intermediate_size": INTERMEDIATE,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "num_hidden_layers": 1,
            "vocab_size": spec.vocab,
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": spec.max_position_embeddings,
            "rope_theta": 500000.0,
        },
        "draft_vocab_size": spec.draft_vocab,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in spec.aux_ids or AUX_IDS],
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "tie_word_embeddings": False,
    }


def speculators_draft(folder: Path, **config_changes: Any) -> Path:
    spec = DraftSpec(layer="layers.0", with_embedding=True)
    folder.mkdir(parents=True, exist_ok=True)
    config = speculators_config(spec) | config_changes
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tensors = spec.tensors()
    if config.get("norm_before_fc"):
        tensors["input_norm.weight"] = ("BF16", (3 * HIDDEN,), None)
    (folder / "model.safetensors").write_bytes(safetensors_bytes(tensors))
    return folder


def torch_state(spec: DraftSpec) -> dict[str, Any]:
    """The spec's tensors as torch tensors, for a `.bin` checkpoint."""
    import torch

    state = {}
    for name, (dtype, shape, data) in spec.tensors().items():
        if dtype == "I64":
            assert data is not None
            state[name] = torch.tensor(array.array("q", data).tolist(), dtype=torch.int64)
        elif dtype == "BOOL":
            state[name] = torch.zeros(shape, dtype=torch.bool)
        else:
            state[name] = torch.randn(shape, generator=torch.Generator().manual_seed(len(name))).to(torch.bfloat16)
    return state


def eagle_bin_draft(folder: Path) -> Path:
    """An original-EAGLE draft: pytorch_model.bin and a LlamaForCausalLM config without aux ids."""
    import torch

    spec = DraftSpec(aux_ids=None)
    folder.mkdir(parents=True, exist_ok=True)
    config = spec.config()
    config["architectures"] = ["LlamaForCausalLM"]
    del config["target_hidden_size"]
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    torch.save(torch_state(spec), folder / "pytorch_model.bin")
    return folder


# --- draft folders laid out as people leave them: shards, indexes, leftovers ----------------------------------


def shard_name(i: int, shards: int) -> str:
    return f"model-{i + 1:05d}-of-{shards:05d}.safetensors"


def sharded_draft(folder: Path, spec: DraftSpec | None = None, *, shards: int = 2, index: bool = True) -> Path:
    """The spec's draft split over `shards` safetensors files, with model.safetensors.index.json unless told not."""
    spec = spec or DraftSpec()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(spec.config(), indent=2))
    items = list(spec.tensors().items())
    weight_map: dict[str, str] = {}
    for i in range(shards):
        part = dict(items[i::shards])
        (folder / shard_name(i, shards)).write_bytes(safetensors_bytes(part, {"format": "pt"}))
        weight_map |= dict.fromkeys(part, shard_name(i, shards))
    if index:
        (folder / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return folder


def stale_single_file(folder: Path, spec: DraftSpec | None = None) -> Path:
    """A complete model.safetensors left beside shards (an older save, a half-finished re-shard)."""
    (folder / "model.safetensors").write_bytes(safetensors_bytes((spec or DraftSpec()).tensors(), {"format": "pt"}))
    return folder


def bin_draft(folder: Path, spec: DraftSpec | None = None) -> Path:
    """The spec's SGLang-layout draft (LlamaForCausalLMEagle3, midlayer.*) saved as pytorch_model.bin only."""
    import torch

    spec = spec or DraftSpec()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(spec.config(), indent=2))
    torch.save(torch_state(spec), folder / "pytorch_model.bin")
    return folder


def write_target(
    folder: Path,
    *,
    architecture: str = TARGET_ARCH,
    layers: int = TARGET_LAYERS,
    hidden: int = HIDDEN,
    vocab: int = VOCAB,
    context: int = CONTEXT,
    shards: int = 2,
    nested: bool = False,
    config_changes: Mapping[str, Any] | None = None,
) -> Path:
    """A target: config.json and a sharded checkpoint whose data is sparse (headers are real)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "max_position_embeddings": context,
        "num_attention_heads": HEADS,
    } | dict(config_changes or {})
    config: dict[str, Any] = {"architectures": [architecture], "model_type": "llama"}
    config |= {"text_config": text} if nested else text
    (folder / "config.json").write_text(json.dumps(config))
    names: dict[str, tuple[str, Shape]] = {"model.embed_tokens.weight": ("BF16", (vocab, hidden))}
    for i in range(layers):
        names[f"model.layers.{i}.mlp.down_proj.weight"] = ("BF16", (hidden, 4 * hidden))
    names["lm_head.weight"] = ("BF16", (vocab, hidden))
    write_sparse_shards(folder, names, shards)
    return folder


def write_sparse_shards(folder: Path, names: Mapping[str, tuple[str, Shape]], shards: int) -> None:
    """Safetensors shards with real headers and hole-filled data, plus their index."""
    items = list(names.items())
    weight_map: dict[str, str] = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header: dict[str, Any] = {}
        offset = 0
        for name, (dtype, shape) in items[s::shards]:
            size = math.prod(shape) * DTYPE_BYTES[dtype]
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
            weight_map[name] = file
            offset += size
        raw = json.dumps(header).encode()
        with (folder / file).open("wb") as fh:
            fh.write(struct.pack("<Q", len(raw)) + raw)
            fh.truncate(8 + len(raw) + offset)
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def write_manifest(folder: Path, **changes: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(
        target_path="target",
        architecture=TARGET_ARCH,
        num_layers=TARGET_LAYERS,
        hidden_size=HIDDEN,
        vocab_size=VOCAB,
        dtype="bfloat16",
        aux_layer_ids=list(AUX_IDS),
        tokenizer="target",
        chat_template=None,
        max_length=2048,
    )
    data = manifest.to_json() | changes
    (folder / "manifest.json").write_text(json.dumps(data))
    return folder
