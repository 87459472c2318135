"""The commands that work on one host or several alike (`status`, `watch`, `free-gpus`, `kill`, `relaunch`) and those
that launch (`launch`, `serve`, `extract`, `train`: a run on one host, or a job of a node per host), each once, over
the command's fleet (`console.fleet.hosts`), acting through `console.actions`. A host given alone answers as itself;
a list or a group (a group of one too: a script gets the same shape whatever its size) answers host by host, every
line or JSON object saying which host it is about, and a host that cannot be reached is said (and fails the exit
code) without hiding the others. `kill` and `relaunch` take a run on one host, a multi-node job on several.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from backends.protocol import TERMINAL_STATES, JobNode, LaunchResult
from console import actions, render
from console.cli import commands, config, output
from console.cli.commands import Handler, follow_metrics, follow_startup
from console.cli.config import UsageError
from console.cli.output import EXIT_FAILED, EXIT_OK, doctor_text, dump, failed, note, out, report
from console.fleet import jobs
from console.fleet.hosts import Fleet, Member, host_json
from console.link.client import AgentClient, reconnect_and_say
from console.link.transport import AgentError, AgentOps, TransportError, lasting

# What a command that works on the fleet does, given it, its options and its tail; its exit code.
FleetHandler = Callable[[Fleet, argparse.Namespace, list[str]], Awaitable[int]]
SPANNING = ("status", "watch", "free-gpus", "kill", "relaunch")


def on_one_host(handler: Handler) -> FleetHandler:
    """A command of one host, run on the host of its fleet (`check` refuses it several first)."""

    async def run(fleet: Fleet, ns: argparse.Namespace, tail: list[str]) -> int:
        return await handler(fleet.only.client, ns, tail)

    return run


async def run_on(fleet: Fleet, handler: FleetHandler, ns: argparse.Namespace, tail: list[str]) -> int:
    """The command over its fleet: a host given alone is reached first (its failure is the command's, said in one
    line); the hosts of a list or group each when asked, each failure said on its own."""
    try:
        if fleet.alone is not None:
            await fleet.alone.start()
        return await handler(fleet, ns, tail)
    except (AgentError, TransportError) as exc:
        return failed(exc)
    finally:
        await fleet.close()


def check(ns: argparse.Namespace, tail: list[str]) -> None:
    """UsageError unless the command is one that several hosts can answer."""
    if ns.command in ("train", "extract"):
        raise UsageError(f"{ns.command} over several hosts is a job: give --nodes N, one node per host")
    if ns.command not in SPANNING or tail:
        raise UsageError(
            f"{ns.command} works on one host; status, watch, free-gpus --dry-run and kill or relaunch JOB take several"
        )
    if ns.command == "free-gpus" and not ns.dry_run:
        raise UsageError("free-gpus kills on one host at a time; with several hosts, --dry-run shows each plan")
    if ns.command == "status" and ns.run is not None:
        raise UsageError("status RUN names a run of one host; give that host alone")


def refused(fleet: Fleet, exc: actions.Refused) -> int:
    """An action over the hosts that could not go ahead: each host that could not answer, then why; failed."""
    for member in fleet.unreached:
        member.say(f"cannot be reached: {member.error}")
    note(str(exc))
    return EXIT_FAILED


def code(fleet: Fleet) -> int:
    return EXIT_FAILED if fleet.unreached else EXIT_OK


async def cmd_status(fleet: Fleet, ns: argparse.Namespace, tail: list[str]) -> int:
    if fleet.alone is not None:
        return await output.cmd_status(fleet.alone, ns, tail)
    answers = await fleet.each(lambda client: client.status(ended=None if ns.all else ns.limit, page=ns.page))
    found = jobs.gather((m.name, result["runs"]) for m, result in zip(fleet.members, answers, strict=True) if result)
    down = {m.name: m.error_at for m in fleet.members if m.error_at is not None}
    if ns.json:
        hosts = [host_json(m, result) for m, result in zip(fleet.members, answers, strict=True)]
        dump({"hosts": hosts, "jobs": jobs.jobs_json(found, down)})
        return code(fleet)
    sections = [f"== jobs\n{jobs.jobs_text(found, down)}"] if found else []
    sections += [section(m, result, render.status_text) for m, result in zip(fleet.members, answers, strict=True)]
    out("\n\n".join(sections))
    return code(fleet)


def section(member: Member, result: Any, text: Callable[[Any], str]) -> str:
    """One host's part of the answer, or why it has none."""
    if result is None:
        return f"== {member.name}: {'' if member.silent else 'cannot be reached: '}{member.error}"
    return f"== {member.name}\n{text(result)}"


