"""`--backend sglang`: refused in one line where it cannot work; where SGLang runs, the same states as hf.

The real SGLang is the real-SGLang tier's (EAGLE3_SGLANG_PYTHON, fixture sglang_python): on this CPU machine it
has no sgl_kernel, so the backend refuses; the comparison with hf runs where the interpreter named has its kernels.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backends.eagle3_contract import read_manifest, read_shard
from backends.extract.cli import main
from backends.extract.sglang_capture import CPU_ENGINE_ENV
from backends.sglang import facts as sglang_facts
from tests.conftest import REPO


@pytest.fixture(autouse=True)
def own_engine_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend sets SGLang's CPU-engine switch in its own process; run in pytest's, it must not
    reach the servers later tests start."""
    monkeypatch.setenv(CPU_ENGINE_ENV, "")
    monkeypatch.delenv(CPU_ENGINE_ENV)


def extract(target: Path, out: Path, *extra: str) -> int:
    return main(["--target", str(target), "--data", "demo", "--out", str(out), "--device", "cpu", *extra])


def with_architecture(target: Path, folder: Path, architecture: str) -> Path:
    copy = Path(shutil.copytree(target, folder))
    config = json.loads((copy / "config.json").read_text())
    config["architectures"] = [architecture]
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_without_sglang_the_backend_is_a_usage_error(
    target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sglang_facts, "installed_version", lambda: None)
    assert extract(target, tmp_path / "out", "--backend", "sglang") == 2
    assert (
        capsys.readouterr().err
        == "error: --backend sglang: sglang is not installed for this Python; use --backend hf\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_target_sglang_cannot_capture_is_refused_before_anything_loads(
    target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sglang_facts, "installed_version", lambda: "0.5.23")
    mixtral = with_architecture(target, tmp_path / "mixtral", "MixtralForCausalLM")
    assert extract(mixtral, tmp_path / "out", "--backend", "sglang") == 2
    err = capsys.readouterr().err
    assert "SGLang 0.5.23's MixtralForCausalLM has no set_eagle3_layers_to_capture" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_an_sglang_without_the_in_process_runner_is_refused_in_one_line(
    target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sglang_facts, "installed_version", lambda: "0.5.5")
    monkeypatch.setitem(sys.modules, "sglang", None)  # importing it fails, as with an older layout
    assert extract(target, tmp_path / "out", "--backend", "sglang", "--limit", "4") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --backend sglang: SGLang 0.5.5 lacks the in-process model runner")
    assert f"written for SGLang {sglang_facts.EXTRACT_RUNNER_VERSION}" in err and err.endswith("; use --backend hf\n")
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_an_sglang_without_its_kernels_says_which_and_what_to_do_and_leaves_no_output(
    target: Path, tmp_path: Path
) -> None:
    # SGLang 0.5.23 installed without sgl_kernel: its model runner's imports fail as the real one's do.
    fake = REPO / "tests" / "fake_sglang_without_kernels"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(REPO)])}
    command = [sys.executable, "-m", "backends.extract", "--target", str(target), "--data", "demo", "--device", "cpu"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "out"), "--backend", "sglang"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: --backend sglang: SGLang 0.5.23 here has no kernels for cpu (module sgl_kernel, from "
        "sglang-kernel==0.4.10: a CUDA build, for a GPU host); run the extraction on a GPU host that has them "
        "(pip install sglang-kernel==0.4.10), or build sgl-kernel for CPU from SGLang's source (its CPU engine), "
        "or use --backend hf\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_load_that_fails_leaves_no_empty_output_folder(
    target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = Path(shutil.copytree(target, tmp_path / "broken"))
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    assert extract(broken, tmp_path / "out", "--limit", "4") == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot load the target from {broken}") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
    (tmp_path / "kept").mkdir()
    assert extract(broken, tmp_path / "kept", "--limit", "4") == 1
    assert (tmp_path / "kept").is_dir()  # a folder the user made is theirs


def test_the_real_sglang_matches_the_hf_backend_or_says_which_kernels_it_lacks(
    sglang_python: Path, target: Path, tmp_path: Path
) -> None:
    options = ["--limit", "48", "--shard-size", "16", "--layers", "1,3,5", "--batch-tokens", "600"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [str(sglang_python), "-m", "backends.extract", "--target", str(target), "--data", "demo"]
    done = subprocess.run(
        [*command, "--device", "cpu", *options, "--out", str(tmp_path / "sgl"), "--backend", "sglang"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    has_kernels = subprocess.run([str(sglang_python), "-c", "import sgl_kernel"], capture_output=True).returncode == 0
    if not has_kernels:  # the real-SGLang tier on this CPU machine: sgl_kernel is a CUDA build, not installed
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr.startswith("error: --backend sglang: SGLang 0.5.23 here has no kernels for cpu (module ")
        assert "sgl_kernel, from sglang-kernel==0.4.10: a CUDA build" in done.stderr and done.stderr.count("\n") == 1
        assert not (tmp_path / "sgl").exists()
        return
    assert done.returncode == 0, done.stderr[-3000:]
    assert extract(target, tmp_path / "hf", *options) == 0
    hf, sgl = read_manifest(tmp_path / "hf"), read_manifest(tmp_path / "sgl")
    assert (sgl.aux_layer_ids, sgl.samples, sgl.tokens) == (hf.aux_layer_ids, hf.samples, hf.tokens)
    assert (hf.backend, sgl.backend, sgl.backend_version) == ("hf", "sglang", sglang_facts.EXTRACT_RUNNER_VERSION)
    for hf_shard, sgl_shard in zip(hf.shards, sgl.shards, strict=True):
        for a, b in zip(
            read_shard(tmp_path / "hf" / hf_shard.file), read_shard(tmp_path / "sgl" / sgl_shard.file), strict=True
        ):
            assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
            assert b["aux_hidden_states"].shape == a["aux_hidden_states"].shape == (len(a["input_ids"]), 3 * 64)
            torch.testing.assert_close(b["aux_hidden_states"], a["aux_hidden_states"], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(b["hidden_state"], a["hidden_state"], rtol=1e-4, atol=1e-4)
