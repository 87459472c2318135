"""Fault injection against the run engine's processes (issue 8, items 1, 2, 4 and 7, and the kill states
of item 8): each test is an attack or a fault reproduced with real processes, real signals and real
files; the run engine is the real one (runctl, its supervisor, the run store). Nothing is a stand-in.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backends.fileio import append_jsonl
from backends.host import diskspace, procinfo
from backends.runs import control as runctl
from backends.runs import watch
from backends.runs.store import EXIT, PROC, SPEC, RunDir, RunSpec, RunStore, SpecError, StoreError
from tests.conftest import remove_live_folder, tmpfs, wait_for

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


def launch(store: RunStore, argv: list[str], **spec: object) -> RunDir:
    result = runctl.launch(store, RunSpec(kind="command", argv=argv, **spec))  # type: ignore[arg-type]
    return store.get(result["run"])


def ended(run: RunDir, timeout: float = 20) -> str:
    return str(wait_for(lambda: run.exit() is not None and run.state(), timeout, f"run {run.id} to end"))


def alive(pid: int) -> bool:
    stat_ = procinfo.read_stat(pid)
    return stat_ is not None and stat_.state != "Z"


def python(script: str) -> list[str]:
    return [sys.executable, "-c", script]


# --- item 1: a recycled pid is never taken for the run --------------------------------------------


def spawn_with_pid(pid: int, argv: list[str]) -> subprocess.Popen[bytes] | None:
    """Start `argv` as the leader of a new session with exactly `pid` (as root, through ns_last_pid)."""
    for _ in range(200):
        NS_LAST_PID.write_text(str(pid - 1))
        proc = subprocess.Popen(argv, start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.fixture
def recycle() -> Iterator[Callable[[int, list[str]], subprocess.Popen[bytes]]]:
    if not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip("forcing a pid needs root (/proc/sys/kernel/ns_last_pid); CI runs as root")
    started: list[subprocess.Popen[bytes]] = []

    def _recycle(pid: int, argv: list[str]) -> subprocess.Popen[bytes]:
        proc = spawn_with_pid(pid, argv)
        if proc is None:
            pytest.fail(f"could not get pid {pid} again in 200 tries")
        started.append(proc)
        return proc

    yield _recycle
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_kill_and_relaunch_of_a_finished_run_never_hit_the_group_that_recycled_its_pid(
    workdir: Path, recycle: Callable[[int, list[str]], subprocess.Popen[bytes]]
) -> None:
    store = RunStore(workdir)
    run = launch(store, ["true"])
    assert ended(run) == "exited"
    child = run.child()
    assert child is not None
    # A stranger's group leader now has the run's child pid; its members are younger than the child.
    leader = recycle(child.pid, ["sh", "-c", "sleep 3001 & sleep 3002 & wait"])
    wait_for(lambda: len([s for s in procinfo.live_stats() if s.pgid == leader.pid]) == 3, 5, "the stranger's group")
    group = [s.pid for s in procinfo.live_stats() if s.pgid == leader.pid]

    with pytest.raises(runctl.OpError, match="nothing to kill"):
        runctl.kill(run, "KILL", 0)
    relaunched = runctl.relaunch(store, run.id, [], [], grace=0)
    assert relaunched["stopped_parent"] is None

    assert all(alive(pid) for pid in group), "a stranger's process was signalled"
    assert run.state() == "exited"
    assert not [e for e in run.events() if e["type"] == "signal"]
    ended(store.get(relaunched["run"]))


def test_a_relaunch_of_a_run_that_ends_as_it_is_stopped_starts_the_copy(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent is seen alive, then ends on its own before the stop's signal (CI met it): the copy still starts,
    and nothing was stopped. Forced here by the look that saw it alive."""
    store = RunStore(workdir)
    parent = launch(store, ["true"])
    assert ended(parent) == "exited"
    monkeypatch.setattr(runctl, "has_live_processes", lambda run: True)
    relaunched = runctl.relaunch(store, parent.id, [], [], grace=0)
    assert relaunched["stopped_parent"] is None and relaunched["parent"] == parent.id
    assert ended(store.get(relaunched["run"])) == "exited"


def test_a_kill_with_no_grace_reports_every_process_dead_once_it_is(workdir: Path) -> None:
    """SIGKILL is never refused, but a killed orphan stays in /proc until its reaper gets to it: the report waited
    for none and said `died: false` of a process in one run of three here."""
    store = RunStore(workdir)
    for _ in range(16):
        run = launch(store, ["sh", "-c", "sleep 60 & sleep 60 & sleep 60 & wait"])
        wait_for(lambda: len(run.processes()) == 4, 20, "the shell and its three sleeps")  # noqa: B023
        report = runctl.kill(run, "KILL", 0)
        # The shell may end on its own first (its `wait` returns once its sleeps are killed): not signalled, dead.
        assert [p["died"] for p in report["processes"]] == [True] * 4
        assert all(p["signals"] in ([], ["KILL"]) for p in report["processes"])
        assert report["state"] == "killed" and not report["escalated"]


