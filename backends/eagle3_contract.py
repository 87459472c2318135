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

import itertools
import json
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
    from safetensors.torch import save_file

    if not samples:
        raise ContractError("a shard needs at least one sample")
    lengths = [int(s["input_ids"].shape[0]) for s in samples]
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    tensors = {
        "input_ids": torch.cat([s["input_ids"].to(torch.int64) for s in samples]),
        "loss_mask": torch.cat([s["loss_mask"].to(torch.int8) for s in samples]),
        "hidden_state": torch.cat([s["hidden_state"] for s in samples]).contiguous(),
        "aux_hidden_states": torch.cat([s["aux_hidden_states"] for s in samples]).contiguous(),
        "sample_offsets": offsets,
    }
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)
    return ShardInfo(file=path.name, samples=len(samples), tokens=sum(lengths))


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
