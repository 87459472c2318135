"""What benchmarks/mutation.sh found no test of in runs/store.py: what `status` tells of a run from its records
(every field of a live run's, its signal, parent, stall, stack dumps, bench results, NaN, silence, a full disk, a
corrupt record's file and reason in one line, its state with a live supervisor's verdict or without an exit record,
a kill of ours told from a failure, its progress read from the metrics' tail), which processes are proven the run's,
`lost` recorded once, the spec checks a launch is refused by, the spec relaunch trusts, the store's permissions and
what a failed create says. Real run folders made by RunStore, real records written as the supervisor writes them,
real sleeping processes standing for a run's child and supervisor. What a test cannot make for real (a full disk, a
read-only mount, an I/O error) is raised by the call that meets it; an age is read by a frozen clock."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from backends.fileio import atomic_write_json
from backends.host import procinfo
from backends.masking import MASK
from backends.protocol import ENV_RUN_ID, Diagnosis, JobNode, Metric
from backends.runs import store as runstore
from backends.runs.store import (
    BENCH,
    EVENTS,
    EXIT,
    METRICS,
    OUTPUT,
    PROC,
    PROGRESS_TAIL,
    SPEC,
    WATCH,
    CorruptFile,
    RunDir,
    RunNotFound,
    RunSpec,
    RunStore,
    SpecError,
    StoreError,
    derive_state,
    new_run_id,
    nonfinite_of,
    progress_of,
    record_lost,
    signalled_by_us,
    signalled_in,
)


class Sleeper(Protocol):
    def __call__(self, *, session: bool = False, marker: str | None = None) -> procinfo.ProcIdentity: ...


@pytest.fixture
def sleeper() -> Iterator[Sleeper]:
    """Live processes of ours, killed when the test ends: with no run marker in their environment unless given one
    (`marker`: a run's id), each in a session of its own if asked (as the supervisor starts a run's child)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*, session: bool = False, marker: str | None = None) -> procinfo.ProcIdentity:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_RUN")}
        if marker is not None:
            env[ENV_RUN_ID] = marker
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=session,
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


# --- what `status` tells of a live run: every field from its record ------------------------------------------

NOW = 1_700_000_000.0  # the frozen clock of the tests that read an age (exact in a float, as are its quarters)


def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: NOW)


def age(path: Path, seconds: float) -> None:
    """`path` last changed `seconds` before NOW, to the nanosecond."""
    ns = int((NOW - seconds) * 1e9)
    os.utime(path, ns=(ns, ns))


def lines(run: RunDir, name: str, rows: list[object]) -> None:
    run.file(name).write_text("".join(f"{json.dumps(row)}\n" for row in rows))


JOB: JobNode = {"id": "tune-7", "node_rank": 1, "nnodes": 2}
DIAGNOSIS: Diagnosis = {"code": "nccl_timeout", "meaning": "a collective timed out", "hint": "check", "line": "NCCL"}
STALLED = [{"pid": 4242, "rank": 1, "state": "S", "where": "all_reduce (torch/distributed.py:12)"}]


def bench_row(t: float) -> dict[str, Any]:
    return {"t": t, "bench_run": None, "served_run": "r", "url": "http://h:8000", "argv": ["sglang", "--api-key", "k"]}


