"""One connection per host for the commands that span several (`console.cli.many_hosts`, `console.cli.job_launch`,
`console.fleet.job_actions`): each host with its own settings, its own client, and the error that kept it out.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from console.cli import config
from console.cli.output import note
from console.errors import AgentError, TransportError
from console.link.client import AgentClient
from console.link.deadlines import NoAnswer
from console.link.transport import Transport

TransportFor = Callable[[argparse.Namespace], Transport]  # a host's transport, given its options


@dataclass
class Link:
    """One host of the command: its name as given, its options (config.toml's applied), its client once up."""

    name: str
    ns: argparse.Namespace
    client: AgentClient
    error: str | None = None
    error_at: float | None = None  # when it was found unreachable (time.time())
    silent: bool = False  # reached, but it did not answer in time (the error says which call)

    def say(self, text: str) -> None:
        note(f"{self.name}: {text}")


def links(ns: argparse.Namespace, hosts: list[str], settings: config.Config, transport: TransportFor) -> list[Link]:
    made = []
    for name in hosts:
        own = argparse.Namespace(**vars(ns))
        own.host = name
        config.apply_settings(own, settings)
        link = Link(name, own, AgentClient(transport(own), own.timeout_s))
        link.client.say = link.say
        made.append(link)
    return made


async def answer(link: Link, ask: Callable[[AgentClient], Awaitable[Any]]) -> Any:
    """The host's answer; None, with `link.error` said, when it could not give one."""
    try:
        await link.client.start()
        return await ask(link.client)
    except (TransportError, AgentError) as exc:
        link.error, link.error_at, link.silent = str(exc), time.time(), isinstance(exc, NoAnswer)
        return None


def host_json(link: Link, result: Any) -> dict[str, Any]:
    """One host's part of the JSON: its answer, each run and GPU marked with the host; or why there is none."""
    if result is None:
        return {"host": link.name, "ok": False, "error": link.error}
    for item in (*result.get("runs", ()), *result.get("gpus", ())):
        item["host"] = link.name
    return {"host": link.name, "ok": True, "result": result}
