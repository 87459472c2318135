"""A multi-node job's actions over its hosts: `kill JOB` stops every node on every host; `relaunch JOB` stops
them all, then starts each node again with the same flag edit (same job id, same meeting point), so that no new
node meets an old one.
"""

from __future__ import annotations

import argparse
import asyncio

from backends.protocol import TERMINAL_STATES, KillResult, RelaunchResult, RunInfo
from console import render
from console.cli.output import EXIT_FAILED, EXIT_OK, dump, note, out
from console.fleet import jobs
from console.fleet.links import Link, answer, host_json
from console.link.client import AgentClient
from console.link.ops import AgentOps


async def job_runs(client: AgentClient, job: str) -> list[RunInfo]:
    """The host's runs of the job: of each node, its newest, by rank."""
    found = jobs.gather([("", (await client.list_runs())["runs"])])
    return next(([node.run for node in each.nodes] for each in found if each.id == job), [])


def live(run: RunInfo) -> bool:
    return run["state"] not in TERMINAL_STATES


async def kill_job(ns: argparse.Namespace, every: list[Link]) -> int:
    """`kill JOB` over the hosts: every live run of the job, on every host, each with its host's kill."""

    async def kill_here(client: AgentClient) -> list[KillResult]:
        mine = [run for run in await job_runs(client, ns.run) if live(run)]
        return list(await asyncio.gather(*(client.kill(r["id"], signal=ns.signal, grace=ns.grace) for r in mine)))

    answers = await asyncio.gather(*(answer(link, kill_here) for link in every))
    if ns.json:
        killed = [None if result is None else {"killed": result} for result in answers]
        dump({"hosts": [host_json(link, result) for link, result in zip(every, killed, strict=True)]})
    for link, result in zip(every, answers, strict=True) if not ns.json else ():
        if result is None:
            out(f"== {link.name}: cannot be reached: {link.error}")
        elif result:
            out(f"== {link.name}\n" + "\n".join(render.kill_text(killed) for killed in result))
    if not any(answers) and not any(link.error for link in every):
        note(f"no live run of job {ns.run} on {', '.join(link.name for link in every)}: `status` lists the jobs")
        return EXIT_FAILED
    return EXIT_FAILED if any(link.error for link in every) else EXIT_OK


async def relaunch_job(ns: argparse.Namespace, every: list[Link]) -> int:
    """`relaunch JOB [--set F] [--unset F]` over the hosts: every node stopped, then each started again with the
    same edit; with --dry-run, each node's new command line, nothing stopped."""
    found = await asyncio.gather(*(answer(link, lambda client: job_runs(client, ns.run)) for link in every))
    if down := [link for link in every if link.error]:
        for link in down:
            link.say(f"cannot be reached: {link.error}")
        note(f"nothing relaunched: job {ns.run} relaunches only when every host answers")
        return EXIT_FAILED
    nodes = [(link, run) for link, runs in zip(every, found, strict=True) for run in runs]
    gathered = jobs.gather((link.name, runs) for link, runs in zip(every, found, strict=True))
    if not gathered:
        note(f"no job {ns.run} on {', '.join(link.name for link in every)}: `status` lists the jobs")
        return EXIT_FAILED
    if missing := gathered[0].missing:
        absent = ", ".join(f"node {rank}" for rank in missing)
        note(f"job {ns.run} has no run of {absent} on these hosts: give every host of the job")
        return EXIT_FAILED
    change = {"set": ns.sets, "unset": ns.unsets, "grace": ns.grace, "force": ns.force}
    if ns.dry_run:
        previews = await asyncio.gather(
            *(link.client.relaunch(run["id"], **change, dry_run=True) for link, run in nodes)
        )
        for (link, run), preview in zip(nodes, previews, strict=True):
            out(f"== {link.name}: node {run['job']['node_rank']}\n{render.relaunch_preview(preview)}")
        return EXIT_OK
    started = await stop_then_relaunch(
        [(link.client, run) for link, run in nodes], ns.sets, ns.unsets, ns.grace, ns.force
    )
    return report_relaunched(ns, nodes, started)


async def stop_then_relaunch(
    nodes: list[tuple[AgentOps, RunInfo]], sets: list[str], unsets: list[str], grace: float, force: bool = False
) -> list[RelaunchResult | BaseException]:
    """Each node's run relaunched with the same edit, every live one stopped first: a new node must never meet
    an old one at the rendezvous. Each node's outcome, in order (an exception where it could not start)."""
    await asyncio.gather(*(client.kill(run["id"], grace=grace) for client, run in nodes if live(run)))
    asked = (client.relaunch(run["id"], set=sets, unset=unsets, grace=grace, force=force) for client, run in nodes)
    return list(await asyncio.gather(*asked, return_exceptions=True))


def report_relaunched(
    ns: argparse.Namespace, nodes: list[tuple[Link, RunInfo]], started: list[RelaunchResult | BaseException]
) -> int:
    failed = False
    for (link, run), result in zip(nodes, started, strict=True):
        rank = run["job"]["node_rank"]
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result
            link.say(f"node {rank}: run {run['id']} was not relaunched: {result}")
            failed = True
        elif result["error"]:
            link.say(f"node {rank}: run {result['run']} failed to start: {result['error']}")
            failed = True
        else:
            link.say(f"node {rank}: run {result['run']} (from {run['id']})")
    if ns.json:
        dump([result if isinstance(result, dict) else {"error": str(result)} for result in started])
    else:
        out(ns.run)
    return EXIT_FAILED if failed else EXIT_OK
