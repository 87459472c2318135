"""Process facts read from /proc, and the one safe way to signal a process.

Every signal this project sends goes through `signal_if_ours`, which checks the
recorded start time (pid reuse), the owner, pid 1 and our own process chain.
Linux only: GPU hosts run Linux, and /proc needs no third-party package.
"""

from __future__ import annotations

import functools
import os
import pwd
import signal
import sys
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass
from pathlib import Path

PROC = Path("/proc")

# A further fact a process must show right before it is signalled: why it may not be (None: it may).
Proof = Callable[[int], "str | None"]


@dataclass(frozen=True)
class ProcIdentity:
    """A pid plus what makes it unique across pid reuse and reboots."""

    pid: int
    start_ticks: int
    boot_id: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @staticmethod
    def from_json(data: object) -> ProcIdentity | None:
        if not isinstance(data, dict):
            return None
        try:
            return ProcIdentity(int(data["pid"]), int(data["start_ticks"]), str(data["boot_id"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    pgid: int
    sid: int  # the session: the pid of the process that created it with setsid()
    state: str
    start_ticks: int
    cpu_ticks: int  # user + system time so far, in clock ticks


@functools.cache
def boot_id() -> str:
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def read_stat(pid: int) -> ProcStat | None:
    """Parse /proc/PID/stat; None when the process is gone or unreadable."""
    try:
        raw = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or ')'.
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return ProcStat(
            pid=pid,
            state=rest[0].decode(),
            ppid=int(rest[1]),
            pgid=int(rest[2]),
            sid=int(rest[3]),
            start_ticks=int(rest[19]),
            cpu_ticks=int(rest[11]) + int(rest[12]),
        )
    except (IndexError, ValueError):
        return None


def identify(pid: int, include_zombie: bool = False) -> ProcIdentity | None:
    """The identity of a live process; a zombie counts only when asked for
    (a parent recording its own child, which may already have exited)."""
    stat = read_stat(pid)
    if stat is None or (stat.state == "Z" and not include_zombie):
        return None
    return ProcIdentity(pid, stat.start_ticks, boot_id())


def is_alive(ident: ProcIdentity) -> bool:
    """True when `ident` still names the same running (non-zombie) process."""
    current = identify(ident.pid)
    return current is not None and current == ident


def proc_uid(pid: int) -> int | None:
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def user_name(uid: int | None) -> str | None:
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir(PROC) if name.isdigit()]


def ancestors(pid: int) -> list[int]:
    """pid's parent chain, nearest first, excluding pid itself."""
    chain: list[int] = []
    stat = read_stat(pid)
    while stat is not None and stat.ppid > 0 and stat.ppid not in chain:
        chain.append(stat.ppid)
        stat = read_stat(stat.ppid)
    return chain


def protected_pids() -> set[int]:
    """Processes that must never be signalled: pid 1, us, and everyone above us
    (the agent, the SSH session or the local console that started it)."""
    me = os.getpid()
    return {1, me, *ancestors(me)}


def refusal(ident: ProcIdentity) -> str | None:
    """Why `ident` must not be signalled by us, or None when it may."""
    if ident.pid in protected_pids():
        return "protected (pid 1, the agent or the console)"
    if not is_alive(ident):
        return "gone or pid reused (start time no longer matches)"
    uid = proc_uid(ident.pid)
    if uid is None:
        return "gone"
    if uid != os.geteuid():
        return f"belongs to user {user_name(uid)}"
    return None


def signal_if_ours(ident: ProcIdentity, sig: signal.Signals, proof: Proof | None = None) -> str | None:
    """Send `sig` to the process when it is still ours; return why not otherwise.

    The pid is pinned with a pidfd and the identity checked again through it, so
    a pid recycled between the check and the signal cannot be hit. `proof(pid)`,
    when given, must pass too, after the identity check: free-gpus proves there
    that the process still holds its GPU.
    """
    reason = refusal(ident)
    if reason is not None:
        return reason
    try:
        pidfd = os.pidfd_open(ident.pid)
    except ProcessLookupError:
        return "gone"
    except OSError:
        pidfd = -1  # kernels before 5.3: fall back to kill(2) right after the check
    try:
        if pidfd >= 0 and not is_alive(ident):
            return "gone or pid reused (start time no longer matches)"
        reason = None if proof is None else proof(ident.pid)
        if reason is not None:
            return reason
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(ident.pid, sig)
    except ProcessLookupError:
        return "gone"
    except PermissionError as exc:
        return f"not permitted: {exc.strerror}"
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return None


def mapped_files(pid: int) -> set[str] | None:
    """The files mapped into pid's memory (paths from /proc/PID/maps); None when the process is gone or its
    memory map is not ours to read (another user's process)."""
    try:
        lines = (PROC / str(pid) / "maps").read_text(errors="replace").splitlines()
    except OSError:
        return None
    # address perms offset dev inode [path]; the path may hold spaces, and [heap]-like names are no files.
    paths = (parts[5] for parts in (line.split(maxsplit=5) for line in lines) if len(parts) == 6)
    return {path for path in paths if path.startswith("/")}


def live_stats() -> list[ProcStat]:
    """One pass over /proc: every live (non-zombie) process."""
    stats = (read_stat(pid) for pid in all_pids())
    return [stat for stat in stats if stat is not None and stat.state != "Z"]


def _environ(pid: int) -> list[bytes]:
    """The environment pid started with, as NAME=value entries ([] when it cannot be read)."""
    try:
        return (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


def carries_marker(pid: int, marker: bytes) -> bool:
    """True when the environment pid started with holds `marker` (b"NAME=value") as a whole entry."""
    return marker in _environ(pid)


def environ_value(pid: int, name: str) -> str | None:
    """The value of `name` in the environment pid started with, or None."""
    prefix = name.encode() + b"="
    found = next((entry[len(prefix) :] for entry in _environ(pid) if entry.startswith(prefix)), None)
    return None if found is None else found.decode(errors="replace")


def restart_without(names: Collection[str]) -> None:
    """Run this program again (same pid, command line and descriptors) without the environment variables
    `names` when it has any. Removing them from os.environ is not enough: /proc/PID/environ shows the
    environment a process started with, and that is what `run_processes` reads."""
    if any(name in os.environ for name in names):
        env = {key: value for key, value in os.environ.items() if key not in names}
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def proc_owner(pid: int) -> int | None:
    try:
        return (PROC / str(pid)).stat().st_uid
    except OSError:
        return None


def unproven_writers(log: Path, proven: Collection[int], child: ProcIdentity | None) -> list[int]:
    """Processes of ours born since the run's `child`, not among `proven`, whose stdout or stderr is the run's
    `log`: a process of the run that left its session and cleared its environment still writes where it was
    started. Told to the user, never signalled: anyone may point a process's output at a file."""
    try:
        target = log.stat()
    except OSError:
        return []
    floor = child.start_ticks if child is not None else 0
    found: list[int] = []
    for stat in live_stats():
        if stat.pid in proven or stat.start_ticks < floor or proc_owner(stat.pid) != os.geteuid():
            continue
        for fd in (1, 2):
            try:
                st = os.stat(PROC / str(stat.pid) / "fd" / str(fd))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                found.append(stat.pid)
                break
    return found


def holds_its_pid(ident: ProcIdentity) -> bool:
    """True while `ident`'s pid is still its own: the process lives, or is a zombie not yet reaped."""
    stat = read_stat(ident.pid)
    return ident.boot_id == boot_id() and stat is not None and stat.start_ticks == ident.start_ticks


def run_processes(
    marker: bytes,
    child: ProcIdentity | None,
    stats: list[ProcStat] | None = None,
    *,
    child_reaped: bool = False,
    session: int | None = None,
) -> dict[int, ProcIdentity]:
    """A run's live processes, each proven to be the run's: never inferred from a pid, group or session number.

    Proof is one of:
    - the recorded child itself (pid, start time and boot id all match), until its supervisor has reaped it
      (a pid reused within the same clock tick matches all three);
    - a process of ours in the child's `session` (recorded at spawn: the child leads it), while the child's
      pid is still the child's (alive, or a zombie its supervisor has not reaped). Linux frees a pid only
      once no process has it as its pid, group or session, and only the process of that pid can create a
      session of that number: while the child holds its pid, a session of that number is the child's. Nothing
      inside can erase that: setproctitle clears /proc/PID/environ, a dead launcher's children are re-parented,
      neither changes a session. The supervisor reaps the child only once its session is empty, for this;
    - a process of ours whose environment carries the run's `marker` (the supervisor sets it for the child
      alone, its children inherit it): what proves a process that left the session (setsid, a daemon);
    - a live child, or a member of the live process group, of a process already proven.
    A process that left the session and cleared its environment, once its parent is gone, proves nothing and
    is left alone. (A subreaper supervisor would adopt it, but also adopt the supervisor of a run started from
    inside this one: that run is its own.) A child recorded on another boot (a store shared over NFS) proves
    nothing, and neither does a pid, group or session that merely has its number: all three recycle.
    """
    if child is not None and child.boot_id != boot_id():
        return {}
    stats = live_stats() if stats is None else stats  # one scan of /proc for every lookup below
    by_pid = {stat.pid: stat for stat in stats}
    me = os.geteuid()
    proven: set[int] = set()
    if (
        child is not None
        and not child_reaped
        and (stat := by_pid.get(child.pid)) is not None
        and stat.start_ticks == child.start_ticks
    ):
        proven.add(child.pid)
    own_session = session if child is not None and session == child.pid and holds_its_pid(child) else None
    floor = child.start_ticks if child is not None else 0  # nothing of the run is older than its child
    for stat in stats:
        # Cheap tests first: the environment is read only for processes of ours born since the child.
        if stat.pid in proven or stat.start_ticks < floor or proc_owner(stat.pid) != me:
            continue
        if stat.sid == own_session or carries_marker(stat.pid, marker):
            proven.add(stat.pid)
    # A live parent link, or the group of a live leader, is a current fact: it extends the proof.
    children: dict[int, list[int]] = {}
    members: dict[int, list[int]] = {}
    for stat in stats:
        children.setdefault(stat.ppid, []).append(stat.pid)
        members.setdefault(stat.pgid, []).append(stat.pid)
    stack = list(proven)
    while stack:
        pid = stack.pop()
        for found in (*children.get(pid, ()), *(members.get(pid, ()) if by_pid[pid].pgid == pid else ())):
            if found not in proven:
                proven.add(found)
                stack.append(found)
    protected = protected_pids()
    return {
        pid: ProcIdentity(pid, by_pid[pid].start_ticks, boot_id())
        for pid in proven
        if pid not in protected and by_pid[pid].start_ticks >= floor
    }
