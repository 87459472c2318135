"""What benchmarks/mutation.sh found no test of in runs/store.py: what `status` tells of a run from its records
(its signal, parent, stall, stack dumps, a full disk, a corrupt record's file and reason, its state with a live
supervisor's verdict, its progress), and the spec checks a launch is refused by. Real run folders made by
RunStore, real records written as the supervisor writes them, real sleeping processes standing for a run's
child and supervisor."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.fileio import atomic_write_json
from backends.host import procinfo
from backends.protocol import Metric
from backends.runs.store import (
    EVENTS,
    EXIT,
    PROC,
    WATCH,
    CorruptFile,
    RunDir,
    RunSpec,
    RunStore,
    SpecError,
    progress_of,
    signalled_in,
)

Sleeper = Callable[[], procinfo.ProcIdentity]


@pytest.fixture
def sleeper() -> Iterator[Sleeper]:
    """Live processes of ours (no run marker in their environment), killed when the test ends."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> procinfo.ProcIdentity:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_RUN")}
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
            stdout=subprocess.PIPE,
            env=env,
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        ident = procinfo.identify(proc.pid)
        assert ident is not None
        return ident

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def made(tmp_path: Path, **spec: Any) -> RunDir:
    return RunStore(tmp_path / "work").create(RunSpec(**{"kind": "command", "argv": ["sleep", "1"], **spec}))


def write(run: RunDir, name: str, data: object) -> None:
    atomic_write_json(run.file(name), data)


def proc_record(child: procinfo.ProcIdentity | None, supervisor: procinfo.ProcIdentity | None) -> dict[str, Any]:
    return {
        "child": child.to_json() if child else None,
        "supervisor": supervisor.to_json() if supervisor else None,
        "child_started_at": 100.0,
    }


def test_status_of_an_ended_run_tells_its_signal_parent_stall_dumps_and_the_full_disk_it_met(tmp_path: Path) -> None:
    run = made(tmp_path, parent="20260101-000000-000-abcd")
    write(run, PROC, proc_record(None, None))
    said = "no space left on the device holding the run's log"
    write(run, EXIT, {"code": None, "signal": "KILL", "ended_at": 200.0, "disk_full": said})
    write(run, WATCH, {"stalled_since": 150.0, "stack_dumps": ["150.txt"], "state": "stalled"})
    info = run.info()
    assert (info["state"], info["signal"], info["parent"]) == ("failed", "KILL", "20260101-000000-000-abcd")
    assert (info["stalled_since"], info["stack_dumps"]) == (150.0, ["stacks/150.txt"])
    assert [(d["code"], d["meaning"]) for d in info["diagnoses"]] == [("disk_full", said)]


def test_a_corrupt_run_is_told_with_every_field_a_whole_one_has(tmp_path: Path) -> None:
    whole = made(tmp_path)
    write(whole, PROC, proc_record(None, None))
    write(whole, EXIT, {"code": 0, "ended_at": 200.0})
    broken = made(tmp_path)
    broken.file(PROC).write_text("[1]")
    info = broken.info()
    assert info["state"] == "corrupt" and info["corrupt"] == {"file": PROC, "reason": "not a JSON object"}
    assert set(info) == set(whole.info())  # what the console and --json read is there either way
    assert (info["started_at"], info["stack_dumps"], info["progress"]) == (None, None, None)
    with pytest.raises(CorruptFile, match=f"run {broken.id} is corrupt: proc.json: not a JSON object"):
        broken.proc()


def test_a_spec_that_is_no_object_is_a_corrupt_run_saying_so(tmp_path: Path) -> None:
    run = made(tmp_path)
    run.file("spec.json").write_text("[]")
    assert run.info()["corrupt"] == {"file": "spec.json", "reason": "spec.json is not a JSON object"}


def test_an_exit_record_holding_nan_is_corrupt_not_a_code(tmp_path: Path) -> None:
    run = made(tmp_path)
    write(run, PROC, proc_record(None, None))
    run.file(EXIT).write_text('{"code": NaN, "ended_at": 200.0}')
    assert run.state() == "corrupt"
    assert run.info()["corrupt"] is not None and run.info()["corrupt"]["file"] == EXIT  # type: ignore[index]


def test_an_events_line_that_is_no_object_makes_the_run_corrupt(tmp_path: Path) -> None:
    run = made(tmp_path)
    write(run, PROC, proc_record(None, None))
    run.file(EVENTS).write_text('[1, 2]\n{"t": 1.0, "type": "state", "state": "running"}\n')
    with pytest.raises(CorruptFile, match="line 1 is not an event"):
        run.events()


def test_a_live_runs_state_is_its_supervisors_verdict(tmp_path: Path, sleeper: Sleeper) -> None:
    run = made(tmp_path)
    child, supervisor = sleeper(), sleeper()
    write(run, PROC, proc_record(child, supervisor))
    assert run.child() == child and run.supervisor() == supervisor
    write(run, WATCH, {"state": "stalled", "stalled_since": 1.0})
    assert run.state() == "stalled" and run.info()["state"] == "stalled"
    write(run, WATCH, {"state": "ready"})
    assert run.state() == "ready"
    # The run's processes: its child, proven by its recorded identity (it carries no marker).
    assert child.pid in run.processes()


def test_a_signal_sent_the_moment_a_run_ended_counts_as_its_kill() -> None:
    events = [{"t": 200.0, "type": "signal", "signal": "TERM"}]
    assert signalled_in(events, 200.0)
    assert not signalled_in(events, 199.5)


def test_progress_reads_back_past_rows_without_a_step_to_the_newest_step() -> None:
    rows: list[dict[str, Any]] = [
        {Metric.ETA_S: 30.0},
        {"loss": 1.0},
        {Metric.STEP: 40, Metric.ETA_S: 99.0},
        {Metric.STEP: 39},
    ]
    assert progress_of(rows) == {Metric.ETA_S: 30.0, Metric.STEP: 40}


def test_a_spec_says_what_is_wrong_with_it() -> None:
    with pytest.raises(SpecError, match=r"^name must be a string$"):
        RunSpec(kind="command", argv=["x"], name=3).validate()  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^cwd must be a string or null$"):
        RunSpec(kind="command", argv=["x"], cwd=3).validate()  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^a metrics source goes with train runs, not 'serve' runs$"):
        RunSpec(kind="serve", argv=["x"], metrics_from="jsonl").validate()
    RunSpec(kind="train", argv=["x"], metrics_from="jsonl").validate()


def test_a_store_others_could_enter_is_made_private(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    run = made(tmp_path)
    os.chmod(workdir, 0o755)
    os.chmod(workdir / "runs", 0o751)
    RunStore(workdir).secure()
    assert (workdir.stat().st_mode & 0o777, (workdir / "runs").stat().st_mode & 0o777) == (0o700, 0o700)
    assert run.path.is_dir()
