"""The draft's config.json as SGLang reads it: its defaults filled in, its geometry, aux layer ids and options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.doctor.codes import finding
from backends.doctor.config_values import int_list, positive_int
from backends.doctor.reading import DraftFiles
from backends.protocol import Finding
from backends.sglang import facts


def sglang_view(files: DraftFiles) -> dict[str, Any]:
    """The config as SGLang would see it: LlamaConfig defaults for fields the file leaves out.

    A speculators config keeps the layer geometry in `transformer_layer_config`
    and its aux ids in the input-of-layer convention; it is flattened here the
    way `convert` writes it, so that its geometry can be checked before converting.
    """
    config = files.config
    if files.format != "speculators":
        return {**facts.LLAMA_CONFIG_DEFAULTS, **config}
    layer = config.get("transformer_layer_config")
    layer = layer if isinstance(layer, dict) else {}
    view: dict[str, Any] = {**facts.LLAMA_CONFIG_DEFAULTS, **layer}
    for key in ("draft_vocab_size", "tie_word_embeddings", *(k for o in facts.DRAFT_OPTIONS for k in o.config_keys)):
        if key in config:
            view[key] = config[key]
    if config.get("target_hidden_size") is not None:
        view["target_hidden_size"] = config["target_hidden_size"]
    ids = int_list(config.get("eagle_aux_hidden_state_layer_ids"))
    if ids is not None:
        view["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids], "use_aux_hidden_state": True}
    view["architectures"] = config.get("architectures")
    return view


@dataclass
class Geometry:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    draft_vocab: int | None  # None: the head is borrowed from the target
    target_hidden: int
    num_layers: int


def geometry(view: Mapping[str, Any]) -> tuple[Geometry | None, list[Finding]]:
    found: list[Finding] = []
    values: dict[str, int] = {}
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "num_hidden_layers"):
        value = positive_int(view.get(key))
        if value is None:
            found.append(
                finding("config-invalid", "error", f"draft config {key} = {view.get(key)!r} is not a positive integer")
            )
        else:
            values[key] = value
    kv = view.get("num_key_value_heads")
    kv_heads = values.get("num_attention_heads", 0) if kv is None else positive_int(kv)
    if kv_heads is None:
        found.append(finding("config-invalid", "error", f"draft config num_key_value_heads = {kv!r} is not valid"))
    target_hidden = values.get("hidden_size", 0)
    if "target_hidden_size" in view:
        th = positive_int(view["target_hidden_size"])
        if th is None:
            found.append(
                finding(
                    "config-invalid",
                    "error",
                    f"draft config target_hidden_size = {view['target_hidden_size']!r}: SGLang uses it as given "
                    "and fails to build fc",
                    "set it to the target's hidden size, or remove the key when it equals hidden_size",
                )
            )
        else:
            target_hidden = th
    draft_vocab = view.get("draft_vocab_size")
    if draft_vocab is not None and positive_int(draft_vocab) is None:
        found.append(finding("config-invalid", "error", f"draft config draft_vocab_size = {draft_vocab!r} is invalid"))
    if found or kv_heads is None:
        return None, found
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    head_dim = positive_int(view.get("head_dim")) or hidden // heads
    return Geometry(
        hidden=hidden,
        intermediate=values["intermediate_size"],
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=values["vocab_size"],
        draft_vocab=draft_vocab if isinstance(draft_vocab, int) else None,
        target_hidden=target_hidden,
        num_layers=values["num_hidden_layers"],
    ), []


def aux_ids(view: Mapping[str, Any]) -> list[int] | None:
    """eagle_config.eagle_aux_hidden_state_layer_ids, the only place SGLang reads them."""
    eagle = view.get("eagle_config")
    return int_list(eagle.get("eagle_aux_hidden_state_layer_ids")) if isinstance(eagle, dict) else None


def enabled_options(view: Mapping[str, Any]) -> frozenset[str]:
    eagle = view.get("eagle_config") if isinstance(view.get("eagle_config"), dict) else {}
    on = set()
    for option in facts.DRAFT_OPTIONS:
        for key in option.config_keys:
            if view.get(key) or (option.in_eagle_config and isinstance(eagle, dict) and eagle.get(key)):
                on.add(option.name)
    return frozenset(on)


def num_aux(release: facts.ReleaseFacts, view: Mapping[str, Any]) -> int:
    """How many aux states SGLang sizes fc for."""
    if not release.num_aux_from_config:
        return 3
    explicit = positive_int(view.get("num_aux_hidden_states"))
    ids = aux_ids(view)
    return explicit or (len(ids) if ids else 3)
