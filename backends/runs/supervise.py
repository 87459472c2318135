"""One run's supervisor: `python -m backends.runs.supervise [--detach] RUN_DIR`.

Started by the agent in its own session, it starts the child in a session of the
child's own with stdout and stderr going straight to output.log (a file, so the
child outlives us), records both identities and the child's session in proc.json,
keeps the run's watch (`backends.runs.watch`: phases, health, stalls), waits, and
writes exit.json, with why the run failed when it did (`backends.runs.failure_reason`).
It reaps the child only once nothing is left in its session: until then the child's
zombie keeps the session's number the run's (`procinfo.run_processes`). With --detach
it forks first and returns at once, so the agent never has a zombie to reap.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from backends.fileio import atomic_write_json, open_private
from backends.host import diskspace, procinfo
from backends.host.gpus import GpuSampler
from backends.protocol import CHILD_ONLY_ENV, ENV_METRICS_FILE, ENV_RUN_DIR, ENV_RUN_ID
from backends.runs import failure_reason, watch
from backends.runs.metrics_sources import MetricsFollower
from backends.runs.store import (
    EXIT,
    METRICS,
    OUTPUT,
    PROC,
    SUPERVISOR_LOG,
    RunDir,
    StoreError,
)


def child_env(run: RunDir, env_overrides: dict[str, str], gpus: list[int]) -> dict[str, str]:
    env = dict(os.environ)
    # Python children would otherwise block-buffer into the log and look hung.
    env.setdefault("PYTHONUNBUFFERED", "1")
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    env.update(env_overrides)
    env[ENV_RUN_ID] = run.id
    env[ENV_RUN_DIR] = str(run.path)
    env[ENV_METRICS_FILE] = str(run.file(METRICS))
    return env


RETRY_S = 1.0  # how often a record the full disk refused is tried again
SESSION_POLL_S = 2.0  # how often an ended child's session is looked at until it is empty


class Supervisor:
    """One run's supervisor. Its records (the child's identity, its exit) must outlive a full disk:
    they go through the room reserved at launch (`Reserved`), and whatever still fails is kept in
    memory and tried again until space returns. Everything else it writes is best effort."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.disk_full: str | None = None  # what the first full-disk error said
        self.pending: dict[str, dict[str, object]] = {}  # record name -> what it must say

    def note(self, exc: OSError) -> None:
        said = diskspace.no_space_message(self.run.path) if diskspace.is_full(exc) else str(exc)
        if diskspace.is_full(exc) and self.disk_full is None:
            self.disk_full = said
        with contextlib.suppress(OSError):  # supervisor.log may sit on the full disk too
            print(f"supervise: {said}", file=sys.stderr, flush=True)

    def best_effort(self, write: Callable[[], object]) -> None:
        try:
            write()
        except OSError as exc:
            self.note(exc)

    def event(self, event_type: str, /, **fields: object) -> None:
        self.best_effort(lambda: self.run.append_event(event_type, **fields))

    def record(self, name: str, data: dict[str, object], final: bool = True) -> None:
        """Write a record that must not be lost: at once, else (when `final`: its last version) through
        its reserved room, else (kept in memory) at the next `retry`."""
        try:
            try:
                atomic_write_json(self.run.file(name), data)
            except OSError as exc:
                if not diskspace.is_full(exc) or not final:
                    raise
                self.note(exc)
                self.run.reserved(name).commit(self.run.file(name), data)
        except OSError as exc:
            self.note(exc)
            self.pending[name] = data
            return
        self.pending.pop(name, None)

    def retry(self) -> None:
        for name, data in list(self.pending.items()):
            self.record(name, data)

    def fail(self, message: str) -> int:
        """The child could not be started: record why, as the run's exit."""
        self.record(EXIT, {"code": None, "signal": None, "error": message, "ended_at": time.time()})
        self.event("failed", error=message)
        self.event("state", state="failed")
        self.flush()
        return 1

    def flush(self) -> None:
        """Wait until every pending record is written (the disk has room again); not for a run folder that
        is gone (removed while its run went on), which will never take them and which nobody reads."""
        while self.pending and self.run.path.is_dir():
            time.sleep(RETRY_S)
            self.retry()

    def run_child(self) -> int:
        run = self.run
        me = procinfo.identify(os.getpid())
        proc: dict[str, object] = {"supervisor": me.to_json() if me else None}  # kept whole: the disk may lag
        self.record(PROC, proc, final=False)  # the room is kept for the version that names the child too
        self.event("supervisor_started", pid=os.getpid())
        try:
            spec = run.trusted_spec()
        except StoreError as exc:  # missing, corrupt, or writable by others
            return self.fail(str(exc))
        cwd = spec.cwd or str(Path.home())
        env = child_env(run, spec.env, spec.gpus)
        try:
            with open(run.file(OUTPUT), "ab", buffering=0) as log:
                child = subprocess.Popen(
                    spec.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    env=env,
                    start_new_session=True,
                )
        except OSError as exc:
            message = f"cannot start {spec.argv[0]!r}: {exc.strerror or exc}"
            if diskspace.is_full(exc):
                message = f"cannot start {spec.argv[0]!r}: {diskspace.no_space_message(run.path)}"
            elif exc.filename is not None and isinstance(exc, FileNotFoundError):
                message += " (check the program name and PATH, or the --cwd)"
            self.event("spawn_failed", errno=exc.errno)
            return self.fail(message)
        ident = procinfo.identify(child.pid, include_zombie=True)
        stat = procinfo.read_stat(child.pid)  # Popen returns after exec: the child has left our session
        # The child's identity: in memory now, on disk through the reserved room (or as soon as there is room).
        proc.update(
            child=ident.to_json() if ident else None,
            session=stat.sid if stat is not None else None,
            child_started_at=time.time(),
        )
        self.record(PROC, proc)
        self.event("spawned", pid=child.pid)
        self.event("state", state="running")
        follower = MetricsFollower(run, spec.metrics_from, cwd=Path(cwd)) if spec.metrics_from else None
        watcher = None
        try:
            if follower is not None:
                follower.start()
            if ident is not None:
                sampler = GpuSampler() if watch.stall_window(spec) is not None else None
                watcher = watch.RunWatcher(run, spec, sampler)
                watcher.start()
        except OSError as exc:
            self.note(exc)
        code = self.wait(child)
        if follower is not None:
            # The final drain: rows printed just before the exit are in before exit.json.
            self.best_effort(follower.stop)
        if watcher is not None:
            self.best_effort(watcher.stop)
            if watcher.disk_full is not None and self.disk_full is None:
                self.disk_full = watcher.disk_full
        if watcher is not None:  # explained before exit.json: whoever sees the end finds the diagnosis
            self.best_effort(lambda: watcher.explain_exit(code))
        ended: dict[str, object] = {"code": code, "signal": None, "error": None, "ended_at": time.time()}
        if code < 0:
            ended.update(code=None, signal=signal.Signals(-code).name.removeprefix("SIG"))
        if code != 0:  # read by whoever sees the run failed, in the same record
            reader = watcher.reader if watcher is not None else None
            ended["reason"] = failure_reason.reason(run.file(OUTPUT), reader, spec.argv, env)
        self.event("exit", code=ended["code"], signal=ended["signal"])
        self.disk_full = self.disk_full or diskspace.full_now(run.path)
        if self.disk_full is not None:
            ended["disk_full"] = self.disk_full
        self.record(EXIT, ended)
        self.flush()
        state = RunDir(run.path).state()
        if watcher is not None:  # watch.json agrees with the run's final state
            self.best_effort(lambda: watcher.settle(state))
        self.event("state", state=state)
        self.release(child)
        return 0

    def wait(self, child: subprocess.Popen[bytes]) -> int:
        """The child's exit code (-N when signal N ended it), trying again meanwhile whatever record the disk
        refused. The child is left a zombie: see `release`."""
        while True:
            flags = os.WEXITED | os.WNOWAIT | (os.WNOHANG if self.pending else 0)
            ended = os.waitid(os.P_PID, child.pid, flags)
            if ended is not None:  # WEXITED reports an exit, a kill or a core dump, nothing else
                return ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status
            time.sleep(RETRY_S)
            self.retry()

    def release(self, child: subprocess.Popen[bytes]) -> None:
        """Reap the child once its session is empty. Until then its zombie holds its pid, which holds the
        session's number: what is left in the session (the launcher's children) is provably the run's."""
        said = False
        while left := sorted(stat.pid for stat in procinfo.live_stats() if stat.sid == child.pid):
            if not said:
                self.event("outlived", pids=left)
                said = True
            time.sleep(SESSION_POLL_S)
        child.wait()


def supervise(run: RunDir) -> int:
    return Supervisor(run).run_child()


def detach(run: RunDir) -> None:
    """Fork; the parent returns to the caller's exit, the child leads a new session."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    log = open_private(run.file(SUPERVISOR_LOG), os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.runs.supervise", description=__doc__)
    parser.add_argument("--detach", action="store_true", help="fork into a new session and return at once")
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    run = RunDir(args.run_dir.resolve())
    if not run.file("spec.json").is_file():
        print(f"supervise: {run.path} is not a run folder (no spec.json)", file=sys.stderr)
        return 2
    if args.detach:
        detach(run)
    return supervise(run)


if __name__ == "__main__":
    procinfo.restart_without(CHILD_ONLY_ENV)  # a supervisor started from inside a run is not that run's
    sys.exit(main())
