"""What the CLI and the console do to runs, once: launch a command, our stages or SGLang's server (on one host, or
a stage or the server as a job with a node per host), kill, relaunch (its preview first), free GPUs. Typed in (the
options below, runs by id) and out (the protocol's results; `Refused`, with a one-line reason, where an action
cannot go ahead). The CLI writes the outcomes as text or JSON, the console as dialogs and notifications.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from backends.protocol import (
    TERMINAL_STATES,
    FreeGpusResult,
    GpuProcess,
    JobNode,
    KillResult,
    LaunchResult,
    RelaunchPreview,
    RelaunchResult,
    RunInfo,
    ServeNode,
)
from console.fleet import jobs
from console.fleet.hosts import Fleet, Member
from console.link.transport import AgentError, AgentOps, TransportError

T = TypeVar("T")
KILL_GRACE_S = 10.0  # SIGKILL follows SIGTERM after this long, for whatever is left


class Refused(Exception):
    """An action that cannot go ahead; the message says why and what to do."""


@dataclass(frozen=True)
class RunOptions:
    """What every launch of ours takes besides its command: the run's name, environment, folder and GPUs."""

    name: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    gpus: Sequence[int] = ()
    force: bool = False


@dataclass(frozen=True)
class Stage:
    """`extract`/`train`: the stage's own words, run by torchrun with `nproc` processes under `python`."""

    stage: str
    args: Sequence[str]
    python: str | None = None
    nproc: int | None = None
    run: RunOptions = RunOptions()


@dataclass(frozen=True)
class Serve:
    """`serve TARGET DRAFT [FLAGS]`: SGLang's server for a target and its EAGLE-3 draft; FLAGS come last and win."""

    target: str
    draft: str
    flags: Sequence[str] = ()
    python: str = "python3"  # the host's interpreter that has SGLang
    port: int | None = None  # None: the engine's default
    metrics: bool = True
    sglang_python: str | None = None
    run: RunOptions = RunOptions()

    @property
    def listens_on(self) -> int:
        from backends import serving  # the engine's facts: only a serve command pays for importing them

        return self.port if self.port is not None else serving.DEFAULT.default_port


@dataclass(frozen=True)
class Command:
    """`launch KIND -- ARGV`: any command as a run of KIND; a serve run's health and metrics endpoints, the
    host Python whose SGLang checks it, where its metric rows come from, and the job node it is, when given."""

    kind: str
    argv: Sequence[str]
    health_url: str | None = None
    metrics_url: str | None = None
    sglang_python: str | None = None
    metrics_from: str | None = None
    node: JobNode | None = None
    run: RunOptions = RunOptions()


Ours = Stage | Serve  # what runs as a job, a node per host
Launch = Ours | Command


@dataclass(frozen=True)
class Edit:
    """A relaunch's change: flags set and removed, how long the parent gets to stop, and whether the checks may
    be overruled."""

    sets: Sequence[str] = ()
    unsets: Sequence[str] = ()
    grace: float = KILL_GRACE_S
    force: bool = False


# --- launch --------------------------------------------------------------------------------------------------


def node_fields(node: JobNode | None) -> dict[str, Any]:
    """A node's launch arguments (none for a run of one node)."""
    return {} if node is None else {"job": node["id"], "node_rank": node["node_rank"], "nnodes": node["nnodes"]}


def serve_argv(serve: Serve, node: ServeNode | None = None) -> list[str]:
    """The serving engine's command for a target and its EAGLE-3 draft."""
    from backends import serving

    return serving.DEFAULT.serve_command(
        serve.python,
        serve.target,
        serve.draft,
        port=serve.listens_on,
        gpus=len(serve.run.gpus),
        extra=list(serve.flags),
        metrics=serve.metrics,
        node=node,
    )


