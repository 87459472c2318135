"""The dry-load accounts for every tensor and every parameter, in the interpreter of the SGLang that serves.

The real-loader tests run in the real-SGLang tier (fixture sglang_python: SGLang 0.5.23 on CPU, never skipped
under `make test`). Each case's verdict is checked against SGLang's real loader judged another way
(tests/sglang_real_loader.py: SGLang's own DefaultModelLoader over the whole checkpoint, tensors found by value).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from backends.doctor import dryload
from backends.doctor.cli import main as doctor_main
from backends.doctor.dryload import audit_load, dry_load
from backends.doctor.full import full_diagnosis
from backends.doctor.reading import read_draft
from backends.protocol import Finding
from tests.conftest import REPO
from tests.draft_fixtures import HIDDEN, corrupt_header, good_draft
from tests.sglang_tier import DRY_LOAD, REAL_LOADER, in_tier

FAKE_SGLANG = REPO / "tests" / "fake_sglang"


class LoaderLike(nn.Module):
    """A stand-in with SGLang's loading habits: stacked qkv, silent skips, asserting shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Parameter(torch.zeros(6, 4))
        self.norm = nn.Parameter(torch.zeros(4))
        self.never = nn.Parameter(torch.zeros(2, 2))
        self.hot_token_id: torch.Tensor | None = None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        shards = {"q": 0, "k": 2, "v": 4}
        for name, tensor in weights:
            if "d2t" in name:
                self.hot_token_id = tensor + torch.arange(tensor.shape[0])
            elif name in ("q", "k", "v"):
                self.qkv.data[shards[name] : shards[name] + 2].copy_(tensor)
            elif name == "norm":
                if tensor.shape != self.norm.shape:  # SGLang's default_weight_loader asserts this
                    raise AssertionError("shape mismatch")
                self.norm.data.copy_(tensor)


def test_audit_finds_unconsumed_unwritten_and_raising_tensors() -> None:
    model = LoaderLike()
    tensors = [
        ("q", torch.ones(2, 4)),
        ("k", torch.ones(2, 4)),  # v never comes: a third of qkv stays unwritten
        ("layers.0.norm", torch.ones(4)),  # skipped silently, as SGLang 0.5.5 does
        ("norm", torch.ones(5)),  # the loader asserts
        ("d2t", torch.zeros(3, dtype=torch.int64)),
        ("t2d", torch.zeros(8, dtype=torch.bool)),  # ignored by design, not reported
    ]
    audit = audit_load(model, tensors)
    assert audit.unconsumed == ["layers.0.norm"]
    assert audit.errors == {"norm": "AssertionError: shape mismatch"}
    assert audit.unwritten == pytest.approx({"qkv": 1 / 3, "norm": 1.0, "never": 1.0})


def test_audit_of_a_complete_checkpoint_is_clean() -> None:
    model = LoaderLike()
    del model.never
    tensors = [(n, torch.ones(2, 4)) for n in ("q", "k", "v")] + [("norm", torch.ones(4))]
    audit = audit_load(model, tensors)
    assert audit.unconsumed == [] and audit.unwritten == {} and audit.errors == {}


def test_a_tensor_the_loader_raises_on_is_an_error_naming_it_and_what_was_raised(tmp_path: Path) -> None:
    files, _ = read_draft(good_draft(tmp_path / "draft"))
    assert files is not None
    audit = audit_load(LoaderLike(), [("norm", torch.ones(5))])
    failed = [f for f in dryload.findings_of(audit, files, None, "0.5.23") if f["code"] == "dry-load-failed"]
    assert [(f["severity"], f["message"]) for f in failed] == [
        (
            "error",
            "SGLang 0.5.23's loader raised on norm: AssertionError: shape mismatch (the server would crash at startup)",
        )
    ]


def test_without_sglang_in_the_serving_python_it_says_skipped(tmp_path: Path) -> None:
    found = dry_load(good_draft(tmp_path / "draft"), python=sys.executable)  # the test venv has no sglang
    assert [(f["code"], f["severity"]) for f in found] == [("dry-load-skipped", "info")]
    assert f"sglang is not importable by {sys.executable}" in found[0]["message"]


def test_doctor_dry_load_flag_without_sglang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor_main([str(good_draft(tmp_path / "draft")), "--sglang-version", "0.5.23", "--dry-load"]) == 0
    assert "INFO dry-load-skipped: dry-load skipped: sglang is not importable" in capsys.readouterr().out


def test_estimate_grows_with_the_checkpoint(tmp_path: Path) -> None:
    draft = good_draft(tmp_path / "draft")
    assert dryload.STARTUP_S <= dryload.estimate_seconds(draft) < dryload.STARTUP_S + 1