async def cmd_free_gpus(fleet: Fleet, ns: argparse.Namespace, _: list[str]) -> int:
    if fleet.alone is None:  # several hosts: each plan (`check` lets nothing else through)
        answers = await fleet.each(lambda client: actions.free_gpus_plan(client, ns.gpus))
        if ns.json:
            dump({"hosts": [host_json(m, result) for m, result in zip(fleet.members, answers, strict=True)]})
        else:
            out("\n\n".join(section(m, r, render.free_text) for m, r in zip(fleet.members, answers, strict=True)))
        return code(fleet)
    client = fleet.alone
    plan = await actions.free_gpus_plan(client, ns.gpus)
    victims = actions.to_kill(plan)
    if ns.dry_run or not victims:
        dump(plan) if ns.json else out(render.free_text(plan))
        return EXIT_OK
    if not ns.yes:
        if not sys.stdin.isatty():
            raise UsageError("free-gpus would kill processes: add --yes, or --dry-run to see the plan")
        out(render.free_text(plan))
        answer = input(f"Kill {len(victims)} process(es)? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            out("nothing done")
            return EXIT_OK
    result = await actions.free_gpus(client, ns.gpus, ns.timeout)
    dump(result) if ns.json else out(render.free_text(result))
    return EXIT_FAILED if actions.survivors(result) else EXIT_OK


async def cmd_kill(fleet: Fleet, ns: argparse.Namespace, tail: list[str]) -> int:
    if fleet.alone is not None:
        return await output.cmd_kill(fleet.alone, ns, tail)
    answers = await actions.kill_job(fleet, ns.run, ns.signal, ns.grace)
    if ns.json:
        killed = [None if result is None else {"killed": result} for result in answers]
        dump({"hosts": [host_json(m, result) for m, result in zip(fleet.members, killed, strict=True)]})
    for member, result in zip(fleet.members, answers, strict=True) if not ns.json else ():
        if result is None:
            out(f"== {member.name}: cannot be reached: {member.error}")
        elif result:
            out(f"== {member.name}\n" + "\n".join(render.kill_text(killed) for killed in result))
    if not any(answers) and not fleet.unreached:
        hosts = ", ".join(member.name for member in fleet.members)
        note(f"no live run of job {ns.run} on {hosts}: `status` lists the jobs")
        return EXIT_FAILED
    return code(fleet)


async def cmd_relaunch(fleet: Fleet, ns: argparse.Namespace, _: list[str]) -> int:
    edit = actions.Edit(ns.sets, ns.unsets, ns.grace, ns.force)
    if fleet.alone is not None:
        return await relaunch_run(fleet.alone, ns, edit)
    try:
        nodes = await actions.job_nodes(fleet, ns.run)
    except actions.Refused as exc:
        return refused(fleet, exc)
    if ns.dry_run:
        previews = await asyncio.gather(*(actions.preview(m.client, run["id"], edit) for m, run in nodes))
        for (member, run), preview in zip(nodes, previews, strict=True):
            out(f"== {member.name}: node {run['job']['node_rank']}\n{render.relaunch_preview(preview)}")
        return EXIT_OK
    started = await actions.relaunch_nodes([(m.client, run) for m, run in nodes], edit)
    failed = False
    for (member, run), result in zip(nodes, started, strict=True):
        rank = run["job"]["node_rank"]
        if isinstance(result, Exception):
            member.say(f"node {rank}: run {run['id']} was not relaunched: {result}")
            failed = True
        elif result["error"]:
            member.say(f"node {rank}: run {result['run']} failed to start: {result['error']}")
            failed = True
        else:
            member.say(f"node {rank}: run {result['run']} (from {run['id']})")
    if ns.json:
        dump([result if isinstance(result, dict) else {"error": str(result)} for result in started])
    else:
        out(ns.run)
    return EXIT_FAILED if failed else EXIT_OK


async def relaunch_run(client: AgentOps, ns: argparse.Namespace, edit: actions.Edit) -> int:
    if ns.dry_run:
        preview = await actions.preview(client, ns.run, edit)
        dump(preview) if ns.json else out(render.relaunch_preview(preview))
        return EXIT_OK
    result = await actions.relaunch(client, ns.run, edit)
    if result["stopped_parent"] and not ns.json:
        out(render.kill_text(result["stopped_parent"]))
    return report_launched(result, ns.json)


async def cmd_watch(fleet: Fleet, ns: argparse.Namespace, _: list[str]) -> int:
    """Each run's changes of state, one timed line each, across lost connections, until Ctrl-C; over several
    hosts it ends only when every host's watch has stopped for good."""
    if fleet.alone is not None:
        await watch_runs(fleet.alone, ns.interval, ns.json, note)
        return EXIT_OK
    await asyncio.gather(*(watch(member, ns) for member in fleet.members))
    return code(fleet)


async def watch(member: Member, ns: argparse.Namespace) -> None:
    """The host's changes of state, each line labelled with the host, until Ctrl-C; a host down (at the start
    too) or not answering is said and reconnected with backoff while the others go on. A failure retrying
    cannot help (a refused host key; a link lost the same way right after each of three reconnects, as one
    host's watch alone would stop; a status the agent refuses) is said, and ends this host's watch only."""
    try:
        try:
            await member.client.start()
        except TransportError as exc:
            if not exc.transient:
                raise
            member.say(f"cannot be reached ({exc}); trying again while the other hosts go on")
            await member.client.reconnect_until_back(lambda _exc: None)
            member.say("reached")
        await watch_runs(member.client, ns.interval, ns.json, member.say, member.name)
    except (AgentError, TransportError) as exc:
        member.error, member.error_at = str(exc), time.time()
        member.say(f"{exc}; no longer watched (the other hosts go on)")


def report_launched(result: LaunchResult, as_json: bool) -> int:
    """Print a new run's id (or the whole reply as JSON); fail when it could not start."""
    verdict, flags = result.get("doctor"), result.get("flags")
    if flags and not as_json:
        report(render.flags_text(flags))
    if verdict and verdict["findings"] and not as_json:
        report(doctor_text(verdict))
    if as_json:
        dump(result)
    else:
        out(result["run"])
    if result.get("error"):
        note(f"run {result['run']} failed to start: {result['error']}")
        return EXIT_FAILED
    return EXIT_OK


async def cmd_launch(fleet: Fleet, ns: argparse.Namespace, argv: list[str]) -> int:
    if not argv:
        raise UsageError("launch needs the command after '--', e.g. launch command -- python train.py")
    if ns.sglang_python is not None and ns.kind != "serve":
        why = f"--sglang-python names the Python of SGLang's server: it goes with launch serve, not {ns.kind}"
        raise UsageError(why)
    run = actions.RunOptions(ns.name, dict(ns.env), ns.cwd or os.getcwd(), ns.gpus, ns.force)
    command = actions.Command(
        ns.kind, argv, ns.health_url, ns.metrics_url, ns.sglang_python, ns.metrics_from, launched_node(ns), run
    )
    return report_launched(await actions.launch(fleet.only, command), ns.json)


def launched_node(ns: argparse.Namespace) -> JobNode | None:
    """`launch --job NAME --node-rank R --nnodes N`: the node it names, or None without them."""
    given = (ns.job, ns.node_rank, ns.nnodes)
    if all(value is None for value in given):
        return None
    if any(value is None for value in given):
        raise UsageError("a node of a job takes --job NAME, --node-rank R and --nnodes N together")
    if not 0 <= ns.node_rank < ns.nnodes:
        raise UsageError(f"--node-rank is 0 to {ns.nnodes - 1} for --nnodes {ns.nnodes}")
    return {"id": ns.job, "node_rank": ns.node_rank, "nnodes": ns.nnodes}


def launched(ns: argparse.Namespace, tail: list[str]) -> actions.Ours:
    """What `extract`/`train` (`ns` holding the run options that `main` took out of the stage's words, `tail` the
    stage's own) or `serve` (`tail` its extra server flags) launches."""
    if ns.command == "serve":
        run = actions.RunOptions(ns.name, dict(ns.env), os.getcwd(), ns.gpus, ns.force)
        return actions.Serve(ns.target, ns.draft, tail, ns.python, ns.port, not ns.no_metrics, ns.sglang_python, run)
    run = actions.RunOptions(ns.name, dict(ns.env), ns.cwd or os.getcwd(), ns.gpus)
    return actions.Stage(ns.command, tail, ns.python, ns.nproc, run)


async def cmd_launched(fleet: Fleet, ns: argparse.Namespace, tail: list[str]) -> int:
    """`extract`, `train` and `serve`: on one host, or with --nodes as a job with a node per host."""
    what = launched(ns, tail)
    if ns.nodes is not None and (ns.nodes > 1 or fleet.named):
        return await launch_job(fleet, ns, what)
    member = fleet.only
    code = report_launched(result := await actions.launch(member, what), as_json=False)
    if code != EXIT_OK or not ns.follow:
        return code
    return await follow_launched(member.client, what, result["run"])


async def follow_launched(client: AgentClient, what: actions.Ours, run: str) -> int:
    """A server followed to its readiness, a stage to its end."""
    return await (follow_startup(client, run) if isinstance(what, actions.Serve) else follow_metrics(client, run))


async def launch_job(fleet: Fleet, ns: argparse.Namespace, what: actions.Ours) -> int:
    """`a,b train --nodes 2 ...`: the job, its id on stdout, each node's fate said; node 0 followed with --follow."""
    try:
        job = await actions.launch_job(fleet, what, ns.rdzv_host)
    except actions.Refused as exc:
        return refused(fleet, exc)
    out(job.id)
    note(
        f"job {job.id}: {len(job.nodes)} nodes meeting at {job.meeting} ({job.engine}); `kill {job.id}` stops them all"
    )
    for node in job.nodes:
        node.member.say(f"node {node.rank}: {node.said}")
    if not job.whole:
        note(f"job {job.id} did not start on every node; the nodes that had started were stopped")
        return EXIT_FAILED
    first = job.nodes[0]
    assert first.started is not None
    return await follow_launched(first.member.client, what, first.started["run"]) if ns.follow else EXIT_OK


async def watch_runs(
    client: AgentClient, interval: float, as_json: bool, say: Callable[[str], None], host: str | None = None
) -> None:
    """Look every `interval` s and print what changed; `host` labels each line and run (several hosts). A lost link
    is reconnected, a status the agent failed to give asked again (each said); one it refuses for good is raised."""
    states: dict[str, str] | None = None
    told: str | None = None  # the failure of the agent's last said: said again only when it changes
    while True:
        try:
            runs = (await client.status(gpus=False))["runs"]
        except TransportError as exc:
            await reconnect_and_say(client, say, str(exc), "changes meanwhile follow")
            continue
        except AgentError as exc:
            if lasting(exc):
                raise
            if exc.message != told:
                told = exc.message
                say(f"status failed ({exc.message}); asking again every {interval:g} s")
            await asyncio.sleep(interval)
            continue
        told = None
        if states is None:
            live = sum(run["state"] not in TERMINAL_STATES for run in runs)
            say(f"watching {len(runs)} runs ({live} live); Ctrl-C to stop")
        if host is not None:
            for run in runs:
                run["host"] = host  # the JSON line says whose it is
        for line in watch_lines(states, runs, as_json):
            out(line if as_json or host is None else f"{host} {line}")
        states = {run["id"]: run["state"] for run in runs}
        await asyncio.sleep(interval)


def watch_lines(states: dict[str, str] | None, runs: Sequence[Mapping[str, Any]], as_json: bool) -> list[str]:
    """What `watch` prints for one look. The first (no `states` yet): the stalls it finds, or for a
    script every run, marked `first`; then each change, with where the stacks are or what to try."""
    now = time.time()
    if states is None:
        if as_json:
            return [
                json.dumps({"t": round(now, 3), "first": True, "from": None, "to": r["state"], "run": r}) for r in runs
            ]
        return [
            f"{render.clock(now)} {line}" for line in render.run_notes([r for r in runs if r["state"] == "stalled"])
        ]
    by_id = {run["id"]: run for run in runs}
    lines: list[str] = []
    for change in render.state_changes(states, runs):
        run = by_id[change.run_id]
        if as_json:
            lines.append(json.dumps({"t": round(now, 3), "from": change.was, "to": run["state"], "run": run}))
        else:
            lines.append(f"{render.clock(now)} {change.text}")
            lines.extend(f"    {line}" for line in render.run_notes([run], failures=False))
    return lines


def handler_for(command: str) -> FleetHandler:
    """What `command` does over its fleet: its own handler here, or a command of one host run on the fleet's host."""
    one_host: dict[str, Handler] = {"stacks": output.cmd_stacks, **commands.HANDLERS}
    return HANDLERS.get(command) or on_one_host(one_host[command])


def list_hosts(settings: config.Config, as_json: bool) -> int:
    """`eagle3-console hosts`: each host a fleet can be made of, where it is, what it sets."""
    hosts = config.known_hosts(settings)
    if as_json:
        dump([dataclasses.asdict(host) for host in hosts])
    elif hosts:
        settings_of = {host.name: " ".join(f"{key}={value}" for key, value in host.settings.items()) for host in hosts}
        rows = [[h.name, h.address, h.source, settings_of[h.name], h.description] for h in hosts]
        out(render.table(["HOST", "ADDRESS", "FROM", "SETTINGS", "DESCRIPTION"], rows))
    else:
        out(f"no hosts yet: name them in {settings.path}, or as Host entries in ~/.ssh/config")
    return EXIT_OK


HANDLERS: dict[str, FleetHandler] = {
    "status": cmd_status,
    "watch": cmd_watch,
    "kill": cmd_kill,
    "relaunch": cmd_relaunch,
    "free-gpus": cmd_free_gpus,
    "launch": cmd_launch,
    "serve": cmd_launched,
    "extract": cmd_launched,
    "train": cmd_launched,
}
