"""Curves can leave: `metrics RUN --csv` and `export RUN --tensorboard DIR`.

Real: the CLI and the agent as processes, runs that write their own metric rows, TensorBoard's writer and its own
EventAccumulator reading the files back, our tensorboard metrics source's names. No double.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from backends.runs.metrics_sources import canonical_name
from console.cli.export import csv_text, points, tensorboard_step, tensorboard_tag, unplaced, write_tensorboard
from tests.conftest import CLI, launch, wait_state

# The run writes the JSON lines it is given into its metrics file, as our trainer does.
WRITER = "import os, sys; open(os.environ['EAGLE3_METRICS_FILE'], 'a').write(sys.argv[1])"
Row = dict[str, Any]


def run_writing(cli: CLI, rows: list[Row]) -> str:
    text = "".join(json.dumps(row) + "\n" for row in rows)
    run_id = launch(cli, "command", "--", sys.executable, "-c", WRITER, text)
    assert wait_state(cli, run_id, {"exited", "failed"})["state"] == "exited"
    return run_id


def read_csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def expected_table(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """Every name in the order first seen; each value as JSON wrote it (text as it is), '' where a row lacks it."""
    columns = list(dict.fromkeys(name for row in rows for name in row))
    return columns, [[as_written(row[c]) if c in row else "" for c in columns] for row in rows]


def as_written(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


names = st.one_of(st.sampled_from(["step", "loss", "acc_0", "val_loss", "source", "lr"]), st.text(min_size=1))
values = st.one_of(
    st.integers(-(10**15), 10**15), st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.text()
)
row_sets = st.lists(st.dictionaries(names, values, min_size=1, max_size=6), min_size=1, max_size=8)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=row_sets)
def test_csv_of_a_real_run_gives_back_every_value_in_its_column(cli: CLI, rows: list[Row]) -> None:
    run_id = run_writing(cli, rows)
    done = cli("metrics", run_id, "--csv")
    assert done.returncode == 0, done.stderr
    header, *body = read_csv(done.stdout.decode())
    assert (header, body) == expected_table(rows)


@given(rows=row_sets)
def test_csv_gives_back_every_value_in_its_column_header_first(rows: list[Row]) -> None:
    """The same property over many more row sets, as they arrive from the agent (parsed JSON)."""
    arrived = [json.loads(json.dumps(row)) for row in rows]
    header, *body = read_csv(csv_text(arrived))
    assert (header, body) == expected_table(rows)


def test_csv_with_tail_has_the_last_rows_and_only_their_columns(cli: CLI) -> None:
    rows: list[Row] = [
        {"step": 0, "loss": 5.4},
        {"step": 50, "loss": 4.25, "val_loss": 4.5},
        {"step": 100, "lr": 1e-05},
    ]
    run_id = run_writing(cli, rows)
    done = cli("metrics", run_id, "--csv", "--tail", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "step,loss,val_loss,lr\r\n50,4.25,4.5,\r\n100,,,1e-05\r\n"


def test_csv_does_not_go_with_json(cli: CLI) -> None:
    run_id = run_writing(cli, [{"step": 0, "loss": 1.0}])
    for argv in (["--csv", "--json"], ["--csv", "--json", "--follow"]):
        done = cli("metrics", run_id, *argv)
        assert done.returncode == 2
        said = done.stderr.decode().strip()
        assert "--csv" in said and "--json" in said and len(said.splitlines()) == 1
    assert done.stdout == b""


def test_export_needs_a_folder(cli: CLI) -> None:
    done = cli("export", "anything")
    assert done.returncode == 2
    assert "--tensorboard" in done.stderr.decode() and len(done.stderr.decode().strip().splitlines()) == 1


TRAINING: list[Row] = [
    {"step": 0, "t": 1_764_000_000.5, "loss": 5.4, "acc_0": 0.03, "acc_1": 0.01, "lr": 0.001, "source": "ours"},
    {"step": 50, "t": 1_764_000_010.0, "loss": 4.1, "acc_0": 0.21, "acc_1": 0.12, "grad_norm": 2.5},
    {"step": 100, "t": 1_764_000_020.0, "val_loss": 4.5, "val_acc_0": 0.3, "val_sim_accept_len": 1.42, "plateau": True},
    {"step": 100, "tokens_per_s": 2048},
]


def test_tensorboard_export_reads_back_with_tensorboards_own_loader_under_specforges_tags(
    cli: CLI, tmp_path: Path
) -> None:
    run_id = run_writing(cli, TRAINING)
    folder = tmp_path / "tb"
    done = cli("export", run_id, "--tensorboard", str(folder))
    assert done.returncode == 0, done.stderr
    assert "wrote 13 points of 4 rows" in done.stdout.decode()
    loaded = EventAccumulator(str(folder))
    loaded.Reload()
    got = {tag: [(e.step, e.value) for e in loaded.Scalars(tag)] for tag in loaded.Tags()["scalars"]}
    as_written = np.float32  # a TensorBoard scalar is a 32-bit float, as SpecForge's SummaryWriter writes it
    assert got == {
        "train/loss": [(0, as_written(5.4)), (50, as_written(4.1))],
        "train/acc_0": [(0, as_written(0.03)), (50, as_written(0.21))],
        "train/acc_1": [(0, as_written(0.01)), (50, as_written(0.12))],
        "train/lr": [(0, as_written(0.001))],
        "train/grad_norm": [(50, 2.5)],
        "eval/avg_loss": [(100, 4.5)],
        "eval/acc_0": [(100, as_written(0.3))],
        "eval/simulated_acc_len": [(100, as_written(1.42))],
        "plateau": [(100, 1.0)],
        "tokens_per_s": [(100, 2048.0)],
    }
    assert [e.wall_time for e in loaded.Scalars("train/loss")] == [1_764_000_000.5, 1_764_000_010.0]
    # Our own tensorboard:DIR source reads these tags back as the names they were exported from.
    assert {canonical_name(tag) for tag in got} == {n for row in TRAINING for n in row} - {"step", "t", "source"}


def test_names_specforge_has_get_its_tags_and_others_keep_ours() -> None:
    assert [tensorboard_tag(n) for n in ("accept_len", "val_acceptance_rate_2", "epoch_ploss_1", "ploss_3")] == [
        "accept_len",
        "eval/acceptance_rate_2",
        "train/epoch_ploss_1",
        "train/ploss_3",
    ]


def test_rows_without_a_step_are_placed_by_their_order_and_text_is_left_out() -> None:
    served: list[Row] = [{"t": 5.0, "accept_len": 2.1, "source": "sglang"}, {"t": 6.0, "accept_len": 2.3}]
    assert [(p.tag, p.step, p.wall_time, p.value) for p in points(served)] == [
        ("accept_len", 0, 5.0, 2.1),
        ("accept_len", 1, 6.0, 2.3),
    ]


EXTREMES: list[Row] = [
    {"step": 1, "t": 1_764_000_000.0, "loss": 1e308, "acc_0": float("inf")},
    {"step": 2, "loss": float("nan"), "acc_0": float("-inf"), "grad_norm": "NaN"},
    {"step": 1e300, "loss": 1.0},  # beyond a TensorBoard step: left out, and said
    {"step": 3, "t": 1e308, "loss": 10**400},
]


def test_an_export_of_extreme_values_reads_back_and_says_what_it_left_out(cli: CLI, tmp_path: Path) -> None:
    run_id = run_writing(cli, EXTREMES)
    folder = tmp_path / "tb"
    done = cli("export", run_id, "--tensorboard", str(folder))
    assert done.returncode == 0, done.stderr
    assert "wrote 6 points of 4 rows" in done.stdout.decode()
    assert done.stderr.decode() == (
        "eagle3-console: left out 1 row(s) whose step is beyond what a TensorBoard step holds (a 64-bit integer)\n"
    )
    loaded = EventAccumulator(str(folder))
    loaded.Reload()
    got = {tag: [(e.step, e.value) for e in loaded.Scalars(tag)] for tag in loaded.Tags()["scalars"]}
    inf = float("inf")  # 1e308 and 10**400 as TensorBoard's 32-bit scalars hold them
    assert {tag: [(step, str(value)) for step, value in series] for tag, series in got.items()} == {
        "train/loss": [(1, str(inf)), (2, "nan"), (3, str(inf))],
        "train/acc_0": [(1, str(inf)), (2, str(-inf))],
        "train/grad_norm": [(2, "nan")],
    }


numbers = st.one_of(st.floats(), st.integers(), st.integers(-(2**70), 2**70), st.sampled_from([1e300, -1e300, 2**63]))
extreme_rows = st.lists(
    st.dictionaries(st.sampled_from(["step", "t", "loss", "acc_0", "lr"]), numbers | st.sampled_from(["nan", "-Inf"])),
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(rows=extreme_rows)
def test_no_finite_or_infinite_number_stops_an_export(rows: list[Row]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        written, count = write_tensorboard(rows, Path(folder), "r")
        placed = [row for number, row in enumerate(rows) if tensorboard_step(row, number) is not None]
        assert count == sum(1 for row in placed for name in row if name not in ("step", "t"))
        assert unplaced(rows) == len(rows) - len(placed)
        assert written.exists()
    for number, row in enumerate(rows):
        step = row.get("step")
        beyond = isinstance(step, int | float) and math.isfinite(step) and not -(2**63) <= int(step) < 2**63
        assert (tensorboard_step(row, number) is None) == beyond


def test_rows_of_values_that_are_not_numbers_are_said_once_and_kept_in_the_csv(cli: CLI) -> None:
    run_id = run_writing(cli, [{"step": 1, "loss": "abc\u001b]52;c;x\u0007"}, {"step": 2, "loss": [1]}, {"step": 3}])
    done = cli("metrics", run_id, "--csv")
    assert done.returncode == 0, done.stderr
    assert done.stderr.decode() == (
        f"eagle3-console: run {run_id}: 2 metric rows hold values that are not numbers, left out of its charts "
        '(first: "loss" = "abc\\u001b]52;c;x\\u0007" at step 1)\n'
    )
    assert read_csv(done.stdout.decode())[1:] == [["1", "abc\x1b]52;c;x\x07"], ["2", "[1]"], ["3", ""]]


def test_without_tensorboard_the_export_says_what_to_install(
    cli: CLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = run_writing(cli, [{"step": 0, "loss": 1.0}])
    # A `tensorboard` that cannot be imported, first on the console's path: as where it is not installed.
    shadow = tmp_path / "shadow" / "tensorboard"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named tensorboard')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shadow.parent), os.environ["PYTHONPATH"]]))
    folder = tmp_path / "tb"
    done = cli("export", run_id, "--tensorboard", str(folder))
    assert done.returncode == 1
    said = done.stderr.decode().strip()
    assert "pip install tensorboard" in said and len(said.splitlines()) == 1
    assert not folder.exists()
