"""Metrics from other trainers: each stdout format and TensorBoard event files
become our metrics.jsonl rows, malformed input never raises, and the follower
run by the supervisor neither loses nor repeats rows."""

from __future__ import annotations

import errno
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.fileio import append_jsonl
from backends.protocol import not_metric_values, parse_source
from backends.runs import metrics_sources
from backends.runs.metrics_sources import (
    LINE_SOURCES,
    LineParser,
    MetricsFollower,
    canonical_name,
    parse_text,
)
from backends.runs.store import EVENTS, EXIT, METRICS, METRICS_SOURCE, OUTPUT, RunDir, RunSpec, RunStore, SpecError
from tests.conftest import REPO, wait_for


def rows_of(run: RunDir) -> list[dict[str, Any]]:
    path = run.file(METRICS)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def errors_of(run: RunDir) -> list[str]:
    path = run.file(EVENTS)
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [e["error"] for e in events if e["type"] == "metrics_error"]


@pytest.fixture
def train_run(tmp_path: Path) -> RunDir:
    return RunStore(tmp_path / "work").create(RunSpec(kind="train", argv=["python", "train.py"]))


# --- the option ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("jsonl", "jsonl"),
        (" SpecForge ", "specforge"),
        ("speculators", "speculators"),
        ("eagle", "eagle"),
        ("tensorboard:outputs/runs", "tensorboard:outputs/runs"),
        ("TensorBoard: /abs/dir ", "tensorboard:/abs/dir"),
        ("tensorboard:C:/x", "tensorboard:C:/x"),
    ],
)
def test_parse_source_normalises_good_values(text: str, value: str) -> None:
    assert parse_source(text) == value


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("wandb", ["unknown metrics source 'wandb'", "jsonl, specforge, speculators, eagle or tensorboard:DIR"]),
        ("", ["unknown metrics source"]),
        ("tensorboard", ["tensorboard:DIR"]),
        ("tensorboard:  ", ["tensorboard:DIR"]),
        ("specforge:outputs", ["takes no argument"]),
        ("tensorboard:a\0b", ["NUL"]),
    ],
)
def test_parse_source_says_what_to_write(text: str, words: list[str]) -> None:
    with pytest.raises(ValueError) as exc:
        parse_source(text)
    for word in words:
        assert word in str(exc.value)


def test_run_spec_carries_and_validates_metrics_from(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    run = store.create(RunSpec(kind="train", argv=["t"], metrics_from="tensorboard:runs"))
    assert run.spec().metrics_from == "tensorboard:runs"
    assert RunSpec(kind="train", argv=["t"]).metrics_from is None
    with pytest.raises(SpecError, match="tensorboard:DIR"):
        store.create(RunSpec(kind="train", argv=["t"], metrics_from="tensorboard"))
    with pytest.raises(SpecError, match="goes with train runs"):
        store.create(RunSpec(kind="serve", argv=["t"], metrics_from="specforge"))
    with pytest.raises(SpecError, match="string or null"):
        RunSpec.from_json({"kind": "train", "argv": ["t"], "metrics_from": 3})


# --- names --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        # SpecForge v0.2.0 and 2026
        ("train/acc_3", "acc_3"),
        ("train/ploss_2", "ploss_2"),
        ("train/lr", "lr"),
        ("acc_0", "acc_0"),
        ("loss", "loss"),
        ("train/grad_norm", "grad_norm"),
        ("eval/acc_1", "val_acc_1"),
        ("eval/ploss_1", "val_ploss_1"),
        ("eval/avg_loss", "val_loss"),
        ("eval/avg_acc", "val_acc"),
        ("eval/simulated_acc_len", "val_sim_accept_len"),
        ("eval/acceptance_rate_2", "val_acceptance_rate_2"),
        ("train/epoch_acc_0", "epoch_acc_0"),
        ("eval/epoch_ploss_4", "val_ploss_4"),
        # speculators
        ("train/loss_0", "ploss_0"),
        ("train/loss", "loss"),
        ("train/full_acc_2", "full_acc_2"),
        ("train/cond_acc_2", "cond_acc_2"),
        ("val/loss_epoch", "val_loss"),
        ("val/loss_1_epoch", "val_ploss_1"),
        ("val/full_acc_1_epoch", "val_full_acc_1"),
        ("global_step", "step"),
        # EAGLE
        ("train/epochacc_5", "epoch_acc_5"),
        ("train/epochploss_5", "epoch_ploss_5"),
        ("test/epochacc_0", "val_acc_0"),
        ("test/epochploss_0", "val_ploss_0"),
        # unknown: own name, less train/ only
        ("perf/tokens_per_sec", "perf/tokens_per_sec"),
        ("train/perf/step_time", "perf/step_time"),
        ("eval/whatever", "eval/whatever"),
        ("acceptance_rate_1", "acceptance_rate_1"),
    ],
)
def test_canonical_names(name: str, ours: str) -> None:
    assert canonical_name(name) == ours


# --- SpecForge ----------------------------------------------------------------------------------