async def launch(member: Member, what: Launch, node: JobNode | None = None, meeting: str | None = None) -> LaunchResult:
    """`what` on the member's host; with `node`, one node of a job whose nodes meet at `meeting` (torchrun's
    rendezvous for a stage, SGLang's --dist-init-addr for a server, whose node 0 alone serves HTTP and so alone
    has its health polled)."""
    run = what.run
    if isinstance(what, Command):
        return await member.client.launch(
            what.kind,
            what.argv,
            name=run.name,
            env=dict(run.env),
            cwd=run.cwd,
            gpus=run.gpus,
            health_url=what.health_url,
            metrics_url=what.metrics_url,
            sglang_python=what.sglang_python,
            stall_after=member.stall_after,
            metrics_from=what.metrics_from,
            force=run.force,
            **node_fields(what.node),
        )
    if isinstance(what, Stage):
        return await member.client.launch(
            what.stage,
            what.args,
            module=f"backends.{what.stage}",
            python=what.python,
            nproc=what.nproc,
            name=run.name or what.stage,
            env=dict(run.env),
            cwd=run.cwd,
            gpus=run.gpus,
            stall_after=member.stall_after,
            rendezvous=meeting,
            **node_fields(node),
        )
    served = ServeNode(node["node_rank"], node["nnodes"], meeting) if node and meeting else None
    first = not node or node["node_rank"] == 0
    return await member.client.launch(
        "serve",
        serve_argv(what, served),
        name=run.name or "serve",
        env=dict(run.env),
        cwd=run.cwd,
        gpus=run.gpus,
        health_url=f"http://127.0.0.1:{what.listens_on}/health" if first else None,
        sglang_python=what.sglang_python,
        stall_after=member.stall_after,
        force=run.force,
        **node_fields(node),
    )


async def settled(*asked: Awaitable[T]) -> list[T | AgentError | TransportError]:
    """Each of the requests' outcomes, asked at once and in order: its result, or the error of a host that refused
    or could not be reached (any other exception is a bug of ours and is raised)."""
    outcomes = await asyncio.gather(*asked, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, (AgentError, TransportError)):
            raise outcome
    return outcomes  # type: ignore[return-value]


def job_id(name: str | None, stage: str) -> str:
    """A job's id: its name (or the stage's) in the letters a job id takes, and a random tail, so that two
    launches never share a rendezvous."""
    shown = re.sub(r"[^A-Za-z0-9._-]+", "-", name or stage).strip("-._")[:40] or stage
    return f"{shown}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class NodeOutcome:
    member: Member
    rank: int
    started: LaunchResult | None  # None: it did not start (`said` says why)
    said: str


@dataclass(frozen=True)
class JobLaunched:
    id: str
    meeting: str  # host:port where the nodes meet
    engine: str  # what meets there
    nodes: list[NodeOutcome]

    @property
    def whole(self) -> bool:
        return all(node.started is not None for node in self.nodes)


async def launch_job(fleet: Fleet, what: Ours, meeting_host: str | None = None) -> JobLaunched:
    """`what` as a job, a node per host in the fleet's order, every node meeting at the first host (on a port free
    there; `meeting_host` when the others reach it by another address). Every host is reached before anything
    starts (a job missing a node would wait out the rendezvous for nothing): Refused when one cannot be, each
    member's `error` saying why. A node that cannot start stops the nodes already started, for the same reason."""
    await fleet.each(lambda client: client.hello())
    if fleet.unreached:
        raise Refused("nothing launched: a job starts only when every node's host answers")
    members = fleet.members
    found = await members[0].client.rendezvous()
    meeting = f"{meeting_host or found['address']}:{found['port']}"
    name = job_id(what.run.name, what.stage if isinstance(what, Stage) else "serve")
    nnodes = len(members)
    results = await settled(
        *(launch(m, what, {"id": name, "node_rank": r, "nnodes": nnodes}, meeting) for r, m in enumerate(members))
    )
    nodes = [
        NodeOutcome(m, rank, *_node_outcome(result))
        for rank, (m, result) in enumerate(zip(members, results, strict=True))
    ]
    engine = "SGLang's --dist-init-addr" if isinstance(what, Serve) else "torchrun"
    job = JobLaunched(name, meeting, engine, nodes)
    if not job.whole:
        await settled(*(node.member.client.kill(node.started["run"]) for node in nodes if node.started is not None))
    return job


def _node_outcome(result: LaunchResult | AgentError | TransportError) -> tuple[LaunchResult | None, str]:
    if isinstance(result, (AgentError, TransportError)):
        return None, f"did not start: {result}"
    if result["error"]:
        return None, f"run {result['run']} failed to start: {result['error']}"
    return result, f"run {result['run']}"


# --- kill ----------------------------------------------------------------------------------------------------


def live(run: RunInfo) -> bool:
    return run["state"] not in TERMINAL_STATES


