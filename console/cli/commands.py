"""`eagle3-console [--workdir DIR] HOST COMMAND ...`: the scriptable command line: what each command of one host
does (those answered by one request are in `console.cli.one_shot`; those that work on one host or several alike in
`console.cli.fleet_commands`), and the one table (`COMMANDS`) that ties each to its grammar in
`console.cli.grammar`. Every command runs over the fleet of the hosts it names (`console.fleet.hosts`), a fleet of
one for a host given alone. Exit codes and messages: `console.cli.output`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from backends.protocol import JobNode, MetricRow
from console import actions, render
from console.cli import config, connect, export, fleet_commands, grammar
from console.cli.fleet_commands import FleetHandler, report_launched
from console.cli.grammar import Grammar, Parser, UsageError, split, stage_options
from console.cli.one_shot import cmd_stacks
from console.cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    doctor_text,
    dump,
    failed,
    note,
    out,
)
from console.fleet.hosts import Fleet
from console.link.client import PAST_END, AgentClient, follow, log_bytes
from console.link.ops import AgentError, TransportError
from console.visible import LINES, TerminalLog, visible

# What a command of one host does, given its client, its options and its tail (see `console.cli.grammar.Grammar`);
# its exit code. A command that works on several hosts alike takes the fleet (`fleet_commands.FleetHandler`).
Handler = Callable[[AgentClient, argparse.Namespace, list[str]], Awaitable[int]]


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


async def cmd_logs(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    if ns.tail is not None and ns.tail < 0:
        raise UsageError("--tail needs a count of lines, 0 or more")
    # Byte for byte into a pipe or a file; to a terminal, the run's escapes are shown, not obeyed (unless --raw).
    log = TerminalLog(sys.stdout.buffer, shown=not ns.raw and sys.stdout.isatty())
    chunk = await client.logs(ns.run, tail=ns.tail)
    log.write(base64.b64decode(chunk["data_b64"]))
    offset = chunk["next_offset"]
    if not ns.follow:
        async for data in log_bytes(client, ns.run, offset, chunk["size"]):
            log.write(data)
        log.write(b"", end=True)
        return EXIT_OK
    async for msg in follow(client, ns.run, {"log": offset, "metrics": PAST_END, "events": PAST_END}, note):
        if msg["stream"] == "log":
            log.write(base64.b64decode(msg["data_b64"]))
        elif msg["stream"] == "end" and msg.get("error"):
            note(msg["error"])
            return EXIT_FAILED
        elif msg["stream"] == "end" and msg.get("failure"):
            note(f"run {ns.run} failed: {msg['failure']}")
    return EXIT_OK


async def follow_metrics(client: AgentClient, run: str, wide: bool = False) -> int:
    """Print metric rows as a live table until the run ends; its fate decides the exit code."""
    table = render.LiveTable(wide)
    final = None
    failure = ""  # why a failed run failed, as the end says
    nan_told = False  # a NaN or infinity is said once, on stderr, beside its marked cell
    async for msg in follow(client, run, {"log": PAST_END, "events": PAST_END, "metrics": 0}, note):
        if msg["stream"] == "metrics":
            rows = [r for r in msg["rows"] if isinstance(r, dict)]
            for line in table.lines(rows):
                out(line)
            if not nan_told and (said := render.nonfinite_note(run, rows)) is not None:
                nan_told = True
                note(said)
        elif msg["stream"] == "end":
            if msg.get("error"):
                note(msg["error"])
                return EXIT_FAILED
            final = msg["state"]
            failure = f": {msg['failure']}" if msg.get("failure") else ""
    note(f"run {run} {final}{failure}")
    return EXIT_OK if final == "exited" else EXIT_FAILED


async def all_metric_rows(client: AgentClient, run: str) -> list[MetricRow]:
    """Every metric row of the run, as many replies as it takes; a note on stderr for lines that were not rows."""
    rows: list[MetricRow] = []
    skipped = offset = 0
    while True:  # a reply holds a few MiB of the file: ask again from where it stopped
        result = await client.metrics(run, offset=offset)
        rows += result["rows"]
        skipped += result["skipped"]
        if result["next_offset"] == offset:
            break
        offset = result["next_offset"]
    if skipped:
        note(f"skipped {skipped} malformed metric line(s)")
    if (said := render.not_numbers_note(run, rows)) is not None:
        note(said)
    return rows


async def cmd_metrics(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    if ns.csv and (ns.follow or ns.json):
        raise UsageError("--csv writes every row once as a table: it goes with --tail, not with --follow or --json")
    if ns.follow:
        return await follow_metrics(client, ns.run, ns.wide)
    if ns.tail is not None and ns.tail < 0:
        raise UsageError("--tail needs a count of rows, 0 or more")
    rows = await all_metric_rows(client, ns.run)
    if ns.tail is not None:
        rows = rows[max(0, len(rows) - ns.tail) :]
    if ns.csv:
        text = export.csv_text(rows)  # data into a file or a pipe; on a terminal, a metric name's escapes shown
        sys.stdout.write(visible(text, keep=LINES + "\r") if sys.stdout.isatty() else text)
    elif ns.json:
        for row in rows:
            out(json.dumps(row))
    elif rows:
        out(render.metrics_table(rows))
    else:
        out("no metrics yet")
    if (said := render.nonfinite_note(ns.run, rows)) is not None:
        note(said)
    return EXIT_OK


async def cmd_export(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    rows = await all_metric_rows(client, ns.run)
    run = (await client.run_info(ns.run))["id"]
    try:
        written, count = export.write_tensorboard(rows, ns.tensorboard, run)
    except export.ExportError as exc:
        note(str(exc))
        return EXIT_FAILED
    out(f"wrote {count} points of {len(rows)} rows to {written}" + ("" if rows else " (the run has no metrics yet)"))
    if left_out := export.unplaced(rows):
        note(f"left out {left_out} row(s) whose step is beyond what a TensorBoard step holds (a 64-bit integer)")
    return EXIT_OK


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
        return fleet_commands.refused(fleet, exc)
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


async def follow_startup(client: AgentClient, run: str) -> int:
    """Print a server's phases, health, stalls and failures as they happen; 0 once it is ready."""
    offsets = {"log": PAST_END, "metrics": PAST_END, "events": 0}
    async for msg in follow(client, run, offsets, note):
        if msg["stream"] == "end":
            why = f": {msg['failure']}" if msg.get("failure") else ""
            ended = msg.get("error") or f"run {run} {msg['state']} before it was ready{why}; see `logs {run}`"
            note(ended)
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


