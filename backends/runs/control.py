"""Run control: launch, kill and relaunch, on top of the run store.

Blocking functions; the agent calls the slow ones in a thread. Every signal
goes through procinfo.signal_if_ours, with identities taken when the run's
processes were listed, so a pid recycled meanwhile is never signalled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from backends import PACKAGE_ROOT, shipped
from backends.argv_edit import ArgvEditError, edit_argv
from backends.host import diskspace, procinfo
from backends.masking import mask_argv, mask_env
from backends.protocol import (
    SIGNAL_NAMES,
    DoctorResult,
    Finding,
    KilledProcess,
    KillResult,
    LaunchResult,
    PreflightResult,
    StacksResult,
)
from backends.runs import stages
from backends.runs.job import node_of, torchrun_args
from backends.runs.store import OUTPUT, STACKS, RunDir, RunSpec, RunStore, StoreError

LAUNCH_CONFIRM_S = 5.0
POLL_S = 0.01  # a kill is answered when its processes are seen gone: a coarse poll only adds wait
FIRST_POLL_S = 0.001  # a signalled process is mostly gone within a millisecond or two: look soon, then less often
KILL_ESCALATION_WAIT_S = 5.0
EXIT_RECORD_WAIT_S = 2.0


class OpError(Exception):
    """An operation that cannot be done; the message says why and what to do."""

    def __init__(self, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


def gate(spec: RunSpec, force: bool) -> PreflightResult:
    """The pre-launch checks: one of our stages with an interpreter that cannot run it, a serve command's flag
    SGLang refuses, or doctor's errors in its draft refuse the launch unless forced."""
    # Imported by the first launch: SGLang's facts and doctor are no part of an agent that only looks.
    from backends.runs import preflight

    unfit = stages.python_problem(spec.argv, spec.env, spec.cwd)
    if unfit is not None and not force:
        raise OpError("python_unfit", unfit)
    checked = preflight.check_launch(spec.kind, spec.argv, spec.cwd, spec.env, spec.sglang_python)
    if force:
        return checked
    flags, verdict = checked["flags"], checked["doctor"]
    if flags is not None and flags["severity"] == "error":
        fix = flags["fix"] or "fix it, or launch with --force"
        raise OpError("flags_refused", f"{flags['message']}; {fix}", details=verdict)
    if verdict is not None and verdict["errors"]:
        codes = sorted({f["code"] for f in verdict["findings"] if f["severity"] == "error"})
        raise OpError(
            "doctor_refused",
            f"doctor found {verdict['errors']} error(s) in the draft ({', '.join(codes)}); "
            "fix them, or launch with --force to start anyway",
            details=verdict,
        )
    return checked


def unchanged_agent() -> None:
    """A supervisor imports the agent's code anew: OpError when the uploaded copy changed since it was verified."""
    try:
        shipped.check_unchanged()
    except (shipped.Altered, OSError) as exc:
        raise OpError(
            "agent_altered",
            f"the agent's files on the host changed since it started ({exc}); nothing was launched: connect again "
            "and the console restores them (from the command line: --no-reuse)",
        ) from None