def test_status_of_a_live_stalled_run_tells_every_field_of_its_record(
    tmp_path: Path, sleeper: Sleeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = "20260101-000000-000-abcd"
    env = {"LOG_LEVEL": "debug", "HF_TOKEN": "hf_secret"}
    run = made(
        tmp_path, kind="train", name="tune", argv=["python", "train.py"], env=env, gpus=[0, 3], parent=parent, job=JOB
    )
    child, supervisor = sleeper(), sleeper()
    write(run, PROC, proc_record(child, supervisor))
    watch = {
        "state": "stalled",
        "phase": "training",
        "health": "unreachable",
        "stalled_since": 150.0,
        "stall_kind": "spinning",
        "stack_dumps": ["150.txt", "160.txt"],
        "diagnoses": [DIAGNOSIS],
        "stalled_processes": STALLED,
    }
    write(run, WATCH, watch)
    # The newest rows last, as the trainer appends them: a NaN the trainer spelled as text, among other values.
    nan_row = {Metric.STEP: 7, Metric.LR: 0.001, Metric.SOURCE: "specforge", Metric.LOSS: "NaN"}
    lines(run, METRICS, [{Metric.STEP: 6, Metric.LOSS: 2.0}, nan_row])
    # Seven bench results and rows that are none (no time, no figures, not an object, torn): the latest five.
    benches = [{**bench_row(float(t)), "figures": {"accept_len": t / 10}} for t in range(1, 8)]
    del benches[4]["argv"]  # a result of a bench that wrote no command line
    junk: list[object] = [{"t": 7.5, "figures": None}, {"figures": {"accept_len": 1.0}}, [1, 2], "text"]
    lines(run, BENCH, [*benches[:3], *junk, *benches[3:]])
    with open(run.file(BENCH), "a") as torn:
        torn.write('{"t": 9.0, "figu')
    age(run.file(OUTPUT), 0.25)
    frozen_clock(monkeypatch)
    info = run.info()
    assert info == {
        "id": run.id,
        "name": "tune",
        "kind": "train",
        "state": "stalled",
        "phase": "training",
        "pid": child.pid,
        "argv": ["python", "train.py"],
        "env": {"LOG_LEVEL": "debug", "HF_TOKEN": MASK},
        "gpus": [0, 3],
        "started_at": 100.0,
        "ended_at": None,
        "exit_code": None,
        "signal": None,
        "error": None,
        "parent": parent,
        "health": "unreachable",
        "stalled_since": 150.0,
        "stall_kind": "spinning",
        "stack_dumps": ["stacks/150.txt", "stacks/160.txt"],
        "diagnoses": [DIAGNOSIS],
        "corrupt": None,
        "truncated": [],
        "progress": {Metric.STEP: 7},
        "bench": [{k: v for k, v in row.items() if k != "argv"} for row in benches[2:]],
        "job": JOB,
        "stalled_processes": STALLED,
        "silent_s": 0.2,  # output.log's age, to a tenth of a second
        "nonfinite": {"metric": Metric.LOSS, "step": 7, "value": "nan"},
    }
    # The supervisor's verdict is the state only while the supervisor lives to keep it current.
    assert derive_state(run, {"state": "ready"}) == "ready"  # the watch as the caller read it
    write(run, PROC, proc_record(child, dead(supervisor)))
    assert run.info()["state"] == "running"
    # A run that recovered lists no stalled processes, whatever the watch still holds of the stall.
    write(run, PROC, proc_record(child, supervisor))
    write(run, WATCH, {**watch, "state": "ready"})
    assert "stalled_processes" not in run.info()


def test_a_status_tells_the_state_and_the_stall_of_one_verdict_of_the_watch(
    tmp_path: Path, sleeper: Sleeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor rewrites watch.json whenever it likes: a status reads it once, so that the state it tells and
    the phase and stall it tells with it are of one verdict."""
    run = made(tmp_path, kind="serve")
    write(run, PROC, proc_record(sleeper(), sleeper()))
    verdicts = iter([{"state": "stalled", "phase": "decode", "stalled_since": 150.0}, {"state": "ready"}])
    read = RunDir.watch

    def rewritten_before_each_read(self: RunDir) -> dict[str, Any]:
        write(self, WATCH, next(verdicts))
        return read(self)

    monkeypatch.setattr(RunDir, "watch", rewritten_before_each_read)
    info = run.info()
    assert (info["state"], info["phase"], info["stalled_since"]) == ("stalled", "decode", 150.0)


def dead(ident: procinfo.ProcIdentity) -> procinfo.ProcIdentity:
    """A process that has ended, its pid now another's (started at another time)."""
    return dataclasses.replace(ident, start_ticks=ident.start_ticks - 1)


def test_the_state_of_a_run_without_an_exit_record(tmp_path: Path, sleeper: Sleeper) -> None:
    live = sleeper()
    cases: list[tuple[procinfo.ProcIdentity | None, procinfo.ProcIdentity | None, list[dict[str, Any]], str]] = [
        (dead(live), dead(live), [{"t": 1.0, "type": "signal", "signal": "TERM"}], "killed"),  # ours, not lost
        (dead(live), dead(live), [{"t": 1.0, "type": "state", "state": "running"}], "lost"),
        (dead(live), live, [], "running"),  # between the child's exit and exit.json
        (None, live, [], "starting"),  # between spawn and the child's record
    ]
    for child, supervisor, events, state in cases:
        run = made(tmp_path, created_at=NOW - 3600)
        write(run, PROC, proc_record(child, supervisor))
        lines(run, EVENTS, list(events))
        assert (run.state(), run.info()["state"]) == (state, state), (child, supervisor, events)


def test_a_supervisor_that_never_recorded_itself_is_lost_30_s_after_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting, late = made(tmp_path, created_at=NOW - 29.75), made(tmp_path, created_at=NOW - 30.0)
    frozen_clock(monkeypatch)
    assert (waiting.state(), late.state()) == ("starting", "lost")


def test_a_run_folder_without_a_spec_is_being_made_for_5_s_then_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(tmp_path / "work")
    made(tmp_path)
    fresh, old = RunDir(store.runs / new_run_id()), RunDir(store.runs / new_run_id(NOW - 100))
    for folder, seconds in ((fresh, 4.75), (old, 5.0)):
        folder.path.mkdir()
        age(folder.path, seconds)
    frozen_clock(monkeypatch)
    assert (fresh.being_created(), old.being_created()) == (True, False)
    assert not RunDir(store.runs / new_run_id(NOW - 200)).being_created()  # gone: nothing being made


# --- how an ended run ended: its exit record and our signals -------------------------------------------------


def test_an_ended_runs_state_tells_our_kill_from_a_failure_and_says_why_it_failed(tmp_path: Path) -> None:
    ours = {"t": 150.0, "type": "signal", "signal": "TERM"}
    late = {"t": 250.0, "type": "signal", "signal": "TERM"}  # sent to what was left after it ended
    error = "cannot exec train.py: Permission denied"
    cases: list[tuple[dict[str, Any], list[dict[str, Any]], str, str | None]] = [
        ({"code": None, "error": error, "ended_at": 200.0}, [ours], "failed", error),  # it never started
        ({"code": -15, "signal": "TERM", "ended_at": 200.0}, [late], "failed", None),
        (
            {"code": 1, "reason": "ValueError: boom", "ended_at": 200.0},
            [late],
            "failed",
            "ValueError: boom (exit code 1)",
        ),
        ({"code": -15, "signal": "TERM", "ended_at": 200.0}, [ours], "killed", None),
        ({"code": -15, "signal": "TERM", "reason": "Terminated", "ended_at": 200.0}, [ours], "killed", None),
        ({"code": -15, "signal": "TERM", "ended_at": "soon"}, [late], "killed", None),  # no time: any signal of ours
        ({"code": 0, "ended_at": 200.0}, [], "exited", None),
    ]
    for ended, events, state, failure in cases:
        run = made(tmp_path)
        write(run, PROC, proc_record(None, None))
        lines(run, EVENTS, list(events))
        write(run, EXIT, ended)
        info = run.info()
        assert (info["state"], info.get("failure"), info["ended_at"]) == (state, failure, ended["ended_at"]), ended
        assert signalled_by_us(run) == bool(events)
        assert signalled_by_us(run, 200.0) == (events == [ours])


def test_a_signal_we_record_counts_as_our_kill_of_a_run_that_ends_after_it(tmp_path: Path) -> None:
    run = made(tmp_path)
    write(run, PROC, proc_record(None, None))
    run.append_event("signal", signal="TERM")
    [sent] = run.events()
    assert (sent["type"], sent["signal"]) == ("signal", "TERM") and abs(sent["t"] - time.time()) < 60
    write(run, EXIT, {"code": -15, "signal": "TERM", "ended_at": time.time() + 1})
    assert run.state() == "killed"


def test_status_of_an_ended_run_tells_each_diagnosis_whole_and_no_empty_stack_dumps(tmp_path: Path) -> None:
    run = made(tmp_path)
    write(run, PROC, proc_record(None, None))
    said = "no space left on /dev/sda1 (0 bytes free)"
    write(run, EXIT, {"code": 1, "ended_at": 200.0, "disk_full": said})
    write(run, WATCH, {"stack_dumps": [], "diagnoses": [DIAGNOSIS]})
    info = run.info()
    assert info["stack_dumps"] is None
    assert info["diagnoses"] == [
        DIAGNOSIS,
        {
            "code": "disk_full",
            "meaning": said,
            "hint": "free space on that device; the run's log and metrics may have gaps from then on",
            "line": "",
        },
    ]


# --- a corrupt record: which file and why, in one line -------------------------------------------------------

DEEP: object = {"t": 1.0, "type": "state"}
for _ in range(40):
    DEEP = {"t": 1.0, "type": "state", "inner": [DEEP]}


def unexpected_field() -> str:
    try:
        RunSpec(kind="command", argv=["x"], bogus=1)  # type: ignore[call-arg]
    except TypeError as exc:
        return str(exc)
    raise AssertionError("RunSpec took a field it does not have")


A_FOLDER = b"(a folder)"  # the record's path is a folder: the system refuses to read it
GONE = b"(gone)"
# Each broken record: the file, what it holds instead (or that it is gone, or a folder), and the reason told.
CORRUPT = [
    pytest.param(SPEC, GONE, "missing", id="spec-gone"),
    pytest.param(SPEC, A_FOLDER, "cannot be read (Is a directory)", id="spec-folder"),
    pytest.param(SPEC, b"[]", "spec.json is not a JSON object", id="spec-list"),
    pytest.param(
        SPEC,
        b'{"kind": "command", "argv": ["x"], "bogus": 1}',
        f"spec.json has unexpected fields: {unexpected_field()}",
        id="spec-unknown-field",
    ),
    pytest.param(
        SPEC,
        b'{"kind": "command", "argv": ["x"], "stall_after": NaN}',
        "stall window must be positive seconds",  # a spec may hold a NaN: its check tells what is wrong with it
        id="spec-nan",
    ),
    pytest.param(PROC, A_FOLDER, "cannot be read (Is a directory)", id="proc-folder"),
    pytest.param(PROC, b"[1]", "not a JSON object", id="proc-list"),
    pytest.param(
        PROC,
        b'{"child_started_at": NaN}',
        "not valid JSON (NaN is not a number a record of a run holds)",
        id="proc-nan",
    ),
    pytest.param(
        PROC,
        b'{"child": {"pid": 7}}',
        "its child is not a process identity (pid, start_ticks, boot_id)",
        id="proc-child",
    ),
    pytest.param(
        PROC,
        b'{"supervisor": "me"}',
        "its supervisor is not a process identity (pid, start_ticks, boot_id)",
        id="proc-supervisor",
    ),
    pytest.param(EXIT, A_FOLDER, "cannot be read (Is a directory)", id="exit-folder"),
    pytest.param(EXIT, b"[]", "not a JSON object", id="exit-list"),
    pytest.param(
        EXIT,
        b'{"code": 0, "ended_at": Infinity}',
        "not valid JSON (Infinity is not a number a record of a run holds)",
        id="exit-infinity",
    ),
    pytest.param(EVENTS, A_FOLDER, "cannot be read (Is a directory)", id="events-folder"),
    pytest.param(
        EVENTS,
        b"\n{not json\n",
        "line 2 is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
        id="events-not-json",
    ),
    pytest.param(EVENTS, json.dumps(DEEP).encode() + b"\n", "line 1 is not an event", id="events-too-deep"),
]


@pytest.mark.parametrize(("file", "content", "reason"), CORRUPT)
def test_a_corrupt_record_is_told_in_one_line_and_the_rest_of_the_run_still_shown(
    tmp_path: Path, file: str, content: bytes, reason: str
) -> None:
    env = {"LOG_LEVEL": "debug", "HF_TOKEN": "hf_secret"}
    run = made(tmp_path, kind="train", name="tune", argv=["python", "t.py"], env=env, gpus=[2], parent="p")
    child = procinfo.ProcIdentity(4242, 1, procinfo.boot_id())
    write(run, PROC, proc_record(child, None))
    write(run, EXIT, {"code": 0, "ended_at": 200.0})
    lines(run, EVENTS, [{"t": 1.0, "type": "state", "state": "running"}])
    assert run.info()["state"] == "exited"
    run.file(file).unlink()
    if content == A_FOLDER:
        run.file(file).mkdir()
    elif content != GONE:
        run.file(file).write_bytes(content)
    read: dict[str, Callable[[], object]] = {SPEC: run.spec, PROC: run.proc, EXIT: run.exit, EVENTS: run.events}
    with pytest.raises(CorruptFile) as said:
        read[file]()
    assert str(said.value) == f"run {run.id} is corrupt: {file}: {reason}; repair that file or move runs/{run.id} away"
    info = run.info()
    assert (info["state"], info["corrupt"]) == ("corrupt", {"file": file, "reason": reason})
    whole = file != SPEC  # then the spec's fields are shown, and the child's pid while proc.json is whole
    shown = ("tune", "train", ["python", "t.py"], {"LOG_LEVEL": "debug", "HF_TOKEN": MASK}, [2], "p")
    assert (info["name"], info["kind"], info["argv"], info["env"], info["gpus"], info["parent"]) == (
        shown if whole else ("", "unknown", [], {}, [], None)
    )
    assert info["pid"] == (None if file == PROC else 4242)


# --- the run's processes: each one proven -------------------------------------------------------------------


def test_the_processes_of_a_run_are_those_proven_its_own(tmp_path: Path, sleeper: Sleeper) -> None:
    run = made(tmp_path)
    child = sleeper(session=True)  # the child leads a session of its own, as the supervisor starts it
    left = sleeper(marker=run.id)  # a process of the run that left its session: it carries the run's id
    stranger = sleeper()
    scan = procinfo.live_stats()
    write(run, PROC, {**proc_record(child, None), "session": child.pid})
    assert set(run.processes()) == {child.pid, left.pid}
    late = sleeper(marker=run.id)
    assert set(run.processes(scan)) == {child.pid, left.pid}  # as of the scan it is given
    assert set(run.processes()) == {child.pid, left.pid, late.pid}
    # Once the exit is recorded the child's pid alone proves nothing; the session it still holds does.
    write(run, EXIT, {"code": 0, "ended_at": 200.0})
    assert child.pid in run.processes()
    for session in (None, float(child.pid)):  # not recorded (an older store), or not a session number
        write(run, PROC, {**proc_record(child, None), "session": session})
        assert set(run.processes()) == {left.pid, late.pid}, session
    # An exit record that cannot be read proves no exit: the child is still told by its identity.
    run.file(EXIT).write_text("[]")
    assert child.pid in run.processes() and stranger.pid not in run.processes()


# --- what lost records -----------------------------------------------------------------------------------


def test_lost_is_recorded_once_and_a_store_that_cannot_take_it_still_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = made(tmp_path)
    lines(run, EVENTS, [{"t": 1.0, "type": "state", "state": "running"}])
    record_lost(run)
    record_lost(run)
    assert [e.get("state") for e in run.events()] == ["running", "lost"]
    corrupt = made(tmp_path)
    corrupt.file(EVENTS).write_text("[]\n")
    record_lost(corrupt)  # its events are not told: nothing added, no error
    assert corrupt.file(EVENTS).read_text() == "[]\n"
    full = made(tmp_path)

    def no_space(path: Path, obj: object, torn: object = None) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(runstore, "append_jsonl", no_space)
    record_lost(full)
    assert full.events() == []


# --- metric rows: progress and NaN ------------------------------------------------------------------------


def test_progress_stops_at_the_newest_step_or_shard() -> None:
    assert progress_of([{Metric.STEP: 40}, {Metric.SHARD: 3, Metric.STEP: 39}]) == {Metric.STEP: 40}


def test_progress_is_read_from_the_whole_lines_of_the_metrics_tail(tmp_path: Path) -> None:
    """The tail read is PROGRESS_TAIL bytes: a file of exactly that is read whole; of more, the first line of the
    tail is cut (and passed over) and the next is whole."""
    filler = json.dumps({Metric.LOSS: 1.0, "pad": "x" * 60}) + "\n"

    def metrics(first: str, size: int) -> RunDir:
        run = made(tmp_path, kind="train")
        rest = size - len(first)
        body = filler * (rest // len(filler) - 1)
        pad = rest - len(body)
        assert pad >= len('{"pad": ""}\n')
        run.file(METRICS).write_text(first + json.dumps({"pad": "y" * (pad - 12)}) + "\n" + body)
        assert run.file(METRICS).stat().st_size == size
        return run

    exact = metrics(json.dumps({Metric.STEP: 5}) + "\n", PROGRESS_TAIL)
    assert exact.info()["progress"] == {Metric.STEP: 5}
    cut = json.dumps({Metric.STEP: 1, "pad": "z" * 100}) + "\n"  # the line the tail starts in
    longer = metrics(cut + json.dumps({Metric.STEP: 5}) + "\n", PROGRESS_TAIL + len(cut) - 50)
    assert longer.info()["progress"] == {Metric.STEP: 5}


@pytest.mark.parametrize(
    ("rows", "told"),
    [
        pytest.param(
            [{Metric.STEP: 7, Metric.LR: 0.001, Metric.SOURCE: "specforge", Metric.LOSS: " NaN"}],
            (Metric.LOSS, 7, "nan"),
            id="spelled-among-others",
        ),
        pytest.param(
            [{Metric.STEP: 8, Metric.LOSS: "inf"}, {Metric.STEP: 7, Metric.LOSS: "nan"}],
            (Metric.LOSS, 8, "inf"),
            id="the-newest",
        ),
        pytest.param(
            [{Metric.STEP: 3.0, Metric.GRAD_NORM: -math.inf}], (Metric.GRAD_NORM, None, "-inf"), id="step-not-an-int"
        ),
        pytest.param([{Metric.STEP: "9", Metric.GRAD_NORM: math.nan}], (Metric.GRAD_NORM, None, "nan"), id="step-text"),
        pytest.param(
            [{Metric.STEP: 5, Metric.LOSS: 1.0, Metric.SOURCE: "specforge", "note": "infinite"}], None, id="none"
        ),
        pytest.param(
            [
                {Metric.STEP: 10, Metric.LOSS: 0.9},
                {Metric.STEP: 9, Metric.LOSS: 1.0},
                {Metric.STEP: 8, Metric.LOSS: "nan"},
            ],
            (Metric.LOSS, 8, "nan"),
            id="back-to-finite-still-told",
        ),
    ],
)
def test_the_newest_nan_or_infinity_of_metric_rows_is_told(
    rows: list[dict[str, Any]], told: tuple[str, int | None, str] | None
) -> None:
    found = nonfinite_of(rows)
    assert found == (None if told is None else dict(zip(("metric", "step", "value"), told, strict=True)))


# --- the spec: what a launch is refused by, and what relaunch and the supervisor trust ----------------------

REFUSED = [
    pytest.param(
        {"kind": "bake"}, "unknown run kind 'bake'; use one of extract, train, serve, command", id="kind-unknown"
    ),
    pytest.param({"argv": []}, "argv must be a non-empty list of strings", id="argv-empty"),
    pytest.param({"env": {"A": 1}}, "env must map strings to strings", id="env-number"),
    pytest.param({"gpus": [0, -1]}, "gpus must be a list of GPU indices", id="gpus-negative"),
    pytest.param({"stall_after": 0}, "stall window must be positive seconds", id="stall-zero"),
    pytest.param({"stall_after": math.inf}, "stall window must be positive seconds", id="stall-infinite"),
    pytest.param({"created_at": "now"}, "created_at must be a time in seconds", id="created-text"),
    pytest.param({"created_at": math.nan}, "created_at must be a time in seconds", id="created-nan"),
    pytest.param({"created_at": -math.inf}, "created_at must be a time in seconds", id="created-infinite"),
    pytest.param(
        {"kind": "train", "metrics_from": 3}, "metrics_from must be a string or null", id="metrics-from-number"
    ),
    pytest.param(
        {"kind": "train", "metrics_from": "wandb"},
        "unknown metrics source 'wandb'; use one of jsonl, specforge, speculators, eagle or tensorboard:DIR",
        id="metrics-from-unknown",
    ),
    pytest.param(
        {"job": {"id": "tune-7", "node_rank": 2, "nnodes": 2}},
        "a job's node_rank is 0 to 1 for 2 nodes, not 2",
        id="job-rank",
    ),
    pytest.param({"job": {"id": "tune-7"}}, "job must be an object of id, node_rank and nnodes", id="job-fields"),
    # What exec cannot take: the first problem is told, wherever it is.
    pytest.param(
        {"argv": ["python", "a\0b"], "env": {"A": "1"}, "cwd": "/tmp/\0"},
        "argv[1] contains a NUL byte, which no command line, environment or path can hold",
        id="argv-nul-first",
    ),
    pytest.param(
        {"env": {"A": "1", "B": "x\0"}, "cwd": "/tmp"},
        "env['B'] contains a NUL byte, which no command line, environment or path can hold",
        id="env-nul",
    ),
    pytest.param(
        {"cwd": "/tmp/\0"},
        "cwd contains a NUL byte, which no command line, environment or path can hold",
        id="cwd-nul",
    ),
    pytest.param({"env": {"A=B": "1"}}, "environment variable name 'A=B' contains '=': give NAME=VALUE", id="env-name"),
]


@pytest.mark.parametrize(("fields", "message"), REFUSED)
def test_a_spec_a_launch_is_refused_by_says_what_is_wrong(fields: dict[str, Any], message: str) -> None:
    spec = RunSpec(**{"kind": "command", "argv": ["x"], **fields})
    with pytest.raises(SpecError) as said:
        spec.validate()
    assert str(said.value) == message


def test_a_spec_within_every_bound_is_taken() -> None:
    job: JobNode = {"id": "tune-7", "node_rank": 1, "nnodes": 2}
    RunSpec(kind="train", argv=["x"], stall_after=0.5, job=job, metrics_from="tensorboard:runs", cwd="/tmp").validate()


def test_relaunch_and_the_supervisor_trust_a_spec_only_its_owner_could_write(tmp_path: Path) -> None:
    run = made(tmp_path, name="tune")
    assert run.trusted_spec() == run.spec()
    os.chmod(run.path, 0o711)  # others may enter and read, not write
    os.chmod(run.file(SPEC), 0o644)
    assert run.trusted_spec().name == "tune"
    me = procinfo.user_name(os.geteuid())
    for path, mode in ((run.file(SPEC), 0o620), (run.path, 0o757)):
        os.chmod(path, mode)
        with pytest.raises(SpecError) as said:
            run.trusted_spec()
        assert str(said.value) == (
            f"run {run.id}: {path.name} could have been changed by someone else (mode {mode:o}, owner {me}); "
            "not running it: check who did"
        )
        os.chmod(path, 0o700 if path == run.path else 0o600)
    if os.geteuid() == 0:  # another user's spec: only root can make one here
        os.chown(run.file(SPEC), 65534, 65534)
        with pytest.raises(SpecError, match=r"\(mode 600, owner nobody\)"):
            run.trusted_spec()
    run.file(SPEC).unlink()
    with pytest.raises(SpecError) as said:
        run.trusted_spec()
    assert str(said.value) == f"run {run.id}: spec.json is missing"


# --- the store: its permissions, a failed create, a run by reference ----------------------------------------


def test_a_store_of_another_user_or_one_that_cannot_be_read_is_refused(tmp_path: Path) -> None:
    blocked = tmp_path / "file" / "work"
    blocked.parent.write_text("not a folder")
    with pytest.raises(StoreError) as said:
        RunStore(blocked).secure()
    assert str(said.value) == f"cannot read the run store {blocked}: Not a directory"
    if os.geteuid() != 0:
        return  # a store of another user needs root to make here (CI runs as root)
    run = made(tmp_path)
    for folder in (run.path.parent, run.path.parent.parent):  # runs/, then the workdir
        os.chown(folder, 65534, 65534)
        with pytest.raises(StoreError) as said:
            RunStore(tmp_path / "work").secure()
        assert str(said.value) == f"the run store {folder} belongs to user nobody; choose a --workdir of your own"


def test_a_private_store_on_a_read_only_mount_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store nobody else can enter is left as it is (no chmod); one that others could enter and cannot be made
    private says why."""
    workdir = tmp_path / "work"
    made(tmp_path)

    def read_only(path: object, mode: int) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    with monkeypatch.context() as patch:
        patch.setattr(os, "chmod", read_only)
        RunStore(workdir).secure()
    os.chmod(workdir, 0o750)
    with monkeypatch.context() as patch, pytest.raises(StoreError) as said:
        patch.setattr(os, "chmod", read_only)
        RunStore(workdir).secure()
    assert str(said.value) == f"cannot make the run store {workdir} private: Read-only file system"


def test_a_create_that_fails_says_why_and_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(tmp_path / "work")
    spec = RunSpec(kind="command", argv=["x"])

    def io_error(path: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")  # no file named: the system's words alone

    with monkeypatch.context() as patch:
        patch.setattr(runstore, "private_dir", io_error)
        with pytest.raises(StoreError) as said:
            store.create(spec)
    assert str(said.value) == (
        f"cannot write the run store at {store.runs}: Input/output error; "
        "fix its permissions or choose another --workdir"
    )

    def no_space(path: Path, obj: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with monkeypatch.context() as patch:
        patch.setattr(runstore, "atomic_write_json", no_space)
        with pytest.raises(StoreError) as said:
            store.create(spec)
    assert re.fullmatch(
        r"no space left on .+ \([\d,]+ bytes free\): the run was not created; free some space there or choose "
        r"another --workdir",
        str(said.value),
    ), said.value
    assert store.ids() == []

    # The file system went read-only under the launch (as ext4 does on an I/O error): the half-made run cannot be
    # removed either, and the launch still ends in the store's message.
    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(args[0]))

    with monkeypatch.context() as patch:
        patch.setattr(runstore, "atomic_write_json", read_only)
        patch.setattr(os, "rmdir", read_only)
        with pytest.raises(StoreError, match=r": Read-only file system; fix its permissions or choose another"):
            store.create(spec)


def test_a_run_given_by_nothing_or_by_a_prefix_of_many_says_what_to_give(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "work")
    ids = [store.create(RunSpec(kind="command", argv=["x"])).id for _ in range(6)]
    with pytest.raises(RunNotFound) as said:
        store.get("")
    assert str(said.value) == "no run given; 'status' lists the runs"
    with pytest.raises(RunNotFound) as said:
        store.get("2")
    assert str(said.value) == f"run id prefix '2' is ambiguous: {', '.join(sorted(ids)[:5])}; give more of the id"


def test_a_run_id_names_its_launchs_millisecond() -> None:
    assert new_run_id(1_767_225_845.25).startswith("20260101-000405-250-")