async def kill(
    ops: AgentOps, runs: Sequence[str], signal: str = "TERM", grace: float = KILL_GRACE_S
) -> list[KillResult | AgentError | TransportError]:
    """Each run killed at once (TERM, then KILL after `grace` for what is left); each outcome, in order: what was
    signalled and what died, or why it could not be."""
    return await settled(*(ops.kill(run, signal=signal, grace=grace) for run in runs))


async def job_runs(client: AgentOps, job: str) -> list[RunInfo]:
    """The host's runs of the job: of each node, its newest, by rank."""
    found = jobs.gather([("", (await client.list_runs())["runs"])])
    return next(([node.run for node in each.nodes] for each in found if each.id == job), [])


async def kill_job(
    fleet: Fleet, job: str, signal: str = "TERM", grace: float = KILL_GRACE_S
) -> list[list[KillResult] | None]:
    """Every live run of the job, on every host of the fleet; each host's kills (none where the job has no live
    run; None where the host could not answer, its member's `error` saying why)."""

    async def kill_here(client: AgentOps) -> list[KillResult]:
        mine = [run["id"] for run in await job_runs(client, job) if live(run)]
        done = await kill(client, mine, signal, grace)
        for outcome in done:
            if isinstance(outcome, Exception):
                raise outcome
        return done  # type: ignore[return-value]

    return await fleet.each(kill_here)


# --- relaunch ------------------------------------------------------------------------------------------------


async def preview(ops: AgentOps, run: str, edit: Edit) -> RelaunchPreview:
    """What relaunching the run with `edit` would start, and what the checks say of it; nothing is stopped."""
    return await ops.relaunch(run, set=edit.sets, unset=edit.unsets, grace=edit.grace, force=edit.force, dry_run=True)


async def relaunch(ops: AgentOps, run: str, edit: Edit) -> RelaunchResult:
    """A copy of the run with `edit`, its parent stopped first."""
    return await ops.relaunch(run, set=edit.sets, unset=edit.unsets, grace=edit.grace, force=edit.force)


async def relaunch_nodes(
    nodes: Sequence[tuple[AgentOps, RunInfo]], edit: Edit
) -> list[RelaunchResult | AgentError | TransportError]:
    """Each node of a job relaunched with the same edit, every live one stopped first: a new node must never meet
    an old one at the rendezvous. Each node's outcome, in order (the error where it could not start)."""
    await asyncio.gather(*(ops.kill(run["id"], grace=edit.grace) for ops, run in nodes if live(run)))
    return await settled(*(relaunch(ops, run["id"], edit) for ops, run in nodes))


async def job_nodes(fleet: Fleet, job: str) -> list[tuple[Member, RunInfo]]:
    """The newest run of each node of the job, with its host; Refused unless every host answers and every node
    of the job is among them (a relaunch of part of a job would meet the rest at a dead rendezvous)."""
    found = await fleet.each(lambda client: job_runs(client, job))
    if fleet.unreached:
        raise Refused(f"nothing relaunched: job {job} relaunches only when every host answers")
    hosts = ", ".join(member.name for member in fleet.members)
    gathered = jobs.gather((m.name, runs or []) for m, runs in zip(fleet.members, found, strict=True))
    if not gathered:
        raise Refused(f"no job {job} on {hosts}: `status` lists the jobs")
    if missing := gathered[0].missing:
        absent = ", ".join(f"node {rank}" for rank in missing)
        raise Refused(f"job {job} has no run of {absent} on these hosts: give every host of the job")
    return [(m, run) for m, runs in zip(fleet.members, found, strict=True) for run in runs or []]


# --- free GPUs -----------------------------------------------------------------------------------------------


async def free_gpus_plan(ops: AgentOps, gpus: Sequence[int] | None = None) -> FreeGpusResult:
    """Which of your processes hold GPU memory (all GPUs, or `gpus`) and what freeing them would do."""
    return await ops.free_gpus(gpus=gpus, dry_run=True)


def to_kill(plan: FreeGpusResult) -> list[GpuProcess]:
    return [p for gpu in plan["gpus"] for p in gpu["processes"] if p["action"] == "kill"]


async def free_gpus(ops: AgentOps, gpus: Sequence[int] | None = None, timeout: float = 15.0) -> FreeGpusResult:
    """The plan carried out: each process signalled, and what still holds memory once `timeout` is over."""
    return await ops.free_gpus(gpus=gpus, dry_run=False, timeout=timeout)


def survivors(done: FreeGpusResult) -> list[GpuProcess]:
    return [p for gpu in done["gpus"] for p in gpu["processes"] if p["action"] == "survived"]