# v0.2.0: a tqdm bar redrawn with \r (postfix loss/acc), per-position lines at epoch end and eval.
SPECFORGE_V020 = (
    "Initialized Eagle3 FSDP model\n"
    "Starting training from epoch 0\n"
    "Training Epoch 0:   0%|          | 0/400 [00:00<?, ?it/s]"
    "\rTraining Epoch 0:   0%|          | 1/400 [00:02<14:12,  2.14s/it, loss=5.43, acc=0.03]"
    "\rTraining Epoch 0:   0%|          | 2/400 [00:03<09:01,  1.36s/it, loss=5.43, acc=0.03]"
    "\rTraining Epoch 0:  25%|██▌       | 100/400 [01:40<05:00,  1.00it/s, loss=3.12, acc=0.41]"
    "\rTraining Epoch 0: 100%|██████████| 400/400 [06:40<00:00,  1.00it/s, loss=2.05, acc=0.58]\n"
    "Train Epoch [1/2], position 0,  Acc: 0.74\n"
    "Train Epoch [1/2], position 1,  Acc: 0.52\n"
    "Train Epoch [1/2], position 2,  Acc: 0.38\n"
    "Train Epoch [1/2], position 0, pLoss: 1.21\n"
    "Train Epoch [1/2], position 1, pLoss: 1.87\n"
    "Train Epoch [1/2], position 2, pLoss: 2.40\n"
    "Evaluating Epoch 0: 100%|██████████| 50/50 [00:20<00:00,  2.50it/s]\n"
    "Eval - Step 400 [400/800], position 0,  Acc: 0.71\n"
    "Eval - Step 400 [400/800], position 1,  Acc: 0.49\n"
    "Eval - Step 400 [400/800], position 0, pLoss: 1.30\n"
    "Saved full training state to outputs/epoch_0/training_state.pt\n"
    "Train Epoch [2/2], position 0,  Acc: 0.80\n"
)


def test_specforge_v020_stdout() -> None:
    assert parse_text("specforge", SPECFORGE_V020) == [
        {"epoch": 0, "batch": 1, "loss": 5.43, "acc": 0.03, "source": "specforge"},
        {"epoch": 0, "batch": 100, "loss": 3.12, "acc": 0.41, "source": "specforge"},
        {"epoch": 0, "batch": 400, "loss": 2.05, "acc": 0.58, "source": "specforge"},
        {
            "epoch": 0,
            "epoch_acc_0": 0.74,
            "epoch_acc_1": 0.52,
            "epoch_acc_2": 0.38,
            "epoch_ploss_0": 1.21,
            "epoch_ploss_1": 1.87,
            "epoch_ploss_2": 2.40,
            "source": "specforge",
        },
        {"step": 400, "val_acc_0": 0.71, "val_acc_1": 0.49, "val_ploss_0": 1.30, "source": "specforge"},
        {"epoch": 1, "epoch_acc_0": 0.80, "source": "specforge"},
    ]


# 2026: `step N: {dict}` printed plainly, through rich logging (wrapped at 80 columns), with a tracker prefix.
SPECFORGE_2026 = (
    "[03/02/26 10:00:01] INFO     Loading draft config from configs/llama3-8B-eagle3.json   train.py:88\n"
    "step 50: {'acc_0': 0.21, 'acc_1': 0.09, 'ploss_0': 4.9, 'ploss_1': 5.3, 'acceptance_rate_0': 0.21, "
    "'acc': 0.15, 'loss': 9.14, 'acceptance_rate': 0.12, 'grad_norm': 3.2, 'lr': 2e-05, "
    "'perf/tokens_per_sec': 51234.5}\n"
    "step 100: {'train/acc_0': np.float64(0.33), 'train/ploss_0': tensor(3.8125, device='cuda:0'), "
    "'train/lr': 4e-05, 'train/grad_norm': nan}\n"
    "[03/02/26 10:05:00] INFO     step 150: {'acc_0': 0.41, 'acc_1': 0.22,           train.py:412\n"
    "                             'ploss_0': 3.1, 'ploss_1': 3.9, 'loss': 6.2}\n"
    "step 200: {'eval/avg_loss': 2.91, 'eval/avg_acc': 0.47, 'eval/per_position_acc': [0.62, 0.41, 0.3], "
    "'eval/simulated_acc_len': 2.02, 'eval/acceptance_rate_0': 0.62, 'eval/ploss_0': 2.2}\n"
    'step 250: {"acc_0": 0.5, "loss": 5.0}\n'
)


def test_specforge_2026_stdout() -> None:
    rows = parse_text("specforge", SPECFORGE_2026)
    assert rows[0] == {
        "step": 50,
        "acc_0": 0.21,
        "acc_1": 0.09,
        "ploss_0": 4.9,
        "ploss_1": 5.3,
        "acceptance_rate_0": 0.21,
        "acc": 0.15,
        "loss": 9.14,
        "acceptance_rate": 0.12,
        "grad_norm": 3.2,
        "lr": 2e-05,
        "perf/tokens_per_sec": 51234.5,
        "source": "specforge",
    }
    assert {k: v for k, v in rows[1].items() if k != "grad_norm"} == {
        "step": 100,
        "acc_0": 0.33,
        "ploss_0": 3.8125,
        "lr": 4e-05,
        "source": "specforge",
    }
    assert math.isnan(rows[1]["grad_norm"])
    assert rows[2] == {
        "step": 150,
        "acc_0": 0.41,
        "acc_1": 0.22,
        "ploss_0": 3.1,
        "ploss_1": 3.9,
        "loss": 6.2,
        "source": "specforge",
    }
    assert rows[3] == {
        "step": 200,
        "val_loss": 2.91,
        "val_acc": 0.47,
        "val_acc_0": 0.62,
        "val_acc_1": 0.41,
        "val_acc_2": 0.3,
        "val_sim_accept_len": 2.02,
        "val_acceptance_rate_0": 0.62,
        "val_ploss_0": 2.2,
        "source": "specforge",
    }
    assert rows[4] == {"step": 250, "acc_0": 0.5, "loss": 5.0, "source": "specforge"}
    assert len(rows) == 5


