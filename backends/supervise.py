"""One run's supervisor: `python -m backends.supervise [--detach] RUN_DIR`.

Started by the agent in its own session, it starts the child with stdout and
stderr going straight to output.log (a file, so the child outlives us), records
both identities in proc.json, keeps the run's watch (`backends.watch`: phases,
health, stalls), waits, and writes exit.json. With --detach it
forks first and returns at once, so the agent never has a zombie to reap.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from backends import procinfo, watch
from backends.gpus import GpuSampler
from backends.metrics_sources import MetricsFollower
from backends.runstore import EXIT, METRICS, OUTPUT, PROC, SUPERVISOR_LOG, RunDir, SpecError, atomic_write_json

# Set for every child so that its own code (and ours) can find the run.
ENV_RUN_ID = "EAGLE3_RUN_ID"
ENV_RUN_DIR = "EAGLE3_RUN_DIR"
ENV_METRICS_FILE = "EAGLE3_METRICS_FILE"


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


def write_proc(run: RunDir, **fields: object) -> None:
    data = run.proc()
    data.update(fields)
    atomic_write_json(run.file(PROC), data)


def fail(run: RunDir, message: str) -> int:
    """The child could not be started: record why, as the run's exit."""
    atomic_write_json(run.file(EXIT), {"code": None, "signal": None, "error": message, "ended_at": time.time()})
    run.append_event("failed", error=message)
    run.append_event("state", state="failed")
    return 1


def supervise(run: RunDir) -> int:
    me = procinfo.identify(os.getpid())
    write_proc(run, supervisor=me.to_json() if me else None)
    run.append_event("supervisor_started", pid=os.getpid())
    try:
        spec = run.spec()
    except SpecError as exc:
        return fail(run, str(exc))
    cwd = spec.cwd or str(Path.home())
    with open(run.file(OUTPUT), "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(
                spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=child_env(run, spec.env, spec.gpus),
                start_new_session=True,
            )
        except OSError as exc:
            message = f"cannot start {spec.argv[0]!r}: {exc.strerror or exc}"
            if exc.filename is not None and isinstance(exc, FileNotFoundError):
                message += " (check the program name and PATH, or the --cwd)"
            run.append_event("spawn_failed", errno=exc.errno)
            return fail(run, message)
    ident = procinfo.identify(child.pid, include_zombie=True)
    write_proc(run, child=ident.to_json() if ident else None, child_started_at=time.time())
    run.append_event("spawned", pid=child.pid)
    run.append_event("state", state="running")
    follower = MetricsFollower(run, spec.metrics_from, cwd=Path(cwd)) if spec.metrics_from else None
    if follower is not None:
        follower.start()
    watcher = None
    if ident is not None:
        sampler = GpuSampler() if watch.stall_window(spec) is not None else None
        watcher = watch.RunWatcher(run, spec, ident, sampler)
        watcher.start()
    code = child.wait()
    if follower is not None:
        follower.stop()  # the final drain: rows printed just before the exit are in before exit.json
    if watcher is not None:
        watcher.stop()
    ended: dict[str, object] = {"code": code, "signal": None, "error": None, "ended_at": time.time()}
    if code < 0:
        ended.update(code=None, signal=signal.Signals(-code).name.removeprefix("SIG"))
    atomic_write_json(run.file(EXIT), ended)
    run.append_event("exit", code=ended["code"], signal=ended["signal"])
    run.append_event("state", state=RunDir(run.path).state())
    return 0


def detach(run: RunDir) -> None:
    """Fork; the parent returns to the caller's exit, the child leads a new session."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    log = os.open(run.file(SUPERVISOR_LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.supervise", description=__doc__)
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
    sys.exit(main())
