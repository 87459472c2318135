"""What benchmarks/mutation.sh found no test of in host/procinfo.py: which processes `kill` proves to be a run's,
what it tells of the ones it will not touch, and the facts it reads from /proc. Real processes and real /proc
throughout; the nobody process is started with setpriv (the suite runs as root in CI)."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.host import procinfo
from tests.conftest import REPO
from tests.test_procinfo import identity, wait_for

Start = Callable[..., "subprocess.Popen[bytes]"]
MARKER = b"EAGLE3_RUN_ID=mutation-run"
SLEEP = [sys.executable, "-c", "import sys, time; print('ready', flush=True); time.sleep(60)"]


@pytest.fixture
def start() -> Iterator[Start]:
    """Processes (and the groups they lead) that are SIGKILLed when the test ends."""
    procs: list[subprocess.Popen[bytes]] = []
    extra: list[int] = []

    def _start(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = subprocess.Popen(argv, **kwargs)
        procs.append(proc)
        return proc

    _start.extra = extra  # type: ignore[attr-defined]  # pids a test learnt of (grandchildren) to kill too
    yield _start
    for pid in extra:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stdin):
            if stream is not None:
                stream.close()


def ready(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def as_nobody(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        pytest.skip("another user's process needs root to start")
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", *argv]


# --- what kill tells of a process it will not signal ------------------------------------------------------


def test_a_process_of_another_user_is_refused_by_that_users_name(start: Start) -> None:
    other = ready(start(as_nobody(SLEEP), stdout=subprocess.PIPE))
    assert procinfo.refusal(identity(other.pid)) == "belongs to user nobody"
    assert procinfo.signal_if_ours(identity(other.pid), signal.SIGTERM) == "belongs to user nobody"
    assert other.poll() is None


def test_a_user_without_a_name_is_told_by_number() -> None:
    unnamed = next(uid for uid in range(54321, 60000) if not _has_name(uid))
    assert procinfo.user_name(unnamed) == str(unnamed)
    assert procinfo.user_name(0) == "root"
    assert procinfo.user_name(None) is None


def _has_name(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


# --- facts read from /proc -----------------------------------------------------------------------------


def test_environ_value_reads_one_variable_whole_and_a_value_that_is_no_utf8(start: Start) -> None:
    env = {**os.environ, "EAGLE3_MUT": "abc", "EAGLE3_MUT_LONGER": "no", "RANK": "3"}
    env_bytes = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    env_bytes[b"EAGLE3_BYTES"] = b"\xffx"
    proc = ready(start(SLEEP, stdout=subprocess.PIPE, env=env_bytes))
    assert procinfo.environ_value(proc.pid, "EAGLE3_MUT") == "abc"
    assert procinfo.environ_value(proc.pid, "RANK") == "3"
    assert procinfo.environ_value(proc.pid, "EAGLE3_BYTES") == "\ufffdx"
    assert procinfo.environ_value(proc.pid, "EAGLE3_ABSENT") is None


def test_a_mapped_file_whose_name_is_no_utf8_is_listed_not_an_error(start: Start, tmp_path: Path) -> None:
    odd = os.path.join(os.fsencode(os.path.realpath(tmp_path)), b"weights-\xff.bin")
    with open(odd, "wb") as out:
        out.write(b"\0" * 4096)
    mapper = textwrap.dedent(
        """
        import mmap, sys, time
        with open(sys.argv[1].encode("utf-8", "surrogateescape"), "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    proc = ready(start([sys.executable, "-c", mapper, os.fsdecode(odd)], stdout=subprocess.PIPE))
    files = procinfo.mapped_files(proc.pid)
    assert files is not None
    assert os.fsdecode(odd).encode("utf-8", "surrogateescape").decode(errors="replace") in files


BURN = textwrap.dedent(
    """
    import os, sys
    # CPU in the kernel (stat calls) and more in user space: both count as the process's CPU.
    while os.times().system < 0.05:
        os.stat(sys.executable)
    while os.times().user < os.times().system + 0.1:
        sum(range(10000))
    t = os.times()
    print(round((t.user + t.system) * os.sysconf("SC_CLK_TCK")), flush=True)
    sys.stdin.read()
    """
)


def test_cpu_ticks_are_user_and_system_time_both(start: Start) -> None:
    """What the watch tells a spinning run from a sleeping one by."""
    proc = start([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    spent = int(proc.stdout.readline())
    stat = procinfo.read_stat(proc.pid)
    assert stat is not None
    assert stat.cpu_ticks >= spent > 0


# --- a program restarted without the variables it must not carry -------------------------------------------


RESTARTED = textwrap.dedent(
    """
    import os, sys
    from backends.host import procinfo
    print(os.getpid(), sys.argv[1:], flush=True)
    procinfo.restart_without(["EAGLE3_DROP_ME"])
    started_with = open("/proc/self/environ", "rb").read().split(b"\\0")
    print(os.getpid(), sys.argv[1:], b"EAGLE3_DROP_ME=x" in started_with, b"EAGLE3_KEEP_ME=y" in started_with)
    """
)


def test_restart_without_runs_the_same_program_in_the_same_process_without_the_variables() -> None:
    env = {**os.environ, "EAGLE3_DROP_ME": "x", "EAGLE3_KEEP_ME": "y"}
    done = subprocess.run(
        [sys.executable, "-c", RESTARTED, "one", "two"], cwd=REPO, env=env, capture_output=True, timeout=30, check=True
    )
    first, second, third = done.stdout.decode().splitlines()
    pid = first.split()[0]
    assert first == f"{pid} ['one', 'two']"
    assert second == f"{pid} ['one', 'two']"  # before the restart, printed again by the restarted program
    assert third == f"{pid} ['one', 'two'] False True"


# --- a run's processes ------------------------------------------------------------------------------------


def test_a_process_of_another_user_carrying_the_runs_marker_is_not_the_runs(start: Start) -> None:
    env = {**os.environ, MARKER.split(b"=")[0].decode(): MARKER.split(b"=")[1].decode()}
    child = ready(start(SLEEP, stdout=subprocess.PIPE, env=env))
    other = ready(start(as_nobody(SLEEP), stdout=subprocess.PIPE, env=env))
    found = procinfo.run_processes(MARKER, identity(child.pid))
    assert child.pid in found and other.pid not in found


def test_a_process_older_than_the_runs_child_is_not_the_runs_whatever_it_carries(start: Start) -> None:
    env = {**os.environ, "EAGLE3_RUN_ID": "mutation-run"}
    older = ready(start(SLEEP, stdout=subprocess.PIPE, env=env))
    child = ready(start(SLEEP, stdout=subprocess.PIPE, env=env))
    if identity(older.pid).start_ticks == identity(child.pid).start_ticks:
        pytest.skip("the older process and the child were born in one clock tick")
    found = procinfo.run_processes(MARKER, identity(child.pid))
    assert child.pid in found and older.pid not in found


LEADER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    # A child that cleared its environment and left for a group of its own: the run's only by its parent.
    own_group = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={}, preexec_fn=os.setpgrp)
    # A grandchild that cleared its environment and whose parent exited: the run's only by the leader's group.
    middle = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env={});"
         " print(p.pid, flush=True)"],
        stdout=subprocess.PIPE,
    )
    orphan = int(middle.stdout.readline())
    middle.wait()
    print(own_group.pid, orphan, flush=True)
    time.sleep(60)
    """
)


def test_a_runs_processes_are_proven_through_their_parent_and_their_leaders_group(start: Start) -> None:
    env = {**os.environ, "EAGLE3_RUN_ID": "mutation-run"}
    leader = start([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, env=env, start_new_session=True)
    assert leader.stdout is not None
    own_group, orphan = (int(pid) for pid in leader.stdout.readline().split())
    start.extra += [own_group, orphan]  # type: ignore[attr-defined]
    assert not procinfo.carries_marker(own_group, MARKER) and not procinfo.carries_marker(orphan, MARKER)
    found = procinfo.run_processes(MARKER, identity(leader.pid))
    assert {leader.pid, own_group, orphan} <= set(found)
    # Each as the process it is now, so that a kill through it reaches it.
    assert all(found[pid] == identity(pid) for pid in (leader.pid, own_group, orphan))


# --- what writes to a run's log without being provably the run's -----------------------------------------


def test_unproven_writers_are_our_younger_processes_writing_to_the_log(start: Start, tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.touch()
    elsewhere = tmp_path / "other.log"
    with log.open("ab") as out, elsewhere.open("ab") as other_out:
        older = ready(start(SLEEP, stdout=subprocess.PIPE, stderr=out))
        child = ready(start(SLEEP, stdout=subprocess.PIPE, stderr=out))
        by_stdout = start([sys.executable, "-c", "import time; time.sleep(60)"], stdout=out)
        by_stderr = ready(start(SLEEP, stdout=subprocess.PIPE, stderr=out, env={}))
        closed_stdout = start(
            [sys.executable, "-c", "import os, time; os.close(1); time.sleep(60)"], stdout=subprocess.PIPE, stderr=out
        )
        proven = ready(start(SLEEP, stdout=subprocess.PIPE, stderr=out))
        not_the_log = ready(start(SLEEP, stdout=subprocess.PIPE, stderr=other_out))
        # another user's process writing there (when this test can start one)
        others = [ready(start(as_nobody(SLEEP), stdout=subprocess.PIPE, stderr=out))] if os.geteuid() == 0 else []
    assert wait_for(lambda: not (Path("/proc") / str(closed_stdout.pid) / "fd" / "1").exists())
    assert wait_for(lambda: (Path("/proc") / str(by_stdout.pid) / "fd" / "1").exists())
    child_ident = identity(child.pid)
    if identity(older.pid).start_ticks == child_ident.start_ticks:
        pytest.skip("the older process and the child were born in one clock tick")
    found = procinfo.unproven_writers(log, [proven.pid], child_ident)
    assert isinstance(found, list)
    writers = {child.pid, by_stdout.pid, by_stderr.pid, closed_stdout.pid}
    assert writers <= set(found)  # the child too: born in its own tick, not before it
    assert not {older.pid, proven.pid, not_the_log.pid, *(p.pid for p in others)} & set(found)
    # Without a child (never started), every process of ours writing there.
    assert {older.pid, *writers} <= set(procinfo.unproven_writers(log, [proven.pid], None))
    assert procinfo.unproven_writers(tmp_path / "missing.log", [], child_ident) == []


def test_kill_says_why_it_leaves_a_process_alone_in_its_own_words(start: Start) -> None:
    """The words `kill` and free-gpus print beside a process they did not signal."""
    assert procinfo.refusal(identity(os.getpid())) == "protected (pid 1, the agent or the console)"
    proc = ready(start(SLEEP, stdout=subprocess.PIPE))
    stale = identity(proc.pid)
    proc.kill()
    proc.wait(timeout=10)
    reason = "gone or pid reused (start time no longer matches)"
    assert procinfo.refusal(stale) == reason
    assert procinfo.signal_if_ours(stale, signal.SIGTERM) == reason
