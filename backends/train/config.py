"""The draft's config: derived from the target and the manifest, or read from a
SGLang/SpecForge config.json, and checked against the data before any training.

Written out through the contract's `sglang_draft_config`, so every checkpoint's
config.json is what SGLang's `LlamaForCausalLMEagle3` reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.eagle3_contract import ContractError, Manifest, sglang_draft_config
from backends.train.target import TargetConfig


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    hidden_act: str

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    @staticmethod
    def from_target(target: TargetConfig, manifest: Manifest, draft_vocab_size: int) -> DraftConfig:
        """SpecForge's stock recipe: the target's layer shape, its RoPE and context length
        (a shorter draft context makes SGLang refuse to start), aux ids from the manifest."""
        return DraftConfig(
            hidden_size=target.hidden_size,
            intermediate_size=target.intermediate_size,
            num_attention_heads=target.num_attention_heads,
            num_key_value_heads=target.num_key_value_heads,
            head_dim=target.head_dim,
            vocab_size=target.vocab_size,
            draft_vocab_size=min(draft_vocab_size, target.vocab_size),
            target_hidden_size=target.hidden_size,
            aux_layer_ids=tuple(manifest.aux_layer_ids),
            max_position_embeddings=target.max_position_embeddings,
            rms_norm_eps=target.rms_norm_eps,
            rope_theta=target.rope_theta,
            rope_scaling=target.rope_scaling,
            hidden_act=target.hidden_act,
        )

    @staticmethod
    def from_json(cfg: dict[str, Any], manifest: Manifest) -> DraftConfig:
        """A SGLang/SpecForge draft config.json; aux ids default to the manifest's when it has none."""
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            eagle = cfg.get("eagle_config") or {}
            ids = eagle.get("eagle_aux_hidden_state_layer_ids")
            return DraftConfig(
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                vocab_size=int(cfg["vocab_size"]),
                draft_vocab_size=int(cfg["draft_vocab_size"]),
                target_hidden_size=int(cfg.get("target_hidden_size") or hidden),
                aux_layer_ids=tuple(int(i) for i in ids) if ids is not None else tuple(manifest.aux_layer_ids),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(cfg.get("rope_theta", 10000.0)),
                rope_scaling=cfg.get("rope_scaling"),
                hidden_act=str(cfg.get("hidden_act", "silu")),
            )
        except KeyError as exc:
            raise ContractError(f"the draft config lacks {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ContractError(f"the draft config has a field of the wrong type: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        return sglang_draft_config(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            draft_vocab_size=self.draft_vocab_size,
            target_hidden_size=self.target_hidden_size,
            aux_layer_ids=list(self.aux_layer_ids),
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=self.rope_scaling,
            hidden_act=self.hidden_act,
        )


def check_target(manifest: Manifest, target: TargetConfig) -> None:
    """The data must come from this target: same architecture, width, vocabulary and depth."""
    pairs = (
        ("architecture", manifest.architecture, target.architecture),
        ("hidden size", manifest.hidden_size, target.hidden_size),
        ("vocabulary size", manifest.vocab_size, target.vocab_size),
        ("number of layers", manifest.num_layers, target.num_layers),
    )
    for what, data, model in pairs:
        if data != model:
            raise ContractError(
                f"the data was extracted from a target with {what} {data} (manifest.json), "
                f"but --target has {what} {model}: extract with this target or pass the one the data came from"
            )


def check_draft(draft: DraftConfig, manifest: Manifest) -> None:
    """Refuse data the draft cannot take: fc width, embedding width, vocabulary, aux layers."""
    if draft.target_hidden_size != manifest.hidden_size:
        raise ContractError(
            f"the draft config expects target hidden size {draft.target_hidden_size}, "
            f"but the data's hidden size is {manifest.hidden_size} (manifest.json)"
        )
    if draft.hidden_size != manifest.hidden_size:
        raise ContractError(
            f"the draft config's hidden_size {draft.hidden_size} differs from the target's {manifest.hidden_size}; "
            "this trainer copies the target's embedding into the draft, so they must be equal"
        )
    if draft.vocab_size != manifest.vocab_size:
        raise ContractError(
            f"the draft config's vocab_size {draft.vocab_size} differs from the data's {manifest.vocab_size} "
            "(manifest.json): the draft's d2t maps into the target's vocabulary"
        )
    if not 0 < draft.draft_vocab_size <= draft.vocab_size:
        raise ContractError(
            f"draft_vocab_size {draft.draft_vocab_size} must be between 1 and the vocabulary size {draft.vocab_size}"
        )
    if draft.num_aux != manifest.num_aux:
        raise ContractError(
            f"the draft's fc takes {draft.num_aux} aux hidden states (eagle_aux_hidden_state_layer_ids "
            f"{list(draft.aux_layer_ids)}), but the data has {manifest.num_aux} "
            f"(manifest aux_layer_ids {manifest.aux_layer_ids})"
        )
    if list(draft.aux_layer_ids) != manifest.aux_layer_ids:
        raise ContractError(
            f"the draft config says eagle_aux_hidden_state_layer_ids {list(draft.aux_layer_ids)}, but the data "
            f"was captured at {manifest.aux_layer_ids} (manifest.json, same convention): SGLang would feed "
            "the draft other layers than it was trained on"
        )
