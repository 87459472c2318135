"""Rules on tensor names: SGLang's load_weights, simulated, skips some tensors and never fills some parameters,
both without a word.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from backends.doctor.codes import convert_fix, finding
from backends.doctor.draft_config import num_aux
from backends.doctor.layer_names import LAYER
from backends.doctor.rule_context import Context
from backends.protocol import Finding
from backends.sglang import facts


def _option_prefixes(options: Iterable[str]) -> tuple[str, ...]:
    return tuple(p for o in facts.DRAFT_OPTIONS if o.name in options for p in o.weight_prefixes)


def weight_name_rules(ctx: Context, release: facts.ReleaseFacts) -> list[Finding]:
    """Simulate load_weights: which tensors it skips and which parameters it never fills."""
    assert ctx.geo is not None
    g, view, draft = ctx.geo, ctx.view, ctx.files.root
    tied = view.get("tie_word_embeddings") is True
    params = facts.llama_draft_parameters(
        release,
        num_layers=g.num_layers,
        num_aux=num_aux(release, view),
        fc_bias=bool(view.get("bias")),
        tied=tied,
        options=ctx.options,
    )
    filled: dict[str, set[str | int | None]] = {p: set() for p in params}
    dropped: list[str] = []
    for name in ctx.files.tensors:
        param, shard = facts.sglang_destination(release, name, params)
        if param:
            filled[param].add(shard)
        elif shard is None:
            dropped.append(name)
    # Parameters SGLang fills from the target after loading.
    optional = {"model.embed_tokens.weight"} if g.target_hidden == g.hidden else set()
    if g.draft_vocab is None:
        optional.add("lm_head.weight")
    optional |= {p for p in params if re.match(r"model\.layers\.[1-9]\d*\.input_layernorm", p)}  # unused
    missing = sorted(p for p, shards in filled.items() if p not in optional and set(params[p]) - shards)

    # Tensors already explained by another finding are not reported twice.
    unsupported = [o for o in ctx.options if o not in release.options]
    explained = _option_prefixes(unsupported)
    dropped = [n for n in dropped if not n.removeprefix("model.").startswith(explained)]
    if tied:
        dropped = [n for n in dropped if n.removeprefix("model.") != "lm_head.weight"]
    found: list[Finding] = []
    renamed = [n for n in dropped if LAYER.match(n)]
    if renamed:
        layout = "layers.N" if release.layer_template == "midlayer" else "midlayer"
        # The layer parameters these tensors were meant for are the same fault.
        missing = [p for p in missing if not LAYER.match(p.removeprefix("model."))]
        found.append(
            finding(
                "weights-dropped",
                "error",
                f"SGLang {release.version} names the draft layer {release.layer_template.format(i='N')}.*, the "
                f"checkpoint has {layout}.* ({len(renamed)} tensors, e.g. {renamed[0]}): SGLang skips them without "
                "a word and serves an untrained layer (acceptance about 1.0)",
                f"run {convert_fix(draft)}, or upgrade SGLang to 0.5.23 or newer (it also loads layers.0.*)",
            )
        )
    others = [n for n in dropped if not LAYER.match(n)]
    for name in others:
        hint = _dropped_hint(name)
        found.append(
            finding(
                "weights-dropped",
                "error" if hint else "warning",
                f"SGLang {release.version} skips checkpoint tensor {name}: no parameter has that name"
                + (f" ({hint[0]})" if hint else ""),
                hint[1] if hint else "remove the tensor, or rename it to the SGLang name it was meant for",
            )
        )
    if missing:
        found.append(
            finding(
                "weights-missing",
                "error",
                f"SGLang {release.version} would leave {len(missing)} parameter(s) uninitialised: "
                + ", ".join(_describe_missing(p, params[p], filled[p]) for p in missing),
                "add the tensors to the checkpoint (re-export from the trainer); SGLang never reports them",
            )
        )
    return found


def _dropped_hint(name: str) -> tuple[str, str] | None:
    bare = name.removeprefix("model.")
    if bare.startswith("input_norm."):
        return "trained with norm_before_fc", 'set "norm_before_fc": true in config.json (SGLang 0.5.23 or newer)'
    if bare.startswith(("fc_norm.", "aux_norm_")):
        return "trained with fc_norm", 'set "fc_norm": true in config.json (SGLang 0.5.23 or newer)'
    if bare.startswith("lm_head") and name != bare:
        return "SGLang expects the head as lm_head.weight at top level", "rename it to lm_head.weight"
    return None


def _describe_missing(param: str, shards: tuple[str | int | None, ...], got: set[str | int | None]) -> str:
    name = param.removeprefix("model.")
    if shards == (None,):
        return name
    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", 0: "gate_proj", 1: "up_proj"}
    lacking = [names.get(s, str(s)) for s in shards if s not in got]
    return f"{name} (no {'/'.join(lacking)})"