class NeedsAForwardKernel(nn.Module):
    """A layer that, like SGLang's rotary embedding on a machine without CUDA, takes vllm's kernel when built."""

    def __init__(self, config: object, quant_config: object) -> None:
        super().__init__()
        from vllm._custom_ops import rotary_embedding  # type: ignore[import-not-found]

        self.kernel = rotary_embedding
        self.weight = nn.Parameter(torch.zeros(2))


class NeedsOtherKernels(nn.Module):
    def __init__(self, config: object, quant_config: object) -> None:
        super().__init__()
        import no_such_kernels  # type: ignore[import-not-found]  # noqa: F401


def test_a_kernel_only_a_forward_calls_is_stood_in_for_while_the_class_is_built() -> None:
    assert "vllm" not in sys.modules
    model = dryload._build(NeedsAForwardKernel, config=None)
    assert model.weight.device.type == "cpu"
    assert "vllm" not in sys.modules and "vllm._custom_ops" not in sys.modules  # only while it was built
    with pytest.raises(RuntimeError, match="stood in for by the dry-load, which runs no forward"):
        model.kernel()
    with pytest.raises(ModuleNotFoundError, match="no_such_kernels"):  # any other is the machine's to report
        dryload._build(NeedsOtherKernels, config=None)


@pytest.mark.parametrize(
    ("python", "env", "why"),
    [
        ("/nowhere/bin/python", {}, "/nowhere/bin/python could not be run: No such file or directory"),
        ("/bin/false", {}, "it ended without a verdict in /bin/false (exit 1): no output"),
        # An sglang that is only a package name: SGLang's own modules cannot be imported.
        (sys.executable, {"PYTHONPATH": str(FAKE_SGLANG)}, "cannot be imported by"),
    ],
    ids=["no-interpreter", "no-verdict", "sglang-without-its-modules"],
)
def test_a_dry_load_that_cannot_set_up_is_skipped_with_why_never_an_error(
    tmp_path: Path, python: str, env: dict[str, str], why: str
) -> None:
    draft = good_draft(tmp_path / "draft")
    result = full_diagnosis(draft, sglang_version="0.5.23", dry_load=True, sglang_python=python, env=env)
    [skipped] = [f for f in result["findings"] if f["code"].startswith("dry-load")]
    assert skipped["code"] == "dry-load-skipped" and skipped["severity"] == "warning"
    assert why in skipped["message"]
    assert result["errors"] == 0  # so the pre-launch gate lets the launch through


# --- against the real SGLang 0.5.23 (the real-SGLang tier) -------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A draft and what SGLang's real loader does with it: tensors it skips, parameters it leaves unwritten
    (besides the embedding, which the server takes from the target), or a file it refuses."""

    ignored: tuple[str, ...] = ()
    unwritten: tuple[str, ...] = ()
    refused: bool = False


CASES = {
    "specforge-good": Case(),
    "layers0-on-0.5.23": Case(),
    "renamed-fc": Case(ignored=("fc_proj.weight",), unwritten=("model.fc.weight",)),
    "extra-unknown-tensor": Case(ignored=("extra_head.weight",)),
    "missing-down-proj": Case(unwritten=("model.layers.0.mlp.down_proj.weight",)),
    "corrupt-header": Case(refused=True),
    "trainer-checkpoint": Case(),
}
EMBEDDING = "model.embed_tokens.weight"


def _trained_draft(root: Path) -> Path:
    """A checkpoint written by our trainer (two steps on a tiny target)."""
    from backends.train.__main__ import main as train
    from tests.train_fixtures import write_extraction, write_target

    target = write_target(root / "target")
    write_extraction(root / "data", target, samples=16)
    args = ["--data", str(root / "data"), "--target", str(target), "--out", str(root / "run")]
    args += ["--draft-vocab-size", "48", "--val-samples", "4", "--batch-size", "4", "--steps", "2"]
    assert train(args) == 0
    return root / "run" / "final"


def _drafts(root: Path) -> dict[str, Path]:
    return {
        "specforge-good": good_draft(root / "good"),
        "layers0-on-0.5.23": good_draft(root / "layers0", layer="layers.0"),
        "renamed-fc": good_draft(
            root / "renamed", drop=("fc.weight",), extra={"fc_proj.weight": ("BF16", (HIDDEN, 3 * HIDDEN), None)}
        ),
        "extra-unknown-tensor": good_draft(
            root / "extra", extra={"extra_head.weight": ("BF16", (HIDDEN, HIDDEN), None)}
        ),
        "missing-down-proj": good_draft(root / "missing", drop=("midlayer.mlp.down_proj.weight",)),
        "corrupt-header": corrupt_header(good_draft(root / "corrupt")),
        "trainer-checkpoint": _trained_draft(root / "trained"),
    }


@pytest.fixture(scope="module")
def verdicts(sglang_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[Finding], Any]]:
    """Each case's dry-load findings and SGLang's real loader's verdict on it."""
    drafts = _drafts(tmp_path_factory.mktemp("drafts"))
    paths = [str(p) for p in drafts.values()]
    ours = in_tier(sglang_python, "-c", DRY_LOAD, *paths)
    real = in_tier(sglang_python, str(REAL_LOADER), *paths)
    return {case: (ours[str(path)], real[str(path)]) for case, path in drafts.items()}


