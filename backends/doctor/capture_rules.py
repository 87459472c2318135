"""Rules on the aux layers: which target layers SGLang captures, against the manifest and the draft config."""

from __future__ import annotations

from dataclasses import dataclass

from backends.doctor.codes import finding
from backends.doctor.rule_context import Context
from backends.protocol import Finding
from backends.sglang import facts


@dataclass
class Capture:
    count: int | None  # distinct in-range capture points, None when unknown
    findings: list[Finding]


def capture(ctx: Context, release: facts.ReleaseFacts, ids: list[int] | None) -> Capture:
    """Which target layers SGLang captures, against the manifest and the draft config."""
    found: list[Finding] = []
    t, m = ctx.target, ctx.manifest
    if t is None or t.architecture is None or t.num_layers is None:
        if m is not None and ids is not None and ids != m.aux_layer_ids:
            found.append(_mismatch(release, ids, m.aux_layer_ids, "the draft config lists"))
        return Capture(None, found)
    if t.architecture not in release.capture_classes:
        found.append(
            finding(
                "target-no-capture",
                "error",
                f"{t.architecture} has no set_eagle3_layers_to_capture in SGLang {release.version}: the scheduler "
                "fails at startup",
                "use a newer SGLang that implements EAGLE-3 capture for this model, or another target",
            )
        )
        return Capture(None, found)
    rule = release.capture_rules.get(t.architecture, "plus_one")
    points = facts.capture_points(rule, t.num_layers, ids)
    reachable = facts.capturable(rule, t.num_layers)
    outputs = [p - 1 for p in points]
    found.append(
        finding(
            "aux-layers",
            "info",
            f"draft config aux ids: {ids if ids is not None else 'none (SGLang defaults)'}; manifest: "
            f"{m.aux_layer_ids if m else 'not given'}; SGLang {release.version} captures {t.architecture} at the "
            f"inputs of layers {points} = outputs of layers {outputs} ({facts.CAPTURE_RULES[rule]})",
        )
    )
    outside = [p for p in points if p not in reachable]
    count: int | None = len(set(points))
    if outside:
        count = None  # the width consequence is this same fault
        found.append(
            finding(
                "aux-layers-out-of-range",
                "error",
                f"SGLang would capture at the inputs of layers {outside}, which {t.architecture} with "
                f"{t.num_layers} layers never reaches: those features are silently missing",
                "aux ids count outputs of layers 0..N-1; fix eagle_config.eagle_aux_hidden_state_layer_ids",
            )
        )
    elif len(set(points)) != len(points):
        count = None
        found.append(
            finding(
                "aux-layers-out-of-range",
                "error",
                f"aux ids {ids} repeat a layer; SGLang captures it once, so the features are too narrow",
                "list each aux layer once",
            )
        )
    trained = m.aux_layer_ids if m is not None else ids
    if trained is not None and outputs != trained:
        source = "the extraction manifest says the draft was trained on" if m else "the draft config lists"
        found.append(_mismatch(release, outputs, trained, source, t.architecture))
    default_points = facts.capture_points(rule, t.num_layers, None)
    if release.custom_ids_after_graph_capture and ids is not None and points != default_points:
        found.append(
            finding(
                "aux-layers-cuda-graph",
                "warning",
                f"SGLang {release.version} captures the target's CUDA graphs with the default layers "
                f"{default_points} before it applies the draft's {points}; graph replays (decode, verify) feed "
                "the defaults",
                "launch with --disable-cuda-graph, upgrade SGLang to 0.5.23 or newer, "
                "or train the draft on the default layers",
            )
        )
    return Capture(count, found)


def _mismatch(
    release: facts.ReleaseFacts, captured: list[int], trained: list[int], source: str, arch: str | None = None
) -> Finding:
    what = f"SGLang {release.version} captures outputs of layers {captured}" + (f" for {arch}" if arch else "")
    if arch is None:
        what = f"the draft config lists {captured}"
    return finding(
        "aux-layers-mismatch",
        "error",
        f"{what}, but {source} {trained}: the draft sees other layers than it was trained on",
        "write the trained ids (output-of-layer convention) into eagle_config.eagle_aux_hidden_state_layer_ids"
        + (" as this target family expects them" if arch and release.capture_rules.get(arch) else ""),
    )
