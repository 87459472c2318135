"""`eagle3-console [--workdir DIR] HOST COMMAND ...`: the scriptable command line.

Exit codes: 0 ok, 1 the operation failed, 2 usage error; every failure is one
line on stderr that says what happened and what to do.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from backends.doctor import format_result
from backends.metrics_sources import parse_source
from backends.protocol import MIN_INTERVAL_S, RUN_KINDS, SIGNAL_NAMES, TERMINAL_STATES
from backends.sglang_facts import (
    DEFAULT_PORT,
    DRAFT_PATH_FLAGS,
    EAGLE3_ALGORITHM,
    PORT_FLAG,
    SERVER_MODULES,
    TARGET_PATH_FLAGS,
    TP_SIZE_FLAGS,
)
from console import render
from console.client import PAST_END, AgentClient, AgentError, follow, reconnect_and_say
from console.transport import LocalTransport, Transport, TransportError

if TYPE_CHECKING:
    from console.host_keys import TrustNewKey

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
STAGES = ("extract", "train")
# A subscription offset beyond any file: that stream sends nothing.


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def gpu_list(text: str) -> list[int]:
    try:
        gpus = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU list like 0,1,3") from None
    if any(g < 0 for g in gpus):
        raise argparse.ArgumentTypeError("GPU indices cannot be negative")
    return gpus


def env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def seconds(text: str) -> float:
    """A time in seconds, 0 or more: not nan, not inf."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    if value < 0:
        raise argparse.ArgumentTypeError("seconds cannot be negative")
    return value


def stall_window(text: str) -> float:
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("a stall window is more than 0 seconds")
    return value


def interval(text: str) -> float:
    value = seconds(text)
    if value < MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"give at least {MIN_INTERVAL_S} s: a shorter interval only spins the host")
    return value


