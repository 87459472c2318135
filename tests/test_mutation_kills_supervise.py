"""What benchmarks/mutation.sh found no test of in runs/supervise.py: what the supervisor records when it cannot
start a run (the whole exit record), what it says of a write it could not make (and of a full disk, when a record
goes through its reserved room), how often it tells of processes that outlived the run's launcher, why a run
failed, the events a run ends with, and where a run starts and writes its rows, with nothing said in the
supervisor's log when all goes well. Then (the survivors of its full run): the child's environment, the processes
proc.json and the events name, why a spawn failed (a full disk among the causes), a record refused while the run
runs, a full disk the watch met, a TensorBoard folder relative to the run's --cwd, how a run ended, and the
supervisor's own command line (in the foreground, --detach, --help). The real supervisor (`python -m
backends.runs.supervise`, started as a launch starts it), real processes and files."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backends.fileio import read_jsonl
from backends.host import procinfo
from backends.runs import control as runctl
from backends.runs import supervise
from backends.runs.store import EVENTS, METRICS, PROC, RunDir, RunSpec, RunStore
from console.tui.timeline import timeline
from tests.conftest import REPO, tmpfs, wait_for
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


def waits_for(go: Path) -> list[str]:
    """A child that says it started, then waits for `go` to exist and exits 0."""
    script = (
        f"import os, time\nprint('started', flush=True)\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
    )
    return [sys.executable, "-c", script]


def told(run: RunDir, event_type: str) -> list[dict[str, object]]:
    return [{k: v for k, v in e.items() if k not in ("t", "type")} for e in run.events() if e["type"] == event_type]


DUMPS_ITS_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def test_a_runs_child_gets_its_gpus_its_run_and_the_launchers_environment(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    monkeypatch.setenv("EAGLE3_LAUNCHERS_OWN", "kept")
    spec = RunSpec(kind="command", argv=[sys.executable, "-c", DUMPS_ITS_ENV], gpus=[1, 3], env={"HF_HOME": "/hf"})
    run = RunStore(workdir).create(spec)
    runctl.start_supervisor(run)
    assert wait_for(run.exit, 30, "exit.json")["code"] == 0
    env = json.loads(run.file("output.log").read_text())
    expected = {
        "PYTHONUNBUFFERED": "1",  # set for it: the launcher's had none
        "CUDA_VISIBLE_DEVICES": "1,3",
        "cuda_visible_devices": None,
        "HF_HOME": "/hf",
        "EAGLE3_LAUNCHERS_OWN": "kept",
        "EAGLE3_RUN_ID": run.id,
        "EAGLE3_RUN_DIR": str(run.path),
        "EAGLE3_METRICS_FILE": str(run.file(METRICS)),
    }
    assert {name: env.get(name) for name in expected} == expected


def test_a_runs_records_name_its_supervisor_and_its_child(workdir: Path, tmp_path: Path) -> None:
    """proc.json and the events say which processes are the run's: what `kill` signals and `status` shows."""
    go = tmp_path / "go"
    before = time.time()
    run = supervised(workdir, waits_for(go))
    wait_for(lambda: run.file("output.log").read_text() == "started\n", 30, "the child to start")
    child, supervisor = run.child(), run.supervisor()
    assert child is not None and supervisor is not None and procinfo.is_alive(child)
    proc = run.proc()
    assert proc["supervisor"] == (procinfo.identify(supervisor.pid) or supervisor).to_json()
    assert proc["session"] == child.pid  # the child leads a session of its own
    assert before <= proc["child_started_at"] <= time.time()
    assert told(run, "supervisor_started") == [{"pid": supervisor.pid}]
    assert told(run, "spawned") == [{"pid": child.pid}]
    go.touch()
    ended = wait_for(run.exit, 30, "exit.json")
    assert ended["code"] == 0 and proc["child_started_at"] <= ended["ended_at"]


NOT_A_PROGRAM = "a text file, not a program\n"


