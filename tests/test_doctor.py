"""doctor finds each fault a draft can bring to an SGLang launch, from files alone: one
broken draft per finding code, each giving exactly its finding, plus the two faults of
the story (layers.0.* on 0.5.5, single-layer features) with a fix the user can follow."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.doctor import CODES, diagnose, dryload, rules
from backends.doctor.cli import main
from backends.doctor.reading import read_draft
from backends.protocol import DoctorResult, Finding
from tests.draft_fixtures import (
    AUX_IDS,
    DRAFT_VOCAB,
    HIDDEN,
    VOCAB,
    DraftSpec,
    eagle_bin_draft,
    good_draft,
    safetensors_bytes,
    sharded_draft,
    speculators_draft,
    stale_single_file,
    write_manifest,
    write_target,
)

REPO = Path(__file__).resolve().parent.parent


def problems(result: DoctorResult) -> set[str]:
    """Codes of the findings a user must act on."""
    return {f["code"] for f in result["findings"] if f["severity"] != "info"}


def the(result: DoctorResult, code: str) -> dict[str, Any]:
    matches = [f for f in result["findings"] if f["code"] == code]
    assert matches, f"no {code} in {result['findings']}"
    return dict(matches[0])


@dataclass
class Case:
    """A draft with one fault, how doctor is run on it, and the one code it must give."""

    code: str
    spec: DraftSpec = field(default_factory=DraftSpec)
    version: str | None = None
    target: dict[str, Any] | None = field(default_factory=dict)  # write_target kwargs; None: no target
    manifest: dict[str, Any] | None = None  # write_manifest changes; None: no --data
    context_length: int | None = None
    severity: str = "error"
    also: frozenset[str] = frozenset()  # findings the same files rightly give besides (documented per case)


CASES = {
    "fc-width": Case("fc-width", DraftSpec(fc_in=2 * HIDDEN)),
    "single-layer-features": Case("single-layer-features", DraftSpec(aux_ids=[5], fc_in=3 * HIDDEN), "0.5.23"),
    "d2t-missing": Case("d2t-missing", DraftSpec(drop=("d2t",))),
    "d2t-length": Case("d2t-length", DraftSpec(d2t=list(range(32)))),
    "d2t-range": Case("d2t-range", DraftSpec(d2t=[VOCAB, *range(1, DRAFT_VOCAB)])),
    "vocab-mismatch": Case("vocab-mismatch", target={"vocab": 2 * VOCAB}),
    "tied-embeddings": Case("tied-embeddings", DraftSpec(config_changes={"tie_word_embeddings": True})),
    "num-layers": Case("num-layers", DraftSpec(layer="layers.0", num_layers=2), "0.5.5"),
    "unsupported-option": Case(
        "unsupported-option",
        DraftSpec(
            config_changes={"fc_norm": True},
            extra={f"fc_norm.{k}.weight": ("BF16", (HIDDEN,), None) for k in range(3)},
        ),
        "0.5.5",
    ),
    "norm-before-residual": Case("unsupported-option", DraftSpec(config_changes={"norm_before_residual": True})),
    "context-length": Case("context-length", DraftSpec(max_position_embeddings=2048)),
    "context-length-flag": Case("context-length", target=None, context_length=8192),
    "architecture": Case("architecture", DraftSpec(config_changes={"architectures": ["LlamaForCausalLM"]})),
    "model-type": Case("model-type", DraftSpec(config_changes={"model_type": None})),
    "draft-vocab-size": Case("draft-vocab-size", DraftSpec(config_changes={"draft_vocab_size": None})),
    "config-invalid": Case("config-invalid", DraftSpec(config_changes={"target_hidden_size": "64"})),
    "weights-dropped": Case("weights-dropped", DraftSpec(layer="layers.0"), "0.5.5"),
    "weights-dropped-extra": Case(
        "weights-dropped", DraftSpec(extra={"input_norm.weight": ("BF16", (3 * HIDDEN,), None)}), "0.5.23"
    ),
    "weights-missing": Case("weights-missing", DraftSpec(drop=("midlayer.mlp.down_proj.weight",))),
    "weights-missing-shard": Case("weights-missing", DraftSpec(drop=("midlayer.self_attn.k_proj.weight",))),
    "weight-shape": Case(
        "weight-shape", DraftSpec(extra={"midlayer.self_attn.q_proj.weight": ("BF16", (64, HIDDEN), None)})
    ),
    "lm-head-rows": Case("lm-head-rows", DraftSpec(head_rows=48)),
    # Two ids on 0.5.5 are custom ids, which its CUDA graphs never see.
    "aux-count-mismatch": Case(
        "aux-count-mismatch",
        DraftSpec(aux_ids=[1, 8], fc_in=3 * HIDDEN),
        "0.5.5",
        also=frozenset({"aux-layers-cuda-graph"}),
    ),
    "target-hidden-size": Case("target-hidden-size", target={"hidden": 2 * HIDDEN}),
    "target-no-capture": Case("target-no-capture", target={"architecture": "MixtralForCausalLM"}),
    "target-unreadable": Case("target-unreadable", target={"config_changes": {}, "architecture": "<broken>"}),
    "aux-layers-mismatch": Case("aux-layers-mismatch", manifest={"aux_layer_ids": [2, 5, 8]}),
    "aux-layers-out-of-range": Case("aux-layers-out-of-range", DraftSpec(aux_ids=[1, 5, 11]), "0.5.23"),
    "aux-layers-cuda-graph": Case(
        "aux-layers-cuda-graph",
        DraftSpec(aux_ids=[2, 6, 9]),
        "0.5.5",
        manifest={"aux_layer_ids": [2, 6, 9]},
        severity="warning",
    ),
    "aux-ids-ignored": Case(
        "aux-ids-ignored",
        DraftSpec(aux_ids=None, config_changes={"eagle_aux_hidden_state_layer_ids": AUX_IDS}),
        severity="warning",
    ),
    "manifest-mismatch": Case("manifest-mismatch", manifest={"num_layers": 24}),
    "manifest-invalid": Case("manifest-invalid", manifest={"aux_layer_ids": []}),
}


def run_case(tmp_path: Path, case: Case) -> DoctorResult:
    draft = case.spec.write(tmp_path / "draft")
    target = None
    if case.target is not None:
        kwargs = dict(case.target)
        broken = kwargs.pop("architecture", None) == "<broken>"
        if not broken and "architecture" in case.target:
            kwargs["architecture"] = case.target["architecture"]
        target = write_target(tmp_path / "target", **kwargs)
        if broken:
            (target / "config.json").write_text("{not json")
    data = write_manifest(tmp_path / "data", **case.manifest) if case.manifest is not None else None
    return diagnose(draft, target=target, data=data, sglang_version=case.version, context_length=case.context_length)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_fault_gives_exactly_its_finding(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    result = run_case(tmp_path, case)
    assert problems(result) == {case.code} | case.also, result["findings"]
    item = the(result, case.code)
    assert item["severity"] == case.severity
    assert item["fix"], "every problem says what to do"
    assert (result["errors"] > 0) == (case.severity == "error")


def test_good_draft_passes_with_target_and_manifest(tmp_path: Path) -> None:
    draft = good_draft(tmp_path / "draft")
    result = diagnose(draft, target=write_target(tmp_path / "target"), data=write_manifest(tmp_path / "data"))
    assert result["format"] == "sglang"
    assert result["sglang_versions"] == ["0.5.5", "0.5.23"]
    assert problems(result) == set() and result["errors"] == result["warnings"] == 0
    aux = [f["message"] for f in result["findings"] if f["code"] == "aux-layers"]
    assert aux and all("outputs of layers [1, 5, 8]" in m for m in aux)


def test_story_fault_1_layers0_on_sglang_055(tmp_path: Path) -> None:
    draft = good_draft(tmp_path / "draft", layer="layers.0")
    old = diagnose(draft, sglang_version="0.5.5")
    item = the(old, "weights-dropped")
    assert "layers.N.*" in item["message"] and "midlayer" in item["message"]
    assert f"convert {draft}" in item["fix"] and "upgrade SGLang" in item["fix"]
    # 0.5.23 renames midlayer -> layers.0 and loads the very same checkpoint.
    assert problems(diagnose(draft, sglang_version="0.5.23")) == set()
    # Unknown release: both layouts reported, each tagged.
    both = diagnose(draft)
    assert both["errors"] == 1 and "0.5.5" in the(both, "weights-dropped")["message"]


def test_story_fault_2_single_layer_features(tmp_path: Path) -> None:
    """3 x 7168 = 21504 features trained, one layer served: fc is never applied."""
    draft = good_draft(tmp_path / "draft", aux_ids=[29], fc_in=3 * HIDDEN)
    target = write_target(tmp_path / "target", layers=61)
    data = write_manifest(tmp_path / "data", num_layers=61, aux_layer_ids=[1, 29, 57])
    result = diagnose(draft, target=target, data=data, sglang_version="0.5.5")
    item = the(result, "single-layer-features")
    assert "skips fc" in item["message"] and str(3 * HIDDEN) in item["message"]
    assert "[1, 29, 57]" in item["fix"]


def test_use_aux_hidden_state_false_on_0523(tmp_path: Path) -> None:
    spec = DraftSpec()
    config_changes = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX_IDS, "use_aux_hidden_state": False}}
    draft = DraftSpec(config_changes=config_changes).write(tmp_path / "draft")
    assert problems(diagnose(draft, sglang_version="0.5.23")) == {"single-layer-features"}
    assert "use_aux_hidden_state" in the(diagnose(draft, sglang_version="0.5.23"), "single-layer-features")["fix"]
    assert problems(diagnose(spec.write(tmp_path / "ok"), sglang_version="0.5.23")) == set()


def test_deepseek_family_reads_ids_differently_on_0523(tmp_path: Path) -> None:
    draft = good_draft(tmp_path / "draft", aux_ids=[2, 5, 8])
    target = write_target(tmp_path / "target", architecture="DeepseekV3ForCausalLM")
    old = diagnose(draft, target=target, sglang_version="0.5.5")
    new = diagnose(draft, target=target, sglang_version="0.5.23")
    assert "aux-layers-mismatch" not in problems(old)
    assert "aux-layers-mismatch" in problems(new)  # first id != 1: taken as capture inputs
    assert "outputs of layers [1, 4, 7]" in the(new, "aux-layers-mismatch")["message"]


def test_unknown_version_maps_to_nearest(tmp_path: Path) -> None:
    draft = good_draft(tmp_path / "draft")
    result = diagnose(draft, sglang_version="0.5.21")
    assert result["sglang_versions"] == ["0.5.23"]
    assert "rules of 0.5.23" in the(result, "sglang-version")["message"]
    assert diagnose(draft, sglang_version="0.4.9")["sglang_versions"] == ["0.5.5"]


def test_manifest_missing_is_a_warning(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    result = diagnose(good_draft(tmp_path / "draft"), data=tmp_path / "data")
    assert problems(result) == {"manifest-missing"} and result["errors"] == 0


def test_nested_text_config_target(tmp_path: Path) -> None:
    target = write_target(tmp_path / "target", nested=True, architecture="Qwen3VLForConditionalGeneration")
    result = diagnose(good_draft(tmp_path / "draft"), target=target, sglang_version="0.5.23")
    assert problems(result) == set()
    assert "target-no-capture" in problems(diagnose(tmp_path / "draft", target=target, sglang_version="0.5.5"))


def test_target_hidden_from_headers_when_config_lacks_it(tmp_path: Path) -> None:
    target = write_target(tmp_path / "target", hidden=2 * HIDDEN)
    config = json.loads((target / "config.json").read_text())
    del config["hidden_size"]
    (target / "config.json").write_text(json.dumps(config))
    assert problems(diagnose(good_draft(tmp_path / "draft"), target=target)) == {"target-hidden-size"}


def _cut(path: Path, keep: int) -> None:
    """Keep the first `keep` bytes (negative: drop that many from the end, so offsets lie outside)."""
    path.write_bytes(path.read_bytes()[:keep])


DAMAGES: list[tuple[str, Callable[[Path], object], str]] = [
    ("truncated-header", lambda d: _cut(d / "model.safetensors", keep=40), "weights-unreadable"),
    ("offsets-outside-file", lambda d: _cut(d / "model.safetensors", keep=-100), "weights-unreadable"),
    ("non-json-config", lambda d: (d / "config.json").write_text("{'not': json}"), "config-unreadable"),
    ("no-weights", lambda d: (d / "model.safetensors").unlink(), "draft-not-found"),
    ("no-config", lambda d: (d / "config.json").unlink(), "draft-not-found"),
]


@pytest.mark.parametrize(("damage", "code"), [d[1:] for d in DAMAGES], ids=[d[0] for d in DAMAGES])
def test_damaged_files(tmp_path: Path, damage: Callable[[Path], object], code: str) -> None:
    draft = good_draft(tmp_path / "draft")
    damage(draft)
    result = diagnose(draft)
    assert problems(result) == {code} and result["errors"] == 1
    assert result["format"] == "unknown"


def test_formats_recognised(tmp_path: Path) -> None:
    spec = diagnose(speculators_draft(tmp_path / "spec"), sglang_version="0.5.23")
    assert spec["format"] == "speculators"
    assert problems(spec) == {"architecture"} and "convert" in (the(spec, "architecture")["fix"] or "")
    eagle = diagnose(eagle_bin_draft(tmp_path / "bin"), sglang_version="0.5.5")
    assert eagle["format"] == "eagle-bin" and problems(eagle) == {"architecture"}
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text("{}")
    (tmp_path / "odd" / "model.safetensors").write_bytes(safetensors_bytes({"w": ("F32", (2,), None)}))
    odd = diagnose(tmp_path / "odd")
    assert odd["format"] == "unknown" and the(odd, "draft-format")["severity"] == "warning"


def test_speculators_norm_before_fc_needs_0523(tmp_path: Path) -> None:
    draft = speculators_draft(tmp_path / "spec", norm_before_fc=True)
    old = diagnose(draft, sglang_version="0.5.5")
    assert {"unsupported-option", "architecture"} <= problems(old)
    assert "unsupported-option" not in problems(diagnose(draft, sglang_version="0.5.23"))


def every_draft_of_this_file(tmp_path: Path) -> dict[str, list[Finding]]:
    """doctor's findings on each draft these tests diagnose (the cases, the damaged files, the other layouts, the good
    draft with its target and extraction, an extraction without a manifest), on a leftover file beside shards
    and on two copies of one tensor; and the dry-load's, on a serving Python that cannot be run and on what
    SGLang's loader can report (its audit, which the real-SGLang tier checks against the real loader)."""
    results = {name: run_case(tmp_path / name, case)["findings"] for name, case in CASES.items()}
    for name, damage, _code in DAMAGES:
        damage(good_draft(tmp_path / name))
        results[name] = diagnose(tmp_path / name)["findings"]
    good = good_draft(tmp_path / "good")
    target, data = write_target(tmp_path / "target"), write_manifest(tmp_path / "data")
    results["good"] = diagnose(good, target=target, data=data)["findings"]
    (tmp_path / "no-manifest").mkdir()
    results["no-manifest"] = diagnose(good, data=tmp_path / "no-manifest")["findings"]
    results["speculators"] = diagnose(speculators_draft(tmp_path / "spec"), sglang_version="0.5.23")["findings"]
    results["eagle-bin"] = diagnose(eagle_bin_draft(tmp_path / "bin"), sglang_version="0.5.5")["findings"]
    leftover = stale_single_file(sharded_draft(tmp_path / "leftover"))
    results["leftover"] = diagnose(leftover, sglang_version="0.5.23")["findings"]
    duplicated = stale_single_file(sharded_draft(tmp_path / "duplicated", index=False))
    results["duplicated"] = diagnose(duplicated, sglang_version="0.5.23")["findings"]
    results["dry-load-no-python"] = dryload.dry_load(good, python=str(tmp_path / "no-python"))
    files, _ = read_draft(good)
    assert files is not None
    raised = dryload.LoadAudit(unconsumed=["fc_proj.weight"], unwritten={"model.fc.weight": 1.0}, errors={"norm": "E"})
    for name, audit in (("dry-load-raised", raised), ("dry-load-clean", dryload.LoadAudit())):
        results[name] = dryload.findings_of(audit, files, None, "0.5.23")
    return results


