"""`eagle3-console a,b train --nodes 2 ...`: one of our stages as a multi-node job, a node per host in host
order, every node's torchrun meeting at the first host (its rendezvous on a port free there; backends.runs.job
says which backend and why); the same job id on every host, so that `status` shows the job and `kill JOB` stops
it everywhere.

All hosts are reached before anything starts: a job missing a node would wait out the rendezvous for nothing.
A node that cannot start stops the nodes already started, for the same reason.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import secrets
from collections.abc import Awaitable, Callable

from backends.protocol import JobNode, LaunchResult
from console import actions
from console.cli import config
from console.cli.grammar import UsageError
from console.cli.output import EXIT_FAILED, EXIT_OK, note, out
from console.errors import AgentError, TransportError
from console.fleet.links import Link, TransportFor, answer, links
from console.link.client import AgentClient

Follow = Callable[[AgentClient, argparse.Namespace, str], Awaitable[int]]  # node 0's run followed; the exit code


def check(ns: argparse.Namespace, hosts: list[str]) -> None:
    if ns.nodes != len(hosts):
        raise UsageError(
            f"--nodes {ns.nodes} runs one node per host: give {ns.nodes} hosts (a,b or a group), not {len(hosts)}"
        )


def job_id(ns: argparse.Namespace) -> str:
    """The job's id: its name (or the stage's) in the letters a job id takes, and a random tail, so that two
    launches never share a rendezvous."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", ns.name or ns.command).strip("-._")[:40] or ns.command
    return f"{name}-{secrets.token_hex(3)}"


async def launch_job(
    ns: argparse.Namespace,
    tail: list[str],
    hosts: list[str],
    settings: config.Config,
    transport: TransportFor,
    follow: Follow,
) -> int:
    """The job of `ns.command` (a stage, or serve) over `hosts`, `tail` its stage words or extra server flags."""
    check(ns, hosts)
    every = links(ns, hosts, settings, transport)
    try:
        await asyncio.gather(*(answer(link, lambda client: client.hello()) for link in every))
        if down := [link for link in every if link.error]:
            for link in down:
                link.say(f"cannot be reached: {link.error}")
            note("nothing launched: a job starts only when every node's host answers")
            return EXIT_FAILED
        meet = await every[0].client.rendezvous()
        endpoint = f"{ns.rdzv_host or meet['address']}:{meet['port']}"
        name = job_id(ns)
        results = await asyncio.gather(
            *(
                launch_node(link, tail, {"id": name, "node_rank": rank, "nnodes": len(every)}, endpoint)
                for rank, link in enumerate(every)
            ),
            return_exceptions=True,
        )
        out(name)
        engine = "SGLang's --dist-init-addr" if ns.command == "serve" else "torchrun"
        note(f"job {name}: {len(every)} nodes meeting at {endpoint} ({engine}); `kill {name}` stops them all")
        started = []
        for rank, (link, result) in enumerate(zip(every, results, strict=True)):
            launched, said = outcome(result)
            link.say(f"node {rank}: {said}")
            if launched is not None:
                started.append((link, launched))
        if len(started) < len(every):
            await stop(started)
            note(f"job {name} did not start on every node; the nodes that had started were stopped")
            return EXIT_FAILED
        return await follow(every[0].client, ns, started[0][1]["run"]) if ns.follow else EXIT_OK
    finally:
        await asyncio.gather(*(link.client.close() for link in every), return_exceptions=True)


async def launch_node(link: Link, tail: list[str], node: JobNode, endpoint: str) -> LaunchResult:
    if link.ns.command == "serve":
        return await actions.launch_serve(link.client, link.ns, tail, node, endpoint)
    return await actions.launch_stage(link.client, link.ns, tail, node, endpoint)


def outcome(result: LaunchResult | BaseException) -> tuple[LaunchResult | None, str]:
    """The node's run when it started, and what to say of it."""
    if isinstance(result, (AgentError, TransportError)):
        return None, f"did not start: {result}"
    if isinstance(result, BaseException):
        raise result
    if result["error"]:
        return None, f"run {result['run']} failed to start: {result['error']}"
    return result, f"run {result['run']}"


async def stop(started: list[tuple[Link, LaunchResult]]) -> None:
    await asyncio.gather(*(link.client.kill(result["run"]) for link, result in started), return_exceptions=True)
