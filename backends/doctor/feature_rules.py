"""Rules on the features the target feeds the draft, against what the draft's fc was trained to take."""

from __future__ import annotations

from backends.doctor.capture_rules import capture
from backends.doctor.codes import finding
from backends.doctor.draft_config import aux_ids, num_aux
from backends.doctor.layer_names import canonical_names
from backends.doctor.rule_context import Context
from backends.protocol import Finding
from backends.sglang import facts


def feature_rules(ctx: Context, release: facts.ReleaseFacts) -> list[Finding]:
    """What the target will feed the draft, against what the draft's fc takes."""
    assert ctx.geo is not None
    g, view, found = ctx.geo, ctx.view, []
    canon = canonical_names(ctx.files.tensors)
    fc = ctx.files.tensors.get(canon.get("fc.weight", ""))
    sglang_fc_in = num_aux(release, view) * g.target_hidden
    target_hidden = g.target_hidden  # a target that disagrees is reported as target-hidden-size
    ids = aux_ids(view)
    eagle = view.get("eagle_config")
    flag = eagle.get("use_aux_hidden_state") if isinstance(eagle, dict) else None
    use_aux = not (release.honours_use_aux_flag and flag is False)
    captured = capture(ctx, release, ids)
    found += captured.findings
    n_features = (captured.count if captured.count is not None else len(ids) if ids else 3) if use_aux else 1
    delivered = n_features * target_hidden
    if fc is None or len(fc.shape) != 2:
        return found
    fc_out, fc_in = fc.shape
    if fc_out != g.hidden:
        found.append(
            finding(
                "fc-width",
                "error",
                f"fc.weight is {list(fc.shape)}: its output must be hidden_size {g.hidden}",
                "fix hidden_size in config.json or re-export fc",
            )
        )
    if delivered == g.hidden and fc_in != g.hidden:
        why = (
            "eagle_config.use_aux_hidden_state is false"
            if not use_aux
            else f"{n_features} aux layer(s) x target hidden {target_hidden}"
        )
        fix = (
            'set "use_aux_hidden_state": true in eagle_config'
            if not use_aux
            else "list the aux layers the draft was trained on in eagle_config.eagle_aux_hidden_state_layer_ids"
            + (f" ({ctx.manifest.aux_layer_ids} per the extraction manifest)" if ctx.manifest else "")
        )
        found.append(
            finding(
                "single-layer-features",
                "error",
                f"SGLang {release.version} will feed features of width {delivered} ({why}) = hidden_size, so it "
                f"skips fc, whose weights expect {fc_in} fused features: the trained fc is never applied "
                "(acceptance about 1.0)",
                fix,
            )
        )
    elif fc_in != sglang_fc_in:
        layers_trained = fc_in / g.target_hidden
        found.append(
            finding(
                "fc-width",
                "error",
                f"fc.weight takes {fc_in} features ({layers_trained:g} x target hidden {g.target_hidden}); SGLang "
                f"{release.version} builds fc for {sglang_fc_in} ({num_aux(release, view)} aux layers): the loader "
                "asserts and startup crashes",
                "make eagle_config.eagle_aux_hidden_state_layer_ids list the layers fc was trained on"
                if release.num_aux_from_config and fc_in % g.target_hidden == 0
                else "fc must be trained on 3 aux layers for this SGLang release; check target_hidden_size",
            )
        )
    elif delivered != fc_in:
        found.append(
            finding(
                "aux-count-mismatch",
                "error",
                f"the target will deliver {n_features} x {target_hidden} = {delivered} features, fc takes {fc_in}",
                "make the captured aux layers and target_hidden_size match what the draft was trained on",
            )
        )
    return found