def test_the_registry_holds_every_code_the_rules_give_and_each_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert all(code == code.lower() and " " not in code for code in CODES)
    results = every_draft_of_this_file(tmp_path)
    given = {finding["code"] for findings in results.values() for finding in findings}
    failed = sorted(name for name, findings in results.items() if any(f["code"] == "doctor-failed" for f in findings))
    assert failed == [], f"doctor failed (as it does on a code the registry lacks) on {failed}"

    def broken(*args: object) -> list[Finding]:
        raise RuntimeError("a rule's bug")

    monkeypatch.setattr(rules, "tied_embeddings_rule", broken)
    crashed = diagnose(tmp_path / "good")
    assert problems(crashed) == {"doctor-failed"}
    assert "RuntimeError: a rule's bug" in the(crashed, "doctor-failed")["message"]
    given.add("doctor-failed")
    assert sorted(given - set(CODES)) == [], "given, not registered"
    assert sorted(set(CODES) - given) == [], "registered, given by none of these drafts"


def test_cli_exit_codes_and_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = good_draft(tmp_path / "good")
    assert main([str(good), "--sglang-version", "0.5.5"]) == 0
    bad = good_draft(tmp_path / "bad", layer="layers.0")
    assert main([str(bad), "--sglang-version", "0.5.5"]) == 1
    out = capsys.readouterr().out
    assert "ERROR weights-dropped: " in out and "\n  fix: run eagle3-console HOST convert" in out
    assert main([str(bad), "--sglang-version", "0.5.5", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["errors"] == 1
    assert main(["--no-such-flag"]) == 2


def test_cli_as_a_process_is_fast_and_imports_no_torch(tmp_path: Path) -> None:
    draft = good_draft(tmp_path / "draft")
    code = (
        "import sys; from backends.doctor.cli import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'doctor imported torch'; sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(draft), "--sglang-version", "0.5.23"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "0 error(s), 0 warning(s)" in proc.stdout


# --- properties -------------------------------------------------------------------------------

LAYER_TENSORS = [n for n in DraftSpec().tensors() if n.startswith("midlayer.")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    dropped=st.sets(st.sampled_from([*LAYER_TENSORS, "fc.weight", "norm.weight", "lm_head.weight"]), max_size=3),
    hidden=st.sampled_from([32, 64]),
    fc_layers=st.integers(1, 4),
    head_rows=st.integers(1, 80),
    draft_vocab=st.integers(1, 80),
    version=st.sampled_from(["0.5.5", "0.5.23", None]),
)
def test_doctor_flags_every_injected_mismatch(
    tmp_path_factory: pytest.TempPathFactory,
    dropped: set[str],
    hidden: int,
    fc_layers: int,
    head_rows: int,
    draft_vocab: int,
    version: str | None,
) -> None:
    spec = DraftSpec(
        hidden=hidden,
        target_hidden=hidden,
        fc_in=fc_layers * hidden,
        head_rows=head_rows,
        draft_vocab=draft_vocab,
        drop=tuple(sorted(dropped)),
    )
    folder = spec.write(tmp_path_factory.mktemp("d"))
    result = diagnose(folder, sglang_version=version)
    codes = problems(result)
    assert "doctor-failed" not in codes, result["findings"]
    if dropped:
        assert "weights-missing" in codes
    if fc_layers != 3 and "fc.weight" not in dropped:
        assert codes & {"fc-width", "single-layer-features", "aux-count-mismatch"}
    if head_rows != draft_vocab and "lm_head.weight" not in dropped:
        assert "lm-head-rows" in codes
    if not dropped and fc_layers == 3 and head_rows == draft_vocab:
        assert codes == set()


config_values = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 300), st.text(max_size=4), st.lists(st.integers(-2, 20), max_size=4)
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    changes=st.dictionaries(
        st.sampled_from(
            [
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "vocab_size",
                "draft_vocab_size",
                "num_hidden_layers",
                "architectures",
                "eagle_config",
                "rope_scaling",
                "max_position_embeddings",
                "tie_word_embeddings",
                "target_hidden_size",
                "fc_norm",
            ]
        ),
        config_values,
        max_size=4,
    ),
    renamed=st.booleans(),
    version=st.sampled_from(["0.5.5", "0.5.23", "9.9", None]),
)
def test_doctor_never_raises_on_random_configs(
    tmp_path_factory: pytest.TempPathFactory, changes: dict[str, Any], renamed: bool, version: str | None
) -> None:
    folder = tmp_path_factory.mktemp("d")
    spec = DraftSpec(layer="layers.0" if renamed else "midlayer")
    spec.write(folder)
    config = spec.config() | changes
    (folder / "config.json").write_text(json.dumps(config))
    target = write_target(folder / "target", layers=12)
    result = diagnose(folder, target=target, sglang_version=version)
    assert "doctor-failed" not in problems(result), result["findings"]
    assert result["errors"] == sum(f["severity"] == "error" for f in result["findings"])
