"""Online training on the demo target (CPU): the target computes the states each batch needs, nothing is written
but checkpoints; it learns as offline training does on the same chats, resumes exactly, carries its data
contract into every checkpoint for doctor, and under torchrun (gloo, two processes) trains as one process with
the target replicated or tensor-parallel. Everything here is real: transformers, torch.distributed, the files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backends.doctor import diagnose
from backends.eagle3_contract import MANIFEST
from backends.extract.cli import main as extract_main
from backends.train.__main__ import main
from tests.conftest import REPO
from tests.train_fixtures import read_rows, write_target

LIMIT = "96"  # demo chats: 92 train + 4 held out (5%)
BASE = ("--draft-vocab-size", "256", "--ttt", "3", "--lr", "3e-3", "--batch-size", "8", "--log-every", "2")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def no_metrics_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EAGLE3_METRICS_FILE", raising=False)


def online(target: Path, out: Path, *extra: str, limit: str = LIMIT) -> list[str]:
    return ["--online", "--data", "demo", "--limit", limit, "--target", str(target), "--out", str(out), *BASE, *extra]


def losses(out: Path) -> dict[int, float]:
    rows = [r for r in read_rows(out / "metrics.jsonl") if "loss" in r]
    return {int(str(r["step"])): float(str(r["loss"])) for r in rows}


def test_online_training_learns_writes_no_states_and_its_checkpoint_passes_doctor(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(online(target, out, "--steps", "24", "--eval-every", "12")) == 0
    printed = capsys.readouterr().out
    assert "92 train / 4 val samples (online from demo, target replicate)" in printed
    curve = losses(out)
    assert curve[24] < 0.8 * curve[2]
    # Checkpoints, metrics and the tokenized chats only: no shard, no hidden state on disk.
    assert not list(out.rglob("*shard*")) and sorted(p.name for p in out.iterdir()) == [
        "final",
        "metrics.jsonl",
        "tokenized-chats.safetensors",
    ]
    manifest = json.loads((out / "final" / MANIFEST).read_text())
    assert manifest["aux_layer_ids"] == [1, 3, 4] and manifest["data"] == "demo" and len(manifest["data_sha256"]) == 64
    assert manifest["samples"] == 96 and manifest["chat_template"] and manifest["target_path"] == str(target.resolve())
    result = diagnose(out / "final", target=target, sglang_version="0.5.23")
    assert result["errors"] == 0, result["findings"]
    assert any("manifest: [1, 3, 4]" in f["message"] for f in result["findings"])


def test_doctor_checks_an_online_draft_against_the_contract_its_checkpoint_records(
    target: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    assert main(online(target, out, "--steps", "2", "--eval-every", "0")) == 0
    final = out / "final"
    recorded = json.loads((final / MANIFEST).read_text())
    (final / MANIFEST).write_text(json.dumps({**recorded, "aux_layer_ids": [0, 2, 5]}))
    result = diagnose(final, target=target, sglang_version="0.5.23")
    assert result["errors"] >= 1
    assert any(f["severity"] == "error" and "[0, 2, 5]" in f["message"] for f in result["findings"])


def test_online_training_equals_offline_training_on_the_states_of_the_same_chats(target: Path, tmp_path: Path) -> None:
    """One shard holding every chat gives the offline order the online one in random order (a seeded shuffle
    of the samples), so the two runs see the same batches: only the forward passes' padding differs."""
    data = tmp_path / "hidden"
    argv = ["--target", str(target), "--data", "demo", "--limit", LIMIT, "--out", str(data)]
    assert extract_main([*argv, "--shard-size", "1000", "--dtype", "float32", "--device", "cpu"]) == 0
    offline, live = tmp_path / "offline", tmp_path / "online"
    steps = ("--steps", "12", "--eval-every", "0")
    assert main(["--data", str(data), "--target", str(target), "--out", str(offline), *BASE, *steps]) == 0
    assert main(online(target, live, *steps, "--batch-order", "random")) == 0
    a, b = losses(offline), losses(live)
    assert a.keys() == b.keys() == set(range(2, 13, 2))
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=2e-3), step


