"""convert turns speculators, original-EAGLE and layers.0.* drafts into the SGLang layout that
doctor passes, tensor for tensor, never touching SRC and never leaving half a DST."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from backends.doctor import diagnose
from backends.doctor.convert import ConvertError, convert, main
from tests.draft_fixtures import (
    AUX_IDS,
    DRAFT_VOCAB,
    HIDDEN,
    eagle_bin_draft,
    good_draft,
    speculators_draft,
    write_target,
)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def assert_same_tensors(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor], renames: dict[str, str]) -> None:
    assert sorted(renames.get(k, k) for k in src) == sorted(dst)
    for name, tensor in src.items():
        out = dst[renames.get(name, name)]
        assert out.dtype == tensor.dtype and out.shape == tensor.shape, name
        assert torch.equal(out, tensor), name


def layer_renames(names: list[str]) -> dict[str, str]:
    return {n: "midlayer." + n.removeprefix("layers.0.") for n in names if n.startswith("layers.0.")}


@pytest.mark.parametrize("version", ["0.5.5", "0.5.23"])
def test_speculators_round_trip(tmp_path: Path, version: str) -> None:
    src = speculators_draft(tmp_path / "spec")
    before = snapshot(src)
    result = convert(src, tmp_path / "out")
    assert snapshot(src) == before, "SRC must never be written"
    assert result["format"] == "sglang" and result["errors"] == 0, result["findings"]
    target = write_target(tmp_path / "target")
    checked = diagnose(tmp_path / "out", target=target, sglang_version=version)
    assert checked["errors"] == checked["warnings"] == 0, checked["findings"]

    src_tensors = load_file(str(src / "model.safetensors"))
    dst_tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert_same_tensors(src_tensors, dst_tensors, layer_renames(list(src_tensors)))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["hidden_size"] == HIDDEN and config["draft_vocab_size"] == DRAFT_VOCAB
    # speculators counts layer inputs; SGLang's field counts outputs.
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == AUX_IDS
    assert "target_hidden_size" not in config  # speculators' null would break SGLang's fc
    assert config["rope_theta"] == 500000.0 and config["max_position_embeddings"] == 4096


def test_speculators_defaults_filled_from_transformers(tmp_path: Path) -> None:
    """speculators saves only fields that differ from LlamaConfig's defaults."""
    src = speculators_draft(tmp_path / "spec")
    config = json.loads((src / "config.json").read_text())
    del config["transformer_layer_config"]["rms_norm_eps"]
    (src / "config.json").write_text(json.dumps(config))
    convert(src, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["rms_norm_eps"] == 1e-6


def test_eagle_bin_round_trip(tmp_path: Path) -> None:
    src = eagle_bin_draft(tmp_path / "bin")
    result = convert(src, tmp_path / "out")
    assert result["errors"] == 0, result["findings"]
    state = torch.load(src / "pytorch_model.bin", weights_only=True)
    assert_same_tensors(state, load_file(str(tmp_path / "out" / "model.safetensors")), {})
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and "eagle_config" not in config


def test_layers0_sglang_draft_becomes_midlayer(tmp_path: Path) -> None:
    src = good_draft(tmp_path / "l0", layer="layers.0")
    assert diagnose(src, sglang_version="0.5.5")["errors"] == 1
    result = convert(src, tmp_path / "out")
    assert result["errors"] == 0
    assert diagnose(tmp_path / "out", sglang_version="0.5.5")["errors"] == 0
    names = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert any(n.startswith("midlayer.") for n in names) and not any(n.startswith("layers.") for n in names)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: speculators_draft(p, norm_before_residual=True), "norm_before_residual"),
        (lambda p: good_draft(p), "already in the SGLang layout"),
        (lambda p: good_draft(p, layer="layers.0", num_layers=2), "2 layers"),
    ],
    ids=["norm-before-residual", "already-sglang", "multi-layer"],
)
def test_refusals_say_why_and_write_nothing(tmp_path: Path, make: object, reason: str) -> None:
    src = make(tmp_path / "src")  # type: ignore[operator]
    with pytest.raises(ConvertError, match=reason):
        convert(src, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"], "no DST and no temp folder left behind"


def test_paths_are_checked(tmp_path: Path) -> None:
    src = speculators_draft(tmp_path / "spec")
    with pytest.raises(ConvertError, match="DST is SRC"):
        convert(src, src)
    with pytest.raises(ConvertError, match="inside SRC"):
        convert(src, src / "sub")
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConvertError, match="already exists"):
        convert(src, tmp_path / "taken")
    with pytest.raises(ConvertError, match="unknown target layout"):
        convert(src, tmp_path / "x", to="vllm")
    with pytest.raises(ConvertError, match="does not exist"):
        convert(tmp_path / "nope", tmp_path / "y")


def test_failure_midway_leaves_no_dst(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import backends.doctor.convert as module

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("safetensors.torch.save_file", boom)
    src = speculators_draft(tmp_path / "spec")
    with pytest.raises(OSError, match="disk full"):
        module.convert(src, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec"]


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = speculators_draft(tmp_path / "spec")
    assert main([str(src), str(tmp_path / "out"), "--to", "sglang"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "0 error(s)" in out
    assert main([str(src), str(tmp_path / "out")]) == 1
    assert "refused: " in capsys.readouterr().err
    assert main([str(src)]) == 2
