"""/proc parsing and the one safe way to signal: these decide whether `kill` hits
the right process, so they are tested against real processes."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.host import procinfo
from backends.host.procinfo import ProcIdentity

Spawn = Callable[..., "subprocess.Popen[bytes]"]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start processes that are always killed (with their whole group, if they lead one) at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def _spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = subprocess.Popen(argv, **kwargs)
        procs.append(proc)
        return proc

    yield _spawn
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(proc.pid) == proc.pid:
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def identity(pid: int) -> ProcIdentity:
    ident = procinfo.identify(pid)
    assert ident is not None, f"process {pid} should be alive"
    return ident


# --- read_stat ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["we ird) name", "x) Z 1 2 3"])
def test_read_stat_parses_a_name_with_spaces_and_parens(tmp_path: Path, spawn: Spawn, name: str) -> None:
    exe = tmp_path / name
    shutil.copy("/bin/sleep", exe)
    proc = spawn([str(exe), "30"])
    raw = (Path("/proc") / str(proc.pid) / "stat").read_bytes()
    assert f"({name})".encode() in raw, "the test must exercise a command name with ') '"
    stat = procinfo.read_stat(proc.pid)
    assert stat is not None
    assert stat.pid == proc.pid
    # A parser that split at the first ')' would read "Z", 1, 2 here.
    assert stat.state in ("S", "R")
    assert stat.ppid == os.getpid()
    assert stat.pgid == os.getpgrp()
    assert stat.start_ticks > 0
    assert stat.start_ticks >= identity(os.getpid()).start_ticks


def test_read_stat_of_a_missing_process_is_none() -> None:
    assert procinfo.read_stat(2**22 + 12345) is None  # above the kernel's pid_max
    assert procinfo.identify(2**22 + 12345) is None


def test_read_stat_of_ourselves() -> None:
    stat = procinfo.read_stat(os.getpid())
    assert stat is not None
    assert (stat.ppid, stat.pgid, stat.state) == (os.getppid(), os.getpgrp(), "R")


# --- identity, zombies, pid reuse ---------------------------------------------------------------


def test_identify_a_zombie_is_none(spawn: Spawn) -> None:
    proc = spawn(["sleep", "0.2"])
    ident = identity(proc.pid)
    assert procinfo.is_alive(ident)
    # Do not wait(): the exited child stays a zombie until we reap it.
    assert wait_for(lambda: (s := procinfo.read_stat(proc.pid)) is not None and s.state == "Z")
    assert procinfo.identify(proc.pid) is None
    assert not procinfo.is_alive(ident)
    assert proc.pid not in {stat.pid for stat in procinfo.live_stats()}
    assert proc.wait(timeout=5) == 0
    assert procinfo.read_stat(proc.pid) is None


def test_is_alive_needs_the_same_start_time_and_boot(spawn: Spawn) -> None:
    proc = spawn(["sleep", "30"])
    ident = identity(proc.pid)
    assert ident.boot_id == procinfo.boot_id() != "unknown"
    assert procinfo.is_alive(ident)
    assert not procinfo.is_alive(dataclasses.replace(ident, start_ticks=ident.start_ticks + 1))
    assert not procinfo.is_alive(dataclasses.replace(ident, start_ticks=ident.start_ticks - 1))
    assert not procinfo.is_alive(dataclasses.replace(ident, boot_id="00000000-0000-0000-0000-000000000000"))


def test_identity_json_round_trip_and_garbage(spawn: Spawn) -> None:
    proc = spawn(["sleep", "30"])
    ident = identity(proc.pid)
    assert ProcIdentity.from_json(ident.to_json()) == ident
    garbage: list[object] = [None, [], "x", {}, {"pid": 1}, {"pid": "abc", "start_ticks": 1, "boot_id": "b"}]
    for bad in garbage:
        assert ProcIdentity.from_json(bad) is None


def test_a_killed_process_is_not_alive(spawn: Spawn) -> None:
    proc = spawn(["sleep", "30"])
    ident = identity(proc.pid)
    proc.kill()
    proc.wait(timeout=5)
    assert not procinfo.is_alive(ident)
    assert procinfo.refusal(ident) is not None


# --- protection and refusal ---------------------------------------------------------------------


def test_protected_pids() -> None:
    protected = procinfo.protected_pids()
    assert {1, os.getpid(), os.getppid()} <= protected
    assert set(procinfo.ancestors(os.getpid())) <= protected


def test_ancestors_of_a_child_start_with_us(spawn: Spawn) -> None:
    proc = spawn(["sleep", "30"])
    chain = procinfo.ancestors(proc.pid)
    assert chain[:2] == [os.getpid(), os.getppid()]
    assert proc.pid not in chain


def test_refusal_for_pid_1() -> None:
    init = identity(1)
    reason = procinfo.refusal(init)
    assert reason is not None and "protected" in reason


def test_refusal_for_ourselves_and_our_parent() -> None:
    for pid in (os.getpid(), os.getppid()):
        reason = procinfo.refusal(identity(pid))
        assert reason is not None and "protected" in reason


def test_refusal_for_a_wrong_start_time(spawn: Spawn) -> None:
    proc = spawn(["sleep", "30"])
    ident = identity(proc.pid)
    assert procinfo.refusal(ident) is None
    reason = procinfo.refusal(dataclasses.replace(ident, start_ticks=ident.start_ticks + 7))
    assert reason is not None and "start time" in reason


def test_signal_if_ours_never_signals_protected_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[int, int]] = []
    # Record instead of signalling: if the guard were broken, a real signal would hit pid 1 or pytest.
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    for pid in (1, os.getpid(), os.getppid()):
        reason = procinfo.signal_if_ours(identity(pid), signal.SIGKILL)
        assert reason is not None and "protected" in reason
    assert sent == []


def test_signal_if_ours_delivers_sigterm_to_our_child(spawn: Spawn) -> None:
    proc = spawn(["sleep", "30"])
    ident = identity(proc.pid)
    assert procinfo.signal_if_ours(ident, signal.SIGTERM) is None
    assert proc.wait(timeout=5) == -signal.SIGTERM
    assert not procinfo.is_alive(ident)
    # A second attempt is refused, not sent to whoever gets the pid next.
    assert procinfo.signal_if_ours(ident, signal.SIGTERM) is not None


def test_signal_if_ours_refuses_a_mismatched_identity(spawn: Spawn) -> None:
    proc = spawn(["sleep", "30"])
    ident = identity(proc.pid)
    stale = dataclasses.replace(ident, start_ticks=ident.start_ticks - 1)
    reason = procinfo.signal_if_ours(stale, signal.SIGTERM)
    assert reason is not None and "start time" in reason
    time.sleep(0.1)
    assert proc.poll() is None, "the process behind a reused pid must keep living"
    assert procinfo.is_alive(ident)


def test_signal_if_ours_sends_nothing_when_the_proof_fails_and_says_why(spawn: Spawn) -> None:
    proc = spawn(["sleep", "30"])
    asked: list[int] = []

    def proof(pid: int) -> str | None:
        asked.append(pid)
        return "not the one meant"

    assert procinfo.signal_if_ours(identity(proc.pid), signal.SIGTERM, proof) == "not the one meant"
    assert asked == [proc.pid]
    assert proc.poll() is None, "a process that failed the proof must keep living"
    assert procinfo.signal_if_ours(identity(proc.pid), signal.SIGTERM, lambda pid: None) is None
    assert proc.wait(timeout=5) == -signal.SIGTERM


# --- mapped files ---------------------------------------------------------------------------------


MAPS = (
    "import mmap, sys, time\n"
    "with open(sys.argv[1], 'rb') as mapped:\n"
    "    memory = mmap.mmap(mapped.fileno(), 0, access=mmap.ACCESS_READ)\n"
    "only_open = open(sys.argv[2], 'rb')\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)


def test_mapped_files_are_those_in_a_processs_memory_not_those_it_has_open(tmp_path: Path, spawn: Spawn) -> None:
    mapped, only_open = tmp_path / "mapped file", tmp_path / "open"  # a path with a space, as maps prints it
    for path in (mapped, only_open):
        path.write_bytes(bytes(4096))
    proc = spawn([sys.executable, "-c", MAPS, str(mapped), str(only_open)], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    files = procinfo.mapped_files(proc.pid)
    assert files is not None
    assert str(mapped.resolve()) in files and str(only_open.resolve()) not in files
    assert sys.executable in files or os.path.realpath(sys.executable) in files  # the interpreter is mapped too
    proc.kill()
    proc.wait(timeout=5)
    assert procinfo.mapped_files(proc.pid) is None  # gone


# --- process trees and groups -------------------------------------------------------------------


def _shell_with_grandchild(spawn: Spawn) -> tuple[subprocess.Popen[bytes], int]:
    proc = spawn(["sh", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    return proc, grandchild


MARKER = b"EAGLE3_RUN_ID=test-run"


def test_run_processes_are_the_child_its_descendants_and_its_group(spawn: Spawn) -> None:
    proc, grandchild = _shell_with_grandchild(spawn)
    assert wait_for(lambda: (s := procinfo.read_stat(grandchild)) is not None and s.ppid == proc.pid)
    stranger = spawn(["sleep", "30"])  # ours, younger than the child, but not of the run
    found = procinfo.run_processes(MARKER, identity(proc.pid))
    assert sorted(found) == sorted([proc.pid, grandchild])
    assert stranger.pid not in found and os.getpid() not in found


def test_run_processes_of_a_dead_child_are_those_that_carry_its_marker(spawn: Spawn) -> None:
    env = {**os.environ, "EAGLE3_RUN_ID": "test-run"}
    # The child leaves an orphan (in its group) and exits: only the marker ties the orphan to the run.
    proc = spawn(
        ["sh", "-c", "sleep 30 & echo $!; read _"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdin is not None
    orphan = int(proc.stdout.readline())
    child = identity(proc.pid)
    proc.stdin.close()
    proc.wait(timeout=5)
    unmarked = spawn(["sleep", "30"], start_new_session=True)
    try:
        assert sorted(procinfo.run_processes(MARKER, child)) == [orphan]
        assert procinfo.run_processes(b"EAGLE3_RUN_ID=test-run-2", child) == {}
        assert unmarked.pid not in procinfo.run_processes(MARKER, None)
    finally:
        os.kill(orphan, signal.SIGKILL)


def test_run_processes_of_a_child_recorded_on_another_boot_are_none(spawn: Spawn) -> None:
    proc = spawn(["sleep", "30"], env={**os.environ, "EAGLE3_RUN_ID": "test-run"})
    elsewhere = dataclasses.replace(identity(proc.pid), boot_id="another-boot")
    assert procinfo.run_processes(MARKER, elsewhere) == {}
    assert proc.pid in procinfo.run_processes(MARKER, identity(proc.pid))


def test_read_stat_reads_the_session(spawn: Spawn) -> None:
    ours = procinfo.read_stat(os.getpid())
    assert ours is not None and ours.sid == os.getsid(0)
    leader = spawn(["sleep", "30"], start_new_session=True)
    stat = procinfo.read_stat(leader.pid)
    assert stat is not None and stat.sid == stat.pgid == leader.pid != ours.sid


# The leader leaves a member in its session, renamed (no marker: its environment is cleared), and exits.
RENAMED_MEMBER = (
    "import subprocess, sys\n"
    'code = \'import setproctitle, time; setproctitle.setproctitle("sglang::scheduler"); print(flush=True); '
    "time.sleep(30)'\n"
    "member = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE)\n"
    "member.stdout.readline()\n"
    "print(member.pid, flush=True)\n"
)


def test_run_processes_of_a_session_are_proven_while_its_leaders_pid_is_held(spawn: Spawn) -> None:
    env = {**os.environ, "EAGLE3_RUN_ID": "test-run"}
    leader = spawn([sys.executable, "-c", RENAMED_MEMBER], stdout=subprocess.PIPE, start_new_session=True, env=env)
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    # The leader exits once it has printed: as a supervisor records its child, a zombie's identity counts.
    child = procinfo.identify(leader.pid, include_zombie=True)
    assert child is not None
    try:
        assert not procinfo.carries_marker(member, MARKER)
        # The leader has exited and is not reaped: a zombie holds its pid, and the session's number with it.
        assert wait_for(lambda: (s := procinfo.read_stat(leader.pid)) is not None and s.state == "Z")
        assert sorted(procinfo.run_processes(MARKER, child, child_reaped=True, session=leader.pid)) == [member]
        assert procinfo.run_processes(MARKER, child, child_reaped=True) == {}  # no session recorded
        assert procinfo.run_processes(MARKER, child, child_reaped=True, session=member) == {}  # not the child's
        stranger = dataclasses.replace(child, start_ticks=child.start_ticks - 1)  # another process of that pid
        assert procinfo.run_processes(MARKER, stranger, child_reaped=True, session=leader.pid) == {}
        leader.wait(timeout=5)
        # Reaped: the number is free for a new session of anyone's, and proves nothing any more.
        assert procinfo.run_processes(MARKER, child, child_reaped=True, session=leader.pid) == {}
    finally:
        os.kill(member, signal.SIGKILL)
