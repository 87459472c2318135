"""What benchmarks/mutation.sh found no test of in runs/supervise.py: what the supervisor records when it cannot
start a run (the whole exit record), what it says of a write it could not make (and of a full disk, when a record
goes through its reserved room), how often it tells of processes that outlived the run's launcher, why a run
failed, the events a run ends with, and where a run starts and writes its rows, with nothing said in the
supervisor's log when all goes well. The real supervisor (`python -m backends.runs.supervise`, started as a launch
starts it), real processes and files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from backends.fileio import read_jsonl
from backends.host import procinfo
from backends.runs import control as runctl
from backends.runs import supervise
from backends.runs.store import EVENTS, METRICS, PROC, RunDir, RunSpec, RunStore
from console.tui.timeline import timeline
from tests.conftest import wait_for
from tests.test_faults_processes import fill


def supervised(workdir: Path, argv: list[str]) -> RunDir:
    """A run made in the store and handed to its supervisor, as a launch does after its checks."""
    run = RunStore(workdir).create(RunSpec(kind="command", argv=argv))
    runctl.start_supervisor(run)
    return run


def supervisor_gone(run: RunDir) -> bool:
    supervisor = run.supervisor()
    return supervisor is not None and not procinfo.is_alive(supervisor)


def test_a_run_that_cannot_start_says_why_in_its_exit_and_its_events(workdir: Path) -> None:
    run = supervised(workdir, ["/nonexistent/trainer"])
    ended = wait_for(run.exit, 30, "exit.json")
    said = (
        "cannot start '/nonexistent/trainer': No such file or directory (check the program name and PATH, or the --cwd)"
    )
    assert ended == {"code": None, "signal": None, "error": said, "ended_at": ended["ended_at"]}
    events = [{k: v for k, v in e.items() if k != "t"} for e in run.events()]
    assert {"type": "spawn_failed", "errno": 2} in events
    assert events[-2:] == [{"type": "failed", "error": said}, {"type": "state", "state": "failed"}]
    assert run.state() == "failed"


def test_a_record_the_supervisor_could_not_write_is_said_in_its_log(workdir: Path) -> None:
    run = RunStore(workdir).create(RunSpec(kind="command", argv=["true"]))
    run.file(EVENTS).unlink()
    run.file(EVENTS).mkdir()  # every event it appends fails
    runctl.start_supervisor(run)
    wait_for(run.exit, 30, "exit.json")
    wait_for(lambda: supervisor_gone(run), 30, "the supervisor to end")
    log = run.file("supervisor.log").read_text()
    assert f"supervise: [Errno 21] Is a directory: '{run.file(EVENTS)}'" in log.splitlines()


def test_processes_left_in_the_runs_session_are_told_once(workdir: Path) -> None:
    run = supervised(workdir, ["sh", "-c", "sleep 5 & exit 0"])
    wait_for(run.exit, 30, "exit.json")
    wait_for(lambda: supervisor_gone(run), 60, "the supervisor to end once the session is empty")
    outlived = [e for e in run.events() if e["type"] == "outlived"]
    assert len(outlived) == 1 and len(outlived[0]["pids"]) == 1
    assert run.file("supervisor.log").read_text() == ""  # it waited them out, rather than failing


def test_a_supervisor_handed_no_run_folder_says_so_to_the_launch(workdir: Path) -> None:
    run = RunStore(workdir).create(RunSpec(kind="command", argv=["true"]))
    run.file("spec.json").unlink()
    with pytest.raises(runctl.OpError) as refused:
        runctl.start_supervisor(run)
    assert refused.value.message == (
        f"the run supervisor did not start: supervise: {run.path} is not a run folder (no spec.json)"
    )


def test_what_stays_in_the_runs_session_after_its_launcher_exits_is_the_runs_and_killed(workdir: Path) -> None:
    """The launcher exits at once; the process it left cleared its environment (no run marker) and has no parent
    of the run: only the session the supervisor recorded proves it the run's."""
    run = supervised(workdir, ["sh", "-c", "env -i sleep 60 & echo $!; exit 0"])
    left = int(wait_for(lambda: run.file("output.log").read_text().strip(), 30, "the pid it left"))
    wait_for(run.exit, 30, "the launcher's exit")
    child = run.child()
    assert child is not None and procinfo.read_stat(left) is not None
    assert run.proc()["session"] == child.pid
    assert left in run.processes()
    killed = runctl.kill(run, "TERM", 30)
    assert left in {p["pid"] for p in killed["processes"] if p["died"]}, killed
    assert not run.processes()