def test_specforge_malformed_lines_are_counted_not_raised() -> None:
    parser = LineParser("specforge")
    lines = [
        "step 10: {'acc_0': 0.5",  # never closed: the next line does not continue it
        "step 11: {'acc_0': 0.6}",
        "step 12: {'acc_0': }",
        "step 13: {1, 2}",  # a set, not a dict
        "step 14: {}",  # nothing in it: no row, not malformed
        "Train Epoch [1/2], position 0,  Acc: n/a",
        "Training Epoch 0:  50%|█████     | 5/10 [00:05<00:05, loss=, acc]",
        "step 99999999999999999999999: {'acc_0': 0.1}",
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    rows = [row for i, line in enumerate(lines) for row in parser.feed(line, i)] + parser.flush()
    assert rows == [{"step": 11, "acc_0": 0.6, "source": "specforge"}]
    assert parser.malformed == 4
    assert parser.last_malformed == "Train Epoch [1/2], position 0,  Acc: n/a"


def test_a_wrapped_dict_that_never_closes_is_malformed() -> None:
    parser = LineParser("specforge")
    rows = parser.feed("step 5: {'acc_0': 0.1,", 0) + parser.feed("   'acc_1': 0.2,", 1) + parser.flush()
    assert rows == []
    assert parser.malformed == 1


def test_per_position_lines_of_different_epochs_are_different_rows() -> None:
    text = "\n".join(
        [
            "Train Epoch [1/3], position 0,  Acc: 0.50",
            "Train Epoch [1/3], position 1,  Acc: 0.30",
            "Train Epoch [2/3], position 0,  Acc: 0.60",
            "Train Step [1200], position 0,  Acc: 0.61",
            "Eval in /data/eval.jsonl, position 0,  Acc: 0.55",
            "Eval in /data/eval.jsonl, position 1,  Acc: 0.35",
        ]
    )
    assert parse_text("specforge", text) == [
        {"epoch": 0, "epoch_acc_0": 0.5, "epoch_acc_1": 0.3, "source": "specforge"},
        {"epoch": 1, "epoch_acc_0": 0.6, "source": "specforge"},
        {"step": 1200, "epoch_acc_0": 0.61, "source": "specforge"},
        {"val_acc_0": 0.55, "val_acc_1": 0.35, "source": "specforge"},
    ]


# --- speculators --------------------------------------------------------------------------------

# rich at 80 columns (output to a file): records wrap onto indented lines; a repeated time is left out.
SPECULATORS = """\
[20:17:10] INFO     No previous training checkpoint found in          trainer.py:165
                    'output/checkpoints'. Starting fresh training run.
[20:17:10] INFO     Training epoch 1/2 started                        trainer.py:428
[20:17:13] INFO     train/loss_0=1.980, train/full_acc_0=0.029,       trainer.py:381
                    train/cond_acc_0=0.029, train/loss_1=1.970,
                    train/full_acc_1=9.45e-04, train/cond_acc_1=0.033,
                    train/loss=5.965, epoch=0, lr=2.47e-05, global_step=0
           INFO     train/loss_0=1.801, train/full_acc_0=0.112,       trainer.py:381
                    train/loss=5.001, epoch=0, lr=4.94e-05, global_step=1
Epoch 0 ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 2/2 0:00:01 • 0:00:00
[20:17:20] INFO     Resuming mid-epoch from epoch=0 local_step=1      trainer.py:140
[20:17:21] INFO     val/loss_epoch=4.512, val/full_acc_0_epoch=0.201, trainer.py:407
                    val/loss_0_epoch=1.5, epoch=0
[20:17:22] INFO     lr/AdamW=1.00e-05, lr/Muon=0.020, global_step=2   trainer.py:381
"""


def test_speculators_stdout() -> None:
    assert parse_text("speculators", SPECULATORS) == [
        {
            "step": 0,
            "epoch": 0,
            "ploss_0": 1.98,
            "full_acc_0": 0.029,
            "cond_acc_0": 0.029,
            "ploss_1": 1.97,
            "full_acc_1": 9.45e-04,
            "cond_acc_1": 0.033,
            "loss": 5.965,
            "lr": 2.47e-05,
            "source": "speculators",
        },
        {
            "step": 1,
            "epoch": 0,
            "ploss_0": 1.801,
            "full_acc_0": 0.112,
            "loss": 5.001,
            "lr": 4.94e-05,
            "source": "speculators",
        },
        {"epoch": 0, "val_loss": 4.512, "val_full_acc_0": 0.201, "val_ploss_0": 1.5, "source": "speculators"},
        {"step": 2, "lr/AdamW": 1e-05, "lr/Muon": 0.02, "source": "speculators"},
    ]


def test_speculators_repeated_key_starts_a_new_record() -> None:
    text = "train/loss=1.0, global_step=1\n  train/loss=2.0, global_step=2\n"
    assert [r["step"] for r in parse_text("speculators", text)] == [1, 2]


# --- EAGLE --------------------------------------------------------------------------------------

EAGLE = """\
Now training epoch 0
100%|██████████| 6250/6250 [1:02:11<00:00,  1.68it/s]
Train Epoch [1/40], position 0,  Acc: 0.62
Train Epoch [1/40], position 1,  Acc: 0.41
Train Epoch [1/40], position 0, pLoss: 1.95
Train Epoch [1/40], position 1, pLoss: 2.71
  0%|          | 0/313 [00:00<?, ?it/s]\r 50%|█████     | 156/313 [00:30<00:30,  5.20it/s]\r100%|███| 313/313 [01:00]
Test Epoch [1/40], position 0,  Acc: 0.60
Test Epoch [1/40], position 1,  Acc: 0.39
Test Epoch [1/40], position 0, pLoss: 2.01
Test Epoch [1/40], position 1, pLoss: 2.80
[2026-01-05 10:00:00,000] [INFO] [engine.py:3614:save_16bit_model] Saving model weights to state_0/pytorch_model.bin
"""


def test_eagle_stdout() -> None:
    assert parse_text("eagle", EAGLE) == [
        {
            "epoch": 0,
            "epoch_acc_0": 0.62,
            "epoch_acc_1": 0.41,
            "epoch_ploss_0": 1.95,
            "epoch_ploss_1": 2.71,
            "source": "eagle",
        },
        {"epoch": 0, "val_acc_0": 0.60, "val_acc_1": 0.39, "val_ploss_0": 2.01, "val_ploss_1": 2.80, "source": "eagle"},
    ]


# --- jsonl --------------------------------------------------------------------------------------


def test_jsonl_passes_dict_lines_through() -> None:
    parser = LineParser("jsonl")
    lines = [
        '{"step": 1, "loss": 5.4, "acc_0": 0.03, "tokens_per_s": 12000}',
        "loading shards ...",
        '{"step": 2, "loss": NaN}',
        '{"step": 3,',
        "[1, 2, 3]",
        '{"step": 4, "val_loss": 4.1, "val_sim_accept_len": 1.9, "source": "own"}',
    ]
    rows = [row for line in lines for row in parser.feed(line)] + parser.flush()
    assert rows[0] == {"step": 1, "loss": 5.4, "acc_0": 0.03, "tokens_per_s": 12000, "source": "jsonl"}
    assert rows[1]["step"] == 2 and math.isnan(rows[1]["loss"])
    assert rows[2] == {"step": 4, "val_loss": 4.1, "val_sim_accept_len": 1.9, "source": "own"}
    assert len(rows) == 3
    assert parser.malformed == 1  # `{"step": 3,`; a list does not start like an object


# --- properties ---------------------------------------------------------------------------------

METRIC_WORDS = st.sampled_from(
    [
        "step ",
        "step 3: {",
        "}",
        "{",
        "'acc_0': ",
        '"loss": ',
        "0.5",
        "nan",
        "tensor(",
        ")",
        "np.float64(",
        "[",
        "]",
        ", ",
        "=",
        "train/loss_0=",
        "global_step=",
        "INFO     ",
        "[20:17:13] ",
        "trainer.py:191",
        "Train Epoch [1/3], position ",
        "Eval - Step 5 [",
        "Acc: ",
        "pLoss: ",
        "|",
        "5/10 [00:01<00:01, ",
        "loss=",
        "Epoch 0",
        "\n",
        "\r",
        "  ",
        "-",
        "9" * 30,
        "1e309",
        "\x1b[32m",
        "\x00",
    ]
)
TEXTS = st.one_of(st.text(), st.lists(st.one_of(METRIC_WORDS, st.text(max_size=3)), max_size=60).map("".join))


@settings(max_examples=300, deadline=None)
@given(source=st.sampled_from(sorted(LINE_SOURCES)), text=TEXTS)
def test_any_text_parses_without_raising(source: str, text: str) -> None:
    for row in parse_text(source, text):
        json.dumps(row)  # every row can be written


NAMES = st.from_regex(r"(train/)?(acc|ploss|acceptance_rate)_[0-7]|loss|lr|grad_norm|perf/[a-z_]{1,8}", fullmatch=True)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(
    step=st.integers(0, 10**9), metrics=st.dictionaries(NAMES, FLOATS, min_size=1, max_size=12), as_json=st.booleans()
)
def test_specforge_step_lines_round_trip(step: int, metrics: dict[str, float], as_json: bool) -> None:
    printed = json.dumps(metrics) if as_json else repr(metrics)
    expected: dict[str, Any] = {"step": step}
    for name, value in metrics.items():
        expected[canonical_name(name)] = value
    assert parse_text("specforge", f"step {step}: {printed}\n") == [{**expected, "source": "specforge"}]


SPECULATORS_NAMES = st.from_regex(r"train/(loss|full_acc|cond_acc)_[0-4]|train/loss|lr", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(
    step=st.integers(0, 10**9),
    epoch=st.integers(0, 100),
    metrics=st.dictionaries(SPECULATORS_NAMES, FLOATS, min_size=1, max_size=10),
    width=st.integers(30, 200),
)
def test_speculators_lines_round_trip(step: int, epoch: int, metrics: dict[str, float], width: int) -> None:
    message = ", ".join([*(f"{k}={v!r}" for k, v in metrics.items()), f"epoch={epoch}", f"global_step={step}"])
    # Wrapped the way rich wraps a message column: at spaces, continuation lines indented.
    lines = textwrap.wrap(message, width, break_long_words=False, break_on_hyphens=False)
    text = f"[10:00:00] INFO     {lines[0]}    trainer.py:381\n" + "".join(f"{' ' * 20}{line}\n" for line in lines[1:])
    expected = {"step": step, "epoch": epoch, **{canonical_name(k): v for k, v in metrics.items()}}
    assert parse_text("speculators", text) == [{**expected, "source": "speculators"}]


@settings(max_examples=200, deadline=None)
@given(
    epoch=st.integers(1, 50),
    phase=st.sampled_from(["Train", "Test"]),
    accs=st.lists(st.integers(0, 100), min_size=1, max_size=8),
    plosses=st.lists(st.integers(0, 999), max_size=8),
)
def test_eagle_lines_round_trip(epoch: int, phase: str, accs: list[int], plosses: list[int]) -> None:
    lines = [f"{phase} Epoch [{epoch}/50], position {i},  Acc: {a / 100:.2f}" for i, a in enumerate(accs)]
    lines += [f"{phase} Epoch [{epoch}/50], position {i}, pLoss: {p / 100:.2f}" for i, p in enumerate(plosses)]
    prefix = "epoch" if phase == "Train" else "val"
    expected: dict[str, Any] = {"epoch": epoch - 1}
    expected.update({f"{prefix}_acc_{i}": a / 100 for i, a in enumerate(accs)})
    expected.update({f"{prefix}_ploss_{i}": p / 100 for i, p in enumerate(plosses)})
    assert parse_text("eagle", "\n".join(lines)) == [{**expected, "source": "eagle"}]


JSON_ROWS = st.dictionaries(
    st.text(min_size=1, max_size=10),
    st.one_of(st.integers(), FLOATS, st.text(max_size=5), st.booleans(), st.none()),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(row=JSON_ROWS)
def test_jsonl_lines_round_trip(row: dict[str, Any]) -> None:
    line = json.dumps(row)
    assert parse_text("jsonl", line + "\n") == [{**row, "source": row.get("source", "jsonl")}]


# --- the follower -------------------------------------------------------------------------------


def step_line(step: int) -> str:
    return f"step {step}: {{'train/acc_0': {step / 1000}, 'loss': {10 - step / 100}}}"


# Lines whose rows do not depend on where the reads fall: no per-position groups, no wrapping.
STREAM_LINES = st.lists(
    st.one_of(
        st.integers(0, 999).map(step_line),
        st.integers(0, 9).map(lambda n: f"Training Epoch 0:  {n}0%|█  | {n}/10 [00:0{n}<00:10, loss={n}.5, acc=0.{n}]"),
        st.text(alphabet="abc xyz:", max_size=20),
    ),
    max_size=25,
)
ENDINGS = st.sampled_from(["\n", "\r", "\r\n"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=STREAM_LINES, ending=ENDINGS, cuts=st.lists(st.integers(0, 4000), max_size=8), restarts=st.data())
def test_follower_reads_like_the_whole_text_whatever_the_chunks_and_restarts(
    lines: list[str], ending: str, cuts: list[int], restarts: st.DataObject
) -> None:
    data = ending.join(lines).encode()  # the last line unterminated, as at a sudden exit
    with tempfile.TemporaryDirectory() as tmp:
        run = RunStore(Path(tmp)).create(RunSpec(kind="train", argv=["t"], metrics_from="specforge"))
        follower = MetricsFollower(run, "specforge")
        done = 0
        for cut in sorted({min(c, len(data)) for c in cuts}):
            with open(run.file(OUTPUT), "ab") as fh:
                fh.write(data[done:cut])
            done = cut
            follower.drain()
            if restarts.draw(st.booleans(), label="restart the supervisor here"):
                follower = MetricsFollower(run, "specforge")
        with open(run.file(OUTPUT), "ab") as fh:
            fh.write(data[done:])
        follower.drain(final=True)
        assert rows_of(run) == parse_text("specforge", data.decode())


def test_follower_waits_for_the_rest_of_a_line(train_run: RunDir) -> None:
    follower = MetricsFollower(train_run, "specforge")
    with open(train_run.file(OUTPUT), "ab") as fh:
        fh.write(b"step 10: {'acc_0': 0.5, 'loss': 3.")
    assert follower.drain() == 0
    with open(train_run.file(OUTPUT), "ab") as fh:
        fh.write(b"25}\nstep 20: {'acc_0': 0.6}")
    assert follower.drain() == 1
    assert rows_of(train_run) == [{"step": 10, "acc_0": 0.5, "loss": 3.25, "source": "specforge"}]
    assert follower.drain(final=True) == 1  # the unterminated last line, once the child is gone
    assert rows_of(train_run)[-1] == {"step": 20, "acc_0": 0.6, "source": "specforge"}


def test_follower_joins_a_group_across_reads_and_ends_it_when_quiet(train_run: RunDir) -> None:
    follower = MetricsFollower(train_run, "eagle")
    with open(train_run.file(OUTPUT), "ab") as fh:
        fh.write(b"Train Epoch [1/2], position 0,  Acc: 0.50\n")
    follower.drain()
    with open(train_run.file(OUTPUT), "ab") as fh:
        fh.write(b"Train Epoch [1/2], position 1,  Acc: 0.30\n")
    follower.drain()
    assert rows_of(train_run) == []  # lines came in this read: more may follow
    follower.drain()  # a quiet read: the group is complete
    assert rows_of(train_run) == [{"epoch": 0, "epoch_acc_0": 0.5, "epoch_acc_1": 0.3, "source": "eagle"}]


def test_a_restart_inside_a_group_rebuilds_it_once(train_run: RunDir) -> None:
    with open(train_run.file(OUTPUT), "ab") as fh:
        fh.write(b"step 1: {'acc_0': 0.1}\nTrain Epoch [1/2], position 0,  Acc: 0.50\n")
    MetricsFollower(train_run, "specforge").drain()  # then the supervisor dies, the group pending
    saved = json.loads(train_run.file(METRICS_SOURCE).read_text())
    assert saved["offset"] == len(b"step 1: {'acc_0': 0.1}\n")
    with open(train_run.file(OUTPUT), "ab") as fh:
        fh.write(b"Train Epoch [1/2], position 1,  Acc: 0.30\n")
    MetricsFollower(train_run, "specforge").drain(final=True)
    assert rows_of(train_run) == [
        {"step": 1, "acc_0": 0.1, "source": "specforge"},
        {"epoch": 0, "epoch_acc_0": 0.5, "epoch_acc_1": 0.3, "source": "specforge"},
    ]


def test_a_saved_position_of_another_source_is_not_used(train_run: RunDir) -> None:
    train_run.file(OUTPUT).write_bytes(b'{"step": 1, "loss": 2.0}\n')
    train_run.file(METRICS_SOURCE).write_text(json.dumps({"source": "specforge", "offset": 999}))
    MetricsFollower(train_run, "jsonl").drain(final=True)
    assert rows_of(train_run) == [{"step": 1, "loss": 2.0, "source": "jsonl"}]


# --- faults on the way in and out: no row lost, none written twice --------------------------------------------

FOUR_ROWS = [{"step": step, "loss": 4.0 - step} for step in range(1, 5)]


def jsonl_output(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def as_written(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**row, "source": "jsonl"} for row in rows]


def refusing_once(at: int, error: Exception) -> Callable[[Path, object], None]:
    """append_jsonl, but the `at`-th append of a row (from 0) fails with `error` once, writing nothing, as a full
    disk or a failing one refuses a write; every other goes to the real file."""
    calls = [0]

    def append(path: Path, obj: object) -> None:
        calls[0] += 1
        if calls[0] == at + 1:
            raise error
        append_jsonl(path, obj)

    return append


@pytest.mark.parametrize("at", range(len(FOUR_ROWS)))
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_a_write_refused_at_any_row_loses_none_and_repeats_none(
    train_run: RunDir, monkeypatch: pytest.MonkeyPatch, code: int, at: int
) -> None:
    train_run.file(OUTPUT).write_bytes(jsonl_output(FOUR_ROWS))
    monkeypatch.setattr(metrics_sources, "append_jsonl", refusing_once(at, OSError(code, os.strerror(code))))
    follower = MetricsFollower(train_run, "jsonl")
    assert follower.drain() == at
    assert rows_of(train_run) == as_written(FOUR_ROWS[:at])
    assert not train_run.file(METRICS_SOURCE).exists()  # nothing read is counted as done before it is written
    with open(train_run.file(OUTPUT), "ab") as fh:  # the run prints on meanwhile
        fh.write(jsonl_output([{"step": 5, "loss": 0.5}]))
    assert follower.drain() == len(FOUR_ROWS) - at + 1
    follower.drain(final=True)
    assert rows_of(train_run) == as_written([*FOUR_ROWS, {"step": 5, "loss": 0.5}])
    [said] = errors_of(train_run)
    assert said.startswith(f"cannot write metrics for jsonl: {os.strerror(code)}; the rows are kept and written again")
    saved = json.loads(train_run.file(METRICS_SOURCE).read_text())
    assert saved["offset"] == train_run.file(OUTPUT).stat().st_size
    MetricsFollower(train_run, "jsonl").drain(final=True)  # a second supervisor writes nothing again
    assert len(rows_of(train_run)) == len(FOUR_ROWS) + 1


def test_rows_the_disk_still_refuses_when_the_run_ends_are_said(
    train_run: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    train_run.file(OUTPUT).write_bytes(jsonl_output(FOUR_ROWS))

    def disk_full(path: Path, obj: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(metrics_sources, "append_jsonl", disk_full)
    MetricsFollower(train_run, "jsonl").stop()
    assert errors_of(train_run)[-1] == (
        f"4 metric rows from jsonl, and whatever it printed after them, are not in {METRICS}: the disk still refused "
        "them when the run ended"
    )


def test_a_row_json_cannot_write_is_left_out_alone(train_run: RunDir, monkeypatch: pytest.MonkeyPatch) -> None:
    train_run.file(OUTPUT).write_bytes(jsonl_output(FOUR_ROWS))
    monkeypatch.setattr(metrics_sources, "append_jsonl", refusing_once(1, ValueError("Circular reference detected")))
    MetricsFollower(train_run, "jsonl").drain(final=True)
    assert rows_of(train_run) == as_written([FOUR_ROWS[0], *FOUR_ROWS[2:]])
    assert errors_of(train_run) == [
        "cannot write a metrics row from jsonl: Circular reference detected; left out, the others kept"
    ]


def test_a_read_of_the_log_that_fails_keeps_the_rows_read_before_it(
    train_run: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = jsonl_output(FOUR_ROWS)
    train_run.file(OUTPUT).write_bytes(data)
    monkeypatch.setattr(metrics_sources, "READ_CHUNK", len(data) // 2 + 1)  # two rows a read
    opened = [0]

    def second_read_fails(path: Path, mode: str) -> Any:
        opened[0] += 1
        if opened[0] == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return open(path, mode)

    monkeypatch.setattr(metrics_sources, "open", second_read_fails, raising=False)
    follower = MetricsFollower(train_run, "jsonl")
    follower.drain()
    assert rows_of(train_run) == as_written(FOUR_ROWS[:2])
    follower.drain(final=True)
    assert rows_of(train_run) == as_written(FOUR_ROWS)
    assert errors_of(train_run) == [f"reading metrics from jsonl failed: OSError: [Errno 5] {os.strerror(errno.EIO)}"]


def test_a_line_that_is_no_row_is_counted_said_once_and_drops_no_neighbour(train_run: RunDir) -> None:
    train_run.file(OUTPUT).write_bytes(b'{"step": 1}\n{"step": 2, \n{"step": 3}\n{"step"}\n{"step": 4}\n')
    MetricsFollower(train_run, "jsonl").drain()
    with open(train_run.file(OUTPUT), "ab") as fh:
        fh.write(b'{"step": 5}\n{bad\n')
    MetricsFollower(train_run, "jsonl").drain(final=True)  # another supervisor: it counts on, and says nothing new
    assert [row["step"] for row in rows_of(train_run)] == [1, 3, 4, 5]
    assert errors_of(train_run) == [
        f"jsonl: 2 line(s) that read as no metrics row left out, the rows around them kept ({METRICS_SOURCE} counts "
        'any more); the last: {"step"}'
    ]
    saved = json.loads(train_run.file(METRICS_SOURCE).read_text())
    assert (saved["malformed_lines"], saved["last_malformed"]) == (3, "{bad")


def test_a_line_the_parser_fails_on_costs_that_line_alone(train_run: RunDir, monkeypatch: pytest.MonkeyPatch) -> None:
    real_make_row = metrics_sources.make_row

    def fails_on_step_2(source: str, pairs: Any, *, step: int | None = None, epoch: int | None = None) -> Any:
        if step == 2:
            raise KeyError("a parser bug")
        return real_make_row(source, pairs, step=step, epoch=epoch)

    monkeypatch.setattr(metrics_sources, "make_row", fails_on_step_2)
    train_run.file(OUTPUT).write_bytes(b"".join(f"step {n}: {{'loss': {n}.5}}\n".encode() for n in (1, 2, 3)))
    MetricsFollower(train_run, "specforge").drain(final=True)
    assert [row["step"] for row in rows_of(train_run)] == [1, 3]
    [said] = errors_of(train_run)
    assert said.endswith("; the last: step 2: {'loss': 2.5}")


def test_the_thread_follows_a_growing_log(train_run: RunDir) -> None:
    follower = MetricsFollower(train_run, "jsonl", interval=0.02)
    follower.start()
    try:
        with open(train_run.file(OUTPUT), "ab") as fh:
            fh.write(b'{"step": 1}\n')
        assert wait_for(lambda: rows_of(train_run), timeout=10, what="a row") == [{"step": 1, "source": "jsonl"}]
    finally:
        follower.stop()


NOT_NUMBERS = {
    "loss": "abc",
    "acc": [0.5, {"a": 1}],
    "cfg": {"lr": 1},
    "done": True,
    "eta": None,
    "tag": "\x1b]52;c;x\x07",
}


def test_values_that_are_not_numbers_are_left_out_and_said_once(train_run: RunDir) -> None:
    lines = [
        {"step": 1, "val_loss": 0.5, "spelled": "NaN", "plateau": False, **NOT_NUMBERS},
        {"step": 2, **NOT_NUMBERS},  # nothing but what is left out: no row at all
        {"step": 3, "val_loss": 0.4, "loss": ["x"]},
    ]
    train_run.file(OUTPUT).write_text("".join(json.dumps(line) + "\n" for line in lines))
    follower = MetricsFollower(train_run, "jsonl")
    follower.drain(final=True)
    assert rows_of(train_run) == [
        {"step": 1, "val_loss": 0.5, "spelled": "NaN", "plateau": False, "source": "jsonl"},
        {"step": 3, "val_loss": 0.4, "source": "jsonl"},
    ]
    assert follower.left_out == 2 * len(NOT_NUMBERS) + 1
    assert errors_of(train_run) == ['jsonl gives values that are not numbers; left out of the metrics: loss = "abc"']


leaves = st.none() | st.booleans() | st.text() | st.integers() | st.floats() | st.sampled_from(["nan", " -INF "])
row_names = st.text(max_size=8) | st.sampled_from(["source", "stage", "plateau", "loss"])


@given(
    st.dictionaries(
        row_names,
        st.recursive(leaves, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=6),
        max_size=6,
    )
)
@settings(max_examples=100, deadline=None)
def test_a_metric_value_is_a_number_or_spells_one_save_the_rows_own_text_and_flag(row: dict[str, object]) -> None:
    bad = not_metric_values(row)
    for name, value in row.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        spelled = isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf")
        own = (name in ("source", "stage") and isinstance(value, str)) or (
            name == "plateau" and isinstance(value, bool)
        )
        assert (name not in bad) == (number or spelled or own), (name, value)


# --- TensorBoard --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def summary_writer() -> Iterator[Any]:
    from torch.utils.tensorboard import SummaryWriter

    yield SummaryWriter


def test_tensorboard_scalars_become_one_row_per_step(train_run: RunDir, tmp_path: Path, summary_writer: Any) -> None:
    import numpy as np

    logdir = tmp_path / "outputs" / "runs"
    writer = summary_writer(str(logdir))
    for step in (50, 100):
        writer.add_scalar("train/lr", 2e-5, step)
        for i in range(3):
            writer.add_scalar(f"train/acc_{i}", 0.7 - i / 10, step)
            writer.add_scalar(f"train/ploss_{i}", 1.5 + i / 10, step)
    writer.add_text("config", "draft_vocab_size=32000", 100)
    writer.add_histogram("fc.weight", np.array([0.1, 0.2, 0.3]), 100)
    writer.add_scalar("eval/simulated_acc_len", 2.25, 100)
    writer.flush()
    follower = MetricsFollower(train_run, "tensorboard:outputs/runs", cwd=tmp_path)
    follower.drain()
    assert [r["step"] for r in rows_of(train_run)] == [50]  # step 100 may still be growing
    writer.add_scalar("eval/avg_loss", 2.5, 100)
    writer.add_scalar("train/acc_0", 0.75, 150)
    writer.flush()
    follower.drain(final=True)
    writer.close()
    assert rows_of(train_run) == [
        {
            "step": 50,
            "lr": 2e-5,
            "acc_0": 0.7,
            "ploss_0": 1.5,
            "acc_1": 0.6,
            "ploss_1": 1.6,
            "acc_2": 0.5,
            "ploss_2": 1.7,
            "source": "tensorboard",
        },
        {
            "step": 100,
            "lr": 2e-5,
            "acc_0": 0.7,
            "ploss_0": 1.5,
            "acc_1": 0.6,
            "ploss_1": 1.6,
            "acc_2": 0.5,
            "ploss_2": 1.7,
            "val_sim_accept_len": 2.25,
            "val_loss": 2.5,
            "source": "tensorboard",
        },
        {"step": 150, "acc_0": 0.75, "source": "tensorboard"},
    ]


def test_tensorboard_follows_new_files_and_resumes_without_repeats(
    train_run: RunDir, tmp_path: Path, summary_writer: Any
) -> None:
    logdir = tmp_path / "runs"
    first = summary_writer(str(logdir / "2026-08-01T10:00:00"))
    first.add_scalar("train/loss", 6.0, 1)
    first.add_scalar("global_step", 1, 1)
    first.flush()
    MetricsFollower(train_run, f"tensorboard:{logdir}").drain(final=True)
    second = summary_writer(str(logdir / "2026-08-01T11:00:00"))  # a resumed run writes a new file
    second.add_scalar("train/loss_0", 2.0, 2)
    second.add_scalar("val/loss_epoch", 5.5, 2)
    second.flush()
    first.add_scalar("train/full_acc_0", 0.25, 3)
    first.flush()
    MetricsFollower(train_run, f"tensorboard:{logdir}").drain(final=True)  # a second supervisor
    first.close()
    second.close()
    assert rows_of(train_run) == [
        {"step": 1, "loss": 6.0, "source": "tensorboard"},
        {"step": 3, "full_acc_0": 0.25, "source": "tensorboard"},
        {"step": 2, "ploss_0": 2.0, "val_loss": 5.5, "source": "tensorboard"},
    ]


def test_tensorboard_without_event_files_is_reported(train_run: RunDir, tmp_path: Path) -> None:
    follower = MetricsFollower(train_run, "tensorboard:nowhere", cwd=tmp_path)
    follower.drain()
    assert errors_of(train_run) == []  # the trainer may not have started writing yet
    follower.drain(final=True)
    assert errors_of(train_run) == [f"no TensorBoard event files (events.out.tfevents.*) under {tmp_path / 'nowhere'}"]


def test_tensorboard_missing_is_reported_once(train_run: RunDir, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard.backend.event_processing.event_file_loader", None)
    follower = MetricsFollower(train_run, "tensorboard:runs")
    follower.drain()
    follower.drain(final=True)
    [error] = errors_of(train_run)
    assert error.startswith("cannot read metrics from tensorboard:runs") and "install tensorboard" in error


# --- with a real supervisor ---------------------------------------------------------------------

TRAINER = r"""
import sys, time
out = sys.stdout
out.write("Starting training from epoch 0\n")
for n in (1, 2, 3):
    out.write(f"\rTraining Epoch 0:  {n}0%|█   | {n}/10 [00:0{n}<00:09,  1.00it/s, loss=5.{n}, acc=0.0{n}]")
    out.flush()
    time.sleep(0.15)
out.write("\n")
for i, acc in enumerate((0.74, 0.52)):
    print(f"Train Epoch [1/1], position {i},  Acc: {acc:.2f}", flush=True)
time.sleep(0.8)
print("step 100: {'train/acc_0': 0.61, 'train/ploss_0': 1.9, 'loss': 2.5}", flush=True)
time.sleep(0.6)
print("Eval - Step 100 [100/100], position 0,  Acc: 0.70", flush=True)
print("Eval - Step 100 [100/100], position 1,  Acc: 0.45", flush=True)
out.write("step 101: {'acc_0': 0.66, 'loss': 2.4}")  # the very last output, without a newline
out.flush()
"""


def test_supervisor_turns_specforge_output_into_rows(tmp_path: Path) -> None:
    spec = RunSpec(kind="train", argv=[sys.executable, "-c", TRAINER], metrics_from="specforge", cwd=str(tmp_path))
    run = RunStore(tmp_path / "work").create(spec)
    done = subprocess.run(
        [sys.executable, "-m", "backends.runs.supervise", str(run.path)],
        cwd=REPO,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    expected = [
        {"epoch": 0, "batch": 1, "loss": 5.1, "acc": 0.01, "source": "specforge"},
        {"epoch": 0, "batch": 2, "loss": 5.2, "acc": 0.02, "source": "specforge"},
        {"epoch": 0, "batch": 3, "loss": 5.3, "acc": 0.03, "source": "specforge"},
        {"epoch": 0, "epoch_acc_0": 0.74, "epoch_acc_1": 0.52, "source": "specforge"},
        {"step": 100, "acc_0": 0.61, "ploss_0": 1.9, "loss": 2.5, "source": "specforge"},
        {"step": 100, "val_acc_0": 0.70, "val_acc_1": 0.45, "source": "specforge"},
        {"step": 101, "acc_0": 0.66, "loss": 2.4, "source": "specforge"},
    ]
    assert rows_of(run) == expected
    ended = run.exit()
    assert ended is not None and ended["code"] == 0
    # The final drain comes before exit.json: a reader that sees the exit has every row.
    assert run.file(METRICS).stat().st_mtime_ns <= run.file(EXIT).stat().st_mtime_ns
    assert errors_of(run) == []
    # A supervisor started again on this run resumes where the last one stopped.
    MetricsFollower(run, "specforge").drain(final=True)
    assert rows_of(run) == expected