def test_online_resume_reproduces_an_uninterrupted_run_and_refuses_other_data(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run = ("--steps", "16", "--save-every", "8", "--eval-every", "8")
    assert main(online(target, straight, *run)) == 0
    shutil.copytree(straight / "step-8", resumed / "step-8")
    capsys.readouterr()
    assert main(online(target, resumed, *run, "--resume", limit="80")) == 2
    err = capsys.readouterr().err
    assert "trained on other data" in err and "data_sha256" in err and err.count("\n") == 1
    assert main(online(target, resumed, *run, "--resume")) == 0
    assert f"resuming {resumed / 'step-8'} at step 8" in capsys.readouterr().out
    full, rest = losses(straight), losses(resumed)
    assert sorted(rest) == list(range(10, 17, 2))
    for step, loss in rest.items():
        assert loss == pytest.approx(full[step], rel=1e-5), step
    a = load_file(str(straight / "final" / "model.safetensors"))
    b = load_file(str(resumed / "final" / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["--data", "no-such.jsonl"], 2, "no such file"),
        (["--layers", "1,3,7"], 2, "aux ids run 0..6"),
        (["--layers", "3,1,4"], 2, "increasing"),
        (["--chat-template", "missing.jinja"], 2, "--chat-template missing.jinja"),
        (["--limit", "0"], 2, "--limit must be at least 1"),
        (["--target-placement", "tp"], 2, "tp needs torchrun"),
    ],
)
def test_online_bad_inputs_are_one_line_errors(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, words: str
) -> None:
    out = tmp_path / "run"
    base = online(target, out, "--steps", "1")
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        if flag in base:
            base[base.index(flag) + 1] = value
        else:
            base += [flag, value]
    assert main(base) == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1, err
    assert not (out / "final").exists()


def test_online_data_without_a_usable_chat_and_a_target_without_a_tokenizer_are_refused(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chats = tmp_path / "chats.jsonl"
    chats.write_text('{"prompt": 1}\nnot json\n')
    argv = online(target, tmp_path / "a", "--steps", "1")
    argv[argv.index("demo")] = str(chats)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "holds no usable chat" in err and "1 not JSON (line 2)" in err and err.count("\n") == 1
    bare = write_target(tmp_path / "bare")  # weights and config, no tokenizer
    capsys.readouterr()
    assert main(online(bare, tmp_path / "b", "--steps", "1")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot load the tokenizer of {bare}") and err.count("\n") == 1


def test_one_process_can_spread_the_target_over_the_visible_devices(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """device_map "auto" (here over the CPU alone): the states reach the draft's device and it trains."""
    out = tmp_path / "run"
    assert main(online(target, out, "--steps", "4", "--eval-every", "0", "--target-placement", "spread")) == 0
    assert "(online from demo, target spread)" in capsys.readouterr().out
    assert (out / "final" / MANIFEST).is_file() and len(losses(out)) == 2


def test_online_flags_without_online_are_refused(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--data", str(tmp_path), "--target", str(target), "--out", str(tmp_path / "o"), "--layers", "1,2,3"]
    assert main(argv) == 2
    assert "--layers go with --online" in capsys.readouterr().err


@pytest.mark.parametrize("placement", ["replicate", "tp"])
def test_online_under_torchrun_trains_as_one_process_with_the_global_batch(
    target: Path, tmp_path: Path, placement: str
) -> None:
    """Two processes of 4 samples each see the samples one process of 8 sees; with the target replicated
    or tensor-parallel over both (gloo on CPU), the losses are one process's."""
    single, pair = tmp_path / "single", tmp_path / "pair"
    steps = ("--steps", "6", "--eval-every", "3", "--threads", "1")
    assert main(online(target, single, *steps)) == 0
    argv = online(target, pair, *steps, "--target-placement", placement)
    argv[argv.index("--batch-size") + 1] = "4"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "backends.train", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"target {placement}" in done.stdout
    a, b = losses(single), losses(pair)
    assert a.keys() == b.keys()
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=2e-3), step
    evals = [r for r in read_rows(pair / "metrics.jsonl") if "val_loss" in r]
    single_evals = [r for r in read_rows(single / "metrics.jsonl") if "val_loss" in r]
    assert [r["val_loss"] for r in evals] == pytest.approx([r["val_loss"] for r in single_evals], rel=2e-3)