@pytest.mark.parametrize("case", CASES)
def test_the_dry_load_agrees_with_sglangs_real_loader(
    case: str, verdicts: dict[str, tuple[list[Finding], Any]]
) -> None:
    expected = CASES[case]
    ours, real = verdicts[case]
    # The real loader, judged by value.
    if expected.refused:
        assert "error" in real
    else:
        assert real["ignored"] == list(expected.ignored) and real["hot_token_id_ok"]
        assert set(real["unwritten"]) == {EMBEDDING, *expected.unwritten}
    # The dry-load, as a user reads it.
    by_code = {(f["code"], f["severity"]): f["message"] for f in ours}
    if expected.refused:
        assert [(f["code"], f["severity"]) for f in ours] == [("weights-unreadable", "error")]
        return
    ignored = by_code.get(("dry-load-unconsumed", "warning"), "")
    assert ignored.endswith(
        f"ignored {len(expected.ignored)} tensor(s) without a word: {', '.join(expected.ignored)}"
    ) or (not expected.ignored and not ignored)
    unwritten = by_code.get(("dry-load-unwritten", "error"), "")
    assert all(f"{name} (100%)" in unwritten for name in expected.unwritten) and bool(unwritten) == bool(
        expected.unwritten
    )
    assert not [f for f in ours if f["severity"] == "error" and f["code"] != "dry-load-unwritten"]
    if not expected.ignored and not expected.unwritten:
        assert by_code[("dry-load-unwritten", "info")] == (
            f"SGLang 0.5.23's loader consumed every tensor and wrote every parameter but {EMBEDDING} "
            "(taken from the target)"
        )


def test_the_dry_load_runs_in_the_serving_python(sglang_python: Path, tmp_path: Path) -> None:
    """Not the caller's interpreter (the test venv has no sglang): the one named, with our package on its path."""
    found = dry_load(good_draft(tmp_path / "draft", layer="layers.0"), python=str(sglang_python))
    assert [(f["code"], f["severity"]) for f in found] == [("dry-load-unwritten", "info")], found
    assert found[0]["message"].startswith("SGLang 0.5.23's loader consumed every tensor")


def test_a_corrupt_header_is_one_finding_not_two(sglang_python: Path, tmp_path: Path) -> None:
    draft = corrupt_header(good_draft(tmp_path / "draft"))
    result = full_diagnosis(draft, dry_load=True, sglang_python=str(sglang_python))
    assert [f["code"] for f in result["findings"] if f["severity"] == "error"] == ["weights-unreadable"]
    assert result["errors"] == 1


def test_doctor_learns_the_version_from_the_serving_python(sglang_python: Path, tmp_path: Path) -> None:
    result = full_diagnosis(good_draft(tmp_path / "draft"), dry_load=False, sglang_python=str(sglang_python))
    assert result["sglang_versions"] == ["0.5.23"]
    [version] = [f for f in result["findings"] if f["code"] == "sglang-version"]
    assert version["message"] == f"checked against SGLang 0.5.23 (the sglang of {sglang_python})"
    alone = full_diagnosis(good_draft(tmp_path / "draft"), dry_load=False, sglang_python=sys.executable)
    assert alone["sglang_versions"] == ["0.5.5", "0.5.23"]
    assert f"no sglang for {sys.executable}" in alone["findings"][0]["message"]


def test_doctor_command_dry_loads_with_sglang_python_and_fails_on_an_unwritten_parameter(
    sglang_python: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    draft = good_draft(
        tmp_path / "draft", drop=("fc.weight",), extra={"fc_proj.weight": ("BF16", (HIDDEN, 3 * HIDDEN), None)}
    )
    assert doctor_main([str(draft), "--dry-load", "--sglang-python", str(sglang_python)]) == 1
    out = capsys.readouterr().out
    assert (
        "WARNING dry-load-unconsumed: SGLang 0.5.23's loader ignored 1 tensor(s) without a word: fc_proj.weight" in out
    )
    assert "ERROR dry-load-unwritten: SGLang 0.5.23's loader left 1 parameter(s) unwritten" in out
    assert "the ignored fc_proj.weight may hold them under another name" in out
