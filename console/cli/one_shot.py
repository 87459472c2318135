"""The commands answered by one request (`status`, `stacks`, `kill`): nothing streams, so they run on either
client, the asyncio one or the blocking one of `console.cli.quick`, and import no event loop themselves."""

from __future__ import annotations

import argparse
import sys

from console import render
from console.cli.output import EXIT_FAILED, EXIT_OK, dump, note, out
from console.link.ops import AgentOps
from console.render import bench_lines
from console.visible import visible


async def cmd_status(client: AgentOps, ns: argparse.Namespace, _: list[str]) -> int:
    if ns.run is not None:
        run = await client.run_info(ns.run)
        dump(run) if ns.json else out("\n".join([render.run_text(run), *bench_lines(run.get("bench"))]))
        return EXIT_OK
    status = await client.status()
    if ns.json:
        dump(status)
    else:
        out(render.status_text(status))
    return EXIT_OK


async def cmd_stacks(client: AgentOps, ns: argparse.Namespace, _: list[str]) -> int:
    result = await client.stacks(ns.run, now=ns.now)
    note(f"{result['file']} (taken {render.clock(result['taken_at'])})")
    sys.stdout.write(visible(result["text"]))  # frames name the run's argv and files: shown, never obeyed
    return EXIT_OK


async def cmd_kill(client: AgentOps, ns: argparse.Namespace, _: list[str]) -> int:
    result = await client.kill(ns.run, signal=ns.signal, grace=ns.grace)
    if ns.json:
        dump(result)
    else:
        out(render.kill_text(result))
    return EXIT_OK if all(p["died"] for p in result["processes"]) else EXIT_FAILED