HINT = " (check the program name and PATH, or the --cwd)"
# How each run cannot start: its errno, and what its exit says after the program's name.
CANNOT_START = {
    "missing_program": (2, "No such file or directory" + HINT),
    "not_executable": (13, "Permission denied"),
    "a_folder": (13, "Permission denied"),
    "missing_cwd": (2, "No such file or directory" + HINT),
}


@pytest.mark.parametrize("case", list(CANNOT_START))
def test_a_run_that_cannot_start_says_why_and_still_names_its_supervisor(
    workdir: Path, tmp_path: Path, case: str
) -> None:
    """Only a program or a folder of work that is not there gets the hint to check them: a program that is there
    but may not be run is said as it is."""
    notes = tmp_path / "notes.txt"
    notes.write_text(NOT_A_PROGRAM)
    notes.chmod(0o644)
    program, cwd = {
        "missing_program": ("/nonexistent/trainer", None),
        "not_executable": (str(notes), None),
        "a_folder": (str(tmp_path), None),
        "missing_cwd": ("true", str(tmp_path / "gone")),
    }[case]
    errno, why = CANNOT_START[case]
    run = RunStore(workdir).create(RunSpec(kind="command", argv=[program], cwd=cwd))
    runctl.start_supervisor(run)
    ended = wait_for(run.exit, 30, "exit.json")
    assert ended["error"] == f"cannot start {program!r}: {why}"
    assert told(run, "spawn_failed") == [{"errno": errno}]
    assert run.state() == "failed"
    # proc.json names the supervisor that said so, as the supervisor_started event does.
    supervisor = run.supervisor()
    assert supervisor is not None and told(run, "supervisor_started") == [{"pid": supervisor.pid}]
    assert run.child() is None


def test_a_program_that_cannot_start_for_want_of_room_says_the_disk_is_full(tmp_path: Path) -> None:
    """A disk with bytes to spare and no file left to make (a tmpfs of few inodes): the run's output.log, gone, cannot
    be made again, and what the run's exit says is the full disk, said as our full-disk messages are."""
    with tmpfs(tmp_path / "few", "1m,nr_inodes=40") as disk:  # mount's options: few files
        run = RunStore(disk / "work").create(RunSpec(kind="command", argv=["true"]))
        run.file("output.log").unlink()
        fillers = disk / "fillers"
        fillers.mkdir()
        with contextlib.suppress(OSError):
            for n in range(1000):
                (fillers / str(n)).touch()
        try:
            runctl.start_supervisor(run)
            ended = wait_for(run.exit, 30, "exit.json")
            assert ended["error"].startswith(f"cannot start 'true': no space left on tmpfs at {disk} (")
            assert ended["error"].endswith(" bytes free)")
            assert told(run, "spawn_failed") == [{"errno": 28}]
        finally:
            shutil.rmtree(fillers)
        wait_for(lambda: supervisor_gone(run), 30, "the supervisor to end once its records are written")
        assert run.supervisor() is not None  # proc.json, refused while the disk was full, written since


def test_a_record_refused_while_the_run_runs_is_written_as_soon_as_it_can_be(workdir: Path, tmp_path: Path) -> None:
    """proc.json cannot be written (a folder stands in its place) when the child starts: the supervisor tries again
    while the run goes on, not only once it has ended, so that the run's child is known (to `kill`, to `status`)
    while it runs. What it could not write is not a full disk."""
    go = tmp_path / "go"
    run = RunStore(workdir).create(RunSpec(kind="command", argv=waits_for(go)))
    run.file(PROC).mkdir()
    runctl.start_supervisor(run)
    try:
        wait_for(lambda: run.file("output.log").read_text() == "started\n", 30, "the child to start")
        assert "Is a directory" in wait_for(lambda: run.file("supervisor.log").read_text(), 30, "the failed write")
        run.file(PROC).rmdir()
        child = wait_for(run.child, 30, "proc.json while the run runs")
        assert run.exit() is None and procinfo.is_alive(child)
        assert told(run, "spawned") == [{"pid": child.pid}]
    finally:
        go.touch()
    ended = wait_for(run.exit, 30, "exit.json")
    assert ended == {"code": 0, "signal": None, "error": None, "ended_at": ended["ended_at"]}  # no disk_full
    wait_for(lambda: supervisor_gone(run), 30, "the supervisor to end, with nothing left to write")
    assert told(run, "state")[-1] == {"state": "exited"}
    # Each try said once, as it failed: the room kept for a full disk is not tried for a folder in the way.
    temp = re.escape(str(run.path)) + r"/\.proc\.json\.\d+\.\w+\.tmp"  # atomic_write_json's, beside proc.json
    tried = re.compile(rf"supervise: \[Errno 21\] Is a directory: '{temp}' -> ")
    said = run.file("supervisor.log").read_text().splitlines()
    assert said and all(tried.match(line) for line in said), said