async def cmd_bench(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    """A bench run on the host, followed to its end: its progress and result table (or, with --json, the result)."""
    launched = await client.bench(
        ns.target,
        prompts=ns.prompts,
        requests=ns.requests,
        concurrency=ns.concurrency,
        max_tokens=ns.max_tokens,
        api=ns.api,
        name=ns.name,
        cwd=os.getcwd(),
    )
    run = launched["run"]
    if launched.get("error"):
        note(f"bench run {run} failed to start: {launched['error']}")
        return EXIT_FAILED
    note(f"bench run {run} (`logs {run}`, `kill {run}`)")
    final = None
    stream = sys.stderr if ns.json else sys.stdout
    log = TerminalLog(stream.buffer, shown=stream.isatty())
    async for msg in follow(client, run, {"log": 0, "metrics": PAST_END, "events": PAST_END}, note):
        if msg["stream"] == "log":
            log.write(base64.b64decode(msg["data_b64"]))
        elif msg["stream"] == "end":
            if msg.get("error"):
                note(msg["error"])
                return EXIT_FAILED
            final = msg["state"]
    if ns.json:
        stored = (await client.run_info(launched["served_run"] or run)).get("bench") or []
        result = next((r for r in reversed(stored) if r.get("bench_run") == run), None)
        if result is None:
            note(f"bench run {run} stored no result; `logs {run}` says why")
            return EXIT_FAILED
        dump(result)
    return EXIT_OK if final == "exited" else EXIT_FAILED


async def cmd_doctor(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    result = await client.doctor(
        ns.draft,
        target=ns.target,
        data=ns.data,
        sglang_version=ns.sglang_version,
        context_length=ns.context_length,
        dry_load=ns.dry_load,
        sglang_python=ns.sglang_python,
        cwd=os.getcwd(),
    )
    dump(result) if ns.json else out(doctor_text(result))
    return EXIT_FAILED if result["errors"] else EXIT_OK


async def cmd_convert(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    result = await client.convert(ns.src, ns.dst, to=ns.to, cwd=os.getcwd())
    dump(result) if ns.json else out(f"wrote {ns.dst}\n" + doctor_text(result))
    return EXIT_FAILED if result["errors"] else EXIT_OK


def on_one_host(handler: Handler) -> FleetHandler:
    """A command of one host, run on the host of its fleet (`main` refuses it several first)."""

    async def run(fleet: Fleet, ns: argparse.Namespace, tail: list[str]) -> int:
        return await handler(fleet.only.client, ns, tail)

    return run


@dataclass(frozen=True)
class Command:
    grammar: Grammar
    run: FleetHandler


# What each command does; `--help` lists them in `console.cli.grammar.GRAMMARS`' order.
HANDLERS: dict[str, Handler] = {
    "stacks": cmd_stacks,
    "logs": cmd_logs,
    "metrics": cmd_metrics,
    "export": cmd_export,
    "doctor": cmd_doctor,
    "convert": cmd_convert,
    "bench": cmd_bench,
}
FLEET_HANDLERS: dict[str, FleetHandler] = {
    "launch": cmd_launch,
    **fleet_commands.HANDLERS,
    "serve": cmd_launched,
    "extract": cmd_launched,
    "train": cmd_launched,
}
COMMANDS: dict[str, Command] = {
    g.name: Command(g, FLEET_HANDLERS.get(g.name) or on_one_host(HANDLERS[g.name])) for g in grammar.GRAMMARS
}


def build_parser(completing: bool = False) -> Parser:
    return grammar.build_parser(grammar.GRAMMARS, completing)


async def run_command(command: Command, fleet: Fleet, ns: argparse.Namespace, tail: list[str]) -> int:
    """The command over its fleet: a host given alone is reached first (its failure is the command's); the hosts
    of a list or group each when asked, each failure said on its own."""
    try:
        if fleet.alone is not None:
            await fleet.alone.start()
        return await command.run(fleet, ns, tail)
    finally:
        await fleet.close()


# The commands that change a host (their --dry-run changes nothing): read-only refuses them.
CHANGES = frozenset({"kill", "relaunch", "free-gpus", "launch", "serve", "train", "extract", "bench", "convert"})


class ReadOnly(Exception):
    """A command that changes the host, refused by the read-only setting; the message says where it is set."""


def refuse_if_readonly(ns: argparse.Namespace, hosts: list[str], settings: config.Config) -> None:
    """ReadOnly when the setting in force for any of the hosts is read-only, saying where it comes from."""
    for host in hosts:
        source = config.readonly_source(ns.readonly, host, settings)
        if source is not None:
            allow = "" if source == "--readonly" else "; --no-readonly allows it for one command"
            raise ReadOnly(f"{ns.command} refused: {host} is read-only here ({source}){allow}")


def list_hosts(settings: config.Config, as_json: bool) -> int:
    hosts = config.known_hosts(settings)
    if as_json:
        dump([dataclasses.asdict(host) for host in hosts])
    elif hosts:
        out(hosts_table(hosts))
    else:
        out(f"no hosts yet: name them in {settings.path}, or as Host entries in ~/.ssh/config")
    return EXIT_OK


def hosts_table(hosts: list[config.Host]) -> str:
    """`eagle3-console hosts`: each host, where it is, what it sets."""
    rows = [
        [
            host.name,
            host.address,
            host.source,
            " ".join(f"{key}={value}" for key, value in host.settings.items()),
            host.description,
        ]
        for host in hosts
    ]
    return render.table(["HOST", "ADDRESS", "FROM", "SETTINGS", "DESCRIPTION"], rows)


def complete_and_exit() -> None:
    """The shell asks for completions (argcomplete's hook set _ARGCOMPLETE): answer from the grammar, and exit."""
    import argcomplete

    argcomplete.autocomplete(build_parser(completing=True))


# The terminal console on the command's hosts, for `main` to open when no COMMAND is given (the console and the
# command line stand side by side: neither imports the other).
OpenConsole = Callable[[argparse.Namespace, list[str], config.Config, bool], int]


def main(words: list[str], open_console: OpenConsole) -> int:
    if "_ARGCOMPLETE" in os.environ:
        complete_and_exit()
    options, tail = split(words, grammar.GRAMMARS)
    try:
        settings = config.load()
        rest = options[grammar.first_word(options) :]
        if rest[:1] == ["hosts"] and set(rest[1:]) <= {"--json"} and not tail:
            return list_hosts(settings, "--json" in rest)
        ns = build_parser().parse_args(options)
        hosts = settings.expand(ns.host)
        named = hosts != [ns.host]  # a list or a group, even of one: the answer has the same shape for any size
        command = COMMANDS[ns.command] if ns.command is not None else None
        if command is None:
            return open_console(ns, hosts, settings, named)
        command.grammar.check_tail(tail)
        if command.grammar.tail == "rest":
            stage, tail = stage_options(ns.command, tail)
            vars(ns).update(vars(stage))
        if ns.command in CHANGES and not getattr(ns, "dry_run", False):
            refuse_if_readonly(ns, hosts, settings)
        nodes = getattr(ns, "nodes", None)  # a stage's or serve's: a job over the hosts
        if nodes is not None and (nodes > 1 or named) and nodes != len(hosts):
            raise UsageError(
                f"--nodes {nodes} runs one node per host: give {nodes} hosts (a,b or a group), not {len(hosts)}"
            )
        if named and nodes is None:
            fleet_commands.check(ns, tail)
        if not named:
            ns = connect.host_options(ns, hosts[0], settings)
        fleet = connect.fleet_of(ns, hosts, settings, connect.command_transport, note, named)
        return asyncio.run(run_command(command, fleet, ns, tail))
    except (UsageError, config.ConfigError) as exc:
        note(str(exc))
        return EXIT_USAGE
    except ReadOnly as exc:
        note(str(exc))
        return EXIT_FAILED
    except (AgentError, TransportError) as exc:
        return failed(exc)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        # stdout closed early (e.g. `| head`): not an error of ours.
        sys.stderr.close()
        return EXIT_OK
