"""What benchmarks/mutation.sh found no test of in runs/control.py: what a relaunch answers of the run it
replaced, and which run free-gpus attributes a GPU process to. The real run engine (launch, its supervisor,
kill), real processes."""

from __future__ import annotations

import sys
from pathlib import Path

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
