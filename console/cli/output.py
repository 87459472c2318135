"""What a command prints and the code it exits with: data on stdout, one line for the person on stderr; and the
commands answered by one request (`status`, `stacks`, `kill`), which print their answer and are done. Nothing of
theirs streams, so they run on either client: the asyncio one of the command line, or the blocking one of
`console.cli.quick`, and import no event loop themselves.

Exit codes: 0 ok, 1 the operation failed, 2 usage error; every failure is one line on stderr that says what
happened and what to do.
"""

from __future__ import annotations

import argparse
import json
import sys

from backends.protocol import TERMINAL_STATES, DoctorResult
from console import render
from console.link.transport import AgentError, AgentOps, TransportError
from console.visible import printable, visible

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def note(text: str) -> None:
    """A line for the person watching, on stderr (stdout stays the data); what a run wrote into it is shown, never
    acted on by the terminal (see console.visible), as in everything below."""
    print(f"eagle3-console: {printable(text)}", file=sys.stderr, flush=True)


def out(text: str) -> None:
    print(visible(text), flush=True)


def report(text: str) -> None:
    """Lines for the person on stderr (the findings behind a refusal), stdout kept for the data."""
    print(visible(text), file=sys.stderr, flush=True)


def dump(obj: object) -> None:
    out(json.dumps(obj, indent=2))


def doctor_text(result: DoctorResult) -> str:
    """doctor's findings as text; its rules are imported only when there are findings to show (every other
    command would pay for them at start-up)."""
    from backends.doctor.report import format_result

    return format_result(result)


def failed(exc: AgentError | TransportError) -> int:
    """Say why a request failed (with doctor's findings when they are the reason); the exit code."""
    if isinstance(exc, TransportError):
        note(str(exc))
        return EXIT_FAILED
    if exc.code in ("doctor_refused", "flags_refused") and exc.details:
        report(doctor_text(exc.details))
    note(exc.message)
    return EXIT_USAGE if exc.code in ("bad_args", "unknown_op") else EXIT_FAILED


async def cmd_status(client: AgentOps, ns: argparse.Namespace, _: list[str]) -> int:
    if ns.run is not None:
        run = await client.run_info(ns.run)
        dump(run) if ns.json else out("\n".join([render.run_text(run), *render.bench_lines(run.get("bench"))]))
        return EXIT_OK
    status = await client.status(ended=None if ns.all else ns.limit, page=ns.page)
    # The same keys from an agent that pages nothing (of this protocol, from before): it listed every run.
    status.setdefault("ended_total", sum(run["state"] in TERMINAL_STATES for run in status["runs"]))
    status.setdefault("hidden", 0)
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