def test_an_ended_runs_watch_says_its_final_state(workdir: Path) -> None:
    """The watch (watch.json: state, phase, health) is what the console shows beside a run: once the run has
    ended it agrees with the run's end, not with the last state it watched."""
    run = supervised(workdir, ["sh", "-c", "exit 3"])
    wait_for(run.exit, 30, "exit.json")
    wait_for(lambda: supervisor_gone(run), 30, "the supervisor to end")
    assert run.watch().get("state") == "failed" == run.state()
    # The events end with the exit and the final state, where the console's timeline ends the run.
    ending = [{k: v for k, v in e.items() if k != "t"} for e in run.events()[-2:]]
    assert ending == [{"type": "exit", "code": 3, "signal": None}, {"type": "state", "state": "failed"}]
    assert timeline(run.events()).ended_at == run.events()[-1]["t"]


def test_a_record_written_through_its_reserved_room_says_the_disk_is_full_and_keeps_it_for_the_exit(
    small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The supervisor's own record-keeping, in this process, on a real full tmpfs: what it prints goes to the run's
    supervisor.log, and what it keeps of the full disk goes into exit.json's disk_full."""
    run = RunStore(small_disk / "work").create(RunSpec(kind="command", argv=["true"]))
    fill(small_disk)
    supervisor = supervise.Supervisor(run)
    record: dict[str, object] = {"supervisor": None, "child": None}
    supervisor.record(PROC, record)
    assert json.loads(run.file(PROC).read_text()) == record  # through the room kept for it
    [said] = capsys.readouterr().err.splitlines()
    assert said.startswith(f"supervise: no space left on tmpfs at {small_disk} (") and said.endswith(" bytes free)")
    assert supervisor.disk_full == said.removeprefix("supervise: ")


FAILS_THEN_TALKS = """
import sys, traceback
try:
    raise ValueError("the draft has no lm_head")
except ValueError:
    traceback.print_exc()
for shard in range(2000):  # 120 kB: more than the tail a reader reads afresh
    print(f"releasing shard {shard:05d} " + "." * 40)
sys.exit(1)
"""


def test_why_a_run_failed_is_what_its_watch_read_even_when_the_last_of_its_output_says_nothing(
    workdir: Path,
) -> None:
    run = supervised(workdir, [sys.executable, "-c", FAILS_THEN_TALKS])
    ended = wait_for(run.exit, 30, "exit.json")
    assert ended["code"] == 1 and ended["reason"] == "ValueError: the draft has no lm_head"


WRITES_A_ROW = (
    "import json, os; print(os.getcwd()); "
    "open(os.environ['EAGLE3_METRICS_FILE'], 'a').write(json.dumps({'step': 1, 'loss': 2.5}) + '\\n')"
)


def test_a_run_starts_in_its_folder_writes_its_rows_where_told_and_leaves_the_supervisors_log_empty(
    workdir: Path, tmp_path: Path
) -> None:
    run = RunStore(workdir).create(
        RunSpec(kind="command", argv=[sys.executable, "-c", WRITES_A_ROW], cwd=str(tmp_path))
    )
    runctl.start_supervisor(run)
    wait_for(run.exit, 30, "exit.json")
    wait_for(lambda: supervisor_gone(run), 30, "the supervisor to end")
    assert run.file("output.log").read_text() == f"{tmp_path}\n"
    assert read_jsonl(run.file(METRICS))[0] == [{"step": 1, "loss": 2.5}]
    assert run.file("supervisor.log").read_text() == ""  # nothing went wrong: nothing to say
    told = [(e["type"], e.get("state")) for e in run.events()]
    began = [("supervisor_started", None), ("spawned", None), ("state", "running")]
    assert told == [*began, ("exit", None), ("state", "exited")]


def test_a_python_run_prints_as_it_goes_even_when_the_launch_says_nothing_of_buffering(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor inherits the launcher's environment, and this one has no PYTHONUNBUFFERED (the test's own may):
    a Python child's line is in output.log while it runs, not when it ends, or it would look hung."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    run = supervised(workdir, [sys.executable, "-c", "import time; print('started'); time.sleep(60)"])
    wait_for(lambda: run.file("output.log").read_text() == "started\n", 20, "the line while it runs")
    assert run.exit() is None
    runctl.kill(run, "KILL", 0)