def test_a_full_disk_the_watch_met_while_the_run_ran_is_in_its_exit_though_room_came_back(
    tmp_path: Path,
) -> None:
    """The disk fills while the run runs and empties again before it ends: the watch saw it full (its disk_full
    event), so exit.json says so, though the disk has room by the end."""
    go = tmp_path / "go"
    with tmpfs(tmp_path / "disk", "4m") as disk:
        run = supervised(disk / "work", waits_for(go))
        try:
            wait_for(lambda: run.file("output.log").read_text() == "started\n", 30, "the child to start")
            filler = fill(disk)
            [full] = wait_for(lambda: told(run, "disk_full"), 30, "the watch to see the disk full")
            filler.unlink()
        finally:
            go.touch()
        ended = wait_for(run.exit, 30, "exit.json")
        assert ended["code"] == 0 and ended["disk_full"] == full["message"]
        assert str(full["message"]).startswith(f"no space left on tmpfs at {disk} (")
        wait_for(lambda: supervisor_gone(run), 30, "the supervisor to end")


def test_a_tensorboard_folder_named_from_the_runs_folder_of_work_is_read_there(workdir: Path, tmp_path: Path) -> None:
    """`--metrics-from tensorboard:outputs/runs` names a folder under the run's --cwd, not the supervisor's."""
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tmp_path / "outputs" / "runs"))
    for step, lr in ((50, 0.5), (100, 0.25)):
        value = Summary.Value(tag="train/lr", simple_value=lr)
        writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[value])))
    writer.close()
    spec = RunSpec(kind="train", argv=["true"], cwd=str(tmp_path), metrics_from="tensorboard:outputs/runs")
    run = RunStore(workdir).create(spec)
    runctl.start_supervisor(run)
    assert wait_for(run.exit, 30, "exit.json")["code"] == 0
    assert read_jsonl(run.file(METRICS))[0] == [
        {"step": 50, "lr": 0.5, "source": "tensorboard"},
        {"step": 100, "lr": 0.25, "source": "tensorboard"},
    ]


READS_ITS_STDIN = "import sys; print(repr(sys.stdin.read()))"


FOREGROUND_EXITS = {"runs": 0, "run_fails": 0, "cannot_start": 1, "not_a_run_folder": 2}


