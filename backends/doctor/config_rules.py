"""Rules on the draft's config.json: its vocabulary sizes, tied embeddings, where its aux ids stand, and what
each SGLang release accepts of it (architecture, model_type, number of layers, draft options).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backends.doctor.codes import convert_fix, finding
from backends.doctor.config_values import first_architecture, positive_int
from backends.doctor.draft_config import aux_ids
from backends.doctor.rule_context import Context
from backends.protocol import Finding
from backends.sglang import facts


def draft_vocab_size_rules(ctx: Context) -> list[Finding]:
    found: list[Finding] = []
    g = ctx.geo
    if "draft_vocab_size" not in ctx.view:
        found.append(
            finding(
                "draft-vocab-size",
                "error",
                "draft config has no draft_vocab_size; SGLang reads it without a default and fails to start",
                'add "draft_vocab_size": <rows of lm_head.weight> to config.json (null borrows the target\'s head)',
            )
        )
    if g is not None and g.draft_vocab is not None and g.draft_vocab > g.vocab:
        found.append(
            finding(
                "draft-vocab-size",
                "error",
                f"draft_vocab_size {g.draft_vocab} is larger than vocab_size {g.vocab}",
                "draft_vocab_size counts the draft's head rows; vocab_size must be the target's vocabulary",
            )
        )
    return found


def tied_embeddings_rule(ctx: Context, canon: Mapping[str, str]) -> list[Finding]:
    found: list[Finding] = []
    if ctx.view.get("tie_word_embeddings") is True:
        if "lm_head.weight" in canon:
            found.append(
                finding(
                    "tied-embeddings",
                    "error",
                    "tie_word_embeddings is true, so SGLang uses the (target's) embedding as the head and skips "
                    "the checkpoint's trained lm_head.weight",
                    'set "tie_word_embeddings": false in config.json',
                )
            )
        else:
            found.append(
                finding(
                    "tied-embeddings",
                    "warning",
                    "tie_word_embeddings is true: the draft's head will be the target's embedding",
                    "EAGLE-3 drafts train their own head; check that this is intended",
                )
            )
    return found


def aux_ids_ignored_rule(ctx: Context) -> list[Finding]:
    """Aux ids at the top level of config.json, where SGLang never looks for them."""
    found: list[Finding] = []
    files = ctx.files
    if (
        files.format != "speculators"
        and aux_ids(ctx.view) is None
        and "eagle_aux_hidden_state_layer_ids" in files.config
    ):
        found.append(
            finding(
                "aux-ids-ignored",
                "warning",
                "config.json has eagle_aux_hidden_state_layer_ids at top level; SGLang reads them only from "
                "eagle_config, so it captures its default layers",
                'move them to "eagle_config": {"eagle_aux_hidden_state_layer_ids": [...]} (output-of-layer convention)',
            )
        )
    return found


def too_many_layers(view: Mapping[str, Any], release: facts.ReleaseFacts) -> bool:
    layers = positive_int(view.get("num_hidden_layers"))
    return release.max_draft_layers is not None and layers is not None and layers > release.max_draft_layers


def release_config_rules(ctx: Context, release: facts.ReleaseFacts) -> list[Finding]:
    """What this SGLang release accepts of the draft config."""
    found: list[Finding] = []
    view, draft = ctx.view, ctx.files.root
    archs = view.get("architectures")
    arch = first_architecture(view)
    if arch not in release.draft_architectures:
        known = ", ".join(sorted(release.draft_architectures))
        fix = (
            convert_fix(draft)
            if ctx.files.format in ("speculators", "eagle-bin")
            else f'set "architectures": ["{facts.LLAMA_DRAFT}"] in config.json'
        )
        found.append(
            finding(
                "architecture",
                "error",
                f"architectures {archs!r}: SGLang {release.version} loads EAGLE-3 drafts only as {known}",
                fix,
            )
        )
    model_type = ctx.files.config.get("model_type")
    if arch == facts.LLAMA_DRAFT and ctx.files.format != "speculators" and model_type != "llama":
        found.append(
            finding(
                "model-type",
                "error" if model_type in (None, "speculators", "eagle3") else "warning",
                f"model_type {model_type!r}: SGLang builds {facts.LLAMA_DRAFT} from a LlamaConfig",
                'set "model_type": "llama" in config.json',
            )
        )
    if too_many_layers(view, release):
        layers = positive_int(view.get("num_hidden_layers"))
        found.append(
            finding(
                "num-layers",
                "error",
                f"num_hidden_layers is {layers}; SGLang {release.version} supports only "
                f"{release.max_draft_layers} draft layer ('EAGLE3 currently only supports 1 layer')",
                "upgrade SGLang to 0.5.23 or newer for multi-layer drafts, or train a one-layer draft",
            )
        )
    unsupported = sorted(o for o in ctx.options if o not in release.options)
    for name in unsupported:
        option = next(o for o in facts.DRAFT_OPTIONS if o.name == name)
        newer = [v for v, r in facts.RELEASES.items() if name in r.options]
        fix = f"serve with SGLang {newer[-1]} or newer" if newer else "retrain the draft without it"
        found.append(
            finding(
                "unsupported-option",
                "error",
                f"the draft uses {name} ({option.what}); SGLang {release.version} does not implement it, "
                "so it serves different math than was trained",
                fix,
            )
        )
    return found