def test_a_pid_recycled_within_the_child_s_clock_tick_is_never_taken_for_the_ended_run(workdir: Path) -> None:
    """/proc's start time counts clock ticks (10 ms): a pid reused within the child's tick matches its
    recorded pid, start time and boot id. The exit record (written after the child is reaped) rules it out.
    Simulated by recording the stranger's own identity as the ended run's child; CI has met the real race."""
    store = RunStore(workdir)
    run = launch(store, ["true"])
    assert ended(run) == "exited"
    stranger = subprocess.Popen(["sleep", "3003"], start_new_session=True)
    try:
        stat_ = procinfo.read_stat(stranger.pid)
        assert stat_ is not None
        proc = json.loads(run.file(PROC).read_text())
        proc["child"].update(pid=stranger.pid, start_ticks=stat_.start_ticks)
        run.file(PROC).write_text(json.dumps(proc))

        with pytest.raises(runctl.OpError, match="nothing to kill"):
            runctl.kill(run, "KILL", 0)
        assert runctl.relaunch(store, run.id, [], [], grace=0)["stopped_parent"] is None
        assert alive(stranger.pid), "a stranger's process was signalled"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_child_recorded_on_another_boot_is_never_signalled(workdir: Path) -> None:
    run = launch(RunStore(workdir), python("import time; time.sleep(60)"))
    wait_for(lambda: run.state() == "running", 10, "running")
    proc = json.loads(run.file(PROC).read_text())
    child_pid = proc["child"]["pid"]
    proc["child"]["boot_id"] = "0e0a0b0c-another-boot"  # a store shared over NFS with another host
    run.file(PROC).write_text(json.dumps(proc))
    with pytest.raises(runctl.OpError, match="another boot") as refused:
        runctl.kill(run, "KILL", 0)
    assert refused.value.code == "other_boot"
    assert alive(child_pid)
    os.kill(child_pid, signal.SIGKILL)


def test_what_a_finished_run_left_behind_is_killed_and_the_run_stays_exited(workdir: Path) -> None:
    """A child that exits 0 leaving a daemon of its own: the daemon carries the run's marker, so it is the
    run's to kill, and the run still ended `exited` (the signal came after its end)."""
    run = launch(RunStore(workdir), ["sh", "-c", "setsid sleep 300 & echo $!"])
    assert ended(run) == "exited"
    orphan = int(run.file("output.log").read_text().split()[0])
    assert alive(orphan)
    report = runctl.kill(run, "TERM", 5)
    assert [p["pid"] for p in report["processes"]] == [orphan] and report["processes"][0]["died"]
    assert report["state"] == "exited" and run.state() == "exited"