@pytest.mark.parametrize("case", list(FOREGROUND_EXITS))
def test_the_supervisor_run_by_hand_in_the_foreground(workdir: Path, case: str) -> None:
    """`python -m backends.runs.supervise RUN_DIR`, without --detach, from a shell: it returns once the run has
    ended, with 0 when the run ran (whatever its own exit), 1 when it could not start, 2 when handed no run; the
    run reads nothing of the terminal's input (a child that reads its stdin is not left waiting on it)."""
    argv = {
        "runs": [sys.executable, "-c", READS_ITS_STDIN],
        "run_fails": [sys.executable, "-c", READS_ITS_STDIN + "; sys.exit(4)"],
        "cannot_start": ["/nonexistent/trainer"],
        "not_a_run_folder": ["true"],
    }[case]
    run = RunStore(workdir).create(RunSpec(kind="command", argv=argv))
    if case == "not_a_run_folder":
        run.file("spec.json").unlink()
    done = subprocess.run(
        [sys.executable, "-m", "backends.runs.supervise", str(run.path)],
        cwd=REPO,
        input=b"typed at the terminal\n",
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == FOREGROUND_EXITS[case], done.stderr
    assert done.stdout == b""
    if case == "not_a_run_folder":
        assert done.stderr.decode() == f"supervise: {run.path} is not a run folder (no spec.json)\n"
        return
    assert done.stderr == b""
    ended = run.exit()
    assert ended is not None
    if case == "cannot_start":
        assert ended["error"].startswith("cannot start '/nonexistent/trainer': ")
    else:
        assert run.file("output.log").read_text() == "''\n"
        assert ended["code"] == (4 if case == "run_fails" else 0)


def test_a_detached_supervisor_lets_go_of_its_launchers_files_at_once(workdir: Path, tmp_path: Path) -> None:
    """`--detach` returns at once, and the supervisor it leaves keeps nothing of its launcher's (an agent's pipes, a
    terminal): its input is /dev/null, what it prints goes to the run's supervisor.log. A launcher that reads the
    launch's output to its end is not held until the run ends."""
    go = tmp_path / "go"
    run = RunStore(workdir).create(RunSpec(kind="command", argv=waits_for(go)))
    launch = subprocess.Popen(
        [sys.executable, "-m", "backends.runs.supervise", "--detach", str(run.path)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = launch.communicate(timeout=60)  # the ends of its pipes: nobody holds them any more
        assert (launch.returncode, out, err) == (0, b"", b"")
        supervisor = wait_for(run.supervisor, 30, "proc.json")
        held = {fd: os.readlink(f"/proc/{supervisor.pid}/fd/{fd}") for fd in (0, 1, 2)}
        log = str(run.file("supervisor.log"))
        assert held == {0: os.devnull, 1: log, 2: log}
        assert run.exit() is None
    finally:
        launch.kill()
        launch.wait()
        go.touch()
    assert wait_for(run.exit, 30, "exit.json")["code"] == 0


# How a run ends -> its argv, and (code, signal) as exit.json and the exit event say them.
ENDINGS: dict[str, tuple[list[str], int | None, str | None]] = {
    "exits_0": (["true"], 0, None),
    "exits_3": (["sh", "-c", "exit 3"], 3, None),
    "kills_itself": (["sh", "-c", "kill -KILL $$"], None, "KILL"),
    "killed_by_us": (["sleep", "60"], None, "TERM"),
}


@pytest.mark.parametrize("case", list(ENDINGS))
def test_how_a_run_ended_is_said_alike_in_its_exit_and_its_events(workdir: Path, case: str) -> None:
    """A code for an exit, a signal's name (and no code) for a kill; `error` only for a run that could not start;
    a reason for any end but a clean exit."""
    argv, code, signal_name = ENDINGS[case]
    run = supervised(workdir, argv)
    if case == "killed_by_us":
        wait_for(run.child, 30, "the child recorded")
        runctl.kill(run, "TERM", 30)
    ended = wait_for(run.exit, 30, "exit.json")
    assert {k: v for k, v in ended.items() if k not in ("ended_at", "reason")} == {
        "code": code,
        "signal": signal_name,
        "error": None,
    }
    assert ("reason" in ended) == (case != "exits_0")
    assert told(run, "exit") == [{"code": code, "signal": signal_name}]


def test_the_supervisors_help_and_usage_name_it_as_it_is_run() -> None:
    """`python -m backends.runs.supervise --help`, and the usage a wrong command line gets."""
    command = [sys.executable, "-m", "backends.runs.supervise"]
    env = {**os.environ, "COLUMNS": "120"}  # as wide as a terminal it would be read on, whatever this one is
    helped = subprocess.run([*command, "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and helped.stderr == ""
    assert helped.stdout.startswith("usage: python -m backends.runs.supervise [-h] [--detach] run_dir\n")
    assert "One run's supervisor: `python -m backends.runs.supervise [--detach] RUN_DIR`." in helped.stdout
    assert "--detach    fork into a new session and return at once" in helped.stdout
    wrong = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr == (
        "usage: python -m backends.runs.supervise [-h] [--detach] run_dir\n"
        "python -m backends.runs.supervise: error: the following arguments are required: run_dir\n"
    )
