"""What the CLI prints: the live metrics table stays narrow and readable."""

from __future__ import annotations

from console import render
from console.render import LiveTable, status_text


def test_live_table_keeps_first_and_last_position_and_puts_evals_on_their_own_line() -> None:
    table = LiveTable()
    train = {"step": 20, "loss": 20.1, "ploss_0": 5.0, "acc_0": 0.1, "acc_1": 0.09, "acc_2": 0.08, "lr": 1e-3}
    evals = {"step": 100, "val_loss": 10.3, "val_ploss_0": 2.4, "val_acc_0": 0.31, "val_acc_2": 0.2}
    lines = table.lines([train, evals, {**train, "step": 40}])
    assert lines[0].split() == ["step", "loss", "acc_0", "acc_2", "lr"]
    assert lines[1].split() == ["20", "20.1", "0.1", "0.08", "0.001"]
    assert lines[2] == "eval step=100  val_loss=10.3  val_acc_0=0.31  val_acc_2=0.2"
    assert lines[3].split()[0] == "40" and len(lines) == 4  # no repeated header


def test_wide_table_shows_every_column_and_repeats_the_header_for_new_ones() -> None:
    table = LiveTable(wide=True)
    lines = table.lines([{"step": 1, "ploss_0": 5.0}, {"step": 2, "ploss_0": 4.0, "grad_norm": 3.0}])
    assert [line.split() for line in lines] == [
        ["step", "ploss_0"],
        ["1", "5"],
        ["step", "ploss_0", "grad_norm"],
        ["2", "4", "3"],
    ]


def test_status_without_gpus_says_why() -> None:
    text = status_text(
        {"host": "h", "gpu_source": "none", "gpu_error": "NVML unavailable", "runs": [], "gpus": [], "problems": []}
    )
    assert "no runs yet" in text and "GPUs: none found\nNVML unavailable" in text


def test_a_serve_runs_metric_rows_show_their_time_of_day_not_seconds_since_1970() -> None:
    at = 1796099904.5
    text = render.metrics_table([{"t": at, "accept_len": 3.0}, {"t": at + 5, "accept_len": 3.5}])
    assert text.splitlines()[1].split()[:3] == [*render.clock(at).split(), "3"]
    assert "e+09" not in text


def test_a_distributed_runs_top_frames_are_its_ranks_before_torchruns_agent() -> None:
    agent = '=== pid 10: python -m torch.distributed.run\nThread 10 (idle): "MainThread"\n    _invoke_run (api.py:9)\n'
    rank = '=== pid 20: python -m backends.train\nThread 20 (idle): "MainThread"\n    all_reduce (c10d.py:3)\n'
    assert render.top_frames(agent + rank, count=1) == ["_invoke_run (api.py:9)", "all_reduce (c10d.py:3)"]
    assert render.top_frames(agent + rank, count=1, first=[20]) == ["all_reduce (c10d.py:3)", "_invoke_run (api.py:9)"]
