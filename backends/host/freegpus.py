"""Free GPUs: stop this user's processes that hold memory on chosen GPUs, and say what is left.

First a plan: every compute process on the chosen GPUs, with its identity (pid
plus start time) taken now and the reason, if any, it must be left alone. Then
SIGTERM, wait for the memory to be released, SIGKILL whatever outlives the grace
period, and sample again. Every signal goes through procinfo.signal_if_ours with
the identity from the plan, so a pid reused in the meantime is never signalled.

A pid NVML lists may not be the GPU's holder at all: inside a container NVML
lists the host's pids, and one may equal the pid of an unrelated process of
ours. So a process is stopped only while its GPU's device node is mapped into
its memory, as a CUDA context's is (gpunodes), proven at planning time and again
right before each signal; one that is not is left alone, and the report names
no user or run for it.

The plan says whose each process is (`HolderKind`): a run of this store, a run
of another workdir, the user's own process that is no run's, or another user's,
which is never signalled. Runs are the caller's to prove (`RunOf`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from backends.host import gpunodes, procinfo
from backends.host.gpunodes import GpuNode
from backends.host.gpus import GpuSampler
from backends.host.procinfo import ProcIdentity, Proof
from backends.protocol import (
    FreeGpusResult,
    GpuFreeReport,
    GpuInfo,
    GpuProcess,
    GpuSourceName,
    HeldProcess,
    HolderKind,
    ProtocolError,
)

POLL_S = 0.1
GONE = "gone (or not visible from this host's pid namespace)"


@dataclass(frozen=True)
class RunHolder:
    """The run a process is proven to be part of: its id, and its store's workdir when not this store's."""

    run_id: str
    workdir: str | None = None


RunOf = Callable[[int], RunHolder | None]  # the run a live pid is proven part of, if any


@dataclass(frozen=True)
class PlannedProcess:
    """One compute process on a chosen GPU, as found at planning time."""

    gpu: int
    node: GpuNode  # the GPU's device node, which the process must hold to be stopped
    process: GpuProcess  # user and run_id None when the process is not proven to hold the GPU
    ident: ProcIdentity | None
    skip: str | None  # why it is left alone; None: it is to be stopped
    holder: HolderKind
    workdir: str | None = None  # the other store's, for holder "other_store"


@dataclass(frozen=True)
class FreePlan:
    gpu_source: GpuSourceName
    before: list[GpuInfo]  # the chosen GPUs, sampled at planning time
    processes: list[PlannedProcess]


def free_gpus(
    sampler: GpuSampler,
    indices: list[int] | None,
    dry_run: bool,
    timeout: float = 15.0,
    grace: float = 5.0,
    before_signals: Callable[[FreePlan], None] | None = None,
    run_of: RunOf | None = None,
) -> FreeGpusResult:
    """Free the GPUs `indices` (None: all). Blocks for up to `timeout` seconds.

    Each process's action is "killed", "survived" or "skip: <why>"; still_held
    is every process still listed afterwards (a killed one among them when the
    driver has not released its memory yet). A dry run signals nothing: actions
    are "kill" or "skip: <why>", the memory after is unknown, and still_held
    lists the processes the plan leaves in place.

    `before_signals(plan)` runs after planning and before the first signal (the
    agent records the kill in the events of the runs it hits, in their stores).
    `run_of` proves which run a process is part of (None: no process is a run's).
    """
    plan = plan_free(sampler, indices, run_of)
    if dry_run:
        return _dry_run_report(plan)
    if before_signals is not None:
        before_signals(plan)
    return carry_out(plan, sampler, timeout, grace)


def plan_free(sampler: GpuSampler, indices: list[int] | None, run_of: RunOf | None = None) -> FreePlan:
    gpus = sampler.sample()
    if indices is not None:
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
            raise ProtocolError("bad_args", "free_gpus: 'gpus' must be a list of GPU indices")
        missing = sorted(set(indices) - {gpu["index"] for gpu in gpus})
        if missing:
            seen = ", ".join(str(gpu["index"]) for gpu in gpus) or "none"
            raise ProtocolError(
                "bad_args",
                f"free_gpus: no GPU {', '.join(map(str, missing))} here (GPUs seen: {seen}; source {sampler.source})",
            )
    chosen = [gpu for gpu in gpus if indices is None or gpu["index"] in indices]
    processes = []
    for gpu in chosen:
        node = sampler.gpu_node(gpu["index"])
        for process in gpu["processes"]:
            ident = procinfo.identify(process["pid"])
            skip = GONE if ident is None else procinfo.refusal(ident)
            if skip is None and (skip := gpunodes.not_held(process["pid"], node)) is not None:
                process = _unknown_holder(process)
                planned = PlannedProcess(gpu["index"], node, process, ident, skip, "unknown")
            else:
                planned = _whose(PlannedProcess(gpu["index"], node, process, ident, skip, "unknown"), run_of)
            processes.append(planned)
    return FreePlan(sampler.source, chosen, processes)


def _whose(planned: PlannedProcess, run_of: RunOf | None) -> PlannedProcess:
    """`planned` with its holder: another user's, a run's (this store's or another's, as `run_of` proves it; the
    sampler's guess of a run is replaced by the proof), or the user's own."""
    pid = planned.process["pid"]
    if planned.ident is None:
        return planned
    if procinfo.proc_uid(pid) != os.geteuid():
        return replace(planned, holder="not_yours")
    found = run_of(pid) if run_of is not None else None
    process: GpuProcess = {**planned.process, "run_id": None if found is None else found.run_id}
    if found is None:
        return replace(planned, process=process, holder="own")
    kind: HolderKind = "run" if found.workdir is None else "other_store"
    return replace(planned, process=process, holder=kind, workdir=found.workdir)


def carry_out(plan: FreePlan, sampler: GpuSampler, timeout: float = 15.0, grace: float = 5.0) -> FreeGpusResult:
    """SIGTERM the plan's processes, SIGKILL those alive after `grace`, wait up to `timeout` in all."""
    start = time.monotonic()
    refused: dict[ProcIdentity, str] = {}
    signalled: dict[ProcIdentity, Proof] = {}
    # A process on several chosen GPUs is planned once per GPU but signalled once.
    nodes: dict[ProcIdentity, list[GpuNode]] = {}
    for p in plan.processes:
        if p.skip is None and p.ident is not None:
            nodes.setdefault(p.ident, []).append(p.node)
    for ident, gpu_nodes in nodes.items():
        proof = _holds_all(gpu_nodes)
        reason = procinfo.signal_if_ours(ident, signal.SIGTERM, proof)
        if reason is None:
            signalled[ident] = proof
        else:
            refused[ident] = reason
    gpus_of = {ident: {p.gpu for p in plan.processes if p.ident == ident} for ident in signalled}
    deadline, kill_at = start + max(timeout, 0.0), start + max(min(grace, timeout), 0.0)
    after = _wait_released(sampler, signalled, gpus_of, deadline, kill_at)
    _reap(signalled)  # one that died after the last poll's reap

    def action(planned: PlannedProcess) -> str:
        if planned.skip is not None or planned.ident is None:
            return f"skip: {planned.skip or GONE}"
        if planned.ident in refused:
            return f"skip: {refused[planned.ident]}"
        return "survived" if procinfo.is_alive(planned.ident) else "killed"

    after_by_index = {gpu["index"]: gpu for gpu in after}
    reports = []
    for gpu in plan.before:
        planned = [p for p in plan.processes if p.gpu == gpu["index"]]
        actions = {p.process["pid"]: action(p) for p in planned}
        # A planned process keeps the plan's user, run and holder (none for one not proven to hold the GPU).
        as_planned = {p.process["pid"]: p for p in planned}
        now = after_by_index.get(gpu["index"])
        held = [] if now is None else now["processes"]
        still_held = [_still_held(p, as_planned, actions) for p in held]
        used_after = None if now is None else now["mem_used_mib"]
        processes = [_as_planned(p, actions[p.process["pid"]]) for p in planned]
        reports.append(_report(gpu, used_after, processes, still_held))
    return {"dry_run": False, "gpu_source": plan.gpu_source, "gpus": reports}


def _wait_released(
    sampler: GpuSampler,
    signalled: dict[ProcIdentity, Proof],
    gpus_of: dict[ProcIdentity, set[int]],
    deadline: float,
    kill_at: float,
) -> list[GpuInfo]:
    """Poll until no signalled pid is listed on any GPU, SIGKILLing at `kill_at` the living that still hold
    their GPUs. A process whose GPUs have all left the list (fallen off the bus) cannot be seen to release them:
    it is waited for until it has exited, else it would be told `survived` while it was still dying.

    Returns the latest non-empty sample ([] when every sample came back empty).
    """
    pids = {ident.pid for ident in signalled}
    latest: list[GpuInfo] = []
    killed = False
    while True:
        _reap(signalled)
        sample = sampler.sample()
        if sample:
            latest = sample
        listed = {p["pid"] for gpu in sample for p in gpu["processes"]}
        now = time.monotonic()
        # An empty sample proves nothing (nvidia-smi hiccup), so it never ends the wait early.
        if not pids or now >= deadline:
            return latest
        shown = {gpu["index"] for gpu in sample}
        unseen = [ident for ident, gpus in gpus_of.items() if not gpus & shown and procinfo.is_alive(ident)]
        if sample and not listed & pids and not unseen:
            # Memory was read before the process list, maybe while the process still held it.
            return sampler.sample() or latest
        if not killed and now >= kill_at:
            for ident, proof in signalled.items():
                procinfo.signal_if_ours(ident, signal.SIGKILL, proof)
            killed = True
        time.sleep(POLL_S)


def _reap(signalled: Iterable[ProcIdentity]) -> None:
    """Collect our own children among the signalled, so none lingers as a zombie."""
    me = os.getpid()
    for ident in signalled:
        stat = procinfo.read_stat(ident.pid)
        # Only a zombie child with the planned start time: never another child's exit status.
        if stat is None or stat.state != "Z" or stat.ppid != me or stat.start_ticks != ident.start_ticks:
            continue
        with contextlib.suppress(ChildProcessError):  # someone else (a Popen.wait) reaped it first
            os.waitpid(ident.pid, os.WNOHANG)


def _holds_all(nodes: list[GpuNode]) -> Proof:
    """The proof asked for right before each signal: the process still holds every GPU it was planned on."""
    return lambda pid: next(filter(None, (gpunodes.not_held(pid, node) for node in nodes)), None)


def _unknown_holder(process: GpuProcess) -> GpuProcess:
    """`process` as held by someone unknown: what this pid namespace knows of its pid is about another
    process, so neither its user nor its run is the holder's."""
    return {"pid": process["pid"], "user": None, "mem_mib": process["mem_mib"], "run_id": None}


def _still_held(process: GpuProcess, planned: dict[int, PlannedProcess], actions: dict[int, str]) -> HeldProcess:
    """A process listed after the signals: as planned with its memory now, or one that appeared meanwhile."""
    found = planned.get(process["pid"])
    if found is None:
        return _held(process, "skip: appeared while freeing")
    now: GpuProcess = {**found.process, "mem_mib": process["mem_mib"]}
    return _held(now, actions[process["pid"]], found.holder, found.workdir)


def _as_planned(planned: PlannedProcess, action: str) -> HeldProcess:
    return _held(planned.process, action, planned.holder, planned.workdir)


def _held(process: GpuProcess, action: str, holder: HolderKind = "unknown", workdir: str | None = None) -> HeldProcess:
    return {
        "pid": process["pid"],
        "user": process["user"],
        "mem_mib": process["mem_mib"],
        "run_id": process["run_id"],
        "action": action,
        "holder": holder,
        "workdir": workdir,
    }


def _report(
    gpu: GpuInfo, used_after: int | None, processes: list[HeldProcess], still_held: list[HeldProcess]
) -> GpuFreeReport:
    before = gpu["mem_used_mib"]
    return {
        "index": gpu["index"],
        "mem_used_before_mib": before,
        "mem_used_after_mib": used_after,
        "freed_mib": None if before is None or used_after is None else before - used_after,
        "processes": processes,
        "still_held": still_held,
    }


def _dry_run_report(plan: FreePlan) -> FreeGpusResult:
    reports = []
    for gpu in plan.before:
        planned = [p for p in plan.processes if p.gpu == gpu["index"]]
        processes = [_as_planned(p, "kill" if p.skip is None else f"skip: {p.skip}") for p in planned]
        reports.append(_report(gpu, None, processes, [h for h in processes if h["action"] != "kill"]))
    return {"dry_run": True, "gpu_source": plan.gpu_source, "gpus": reports}