# --- item 2: the run store is its owner's, and stacks never show a secret --------------------------


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_the_run_store_is_private_whatever_the_umask(workdir: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        run = launch(
            RunStore(workdir),
            python("import os; print('token ok' if os.environ['HF_TOKEN'] == 'hf_s3cret' else 'no token')"),
            env={"HF_TOKEN": "hf_s3cret"},
        )
        ended(run)
    finally:
        os.umask(old)
    assert run.file("output.log").read_text() == "token ok\n"  # the child still gets its env
    loose = []
    for path in [workdir, *workdir.rglob("*")]:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            continue  # a temp file the supervisor's last save renamed away meanwhile (it was checked if seen)
        if mode != (0o700 if path.is_dir() else 0o600):
            loose.append(f"{path.relative_to(workdir.parent)} {mode:o}")
    assert not loose, loose


def test_an_older_store_open_to_others_is_made_private_when_the_agent_starts(workdir: Path) -> None:
    (workdir / "runs").mkdir(parents=True)
    os.chmod(workdir, 0o755)
    os.chmod(workdir / "runs", 0o775)
    done = subprocess.run(
        [sys.executable, "-m", "backends.agent", "--workdir", str(workdir)], input=b"", capture_output=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(workdir.stat().st_mode) == 0o700
    assert stat.S_IMODE((workdir / "runs").stat().st_mode) == 0o700


def test_a_spec_others_could_have_rewritten_is_never_run_again(workdir: Path) -> None:
    store = RunStore(workdir)
    run = launch(store, ["true"])
    ended(run)
    os.chmod(run.file(SPEC), 0o664)  # a group-writable spec: someone else may have put their argv in it
    with pytest.raises(SpecError, match="could have been changed by someone else"):
        runctl.relaunch(store, run.id, [], [], grace=0)
    assert store.ids() == [run.id]


def test_stack_dumps_never_show_the_api_key_or_a_token(workdir: Path) -> None:
    if watch.py_spy() is None:
        pytest.fail("py-spy is missing: `make test` installs it with the test extras")
    script = "import time\nprint('up', flush=True)\ntime.sleep(60)\n"
    run = launch(
        RunStore(workdir),
        [*python(script), "--api-key", "sk-live-abc123", "--hf-token=hf_tok456"],
        env={"HF_TOKEN": "hf_env789"},
    )
    wait_for(lambda: run.file("output.log").read_text() == "up\n", 10, "the child up")
    dump = runctl.stacks(run, now=True)
    assert "<module>" in dump["text"]  # py-spy's stack of the child, not only its command line
    assert f"pid {run.child().pid}" in dump["text"]  # type: ignore[union-attr]
    on_disk = (run.path / dump["file"]).read_text()
    for secret in ("sk-live-abc123", "hf_tok456"):
        assert secret not in dump["text"] and secret not in on_disk
    assert "--api-key ***" in on_disk
    assert stat.S_IMODE((run.path / dump["file"]).stat().st_mode) == 0o600
    runctl.kill(run, "KILL", 0)


# --- item 4: a full disk never loses the run's fate -----------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs of our own, to fill; the runs of its store killed before it goes."""
    with tmpfs(tmp_path / "small", "2m") as mount:
        try:
            yield mount
        finally:
            for run in RunStore(mount / "work").all():
                with contextlib.suppress(runctl.OpError):
                    runctl.kill(run, "KILL", 0)


def fill(disk: Path) -> Path:
    """Fill the disk to its last byte; the filler file, to remove when space should return."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 512)
    return filler


def test_launch_on_a_full_disk_says_so(small_disk: Path) -> None:
    store = RunStore(small_disk / "work")
    fill(small_disk)
    with pytest.raises(StoreError) as refused:
        runctl.launch(store, RunSpec(kind="command", argv=["true"]))
    message = str(refused.value)
    assert message.startswith(f"no space left on tmpfs at {small_disk} (") and "bytes free)" in message
    assert "permission" not in message
    assert store.ids() == []


def test_a_disk_full_before_the_child_is_recorded_still_records_it(small_disk: Path) -> None:
    store = RunStore(small_disk / "work")
    run = store.create(RunSpec(kind="command", argv=python("import time; time.sleep(60)")))
    fill(small_disk)  # full between the run's creation and its child's start
    runctl.start_supervisor(run)
    child = wait_for(run.child, 10, "the child recorded")
    assert procinfo.is_alive(child)
    report = runctl.kill(run, "TERM", 5)  # on the full disk still
    assert report["processes"][0]["pid"] == child.pid and report["processes"][0]["died"]
    ended_with = wait_for(run.exit, 10, "exit.json")
    assert ended_with["signal"] == "TERM" and ended_with["disk_full"].startswith("no space left on tmpfs")


def test_a_run_that_fills_the_disk_keeps_its_supervisor_and_its_exit(small_disk: Path) -> None:
    script = (
        "import sys, time\n"
        "try:\n"
        "    while True: print('x' * 4000, flush=True)\n"
        "except OSError:\n"
        "    time.sleep(1)\n"
        "    sys.exit(3)\n"
    )
    store = RunStore(small_disk / "work")
    run = launch(store, python(script))
    assert ended(run) == "failed"
    ended_with = run.exit()
    assert ended_with is not None and ended_with["code"] == 3
    assert ended_with["disk_full"].startswith(f"no space left on tmpfs at {small_disk} (")
    found = [d for d in run.info()["diagnoses"] if d["code"] == "disk_full"]
    assert found and "bytes free" in found[0]["meaning"]


def test_an_exit_the_disk_refuses_is_written_when_space_returns(small_disk: Path) -> None:
    store = RunStore(small_disk / "work")
    run = store.create(RunSpec(kind="command", argv=python("import time; time.sleep(1)")))
    run.reserved(EXIT).slot.unlink()  # as on a copy-on-write file system: no room kept for it
    runctl.start_supervisor(run)
    wait_for(run.child, 10, "the child recorded")
    filler = fill(small_disk)
    supervisor = run.supervisor()
    assert supervisor is not None
    time.sleep(2.5)  # the child has ended; its exit waits for room
    assert run.exit() is None and procinfo.is_alive(supervisor)
    filler.unlink()
    assert wait_for(run.exit, 10, "exit.json once there is room")["code"] == 0
    assert run.state() == "exited"


def test_a_line_the_full_disk_cut_short_is_taken_back_whole(small_disk: Path) -> None:
    events = small_disk / "events.jsonl"
    append_jsonl(events, {"type": "first"})
    fill(small_disk)
    room = 4096 - events.stat().st_size  # what is left of the file's last page
    with pytest.raises(OSError) as refused:
        append_jsonl(events, {"type": "long", "text": "x" * (room + 100)})
    assert diskspace.is_full(refused.value)
    assert events.read_text() == '{"type":"first"}\n'  # no half line for the next one to be glued onto


def test_a_supervisor_given_a_corrupt_spec_records_why_as_the_runs_exit(workdir: Path) -> None:
    store = RunStore(workdir)
    run = store.create(RunSpec(kind="command", argv=["true"]))
    run.file(SPEC).write_text("[" * 100_000)
    runctl.start_supervisor(run)
    ended_with = wait_for(run.exit, 10, "exit.json")
    assert ended_with["error"].startswith(f"run {run.id} is corrupt: spec.json")
    assert run.file("supervisor.log").read_text() == ""  # said in the run's exit, not as a traceback


# --- item 7: the grace period is the run's, newcomers included ------------------------------------


CLEANUP_ON_TERM = """
import pathlib, signal, subprocess, sys, time
out = pathlib.Path(sys.argv[1])
cleanup = (
    "import pathlib, signal, sys, time\\n"
    "out = pathlib.Path(sys.argv[1])\\n"
    "signal.signal(signal.SIGTERM, lambda *_: (out.joinpath('cleanup-got-term').touch(), sys.exit(1)))\\n"
    "time.sleep(float(sys.argv[2]))\\n"
    "out.joinpath('cleanup-done').touch()\\n"
)
def on_term(*_):
    subprocess.Popen([sys.executable, "-c", cleanup, str(out), sys.argv[2]])
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("up", flush=True)
time.sleep(300)
"""


def test_a_cleanup_started_by_the_term_handler_gets_its_grace(workdir: Path, tmp_path: Path) -> None:
    run = launch(RunStore(workdir), [*python(CLEANUP_ON_TERM), str(tmp_path), "1.5"])
    wait_for(lambda: run.file("output.log").read_text() == "up\n", 10, "the child up")
    report = runctl.kill(run, "TERM", 10)
    assert (tmp_path / "cleanup-done").exists(), "kill returned before the cleanup was done"
    assert not (tmp_path / "cleanup-got-term").exists(), "the cleanup was signalled during the grace"
    assert not report["escalated"]


def test_what_outlives_the_grace_is_killed(workdir: Path, tmp_path: Path) -> None:
    run = launch(RunStore(workdir), [*python(CLEANUP_ON_TERM), str(tmp_path), "300"])
    wait_for(lambda: run.file("output.log").read_text() == "up\n", 10, "the child up")
    report = runctl.kill(run, "TERM", 1)
    assert report["escalated"]
    assert not (tmp_path / "cleanup-got-term").exists()
    assert not run.processes()
    cleanup = [p for p in report["processes"] if p["signals"] == ["KILL"]]
    assert len(cleanup) == 1 and cleanup[0]["died"]


# --- item 8: what our own kill leaves is `killed` -------------------------------------------------


def running_with_supervisor(workdir: Path) -> tuple[RunDir, procinfo.ProcIdentity]:
    run = launch(RunStore(workdir), python("import time; time.sleep(60)"))
    wait_for(lambda: run.state() == "running", 10, "running")
    supervisor = run.supervisor()
    assert supervisor is not None
    return run, supervisor


def test_kill_with_a_stopped_supervisor_reports_killed(workdir: Path) -> None:
    run, supervisor = running_with_supervisor(workdir)
    os.kill(supervisor.pid, signal.SIGSTOP)
    try:
        report = runctl.kill(run, "TERM", 5)
        assert report["state"] == "killed" and run.state() == "killed"
    finally:
        os.kill(supervisor.pid, signal.SIGCONT)
    wait_for(lambda: run.exit() is not None, 10, "exit.json once the supervisor runs again")
    assert run.state() == "killed"


def test_kill_of_a_run_whose_supervisor_is_gone_reports_killed(workdir: Path) -> None:
    run, supervisor = running_with_supervisor(workdir)
    os.kill(supervisor.pid, signal.SIGKILL)
    wait_for(lambda: not procinfo.is_alive(supervisor), 5, "the supervisor gone")
    report = runctl.kill(run, "TERM", 5)
    assert report["state"] == "killed" and run.state() == "killed"
    assert run.info()["state"] == "killed"


def test_a_supervisor_whose_run_folder_is_removed_exits_instead_of_retrying_forever(workdir: Path) -> None:
    """Records the disk refused are tried again until there is room; a run folder removed while its run goes
    on (an `rm -rf` of the work directory) will never have room, and nobody is left to read it."""
    store = RunStore(workdir)
    run = launch(store, python("import time; time.sleep(1)"))
    wait_for(run.child, 10, "the child recorded")
    supervisor = run.supervisor()
    assert supervisor is not None
    remove_live_folder(run.path)
    wait_for(lambda: not procinfo.is_alive(supervisor), 20, "the supervisor to exit once its child has")