def start_supervisor(run: RunDir) -> None:
    # cwd = the folder holding `backends`, so `-m` finds it whether installed or uploaded.
    result = subprocess.run(
        [sys.executable, "-m", "backends.runs.supervise", "--detach", str(run.path)],
        cwd=PACKAGE_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        detail = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise OpError("launch_failed", f"the run supervisor did not start: {detail[0]}")


def _exit_written(run: RunDir) -> bool:
    """Whether exit.json is there (a corrupt one is there too: waiting longer will not mend it)."""
    try:
        return run.exit() is not None
    except StoreError:
        return True


def wait_started(run: RunDir, timeout: float = LAUNCH_CONFIRM_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.child() is not None or _exit_written(run):
            return
        time.sleep(POLL_S / 2)


def launch_result(run: RunDir, verdict: DoctorResult | None, flags: Finding | None) -> LaunchResult:
    """A launch's reply: its run as it stands now, and what its checks found (None when not told again)."""
    info = run.info()
    return {
        "run": run.id,
        "state": info["state"],
        "pid": info["pid"],
        "error": info["error"],
        "doctor": verdict,
        "flags": flags,
    }


def launch(store: RunStore, spec: RunSpec, checked: PreflightResult | None = None) -> dict[str, Any]:
    """Create the run, start its supervisor, and report its first state.

    `checked` is what the pre-launch checks found (see `gate`); it is kept in the
    run's events and returned.
    """
    unchanged_agent()
    run = store.create(spec)
    flags, verdict = (checked["flags"], checked["doctor"]) if checked is not None else (None, None)
    try:
        if flags is not None:
            run.append_event("flags", **flags)
        if verdict is not None:
            run.append_event(
                "doctor", errors=verdict["errors"], warnings=verdict["warnings"], findings=verdict["findings"]
            )
        run.append_event(
            "launch",
            kind=spec.kind,
            name=spec.name,
            argv=mask_argv(spec.argv),
            env=mask_env(spec.env),
            cwd=spec.cwd,
            gpus=spec.gpus,
            parent=spec.parent,
        )
    except OSError as exc:
        shutil.rmtree(run.path, ignore_errors=True)  # nothing was started: no half-made run left behind
        why = diskspace.no_space_message(run.path) if diskspace.is_full(exc) else str(exc.strerror or exc)
        raise StoreError(f"{why}: the run was not launched; free some space or choose another --workdir") from None
    start_supervisor(run)
    wait_started(run)
    return dict(launch_result(run, verdict, flags))


def pauses() -> Iterator[float]:
    """The sleeps between looks at something about to happen: FIRST_POLL_S, doubling up to POLL_S."""
    pause = FIRST_POLL_S
    while True:
        yield pause
        pause = min(pause * 2, POLL_S)


def _alive(idents: dict[int, procinfo.ProcIdentity]) -> dict[int, procinfo.ProcIdentity]:
    return {pid: ident for pid, ident in idents.items() if procinfo.is_alive(ident)}


def kill(run: RunDir, signal_name: str = "TERM", grace: float = 10.0) -> KillResult:
    """Signal every process of the run once; after `grace` seconds SIGKILL whatever of the run is left.

    Processes that appear after the first signal (a TERM handler's cleanup) are left alone until the
    grace period is over: the grace is theirs too.
    """
    if signal_name not in SIGNAL_NAMES:
        raise OpError("bad_args", f"signal must be one of {', '.join(SIGNAL_NAMES)}")
    child = run.child()
    if child is not None and child.boot_id != procinfo.boot_id():
        raise OpError(
            "other_boot",
            f"run {run.id} was started on another boot or host (boot id {child.boot_id}, here "
            f"{procinfo.boot_id()}); no process here is provably its own, so nothing was signalled",
        )
    targets = run.processes()
    if not targets:
        said = f"run {run.id} has no live process (state {run.state()}); nothing to kill"
        for unproven in unproven_of(run, ()):
            said += f"; pid {unproven['pid']} {unproven['reason']}"
        raise OpError("not_running", said)
    sent: dict[int, list[str]] = {}
    refused: list[dict[str, Any]] = []

    def send(sig: signal.Signals, idents: dict[int, procinfo.ProcIdentity]) -> None:
        # Recorded first (it makes the run `killed`, not `failed`), but a full disk must not stop the kill.
        with contextlib.suppress(OSError):
            run.append_event("signal", signal=sig.name.removeprefix("SIG"), pids=sorted(idents), by="kill")
        for pid, ident in idents.items():
            reason = procinfo.signal_if_ours(ident, sig)
            if reason is None:
                sent.setdefault(pid, []).append(sig.name.removeprefix("SIG"))
            elif procinfo.is_alive(ident) and all(r["pid"] != pid for r in refused):
                refused.append({"pid": pid, "reason": reason})

    def wait_gone(seconds: float) -> dict[int, procinfo.ProcIdentity]:
        """What is left of the run (the first targets and any newcomer) after up to `seconds`."""
        deadline, waits = time.monotonic() + seconds, pauses()
        while True:
            left = _alive(targets)
            if not left:
                # Cheap checks until the known ones are gone; only then the full scan for newcomers.
                left = run.processes()
                targets.update(left)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(next(waits))

    first = signal.Signals[f"SIG{signal_name}"]
    send(first, targets)
    survivors = wait_gone(grace)
    escalated = False
    if survivors and first != signal.SIGKILL:
        escalated = True
        targets.update(survivors)
        send(signal.SIGKILL, survivors)
        wait_gone(KILL_ESCALATION_WAIT_S)
    elif survivors:  # killed, but not yet gone from /proc (an orphan awaits its reaper)
        wait_gone(KILL_ESCALATION_WAIT_S)
    _wait_exit_record(run)
    refused.extend(unproven_of(run, targets))
    processes: list[KilledProcess] = [
        {"pid": pid, "signals": sent.get(pid, []), "died": not procinfo.is_alive(ident)}
        for pid, ident in sorted(targets.items())
    ]
    return {"run": run.id, "state": run.state(), "processes": processes, "refused": refused, "escalated": escalated}


def unproven_of(run: RunDir, proven: Collection[int]) -> list[dict[str, Any]]:
    """What writes to the run's output.log without being provably the run's (procinfo.unproven_writers): said, in
    `refused`'s shape, never signalled."""
    why = (
        "writes to the run's output.log but left its session and cleared its environment, so it cannot be proven "
        "the run's and was not signalled; kill it yourself if it is"
    )
    return [{"pid": pid, "reason": why} for pid in procinfo.unproven_writers(run.file(OUTPUT), proven, run.child())]


def _wait_exit_record(run: RunDir) -> None:
    """Give a live supervisor a moment to write exit.json, so the state we report is final."""
    supervisor = run.supervisor()
    deadline, waits = time.monotonic() + EXIT_RECORD_WAIT_S, pauses()
    while supervisor is not None and procinfo.is_alive(supervisor) and not _exit_written(run):
        if time.monotonic() > deadline:
            return
        time.sleep(next(waits))


def has_live_processes(run: RunDir) -> bool:
    return bool(run.processes())


def relaunch(
    store: RunStore,
    ref: str,
    sets: list[str],
    unsets: list[str],
    grace: float,
    force: bool = False,
    dry_run: bool = False,
    launch_id: str | None = None,
) -> dict[str, Any]:
    """Launch a copy of a run with flags set or removed, linked to it as parent (`launch_id` its own, never
    its parent's).

    The copy passes the pre-launch gate before anything else happens; then a
    parent that is still alive is stopped: both would want the same GPUs and port.
    `dry_run` stops after the gate: the copy's command line, whether the parent has processes to stop, and
    what the checks found; nothing stopped.
    """
    unchanged_agent()  # before the parent is stopped for a copy that could not start, and before serving is imported
    from backends import serving  # imported by the first relaunch, as the gate's checks are

    parent = store.get(ref)
    spec = parent.trusted_spec()
    if not all(isinstance(x, str) for x in [*sets, *unsets]):
        raise OpError("bad_args", "flags to set or unset must be strings")
    try:
        # A server's flags are edited where they are written (in a shell string, before a container's image...).
        argv = serving.edited(spec.argv, sets, unsets, spec.env) if spec.kind == "serve" else None
        argv = argv if argv is not None else edit_argv(spec.argv, sets, unsets)
    except ArgvEditError as exc:
        raise OpError("bad_args", str(exc)) from None
    child_spec = dataclasses.replace(spec, argv=argv, parent=parent.id, created_at=time.time(), launch_id=launch_id)
    checked = gate(child_spec, force)
    if dry_run:
        return {
            "parent": parent.id,
            "would_stop": has_live_processes(parent),
            "argv": mask_argv(argv),
            "flags": checked["flags"],
            "doctor": checked["doctor"],
        }
    stopped = _stop(parent, grace) if has_live_processes(parent) else None
    result = launch(store, child_spec, checked)
    result.update(parent=parent.id, argv=mask_argv(argv), stopped_parent=stopped)
    return result


def _stop(run: RunDir, grace: float) -> KillResult | None:
    """A relaunch's stop of its parent: None when the parent ended on its own since it was seen alive."""
    try:
        return kill(run, "TERM", grace)
    except OpError as exc:
        if exc.code != "not_running":
            raise
        return None


def owner_lookup(store: RunStore, runs: Iterable[RunDir] | None = None) -> dict[int, str]:
    """pid of each live run child -> run id, to attribute GPU processes to runs: of `runs` (those a look found
    live), else of the store's every run."""
    owners: dict[int, str] = {}
    for run in store.all() if runs is None else runs:
        if _exit_written(run):
            continue
        child = run.child()
        if child is not None and procinfo.is_alive(child):
            owners[child.pid] = run.id
    return owners


def owner_of(pid: int, owners: dict[int, str]) -> str | None:
    """The run whose process tree holds pid: by parent chain, else by process group."""
    for candidate in (pid, *procinfo.ancestors(pid)):
        if candidate in owners:
            return owners[candidate]
    stat = procinfo.read_stat(pid)
    if stat is not None and stat.pgid in owners:
        return owners[stat.pgid]
    return None


def checked_spec(
    cwd_default: str | None,
    *,
    kind: str,
    argv: list[Any],
    name: str | None,
    env: dict[str, Any],
    cwd: str | None,
    gpus: list[Any],
    health_url: str | None,
    metrics_url: str | None,
    sglang_python: str | None,
    stall_after: float | None,
    module: str | None,
    python: str | None,
    nproc: int | None,
    metrics_from: str | None,
    job: str | None,
    node_rank: int | None,
    nnodes: int | None,
    rendezvous: str | None,
    launch_id: str | None,
) -> RunSpec:
    """A RunSpec from a launch's arguments (the protocol's `launch`, force aside); OpError("bad_args") when they
    make no sense."""
    env = dict(env)
    argv = list(argv)
    try:
        node = node_of(job, node_rank, nnodes, rendezvous)
        if module is not None:
            if node and node["nnodes"] > 1 and not rendezvous:
                raise ValueError("a node of a job of our stages meets the others at a rendezvous: give HOST:PORT")
            node_args = torchrun_args(node, rendezvous) if node and rendezvous else []
            argv = stages.module_argv(python or sys.executable, module, argv, nproc, node_args)
    except ValueError as exc:
        raise OpError("bad_args", str(exc)) from None
    if module is not None:
        # The child runs in the user's folder, yet must import our package.
        inherited = env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), inherited]))
    elif any(value is not None for value in (nproc, python, rendezvous)):
        raise OpError("bad_args", "nproc, python and rendezvous go with one of our modules (extract, train)")
    spec = RunSpec(
        kind=kind,
        argv=argv,
        name=name or "",
        env=env,
        cwd=cwd or cwd_default,
        gpus=list(gpus),
        health_url=health_url,
        metrics_url=metrics_url,
        sglang_python=sglang_python,
        stall_after=stall_after,
        metrics_from=metrics_from,
        job=node,
        launch_id=launch_id,
    )
    try:
        spec.validate()
    except StoreError as exc:
        raise OpError("bad_args", str(exc)) from None
    if not spec.name:
        spec.name = Path(spec.argv[0]).name if spec.kind == "command" else spec.kind
    return spec


def stacks(run: RunDir, now: bool) -> StacksResult:
    """The run's latest stack dump; with `now` (or when it has none yet), a fresh one of its live processes."""
    from backends.runs import watch  # the supervisor's watch (SGLang's log facts with it): imported when asked

    folder = run.file(STACKS)
    dumps = sorted(folder.glob("*.txt")) if folder.is_dir() else []
    if now or not dumps:
        members = sorted(run.processes())
        if not members:
            why = "no live process" if not dumps else "no live process to dump now"
            raise OpError("no_stacks", f"run {run.id} has {why}{'' if dumps else ' and no stack dump'}")
        path = watch.dump_stacks(run, members)
        run.append_event("stacks", file=f"{STACKS}/{path.name}", pids=members, by="request")
        dumps = [path]
    latest = dumps[-1]
    text = watch.mask_stacks(run, latest.read_text(errors="replace"))  # dumps written before masking existed
    return {"file": f"{STACKS}/{latest.name}", "text": text, "taken_at": latest.stat().st_mtime}
