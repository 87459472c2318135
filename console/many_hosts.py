"""`status`, `watch` and `free-gpus --dry-run` over several hosts at once: HOST as `a,b`, or a [groups] name of
config.toml (a group of one too: a script gets the same shape of answer whatever the group's size).

Each host is reached on its own connection with its own settings, and every line or JSON object says which
host it is about; a host that cannot be reached is said (and fails the exit code) without hiding the others,
and `watch` reconnects each host on its own.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from backends.protocol import TERMINAL_STATES, KillResult
from console import config, jobs, render
from console.args import UsageError
from console.client import AgentClient
from console.errors import AgentError, TransportError
from console.output import EXIT_FAILED, EXIT_OK, dump, note, out
from console.transport import Transport
from console.watching import watch_runs

COMMANDS = ("status", "watch", "free-gpus", "kill")
TransportFor = Callable[[argparse.Namespace], Transport]  # a host's transport, given its options


def check(ns: argparse.Namespace, tail: list[str]) -> None:
    """UsageError unless the command is one that several hosts can answer."""
    if ns.command is None:
        raise UsageError("the terminal console opens one host; for several, give status, watch or free-gpus --dry-run")
    if ns.command in ("train", "extract"):
        raise UsageError(f"{ns.command} over several hosts is a job: give --nodes N, one node per host")
    if ns.command not in COMMANDS or tail:
        raise UsageError(
            f"{ns.command} works on one host; status, watch, free-gpus --dry-run and kill JOB take several"
        )
    if ns.command == "free-gpus" and not ns.dry_run:
        raise UsageError("free-gpus kills on one host at a time; with several hosts, --dry-run shows each plan")
    if ns.command == "status" and ns.run is not None:
        raise UsageError("status RUN names a run of one host; give that host alone")


@dataclass
class Link:
    """One host of the command: its name as given, its options (config.toml's applied), its client once up."""

    name: str
    ns: argparse.Namespace
    client: AgentClient
    error: str | None = None

    def say(self, text: str) -> None:
        note(f"{self.name}: {text}")


def links(ns: argparse.Namespace, hosts: list[str], settings: config.Config, transport: TransportFor) -> list[Link]:
    made = []
    for name in hosts:
        own = argparse.Namespace(**vars(ns))
        own.host = name
        config.apply_settings(own, settings)
        made.append(Link(name, own, AgentClient(transport(own))))
    return made


async def run(ns: argparse.Namespace, hosts: list[str], settings: config.Config, transport: TransportFor) -> int:
    """The command on every host; its exit code (EXIT_FAILED when any host could not answer)."""
    every = links(ns, hosts, settings, transport)
    try:
        if ns.command == "watch":
            await asyncio.gather(*(watch(link, ns) for link in every))
            return EXIT_OK

        if ns.command == "kill":
            return await kill_job(ns, every)

        async def ask(client: AgentClient) -> Any:
            if ns.command == "status":
                return await client.status()
            return await client.free_gpus(gpus=ns.gpus, dry_run=True, timeout=ns.timeout)

        answers = await asyncio.gather(*(answer(link, ask) for link in every))
        report(ns, every, answers)
        return EXIT_FAILED if any(link.error for link in every) else EXIT_OK
    finally:
        await asyncio.gather(*(link.client.close() for link in every), return_exceptions=True)


async def answer(link: Link, ask: Callable[[AgentClient], Awaitable[Any]]) -> Any:
    """The host's answer; None, with `link.error` said, when it could not give one."""
    try:
        await link.client.start()
        return await ask(link.client)
    except (TransportError, AgentError) as exc:
        link.error = str(exc)
        return None


def report(ns: argparse.Namespace, every: list[Link], answers: list[Any]) -> None:
    found = jobs.gather((link.name, result["runs"]) for link, result in zip(every, answers, strict=True) if result)
    if ns.json:
        hosts = [host_json(link, result) for link, result in zip(every, answers, strict=True)]
        dump({"hosts": hosts, "jobs": jobs.jobs_json(found)} if ns.command == "status" else {"hosts": hosts})
        return
    sections = [f"== jobs\n{jobs.jobs_text(found)}"] if found and ns.command == "status" else []
    for link, result in zip(every, answers, strict=True):
        if result is None:
            sections.append(f"== {link.name}: cannot be reached: {link.error}")
        elif ns.command == "status":
            sections.append(f"== {link.name}\n{render.status_text(result)}")
        else:
            sections.append(f"== {link.name}\n{render.free_text(result)}")
    out("\n\n".join(sections))


def host_json(link: Link, result: Any) -> dict[str, Any]:
    """One host's part of the JSON: its answer, each run and GPU marked with the host; or why there is none."""
    if result is None:
        return {"host": link.name, "ok": False, "error": link.error}
    for item in (*result.get("runs", ()), *result.get("gpus", ())):
        item["host"] = link.name
    return {"host": link.name, "ok": True, "result": result}


async def watch(link: Link, ns: argparse.Namespace) -> None:
    """The host's changes of state, each line labelled with the host, until Ctrl-C; a host down (at the start
    too) is said and reconnected with backoff while the others go on."""
    try:
        await link.client.start()
    except TransportError as exc:
        link.say(f"cannot be reached ({exc}); trying again while the other hosts go on")
        await link.client.reconnect_until_back(lambda _exc: None)
        link.say("reached")
    await watch_runs(link.client, ns, link.say, link.name)


async def kill_job(ns: argparse.Namespace, every: list[Link]) -> int:
    """`kill JOB` over the hosts: every live run of the job, on every host, each with its host's kill."""

    async def kill_here(client: AgentClient) -> list[KillResult]:
        runs = (await client.status(gpus=False))["runs"]
        mine = [r for r in runs if "job" in r and r["job"]["id"] == ns.run and r["state"] not in TERMINAL_STATES]
        return [await client.kill(r["id"], signal=ns.signal, grace=ns.grace) for r in mine]

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
