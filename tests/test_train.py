"""The reference EAGLE-3 trainer on a tiny target (CPU): it learns, its checkpoints
reload exactly, resume reproduces an uninterrupted run, and it refuses bad data."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from backends.eagle3_contract import SGLANG_DRAFT_ARCHITECTURE, SGLANG_DRAFT_WEIGHTS, read_manifest
from backends.train import checkpoint, distributed
from backends.train.__main__ import main
from backends.train.attention import eager_ttt_attention, flex_ttt_attention, ttt_block_mask
from backends.train.data import Batch
from backends.train.loop import Run, describe, prepare
from backends.train.loss import loss_rows, simulated_accept_length
from backends.train.metrics import plateaued
from backends.train.options import TrainOptions
from backends.train.schedule import lr_factor
from backends.train.target import Teacher, load_target_matrices, read_target_config
from backends.train.vocab import build_vocab_map, token_frequencies
from tests.train_fixtures import read_rows, write_extraction, write_manifest, write_target
from tests.train_reference import TeacherTargets, teacher_targets, ttt_loss

REPO = Path(__file__).resolve().parent.parent
DRAFT_VOCAB = 48  # < the 56 tokens the data uses: d2t is a real selection
TRAIN_STEPS = 200


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    target = write_target(root / "target")
    write_extraction(root / "data", target)
    return {"root": root, "target": target, "data": root / "data"}


def args(tiny: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "--data",
        str(tiny["data"]),
        "--target",
        str(tiny["target"]),
        "--out",
        str(out),
        "--draft-vocab-size",
        str(DRAFT_VOCAB),
        "--val-samples",
        "4",
        "--batch-size",
        "8",
        *extra,
    ]


@pytest.fixture(scope="module")
def trained(tiny: dict[str, Path]) -> dict[str, Any]:
    """One full run (default TTT 7), its metric rows in $EAGLE3_METRICS_FILE."""
    out = tiny["root"] / "run"
    metrics = tiny["root"] / "run-metrics.jsonl"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLE3_METRICS_FILE", str(metrics))
        extra = ("--steps", str(TRAIN_STEPS), "--lr", "3e-3", "--log-every", "20", "--eval-every", "100")
        code = main(args(tiny, out, *extra, "--save-every", "100"))
    assert code == 0
    rows = read_rows(metrics)
    return {
        "out": out,
        "train": [r for r in rows if "loss" in r],
        "eval": [r for r in rows if "val_loss" in r],
    }


def test_training_lowers_loss_and_raises_acceptance(trained: dict[str, Any]) -> None:
    first, last = trained["train"][0], trained["train"][-1]
    assert last["step"] == TRAIN_STEPS
    assert last["loss"] < 0.7 * first["loss"], (first["loss"], last["loss"])
    assert last["acc_0"] > first["acc_0"] + 0.2, (first["acc_0"], last["acc_0"])
    assert last["ploss_0"] < first["ploss_0"]
    evals = trained["eval"]
    assert [r["step"] for r in evals] == [100, 200]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]
    assert evals[-1]["val_acc_0"] > evals[0]["val_acc_0"]
    assert evals[-1]["val_sim_accept_len"] > evals[0]["val_sim_accept_len"]


def test_metric_rows_have_the_documented_keys(trained: dict[str, Any]) -> None:
    ttt = range(7)
    train_keys = {"step", "epoch", "loss", "lr", "grad_norm", "tokens_per_s"}
    train_keys |= {f"ploss_{k}" for k in ttt} | {f"acc_{k}" for k in ttt}
    assert all(set(r) == train_keys for r in trained["train"])
    assert [r["step"] for r in trained["train"]] == list(range(20, TRAIN_STEPS + 1, 20))
    row = trained["train"][-1]
    assert row["tokens_per_s"] > 0 and row["grad_norm"] > 0 and 0 < row["lr"] < 3e-3
    eval_keys = {"step", "epoch", "val_loss", "val_sim_accept_len", "plateau"}
    eval_keys |= {f"val_ploss_{k}" for k in ttt} | {f"val_acc_{k}" for k in ttt}
    for r in trained["eval"]:
        assert set(r) == eval_keys
        accs = [r[f"val_acc_{k}"] for k in ttt]
        assert r["val_sim_accept_len"] == pytest.approx(sum(math.prod(accs[: k + 1]) for k in ttt))
        assert r["plateau"] is False


def test_checkpoints_use_the_sglang_layout(trained: dict[str, Any], tiny: dict[str, Path]) -> None:
    from safetensors.torch import load_file

    out: Path = trained["out"]
    assert sorted(p.name for p in out.iterdir()) == ["final", "step-100", "step-200"]
    final = out / "final"
    config = json.loads((final / "config.json").read_text())
    assert config["architectures"] == [SGLANG_DRAFT_ARCHITECTURE]
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == DRAFT_VOCAB
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == read_manifest(tiny["data"]).aux_layer_ids
    assert config["vocab_size"] == 64 and config["hidden_size"] == 32 and config["target_hidden_size"] == 32
    weights = load_file(str(final / "model.safetensors"))
    assert set(weights) == set(SGLANG_DRAFT_WEIGHTS)
    assert weights["fc.weight"].shape == (32, 3 * 32) and weights["fc.weight"].dtype == torch.float32
    assert weights["midlayer.self_attn.q_proj.weight"].shape == (32, 64)
    d2t, t2d = weights["d2t"], weights["t2d"]
    assert d2t.shape == (DRAFT_VOCAB,) and t2d.shape == (64,) and int(t2d.sum()) == DRAFT_VOCAB
    assert torch.equal(torch.arange(DRAFT_VOCAB) + d2t, t2d.nonzero().squeeze(1))
    assert checkpoint.checkpoint_step(final) == TRAIN_STEPS
    state = checkpoint.load_training_state(out / "step-100")
    assert state["step"] == 100 and state["optimizer"]["state"] and state["scheduler"]["last_epoch"] == 100


def test_a_checkpoint_reloads_into_the_trainer_with_identical_outputs(
    trained: dict[str, Any], tiny: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "reload"
    shutil.copytree(trained["out"] / "final", out / "final")
    options = TrainOptions(
        data=tiny["data"], target=tiny["target"], out=out, steps=TRAIN_STEPS, resume=True, val_samples=4, batch_size=8
    )
    run = prepare(options, distributed.init())
    assert run.trainer.progress.step == TRAIN_STEPS
    evaluated = run.trainer.evaluate(run.source.val_batches(run.layout))
    logged = trained["eval"][-1]
    for key, value in evaluated.items():
        assert value == pytest.approx(logged[key], rel=1e-6, abs=1e-7), key


def _resume_args(tiny: dict[str, Path], out: Path, *extra: str) -> list[str]:
    steps = ("--steps", "16", "--ttt", "3", "--lr", "3e-3", "--log-every", "1", "--eval-every", "8")
    return args(tiny, out, *steps, "--save-every", "8", *extra)


@pytest.mark.parametrize("accum", ["1", "2"])
def test_resume_continues_the_step_and_reproduces_an_uninterrupted_run(
    tiny: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    accum: str,
) -> None:
    from safetensors.torch import load_file

    monkeypatch.delenv("EAGLE3_METRICS_FILE", raising=False)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(_resume_args(tiny, straight, "--grad-accum", accum)) == 0
    # The interrupted run: all that survived is the step-8 checkpoint.
    shutil.copytree(straight / "step-8", resumed / "step-8")
    capsys.readouterr()
    assert main(_resume_args(tiny, resumed, "--resume", "--grad-accum", accum)) == 0
    assert f"resuming {resumed / 'step-8'} at step 8" in capsys.readouterr().out
    full = {r["step"]: r for r in read_rows(straight / "metrics.jsonl") if "loss" in r}
    rows = [r for r in read_rows(resumed / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(9, 17))
    for row in rows:
        for key in ("loss", "ploss_2", "acc_0", "lr", "grad_norm"):
            assert row[key] == pytest.approx(full[row["step"]][key], rel=1e-5, abs=1e-6), (row["step"], key)
    a = load_file(str(straight / "final" / "model.safetensors"))
    b = load_file(str(resumed / "final" / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)


def test_resume_without_a_checkpoint_starts_fresh_and_an_existing_run_needs_resume(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(args(tiny, out, "--steps", "2", "--ttt", "2", "--eval-every", "0", "--resume")) == 0
    assert "starting at step 0" in capsys.readouterr().out
    assert main(args(tiny, out, "--steps", "2", "--ttt", "2")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "pass --resume" in err and err.count("\n") == 1
    assert main(args(tiny, out, "--steps", "2", "--ttt", "2", "--resume")) == 0
    assert "nothing to do" in capsys.readouterr().out


def _copy_data(tiny: dict[str, Path], dest: Path, **changes: Any) -> Path:
    shutil.copytree(tiny["data"], dest)
    manifest = read_manifest(dest)
    for key, value in changes.items():
        setattr(manifest, key, value)
    write_manifest(dest, manifest)
    return dest


def _draft_config(tmp_path: Path, aux: list[int]) -> Path:
    from backends.eagle3_contract import sglang_draft_config

    path = tmp_path / "draft.json"
    config = sglang_draft_config(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=64,
        draft_vocab_size=DRAFT_VOCAB,
        target_hidden_size=32,
        aux_layer_ids=aux,
        max_position_embeddings=256,
    )
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("hidden", "hidden size 48 (manifest.json), but --target has hidden size 32"),
        ("vocab", "vocabulary size 128 (manifest.json), but --target has vocabulary size 64"),
        ("aux_count", "the draft's fc takes 2 aux hidden states"),
        ("aux_ids", "the data was captured at [1, 3, 4]"),
        ("shard_width", "aux_hidden_states width 96"),
        ("resume_config", "the draft's fc takes 4 aux hidden states"),
    ],
)
def test_refuses_data_that_disagrees_with_the_draft(
    case: str, expected: str, tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, extra = tiny["data"], ["--steps", "2", "--ttt", "2"]
    if case == "hidden":
        data = _copy_data(tiny, tmp_path / "data", hidden_size=48)
    elif case == "vocab":
        data = _copy_data(tiny, tmp_path / "data", vocab_size=128)
    elif case == "aux_count":
        extra += ["--draft-config", str(_draft_config(tmp_path, [1, 4]))]
    elif case == "aux_ids":
        extra += ["--draft-config", str(_draft_config(tmp_path, [2, 3, 5]))]
    elif case == "shard_width":
        data = _copy_data(tiny, tmp_path / "data", aux_layer_ids=[1, 4])
    else:
        done = tmp_path / "done"
        assert main(args(tiny, done, "--steps", "1", "--ttt", "2", "--eval-every", "0")) == 0
        config = json.loads((done / "final" / "config.json").read_text())
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3, 4]
        (done / "final" / "config.json").write_text(json.dumps(config))
        extra += ["--out", str(done), "--resume"]
    capsys.readouterr()
    code = main([*args({**tiny, "data": data}, tmp_path / "out"), *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert expected in err


def test_the_cli_fails_in_one_line_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    base = ["--target", str(tmp_path), "--out", str(tmp_path / "o")]
    command = [sys.executable, "-m", "backends.train", *base, "--data", str(tmp_path / "nope")]
    missing = subprocess.run(command, capture_output=True, text=True, env=env)
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "manifest.json does not exist" in missing.stderr
    assert main([*base, "--data", str(tmp_path), "--ttt", "0"]) == 2
    assert capsys.readouterr().err == "error: --ttt must be at least 1, not 0\n"
    assert main([*base, "--data", str(tmp_path), "--grad-accum", "0"]) == 2
    assert capsys.readouterr().err == "error: --grad-accum must be at least 1, not 0\n"
    with pytest.raises(SystemExit) as usage:
        main([*base, "--steps", "x"])
    err = capsys.readouterr().err
    assert usage.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1


def test_a_step_larger_than_the_data_is_refused_in_one_line(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args(tiny, tmp_path / "o", "--grad-accum", "100")) == 2
    err = capsys.readouterr().err
    assert "cannot fill one step of 800 (--batch-size 8 x 1 processes x --grad-accum 100)" in err
    assert err.count("\n") == 1


def test_running_out_of_gpu_memory_ends_in_one_line_that_says_what_to_lower(
    tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No GPU here: the step raises what CUDA's allocator raises (the only stand-in in this test)."""
    from backends.train.trainer import Trainer

    def out_of_memory(self: Trainer, *batches: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(Trainer, "train_step", out_of_memory)
    assert main(args(tiny, tmp_path / "o", "--steps", "2")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "out of GPU memory: lower --batch-size (raise --grad-accum as much" in err


def _torchrun(tiny: dict[str, Path], out: Path, fsdp: str, batch: str, accum: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EAGLE3_METRICS_FILE"}
    env["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "backends.train", *args(tiny, out, "--batch-size", batch, "--steps", "4", "--ttt", "2")]
    command += ["--log-every", "1", "--eval-every", "4", "--save-every", "0", "--fsdp", fsdp, "--grad-accum", accum]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def test_processes_and_micro_batches_train_what_one_process_does_with_the_whole_batch(
    tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 8 in one process; 4 x 2 micro-batches (--grad-accum); 4 in each of two processes, DDP or FSDP; and
    2 x 2 micro-batches in each of two: the same samples each step, the same steps."""
    from safetensors.torch import load_file

    monkeypatch.delenv("EAGLE3_METRICS_FILE", raising=False)
    base = ("--steps", "4", "--ttt", "2", "--log-every", "1", "--eval-every", "4", "--save-every", "0")
    assert main(args(tiny, tmp_path / "one", *base, "--batch-size", "8")) == 0
    assert main(args(tiny, tmp_path / "accum", *base, "--batch-size", "4", "--grad-accum", "2")) == 0
    launches = {
        "ddp": ("off", "4", "1"),
        "fsdp": ("on", "4", "1"),
        "ddp-accum": ("off", "2", "2"),
        "fsdp-accum": ("on", "2", "2"),
    }
    for name, (fsdp, batch, accum) in launches.items():
        done = _torchrun(tiny, tmp_path / name, fsdp, batch, accum)
        assert done.returncode == 0, (name, done.stderr[-2000:])
        assert done.stdout.count("eagle3 train:") == 1  # only rank 0 speaks
    rows = {m: read_rows(tmp_path / m / "metrics.jsonl") for m in ("one", "accum", *launches)}
    assert [r["step"] for r in rows["ddp-accum"]] == [1, 2, 3, 4, 4]
    weights = {m: load_file(str(tmp_path / m / "final" / "model.safetensors")) for m in rows}
    for m in ("accum", *launches):
        for a, b in zip(rows["one"], rows[m], strict=True):
            for key in ("loss", "ploss_1", "acc_1", "grad_norm", "val_loss", "val_acc_0"):
                if key in a:
                    assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (m, a["step"], key)
        for name, tensor in weights["one"].items():
            torch.testing.assert_close(weights[m][name], tensor, rtol=1e-4, atol=1e-6)


# ---- units ---------------------------------------------------------------


def test_vocab_map_takes_the_most_frequent_loss_tokens_and_pads() -> None:
    ids = torch.tensor([5, 5, 5, 2, 2, 7, 9, 9, 1, 1, 1, 1])
    mask = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0])  # token 1 is only in the prompt
    counts = token_frequencies([(ids, mask)], vocab_size=10)
    assert counts.tolist() == [0, 0, 2, 0, 0, 3, 0, 1, 0, 2]
    top = build_vocab_map(counts, 3)
    assert top.t2d.nonzero().squeeze(1).tolist() == [2, 5, 9]  # tie 2 vs 9 at count 2: both; 7 drops out
    assert top.draft_ids.tolist() == [2, 5, 9] and top.d2t.tolist() == [2, 4, 7]
    padded = build_vocab_map(counts, 6)
    assert padded.distinct == 4 and len(padded.d2t) == 6
    assert padded.draft_ids.tolist() == [0, 1, 2, 5, 7, 9]  # seen tokens plus the smallest unused ids


def _reference_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """Query t of step k: step-0 keys 0..t and its own keys of steps 1..k, one softmax."""
    batch, heads, seq, dim = q.shape
    groups = heads // keys[0].shape[1]
    out = torch.zeros_like(q)
    for b in range(batch):
        for h in range(heads):
            g = h // groups
            for t in range(seq):
                ks = torch.cat([keys[0][b, g, : t + 1], *[k[b, g, t : t + 1] for k in keys[1:]]])
                vs = torch.cat([values[0][b, g, : t + 1], *[v[b, g, t : t + 1] for v in values[1:]]])
                weights = torch.softmax(ks @ q[b, h, t] / math.sqrt(dim), dim=0)
                out[b, h, t] = weights @ vs
    return out


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_ttt_attention_attends_to_the_prefix_and_its_own_chain() -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 6, 8, dtype=torch.float64)
    keys = [torch.randn(2, 2, 6, 8, dtype=torch.float64) for _ in range(3)]
    values = [torch.randn(2, 2, 6, 8, dtype=torch.float64) for _ in range(3)]
    for step in range(3):
        ks, vs = keys[: step + 1], values[: step + 1]
        expected = _reference_attention(q, ks, vs)
        torch.testing.assert_close(eager_ttt_attention(q, ks, vs), expected)
        flex = flex_ttt_attention(
            q.float(), [k.float() for k in ks], [v.float() for v in vs], ttt_block_mask(6, step, "cpu")
        )
        torch.testing.assert_close(flex.double(), expected, rtol=1e-4, atol=1e-5)


def test_loss_aligns_step_k_with_the_target_at_t_plus_1_plus_k() -> None:
    seq, vocab = 8, 8
    probs = torch.eye(vocab)[:seq].unsqueeze(0)  # target position j says: token j
    in_vocab = torch.ones(1, seq, dtype=torch.bool)
    in_vocab[0, 5] = False  # the target's argmax at position 5 is not in the draft vocabulary
    loss_mask = torch.ones(1, seq, dtype=torch.bool)
    loss_mask[0, 3] = False  # token 3 is not trained on
    right = [20 * torch.eye(vocab)[(torch.arange(seq) + 1 + k).clamp_max(vocab - 1)].unsqueeze(0) for k in range(3)]
    parts = ttt_loss(right, TeacherTargets(probs, in_vocab), loss_mask)
    # step k: positions t = 0..seq-3-k predict token t+2+k; token 3 is masked; target position 5 is out of vocab.
    assert parts.counted.tolist() == [5, 4, 4]
    assert parts.in_loss.tolist() == [4, 3, 3]
    assert parts.correct.tolist() == [4, 3, 3]
    assert parts.ploss.max() < 1e-6
    assert parts.loss == pytest.approx(0.0, abs=1e-5)
    wrong = [20 * torch.eye(vocab)[torch.arange(seq)].unsqueeze(0) for _ in range(3)]  # off by 1+k
    missed = ttt_loss(wrong, TeacherTargets(probs, in_vocab), loss_mask)
    assert missed.correct.sum() == 0 and missed.ploss.min() > 10


def test_teacher_uses_the_lm_head_or_the_tied_embedding(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    folder = write_target(tmp_path / "target")
    cfg = json.loads((folder / "config.json").read_text())
    embed, lm_head = load_target_matrices(folder, read_target_config(folder))
    assert not torch.equal(embed, lm_head)
    # A tied target stores no lm_head.
    tied = tmp_path / "tied"
    tied.mkdir()
    (tied / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    save_file({"model.embed_tokens.weight": embed}, str(tied / "model.safetensors"))
    embed2, head2 = load_target_matrices(tied, read_target_config(tied))
    assert head2 is embed2 and torch.equal(embed2, embed)
    t2d = torch.zeros(64, dtype=torch.bool)
    t2d[:32] = True
    teacher = Teacher(lm_head, torch.arange(32), t2d)
    hidden = torch.randn(2, 5, 32)
    out = teacher_targets(teacher, hidden)
    logits = hidden @ lm_head.T
    torch.testing.assert_close(out.probs, torch.softmax(logits[..., :32], -1))
    assert torch.equal(out.in_vocab, logits.argmax(-1) < 32)


def test_schedule_warms_up_then_decays_to_zero() -> None:
    assert [lr_factor(s, 4, 20) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(12, 4, 20) == pytest.approx(0.5)
    assert lr_factor(20, 4, 20) == pytest.approx(0.0)
    values = [lr_factor(s, 4, 20) for s in range(4, 21)]
    assert values == sorted(values, reverse=True)


def test_plateau_flags_evals_without_a_half_percent_gain() -> None:
    assert not plateaued([5.0, 4.0, 3.0], window=2)
    assert plateaued([5.0, 4.0, 3.99, 3.985], window=2)  # best 3.985 is within 0.5% of 4.0
    assert not plateaued([5.0, 4.0, 3.99, 3.9], window=2)
    assert not plateaued([4.0, 4.0], window=2)  # not enough history
    assert simulated_accept_length([0.5, 0.5, 1.0]) == pytest.approx(0.5 + 0.25 + 0.25)


def test_checkpoints_leave_no_temporaries_and_latest_is_the_highest_complete_step(tmp_path: Path) -> None:
    weights = {name: torch.zeros(2) for name in SGLANG_DRAFT_WEIGHTS}
    for step in (3, 12, 7):
        checkpoint.save_checkpoint(tmp_path, f"step-{step}", weights, {"a": 1}, {"step": step, "epoch": 0})
    checkpoint.save_checkpoint(tmp_path, "step-7", weights, {"a": 2}, {"step": 7, "epoch": 0})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-12", "step-3", "step-7"]  # no temporaries left
    assert checkpoint.read_config(tmp_path / "step-7") == {"a": 2}
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "step-12"
    (tmp_path / "step-12" / checkpoint.MARKER).unlink()  # incomplete: skipped
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "step-7"
    with pytest.raises(ValueError, match="missing"):
        checkpoint.save_checkpoint(tmp_path, "bad", {"fc.weight": torch.zeros(1)}, {}, {"step": 1, "epoch": 0})


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "linear", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_rope_matches_transformers(scaling: dict[str, Any] | None) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from backends.train.rope import RotaryEmbedding

    fields: dict[str, Any] = {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 16}
    fields.update(max_position_embeddings=512, rope_theta=5e5, rope_scaling=scaling)
    reference = LlamaRotaryEmbedding(config=LlamaConfig(**fields))
    positions = torch.arange(3, 300)
    cos_ref, sin_ref = reference(torch.zeros(1, 1), positions.unsqueeze(0))
    cos, sin = RotaryEmbedding(16, 5e5, scaling, 512)(positions)
    torch.testing.assert_close(cos, cos_ref[0])
    torch.testing.assert_close(sin, sin_ref[0])


def test_attention_choice_falls_back_to_flex_without_triton_and_to_eager_where_neither_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from backends.train import ttt_kernel
    from backends.train.errors import TrainError
    from backends.train.trainer import resolve_attention

    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert resolve_attention("auto", gpu, 128) == "triton"  # the test extra installs Triton
    assert resolve_attention("auto", gpu, 8) == "eager"  # tl.dot (flex's kernel and ours) needs head_dim >= 16
    assert resolve_attention("auto", cpu, 128) == "eager"
    with pytest.raises(TrainError, match="head_dim >= 16"):
        resolve_attention("flex", gpu, 8)
    with pytest.raises(TrainError, match="needs a GPU"):
        resolve_attention("triton", cpu, 128)
    monkeypatch.setattr(ttt_kernel, "triton", None)
    assert resolve_attention("auto", gpu, 128) == "flex"
    with pytest.raises(TrainError, match="needs Triton"):
        resolve_attention("triton", gpu, 128)


def counted_compilations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on torch.compile only traces; each graph it traces is counted in the list returned."""
    graphs: list[int] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **{**kw, "backend": counting}))
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # the run points them at its OUT: restored after
        monkeypatch.delenv(name, raising=False)
    torch._dynamo.reset()
    return graphs


def compiled_run(tiny: dict[str, Path], out: Path) -> tuple[Run, Batch]:
    options = TrainOptions(
        data=tiny["data"], target=tiny["target"], out=out, steps=4, val_samples=4, batch_size=8, compile=True
    )
    run = prepare(options, distributed.init())
    return run, next(iter(run.source.train_batches(run.layout, 0, 0, 0)))


def test_one_compiled_graph_serves_every_padded_length_within_torchs_recompile_limit(
    tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The length is dynamic: batches of 5 padded lengths run one graph. Past torch's recompile limit (made
    2 here) a graph per length would run the rest uncompiled, and eager flex attention runs out of memory on
    a long batch; a graph per length took about a minute each on an H200 (an hour for --max-length 8192)."""
    import backends.train.trainer as trainer_module

    graphs = counted_compilations(monkeypatch)
    monkeypatch.setattr(trainer_module, "RECOMPILE_LIMIT", 2)
    for limit in ("recompile_limit", "accumulated_recompile_limit"):  # restored after the test
        monkeypatch.setattr(torch._dynamo.config, limit, 2)
    run, batch = compiled_run(tiny, tmp_path)
    assert run.trainer.padded_lengths == read_manifest(tiny["data"]).max_length  # pad multiple 1 on the CPU
    assert "compile on, one graph for every length, compiled by the first step" in describe(run)
    seq = batch.input_ids.shape[1]
    lengths = [seq - 2 * i for i in range(5)]
    for length in lengths:
        run.trainer.train_step(batch.prefix(length))
    assert len(graphs) == 1, f"{len(graphs)} graphs for {len(lengths)} lengths"


def test_one_compiled_graph_serves_batches_that_skip_different_rows(
    tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch computes its own rows (step_rows): were their counts baked into the compiled graph,
    every batch would compile again, and past torch's recompile limit train uncompiled."""
    graphs = counted_compilations(monkeypatch)
    run, batch = compiled_run(tiny, tmp_path)
    computed = []
    for prompt in (10, 14, 18, 22):
        batch.loss_mask[:, :prompt] = False
        teacher = run.trainer.teacher.rows(batch.hidden_state, batch.loss_mask)
        computed.append(sum(len(r) for r in loss_rows(batch.loss_mask, teacher, run.options.ttt).plan.rows))
        run.trainer.train_step(batch)
    assert len(set(computed)) == 4, "each batch should skip a different number of rows"
    assert len(graphs) == 1
