"""`watch`: each run's changes of state as timed lines (or JSON objects), across lost connections, until Ctrl-C;
over one host, or labelled with each of several (`console.cli.many_hosts`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from backends.protocol import TERMINAL_STATES
from console import render
from console.cli.output import out
from console.errors import TransportError
from console.link.client import AgentClient, reconnect_and_say


async def watch_runs(
    client: AgentClient, ns: argparse.Namespace, say: Callable[[str], None], host: str | None = None
) -> None:
    """Look every `ns.interval` s and print what changed; `host` labels each line and run (several hosts)."""
    states: dict[str, str] | None = None
    while True:
        try:
            runs = (await client.status(gpus=False))["runs"]
        except TransportError as exc:
            await reconnect_and_say(client, say, str(exc), "changes meanwhile follow")
            continue
        if states is None:
            live = sum(run["state"] not in TERMINAL_STATES for run in runs)
            say(f"watching {len(runs)} runs ({live} live); Ctrl-C to stop")
        if host is not None:
            for run in runs:
                run["host"] = host  # the JSON line says whose it is
        for line in watch_lines(states, runs, ns.json):
            out(line if ns.json or host is None else f"{host} {line}")
        states = {run["id"]: run["state"] for run in runs}
        await asyncio.sleep(ns.interval)


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