def metrics_source(text: str) -> str:
    try:
        return parse_source(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> Parser:
    parser = Parser(
        prog="eagle3-console",
        description="Train, serve and debug EAGLE-3 drafts on a GPU host.",
        epilog="HOST is 'local' (this machine) or [user@]host[:port] (over SSH; ~/.ssh/config applies). "
        "Without a COMMAND the terminal console opens. "
        "Run 'eagle3-console HOST COMMAND --help' for a command's options.",
    )
    parser.add_argument("--workdir", type=Path, help="run store on the host (default ~/.eagle3-console)")
    parser.add_argument("--readonly", action="store_true", help="the console without kill, relaunch or free-gpus")
    parser.add_argument(
        "--remote-python",
        metavar="PATH",
        help="the host's Python (3.10 or newer) for the agent (default: python3 on the host's PATH)",
    )
    parser.add_argument(
        "--accept-new-host-key",
        action="store_true",
        help="trust a host key seen for the first time (its fingerprint is shown; a changed key is still refused)",
    )
    parser.add_argument("host", metavar="HOST", help="'local', or [user@]host[:port] over SSH")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    p = sub.add_parser("status", help="runs and GPUs; with RUN, that run whole")
    p.add_argument("run", nargs="?", metavar="RUN", help="one run, every field whole (the runs table cuts large ones)")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("launch", help="start a run: launch KIND [options] -- ARGV...")
    p.add_argument("kind", choices=RUN_KINDS)
    p.add_argument("--name", help="a name to find the run by")
    p.add_argument("--gpus", type=gpu_list, default=[], help="GPUs for CUDA_VISIBLE_DEVICES, e.g. 0,1")
    p.add_argument("--health-url", help="URL polled for health (serve runs)")
    p.add_argument("--stall-after", type=stall_window, help="seconds of silence before the run counts as stalled")
    p.add_argument("--env", type=env_pair, action="append", default=[], help="NAME=VALUE for the run (repeatable)")
    p.add_argument("--cwd", help="working directory of the run (default: the current one)")
    p.add_argument(
        "--metrics-from",
        type=metrics_source,
        metavar="SOURCE",
        help="where a train run's metrics come from: jsonl, specforge, speculators, eagle "
        "or tensorboard:DIR (DIR relative to the run's --cwd)",
    )
    p.add_argument("--force", action="store_true", help="launch even when doctor finds errors in the draft")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("watch", help="print every run's changes of state as they happen, until Ctrl-C")
    p.add_argument("--interval", type=interval, default=2.0, help="seconds between looks (default 2)")
    p.add_argument(
        "--json", action="store_true", help="one JSON object per change: t, from, to, and the run as status gives it"
    )

    p = sub.add_parser("stacks", help="every process's stack of a run: the latest dump, or a fresh one with --now")
    p.add_argument("run", metavar="RUN", help="run id, unique id prefix, or name")
    p.add_argument("--now", action="store_true", help="dump the live processes now (py-spy on the host)")

    p = sub.add_parser("kill", help="stop a run: SIGTERM, grace period, then SIGKILL")
    p.add_argument("run", metavar="RUN", help="run id, unique id prefix, or name")
    p.add_argument("--signal", choices=SIGNAL_NAMES, default="TERM")
    p.add_argument("--grace", type=seconds, default=10.0, help="seconds before SIGKILL (default 10)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("relaunch", help="start a copy of a run with flags changed (stops the old one)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="FLAG[=VALUE]")
    p.add_argument("--unset", dest="unsets", action="append", default=[], metavar="FLAG")
    p.add_argument("--grace", type=seconds, default=10.0)
    p.add_argument("--force", action="store_true", help="relaunch even when doctor finds errors in the draft")
    p.add_argument("--dry-run", action="store_true", help="show the new command line and its checks; stop nothing")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("free-gpus", help="kill your processes holding GPU memory")
    p.add_argument("--gpus", type=gpu_list, help="GPU indices (default: all)")
    p.add_argument("--dry-run", action="store_true", help="show the plan only")
    p.add_argument("--yes", action="store_true", help="do it without asking")
    p.add_argument("--timeout", type=seconds, default=15.0, help="seconds to wait for memory to be released")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("logs", help="a run's output")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--tail", type=int, help="only the last N lines")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")

    p = sub.add_parser("metrics", help="a run's metric rows")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--tail", type=int, help="only the last N rows")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing rows until the run ends")
    p.add_argument("--wide", action="store_true", help="with --follow: every column, per-position ones included")

    p = sub.add_parser("doctor", help="check a draft against its target, data and SGLang, from files alone")
    p.add_argument("draft", metavar="DRAFT", help="the draft folder (config.json + weights)")
    p.add_argument("--target", help="the target model folder")
    p.add_argument("--data", help="the extraction folder the draft was trained on")
    p.add_argument("--sglang-version", help="the SGLang release that will serve (default: the host's)")
    p.add_argument("--context-length", type=int, help="the --context-length the server will get")
    p.add_argument("--dry-load", action="store_true", help="also feed the draft to the host SGLang's own loader")
    p.add_argument(
        "--sglang-python",
        metavar="PATH",
        help="the host's Python that serves SGLang: its version and its loader (default: the agent's)",
    )
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("convert", help="convert a speculators or original-EAGLE draft to the SGLang layout")
    p.add_argument("src", metavar="SRC")
    p.add_argument("dst", metavar="DST")
    p.add_argument("--to", choices=("sglang",), default="sglang")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser(
        "serve",
        help="serve a target with its EAGLE-3 draft: serve TARGET DRAFT [options] [-- SGLANG FLAGS...]",
        description="Shorthand for `launch serve -- PYTHON -m sglang.launch_server --model-path TARGET "
        "--speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT --port PORT [--tp-size #GPUS] "
        "FLAGS...`; SGLang's parser and doctor check it first.",
    )
    p.add_argument("target", metavar="TARGET", help="the target model's folder (or hub name) on the host")
    p.add_argument("draft", metavar="DRAFT", help="the draft's folder on the host")
    p.add_argument("--name", help="a name to find the run by (default: serve)")
    p.add_argument("--gpus", type=gpu_list, default=[], help="GPUs for CUDA_VISIBLE_DEVICES; --tp-size follows them")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the server's port (default {DEFAULT_PORT})")
    p.add_argument("--python", default="python3", help="the host interpreter that has SGLang (default python3)")
    p.add_argument("--env", type=env_pair, action="append", default=[], help="NAME=VALUE for the run (repeatable)")
    p.add_argument("--stall-after", type=stall_window, help="seconds of idle silence that make the launch stalled (30)")
    p.add_argument("--force", action="store_true", help="launch even when SGLang's parser or doctor refuses it")
    p.add_argument("--follow", action="store_true", help="print the startup phases until the server is ready")

    for stage in STAGES:
        p = sub.add_parser(
            stage,
            help=f"launch our {stage} stage: {stage} [--name N] [--gpus L] [--nproc N] [--follow] ARGS...",
            description=f"Shorthand for `launch {stage} -- python -m backends.{stage} ARGS...`: run options come "
            f"first, everything from the first other word on goes to backends.{stage} "
            f"(see `python -m backends.{stage} --help`).",
        )
    return parser


