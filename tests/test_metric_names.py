"""Every name a producer writes into a metric row is a `Metric` name, which the console knows: our trainer's
rows, our extractor's rows, SGLang's decode lines as read from its real output, and other trainers' logs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from backends.extract.cli import main as extract
from backends.protocol import ENV_METRICS_FILE, Metric
from backends.runs.metrics_sources import parse_text
from backends.sglang.log import OutputReader
from backends.train.__main__ import main as train
from tests.train_fixtures import read_rows, write_extraction, write_target

SGLANG_OUTPUT = Path(__file__).with_name("sglang_output")
NAMES = {value for key, value in vars(Metric).items() if key.isupper()}
PER_POSITION: list[Callable[[int], str]] = [
    value.__func__ for value in vars(Metric).values() if isinstance(value, staticmethod)
]


def is_metric_name(name: str) -> bool:
    if name in NAMES:
        return True
    _, _, position = name.rpartition("_")
    return position.isdigit() and any(named(int(position)) == name for named in PER_POSITION)


def unknown_names(rows: list[dict[str, object]]) -> set[str]:
    return {key for row in rows for key in row if not is_metric_name(key)}


def test_the_names_are_distinct_and_the_check_refuses_others() -> None:
    constants = [value for key, value in vars(Metric).items() if key.isupper()]
    assert len(constants) == len(set(constants))
    assert not {named(0) for named in PER_POSITION} & NAMES
    assert all(is_metric_name(name) for name in ("loss", "acc_0", "val_ploss_12", "epoch_acc_3", "accept_len"))
    assert not any(is_metric_name(name) for name in ("accuracy", "acc", "acc_01", "acc_x", "val_acc_", "loss_0"))


def test_the_trainers_rows_use_metric_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = write_target(tmp_path / "target")
    write_extraction(tmp_path / "data", target, samples=16)
    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv(ENV_METRICS_FILE, str(metrics))
    argv = ["--data", str(tmp_path / "data"), "--target", str(target), "--out", str(tmp_path / "out")]
    steps = ["--steps", "2", "--log-every", "1", "--eval-every", "2", "--val-samples", "4", "--batch-size", "4"]
    assert train([*argv, "--draft-vocab-size", "48", "--ttt", "2", *steps]) == 0
    rows = read_rows(metrics)
    assert [Metric.LOSS in row for row in rows] == [True, True, False]  # two steps logged, then an evaluation
    assert Metric.VAL_LOSS in rows[-1]
    assert unknown_names(rows) == set()


def test_the_extractors_rows_use_metric_names(target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv(ENV_METRICS_FILE, str(metrics))
    argv = ["--target", str(target), "--data", "demo", "--out", str(tmp_path / "out"), "--device", "cpu"]
    assert extract([*argv, "--limit", "2", "--shard-size", "1"]) == 0
    rows = read_rows(metrics)
    assert len(rows) == 2
    assert unknown_names(rows) == set()


def test_sglangs_decode_lines_become_metric_names() -> None:
    reader = OutputReader()
    figures = [
        event.values
        for log in sorted(SGLANG_OUTPUT.glob("*.log"))
        for event in reader.feed(log.read_bytes())
        if event.kind == "decode"
    ]
    assert len(figures) == 2  # the real 0.5.23 decode lines: on CPU, without speculative decoding
    # GPU-only: accept len, in a line reconstructed from SGLang's source as tests/sglang_standin.py writes it
    gpu_line = (
        "[2026-11-29 07:10:00] Decode batch, #running-req: 3, #token: 1234, token usage: 0.02, accept len: 3.21, "
        "accept rate: 0.50, cuda graph: True, gen throughput (token/s): 812.33, #queue-req: 1\n"
    )
    figures += [event.values for event in reader.feed(gpu_line.encode()) if event.kind == "decode"]
    assert Metric.ACCEPT_LEN in figures[-1]
    assert {Metric.GEN_THROUGHPUT, Metric.RUNNING_REQ, Metric.QUEUE_REQ} <= set(figures[0])
    assert unknown_names([dict(values) for values in figures]) == set()


# Lines of the trainers whose names `--metrics-from` translates (names it does not know keep their own).
OTHER_TRAINERS = {
    "eagle": (
        "Train Epoch [1/40], position 0,  Acc: 0.62\n"
        "Train Epoch [1/40], position 0, pLoss: 1.95\n"
        "Test Epoch [1/40], position 0,  Acc: 0.60\n"
        "Test Epoch [1/40], position 0, pLoss: 2.01\n"
    ),
    "specforge": (
        "Training Epoch 0: 100%|██████████| 400/400 [06:40<00:00,  1.00it/s, loss=2.05]\n"
        "Eval - Step 400 [400/800], position 1,  Acc: 0.49\n"
        "step 200: {'eval/avg_loss': 2.91, 'eval/avg_acc': 0.47, 'eval/per_position_acc': [0.62, 0.41], "
        "'eval/simulated_acc_len': 2.02, 'eval/acceptance_rate_0': 0.62, 'eval/epoch_ploss_0': 2.2, "
        "'train/acc_1': 0.3, 'train/ploss_1': 3.1, 'train/lr': 4e-05, 'train/grad_norm': 1.5}\n"
    ),
    "speculators": (
        "train/loss_0=1.980, train/loss=5.965, epoch=0, lr=2.47e-05, global_step=0\n"
        "val/loss_epoch=4.512, val/loss_0_epoch=1.5, epoch=0\n"
    ),
}


@pytest.mark.parametrize("source", sorted(OTHER_TRAINERS))
def test_other_trainers_names_become_metric_names(source: str) -> None:
    rows = parse_text(source, OTHER_TRAINERS[source])
    assert len(rows) >= 2
    assert unknown_names(rows) == set()
