"""What benchmarks/mutation.sh found no test of in runs/control.py: what a relaunch answers of the run it
replaced, and which run free-gpus attributes a GPU process to. The real run engine (launch, its supervisor,
kill), real processes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from backends.host import procinfo
from backends.runs import control as runctl
from backends.runs.store import RunDir, RunSpec, RunStore
from tests.conftest import wait_for

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def launched(store: RunStore, argv: list[str]) -> RunDir:
    return store.get(runctl.launch(store, RunSpec(kind="command", argv=argv))["run"])


def test_a_relaunch_names_the_run_it_replaced_and_what_stopping_it_did(workdir: Path) -> None:
    store = RunStore(workdir)
    parent = launched(store, SLEEP)
    child = wait_for(parent.child, 20, "the parent's child")
    result = runctl.relaunch(store, parent.id, [], [], grace=10)
    assert result["parent"] == parent.id and result["run"] != parent.id
    assert result["stopped_parent"] is not None and result["stopped_parent"]["run"] == parent.id
    assert not procinfo.is_alive(child)
    assert store.get(result["run"]).spec().parent == parent.id


def test_gpu_processes_are_attributed_to_the_live_runs_only(workdir: Path) -> None:
    store = RunStore(workdir)
    ended = launched(store, [sys.executable, "-c", "pass"])
    wait_for(ended.exit, 20, "the first run's exit")
    live = launched(store, SLEEP)
    child = wait_for(live.child, 20, "the live run's child")
    assert runctl.owner_lookup(store) == {child.pid: live.id}


def test_kill_records_its_signal_as_kills_and_an_ended_run_is_refused_as_not_running(workdir: Path) -> None:
    store = RunStore(workdir)
    run = launched(store, SLEEP)
    wait_for(run.child, 20, "the child")
    runctl.kill(run, "TERM", 10)
    signals = [e for e in run.events() if e["type"] == "signal"]
    assert [(e["signal"], e["by"]) for e in signals] == [("TERM", "kill")]
    wait_for(run.exit, 20, "exit.json")
    with pytest.raises(runctl.OpError) as refused:
        runctl.kill(run, "TERM", 10)
    assert refused.value.code == "not_running"
    assert refused.value.message == f"run {run.id} has no live process (state killed); nothing to kill"