def split_argv(args: list[str]) -> tuple[list[str], list[str]]:
    """Split at the first '--': options before, the run's own argv after."""
    if "--" in args:
        cut = args.index("--")
        return args[:cut], args[cut + 1 :]
    return args, []


def join_flag_values(options: list[str]) -> list[str]:
    """`--set --disable-cuda-graph` -> `--set=--disable-cuda-graph`: argparse alone
    would take the value for an option of its own."""
    joined: list[str] = []
    items = iter(options)
    for item in items:
        if item in ("--set", "--unset"):
            value = next(items, None)
            joined.append(item if value is None else f"{item}={value}")
        else:
            joined.append(item)
    return joined


def as_flag(text: str) -> str:
    """'disable-cuda-graph' and '--disable-cuda-graph' both name the flag."""
    return text if text.startswith("-") else f"--{text}"


def make_transport(
    ns: argparse.Namespace, trust_new_key: TrustNewKey | None = None, say: Callable[[str], None] | None = None
) -> Transport:
    """`trust_new_key` decides on a host key seen for the first time; None refuses it. `say` tells the person
    what the transport put right on the host (a repaired copy of the agent); None: a line on stderr."""
    if ns.host == "local":
        if ns.remote_python is not None:
            raise UsageError("--remote-python names the Python of an SSH host; 'local' runs the agent with this one")
        return LocalTransport(ns.workdir)
    from console.ssh_transport import DEFAULT_PYTHON, SSHTransport  # asyncssh is needed only for another host

    try:
        transport = SSHTransport(ns.host, ns.workdir, ns.remote_python or DEFAULT_PYTHON)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    transport.trust_new_key = trust_new_key
    if say is not None:
        transport.say = say
    return transport


def terminal_trust(ns: argparse.Namespace) -> TrustNewKey | None:
    """Who trusts a new host key for a command: the flag, else the person at the terminal, else nobody."""
    if ns.host == "local":
        return None
    from console import host_keys  # asyncssh is needed only to reach another host

    if ns.accept_new_host_key:
        return host_keys.accept_and_say
    return host_keys.ask_on_terminal if sys.stdin.isatty() and sys.stderr.isatty() else None


def note(text: str) -> None:
    """A line for the person watching, on stderr (stdout stays the data)."""
    print(f"eagle3-console: {text}", file=sys.stderr, flush=True)


def out(text: str) -> None:
    print(text, flush=True)


def dump(obj: object) -> None:
    out(json.dumps(obj, indent=2))


Command = Callable[[AgentClient, argparse.Namespace, list[str]], Awaitable[int]]


