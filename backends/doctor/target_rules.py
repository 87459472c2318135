"""Rules that hold the draft against the target it will serve with and the extraction it was trained from."""

from __future__ import annotations

from backends.doctor.codes import finding
from backends.doctor.rule_context import Context
from backends.protocol import Finding
from backends.sglang import facts


def target_hidden_size_rule(ctx: Context) -> list[Finding]:
    g, t = ctx.geo, ctx.target
    if g is None or t is None or t.hidden is None or t.hidden == g.target_hidden:
        return []
    return [
        finding(
            "target-hidden-size",
            "error",
            f"the draft expects target hidden states of width {g.target_hidden}, "
            f"the target ({t.path}) has hidden_size {t.hidden}",
            "serve the draft with the target it was trained on, or set target_hidden_size correctly",
        )
    ]


def context_length_rule(ctx: Context) -> list[Finding]:
    wanted = ctx.context_length or (ctx.target.context_length if ctx.target else None)
    if wanted is None:
        return []
    draft_len = facts.derived_context_length(ctx.view)
    if wanted <= draft_len:
        return []
    source = "--context-length" if ctx.context_length else "the target's config"
    return [
        finding(
            "context-length",
            "error",
            f"the draft's context length is {draft_len} (max_position_embeddings), {source} asks for {wanted}: "
            "SGLang refuses to start the draft",
            f'set "max_position_embeddings": {wanted} in the draft\'s config.json, or launch with '
            f"{facts.LONGER_CONTEXT_ENV}=1, or a smaller --context-length",
        )
    ]


def manifest_rules(ctx: Context) -> list[Finding]:
    m, g, t = ctx.manifest, ctx.geo, ctx.target
    if m is None or g is None:
        return []
    problems = []
    if m.hidden_size != g.target_hidden:
        problems.append(f"hidden_size {m.hidden_size} (the draft expects {g.target_hidden})")
    if m.vocab_size != g.vocab:
        problems.append(f"vocab_size {m.vocab_size} (the draft says {g.vocab})")
    if t is not None:
        if t.num_layers is not None and m.num_layers != t.num_layers:
            problems.append(f"num_layers {m.num_layers} (the target has {t.num_layers})")
        if t.architecture is not None and m.architecture != t.architecture:
            problems.append(f"architecture {m.architecture} (the target is {t.architecture})")
    if not problems:
        return []
    return [
        finding(
            "manifest-mismatch",
            "error",
            "the extraction manifest describes another model: " + ", ".join(problems),
            "check that --data and --target belong to this draft's training run",
        )
    ]
