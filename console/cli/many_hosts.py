"""`status`, `watch` and `free-gpus --dry-run` over several hosts at once, and `kill`/`relaunch` of a multi-node
job (`console.fleet.job_actions`): HOST as `a,b`, or a [groups] name of config.toml (a group of one too: a script gets
the same shape of answer whatever the group's size).

Each host is reached on its own connection with its own settings, and every line or JSON object says which
host it is about; a host that cannot be reached is said (and fails the exit code) without hiding the others,
and `watch` reconnects each host on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from console import render
from console.cli import config
from console.cli.grammar import UsageError
from console.cli.output import EXIT_FAILED, EXIT_OK, dump, out
from console.cli.watch import watch_runs
from console.errors import TransportError
from console.fleet import job_actions, jobs
from console.fleet.links import Link, TransportFor, answer, host_json, links
from console.link.client import AgentClient

COMMANDS = ("status", "watch", "free-gpus", "kill", "relaunch")


def check(ns: argparse.Namespace, tail: list[str]) -> None:
    """UsageError unless the command is one that several hosts can answer."""
    if ns.command in ("train", "extract"):
        raise UsageError(f"{ns.command} over several hosts is a job: give --nodes N, one node per host")
    if ns.command not in COMMANDS or tail:
        raise UsageError(
            f"{ns.command} works on one host; status, watch, free-gpus --dry-run and kill or relaunch JOB take several"
        )
    if ns.command == "free-gpus" and not ns.dry_run:
        raise UsageError("free-gpus kills on one host at a time; with several hosts, --dry-run shows each plan")
    if ns.command == "status" and ns.run is not None:
        raise UsageError("status RUN names a run of one host; give that host alone")


async def run(ns: argparse.Namespace, hosts: list[str], settings: config.Config, transport: TransportFor) -> int:
    """The command on every host; its exit code (EXIT_FAILED when any host could not answer)."""
    every = links(ns, hosts, settings, transport)
    try:
        if ns.command == "watch":  # it ends only when every host's watch has stopped for good
            await asyncio.gather(*(watch(link, ns) for link in every))
            return EXIT_FAILED if any(link.error for link in every) else EXIT_OK

        if ns.command == "kill":
            return await job_actions.kill_job(ns, every)
        if ns.command == "relaunch":
            return await job_actions.relaunch_job(ns, every)

        async def ask(client: AgentClient) -> Any:
            if ns.command == "status":
                return await client.status()
            return await client.free_gpus(gpus=ns.gpus, dry_run=True, timeout=ns.timeout)

        answers = await asyncio.gather(*(answer(link, ask) for link in every))
        report(ns, every, answers)
        return EXIT_FAILED if any(link.error for link in every) else EXIT_OK
    finally:
        await asyncio.gather(*(link.client.close() for link in every), return_exceptions=True)


def report(ns: argparse.Namespace, every: list[Link], answers: list[Any]) -> None:
    found = []
    if ns.command == "status":
        found = jobs.gather((link.name, result["runs"]) for link, result in zip(every, answers, strict=True) if result)
    down = {link.name: link.error_at for link in every if link.error_at is not None}
    if ns.json:
        hosts = [host_json(link, result) for link, result in zip(every, answers, strict=True)]
        dump({"hosts": hosts, "jobs": jobs.jobs_json(found, down)} if ns.command == "status" else {"hosts": hosts})
        return
    sections = [f"== jobs\n{jobs.jobs_text(found, down)}"] if found else []
    for link, result in zip(every, answers, strict=True):
        if result is None:
            sections.append(f"== {link.name}: {'' if link.silent else 'cannot be reached: '}{link.error}")
        elif ns.command == "status":
            sections.append(f"== {link.name}\n{render.status_text(result)}")
        else:
            sections.append(f"== {link.name}\n{render.free_text(result)}")
    out("\n\n".join(sections))


async def watch(link: Link, ns: argparse.Namespace) -> None:
    """The host's changes of state, each line labelled with the host, until Ctrl-C; a host down (at the start
    too) or not answering is said and reconnected with backoff while the others go on. A failure retrying
    cannot help (a refused host key; a link lost the same way right after each of three reconnects, as one
    host's watch alone would stop) is said, and ends this host's watch only."""
    try:
        try:
            await link.client.start()
        except TransportError as exc:
            if not exc.transient:
                raise
            link.say(f"cannot be reached ({exc}); trying again while the other hosts go on")
            await link.client.reconnect_until_back(lambda _exc: None)
            link.say("reached")
        await watch_runs(link.client, ns, link.say, link.name)
    except TransportError as exc:
        link.error, link.error_at = str(exc), time.time()
        link.say(f"{exc}; no longer watched (the other hosts go on)")
