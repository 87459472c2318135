"""The dry-load accounts for every tensor and every parameter; without sglang it says so
and does nothing. The real-loader tests run only where sglang imports."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from torch import nn

from backends import dryload
from backends.doctor import main as doctor_main
from backends.dryload import audit_load, dry_load, sglang_importable
from tests.draft_fixtures import good_draft

needs_sglang = pytest.mark.skipif(
    not sglang_importable(),
    reason="sglang is not importable here (its CPU install is about 10 GB); the dry-load's real-loader path is skipped",
)


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


def test_without_sglang_it_says_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dryload, "sglang_importable", lambda: False)
    found = dry_load(good_draft(tmp_path / "draft"))
    assert [(f["code"], f["severity"]) for f in found] == [("dry-load-skipped", "info")]
    assert "sglang not importable" in found[0]["message"]


def test_doctor_dry_load_flag_without_sglang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(dryload, "sglang_importable", lambda: False)
    assert doctor_main([str(good_draft(tmp_path / "draft")), "--sglang-version", "0.5.23", "--dry-load"]) == 0
    assert "INFO dry-load-skipped: dry-load skipped: sglang not importable" in capsys.readouterr().out


def test_estimate_grows_with_the_checkpoint(tmp_path: Path) -> None:
    draft = good_draft(tmp_path / "draft")
    assert dryload.STARTUP_S <= dryload.estimate_seconds(draft) < dryload.STARTUP_S + 1


@needs_sglang
def test_real_loader_passes_a_good_draft(tmp_path: Path) -> None:
    found = dry_load(good_draft(tmp_path / "draft"))
    assert not [f for f in found if f["severity"] == "error"], found


@needs_sglang
def test_real_loader_reports_a_missing_tensor(tmp_path: Path) -> None:
    found = dry_load(good_draft(tmp_path / "draft", drop=("midlayer.mlp.down_proj.weight",)))
    unwritten = [f for f in found if f["code"] == "dry-load-unwritten" and f["severity"] == "error"]
    assert unwritten and "down_proj" in unwritten[0]["message"]