async def cmd_status(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    if ns.run is not None:
        run = await client.request("run_info", run=ns.run)
        dump(run) if ns.json else out(render.run_text(run))
        return EXIT_OK
    status = await client.request("status")
    if ns.json:
        dump(status)
    else:
        out(render.status_text(status))
    return EXIT_OK


async def cmd_launch(client: AgentClient, ns: argparse.Namespace, argv: list[str]) -> int:
    if not argv:
        raise UsageError("launch needs the command after '--', e.g. launch command -- python train.py")
    result = await client.request(
        "launch",
        kind=ns.kind,
        argv=argv,
        name=ns.name,
        env=dict(ns.env),
        cwd=ns.cwd or os.getcwd(),
        gpus=ns.gpus,
        health_url=ns.health_url,
        stall_after=ns.stall_after,
        metrics_from=ns.metrics_from,
        force=ns.force,
    )
    return report_launched(result, ns.json)


def report_launched(result: dict[str, Any], as_json: bool) -> int:
    """Print a new run's id (or the whole reply as JSON); fail when it could not start."""
    verdict, flags = result.get("doctor"), result.get("flags")
    if flags and not as_json:
        print(render.flags_text(flags), file=sys.stderr)
    if verdict and verdict["findings"] and not as_json:
        print(format_result(verdict), file=sys.stderr)
    if as_json:
        dump(result)
    else:
        out(result["run"])
    if result.get("error"):
        note(f"run {result['run']} failed to start: {result['error']}")
        return EXIT_FAILED
    return EXIT_OK


async def cmd_stacks(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    result = await client.request("stacks", run=ns.run, now=ns.now)
    note(f"{result['file']} (taken {render.clock(result['taken_at'])})")
    sys.stdout.write(result["text"])
    return EXIT_OK


async def cmd_kill(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    result = await client.request("kill", run=ns.run, signal=ns.signal, grace=ns.grace)
    if ns.json:
        dump(result)
    else:
        out(render.kill_text(result))
    return EXIT_OK if all(p["died"] for p in result["processes"]) else EXIT_FAILED


async def cmd_relaunch(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    sets = [as_flag(item) for item in ns.sets]
    unsets = [as_flag(item) for item in ns.unsets]
    result = await client.request(
        "relaunch", run=ns.run, set=sets, unset=unsets, grace=ns.grace, force=ns.force, dry_run=ns.dry_run
    )
    if ns.dry_run:
        dump(result) if ns.json else out(render.relaunch_preview(result))
        return EXIT_OK
    if result.get("stopped_parent") and not ns.json:
        out(render.kill_text(result["stopped_parent"]))
    return report_launched(result, ns.json)


async def cmd_free_gpus(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    plan = await client.request("free_gpus", gpus=ns.gpus, dry_run=True)
    victims = [p for g in plan["gpus"] for p in g["processes"] if p["action"] == "kill"]
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
    result = await client.request("free_gpus", gpus=ns.gpus, dry_run=False, timeout=ns.timeout)
    dump(result) if ns.json else out(render.free_text(result))
    held = [p for g in result["gpus"] for p in g["processes"] if p["action"] == "survived"]
    return EXIT_FAILED if held else EXIT_OK


def write_log(data_b64: str) -> None:
    sys.stdout.buffer.write(base64.b64decode(data_b64))
    sys.stdout.buffer.flush()


async def cmd_watch(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    """Each run's changes of state, one timed line each, across lost connections, until Ctrl-C."""
    states: dict[str, str] | None = None
    while True:
        try:
            runs = (await client.request("status", gpus=False))["runs"]
        except TransportError as exc:
            await reconnect_and_say(client, note, str(exc), "changes meanwhile follow")
            continue
        if states is None:
            live = sum(run["state"] not in TERMINAL_STATES for run in runs)
            note(f"watching {len(runs)} runs ({live} live); Ctrl-C to stop")
        for line in watch_lines(states, runs, ns.json):
            out(line)
        states = {run["id"]: run["state"] for run in runs}
        await asyncio.sleep(ns.interval)


def watch_lines(states: dict[str, str] | None, runs: list[dict[str, Any]], as_json: bool) -> list[str]:
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
            lines.extend(f"    {line}" for line in render.run_notes([run]))
    return lines


async def cmd_logs(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    if ns.tail is not None and ns.tail < 0:
        raise UsageError("--tail needs a count of lines, 0 or more")
    chunk = await client.request("logs", run=ns.run, tail=ns.tail)
    write_log(chunk["data_b64"])
    offset = chunk["next_offset"]
    while not ns.follow and offset < chunk["size"]:
        chunk = await client.request("logs", run=ns.run, offset=offset)
        write_log(chunk["data_b64"])
        offset = chunk["next_offset"]
    if not ns.follow:
        return EXIT_OK
    async for msg in follow(client, ns.run, {"log": offset, "metrics": PAST_END, "events": PAST_END}, note):
        if msg["stream"] == "log":
            write_log(msg["data_b64"])
        elif msg["stream"] == "end" and msg.get("error"):
            note(msg["error"])
            return EXIT_FAILED
    return EXIT_OK


async def follow_metrics(client: AgentClient, run: str, wide: bool = False) -> int:
    """Print metric rows as a live table until the run ends; its fate decides the exit code."""
    table = render.LiveTable(wide)
    final = None
    async for msg in follow(client, run, {"log": PAST_END, "events": PAST_END, "metrics": 0}, note):
        if msg["stream"] == "metrics":
            for line in table.lines([r for r in msg["rows"] if isinstance(r, dict)]):
                out(line)
        elif msg["stream"] == "end":
            if msg.get("error"):
                note(msg["error"])
                return EXIT_FAILED
            final = msg["state"]
    note(f"run {run} {final}")
    return EXIT_OK if final == "exited" else EXIT_FAILED


async def cmd_metrics(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    if ns.follow:
        return await follow_metrics(client, ns.run, ns.wide)
    if ns.tail is not None and ns.tail < 0:
        raise UsageError("--tail needs a count of rows, 0 or more")
    rows: list[dict[str, Any]] = []
    skipped = offset = 0
    while True:  # a reply holds a few MiB of the file: ask again from where it stopped
        result = await client.request("metrics", run=ns.run, offset=offset)
        rows += result["rows"]
        skipped += result["skipped"]
        if result["next_offset"] == offset:
            break
        offset = result["next_offset"]
    if ns.tail is not None:
        rows = rows[max(0, len(rows) - ns.tail) :]
    if ns.json:
        for row in rows:
            out(json.dumps(row))
    elif rows:
        out(render.metrics_table(rows))
    else:
        out("no metrics yet")
    if skipped:
        note(f"skipped {skipped} malformed metric line(s)")
    return EXIT_OK


def stage_options(args: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split `[--name N] [--gpus L] [--nproc N] [--follow] ARGS...` at the first other word."""
    parser = Parser(prog="eagle3-console HOST STAGE", add_help=False)
    parser.add_argument("--name")
    parser.add_argument("--gpus", type=gpu_list, default=[])
    parser.add_argument("--nproc", type=int)
    parser.add_argument("--follow", action="store_true")
    own = {"--name": 2, "--gpus": 2, "--nproc": 2, "--follow": 1}
    cut = 0
    while cut < len(args) and args[cut].split("=", 1)[0] in own:
        cut += 1 if "=" in args[cut] else own[args[cut]]
    return parser.parse_args(args[:cut]), args[cut:]


async def cmd_stage(client: AgentClient, ns: argparse.Namespace, args: list[str]) -> int:
    opts, stage_args = stage_options(args)
    if opts.nproc is not None and opts.nproc < 1:
        raise UsageError("--nproc needs a number of processes, 1 or more")
    result = await client.request(
        "launch",
        kind=ns.command,
        argv=stage_args,
        module=f"backends.{ns.command}",
        nproc=opts.nproc,
        name=opts.name or ns.command,
        cwd=os.getcwd(),
        gpus=opts.gpus,
    )
    code = report_launched(result, as_json=False)
    if code != EXIT_OK or not opts.follow:
        return code
    return await follow_metrics(client, result["run"])


def serve_argv(ns: argparse.Namespace, flags: list[str]) -> list[str]:
    """SGLang's server command for a target and its EAGLE-3 draft; FLAGS come last and win."""
    argv = [ns.python, "-m", SERVER_MODULES[0], TARGET_PATH_FLAGS[0], ns.target, *EAGLE3_ALGORITHM]
    argv += [DRAFT_PATH_FLAGS[0], ns.draft, PORT_FLAG, str(ns.port)]
    if len(ns.gpus) > 1 and not any(f.split("=")[0] in TP_SIZE_FLAGS for f in flags):
        argv += [TP_SIZE_FLAGS[0], str(len(ns.gpus))]
    return argv + flags


async def cmd_serve(client: AgentClient, ns: argparse.Namespace, flags: list[str]) -> int:
    result = await client.request(
        "launch",
        kind="serve",
        argv=serve_argv(ns, flags),
        name=ns.name or "serve",
        env=dict(ns.env),
        cwd=os.getcwd(),
        gpus=ns.gpus,
        health_url=f"http://127.0.0.1:{ns.port}/health",
        stall_after=ns.stall_after,
        force=ns.force,
    )
    code = report_launched(result, as_json=False)
    if code != EXIT_OK or not ns.follow:
        return code
    return await follow_startup(client, result["run"])


async def follow_startup(client: AgentClient, run: str) -> int:
    """Print a server's phases, health, stalls and failures as they happen; 0 once it is ready."""
    offsets = {"log": PAST_END, "metrics": PAST_END, "events": 0}
    async for msg in follow(client, run, offsets, note):
        if msg["stream"] == "end":
            note(msg.get("error") or f"run {run} {msg['state']} before it was ready; see `logs {run}`")
            return EXIT_FAILED
        for event in msg.get("rows", []) if msg["stream"] == "events" else []:
            line = render.startup_event(event)
            if line:
                out(line)
            if event.get("type") == "state" and event.get("state") == "ready":
                return EXIT_OK
            if event.get("type") == "stalled":
                note(f"run {run} is stalled (it keeps running): `stacks {run}` shows where each process waits")
                return EXIT_FAILED
    return EXIT_FAILED


async def cmd_doctor(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    result = await client.request(
        "doctor",
        draft=ns.draft,
        target=ns.target,
        data=ns.data,
        sglang_version=ns.sglang_version,
        context_length=ns.context_length,
        dry_load=ns.dry_load,
        sglang_python=ns.sglang_python,
        cwd=os.getcwd(),
    )
    dump(result) if ns.json else out(format_result(result))
    return EXIT_FAILED if result["errors"] else EXIT_OK


async def cmd_convert(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    result = await client.request("convert", src=ns.src, dst=ns.dst, to=ns.to, cwd=os.getcwd())
    dump(result) if ns.json else out(f"wrote {ns.dst}\n" + format_result(result))
    return EXIT_FAILED if result["errors"] else EXIT_OK


COMMANDS: dict[str, Command] = {
    "watch": cmd_watch,
    "doctor": cmd_doctor,
    "convert": cmd_convert,
    "extract": cmd_stage,
    "train": cmd_stage,
    "status": cmd_status,
    "launch": cmd_launch,
    "kill": cmd_kill,
    "serve": cmd_serve,
    "stacks": cmd_stacks,
    "relaunch": cmd_relaunch,
    "free-gpus": cmd_free_gpus,
    "logs": cmd_logs,
    "metrics": cmd_metrics,
}


async def run_command(ns: argparse.Namespace, argv: list[str]) -> int:
    client = AgentClient(make_transport(ns, terminal_trust(ns)))
    try:
        await client.start()
        return await COMMANDS[ns.command](client, ns, argv)
    finally:
        await client.close()


def split_stage(args: list[str]) -> tuple[list[str], list[str]] | None:
    """`[GLOBAL OPTIONS] HOST extract|train REST...`: REST belongs to the stage, not to argparse."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in ("--workdir", "--remote-python") else 1  # the global options that take a value
    if i + 1 < len(args) and args[i + 1] in STAGES:
        return args[: i + 2], args[i + 2 :]
    return None


def open_console(ns: argparse.Namespace) -> int:
    """The terminal console (Textual) on HOST."""
    if not sys.stdout.isatty():
        raise UsageError("the console needs a terminal; give a COMMAND (e.g. 'status') for scripts")
    from console.tui.app import ConsoleApp

    # A new host key is for the console to decide: it asks in a dialog (the app exists by then).
    transport = make_transport(
        ns,
        lambda offered: app.trust_new_key(offered),
        lambda text: app.notify(text, severity="warning", timeout=30, markup=False),
    )
    app = ConsoleApp(transport, readonly=ns.readonly, accept_new_host_key=ns.accept_new_host_key)
    app.run()
    return EXIT_FAILED if app.return_code else EXIT_OK


def main(args: list[str] | None = None) -> int:
    raw = sys.argv[1:] if args is None else args
    options, argv = split_stage(raw) or split_argv(raw)
    try:
        ns = build_parser().parse_args(join_flag_values(options))
        if ns.command is None:
            return open_console(ns)
        if argv and ns.command not in ("launch", "serve", *STAGES):
            raise UsageError(f"'--' and a command line only go with 'launch', not {ns.command!r}")
        return asyncio.run(run_command(ns, argv))
    except UsageError as exc:
        note(str(exc))
        return EXIT_USAGE
    except AgentError as exc:
        if exc.code in ("doctor_refused", "flags_refused") and exc.details:
            print(format_result(exc.details), file=sys.stderr)
        note(exc.message)
        return EXIT_USAGE if exc.code in ("bad_args", "unknown_op") else EXIT_FAILED
    except TransportError as exc:
        note(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        # stdout closed early (e.g. `| head`): not an error of ours.
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
