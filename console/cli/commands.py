"""`eagle3-console [--workdir DIR] HOST COMMAND ...`: the scriptable command line: what each command does (those
answered by one request are in `console.cli.one_shot`), and the one table (`COMMANDS`) that ties it to its grammar
in `console.cli.grammar`. Exit codes and messages: `console.cli.output`.
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
from typing import TYPE_CHECKING

from backends.protocol import JobNode, LaunchResult, MetricRow
from console import actions, render
from console.cli import config, export, grammar, job_launch, many_hosts
from console.cli.grammar import Grammar, Parser, UsageError, split, stage_options
from console.cli.one_shot import cmd_kill, cmd_stacks, cmd_status
from console.cli.output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, doctor_text, dump, failed, note, out, report
from console.cli.watch import watch_runs
from console.errors import AgentError, TransportError
from console.fleet.links import links
from console.link.client import PAST_END, AgentClient, follow, log_bytes
from console.link.transport import LocalTransport, Transport
from console.visible import LINES, TerminalLog, visible

if TYPE_CHECKING:
    from console.link.host_keys import TrustNewKey


def make_transport(
    ns: argparse.Namespace, trust_new_key: TrustNewKey | None = None, say: Callable[[str], None] | None = None
) -> Transport:
    """`trust_new_key` decides on a host key seen for the first time; None refuses it. `say` tells the person
    what the transport put right on the host (a repaired copy of the agent); None: a line on stderr."""
    if ns.host == "local":
        if ns.remote_python is not None:
            raise UsageError("--remote-python names the Python of an SSH host; 'local' runs the agent with this one")
        return LocalTransport(ns.workdir)
    from console.link.ssh import DEFAULT_PYTHON, SSHTransport  # asyncssh is needed only for another host

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
    from console.link import host_keys  # asyncssh is needed only to reach another host

    if ns.accept_new_host_key:
        return host_keys.accept_and_say
    return host_keys.ask_on_terminal if sys.stdin.isatty() and sys.stderr.isatty() else None


# What a command does, given the client, its options and its tail (see `console.cli.grammar.Grammar`); its exit code.
Handler = Callable[[AgentClient, argparse.Namespace, list[str]], Awaitable[int]]


async def cmd_launch(client: AgentClient, ns: argparse.Namespace, argv: list[str]) -> int:
    if not argv:
        raise UsageError("launch needs the command after '--', e.g. launch command -- python train.py")
    if ns.sglang_python is not None and ns.kind != "serve":
        why = f"--sglang-python names the Python of SGLang's server: it goes with launch serve, not {ns.kind}"
        raise UsageError(why)
    result = await client.launch(
        ns.kind,
        argv,
        name=ns.name,
        env=dict(ns.env),
        cwd=ns.cwd or os.getcwd(),
        gpus=ns.gpus,
        health_url=ns.health_url,
        metrics_url=ns.metrics_url,
        sglang_python=ns.sglang_python,
        stall_after=ns.stall_after,
        metrics_from=ns.metrics_from,
        force=ns.force,
        **actions.node_fields(launched_node(ns)),
    )
    return report_launched(result, ns.json)


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


def report_launched(result: LaunchResult, as_json: bool) -> int:
    """Print a new run's id (or the whole reply as JSON); fail when it could not start."""
    verdict, flags = result.get("doctor"), result.get("flags")
    if flags and not as_json:
        report(render.flags_text(flags))
    if verdict and verdict["findings"] and not as_json:
        report(doctor_text(verdict))
    if as_json:
        dump(result)
    else:
        out(result["run"])
    if result.get("error"):
        note(f"run {result['run']} failed to start: {result['error']}")
        return EXIT_FAILED
    return EXIT_OK


async def cmd_relaunch(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    change = {"set": ns.sets, "unset": ns.unsets, "grace": ns.grace, "force": ns.force}
    if ns.dry_run:
        preview = await client.relaunch(ns.run, **change, dry_run=True)
        dump(preview) if ns.json else out(render.relaunch_preview(preview))
        return EXIT_OK
    result = await client.relaunch(ns.run, **change)
    if result["stopped_parent"] and not ns.json:
        out(render.kill_text(result["stopped_parent"]))
    return report_launched(result, ns.json)


async def cmd_free_gpus(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    plan = await client.free_gpus(gpus=ns.gpus, dry_run=True)
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
    result = await client.free_gpus(gpus=ns.gpus, dry_run=False, timeout=ns.timeout)
    dump(result) if ns.json else out(render.free_text(result))
    held = [p for g in result["gpus"] for p in g["processes"] if p["action"] == "survived"]
    return EXIT_FAILED if held else EXIT_OK


async def cmd_watch(client: AgentClient, ns: argparse.Namespace, _: list[str]) -> int:
    """Each run's changes of state, one timed line each, across lost connections, until Ctrl-C."""
    await watch_runs(client, ns, note)
    return EXIT_OK


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


async def cmd_stage(client: AgentClient, ns: argparse.Namespace, stage_args: list[str]) -> int:
    """`extract`/`train`: `ns` holds the run options that `main` took out of the stage's words."""
    code = report_launched(result := await actions.launch_stage(client, ns, stage_args), as_json=False)
    if code != EXIT_OK or not ns.follow:
        return code
    return await follow_metrics(client, result["run"])


async def cmd_serve(client: AgentClient, ns: argparse.Namespace, flags: list[str]) -> int:
    code = report_launched(result := await actions.launch_serve(client, ns, flags), as_json=False)
    if code != EXIT_OK or not ns.follow:
        return code
    return await follow_startup(client, result["run"])


async def follow_job(client: AgentClient, ns: argparse.Namespace, run: str) -> int:
    """A job's node 0 followed as one run of its command would be."""
    return await (follow_startup(client, run) if ns.command == "serve" else follow_metrics(client, run))


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


@dataclass(frozen=True)
class Command:
    grammar: Grammar
    run: Handler


# What each command does; `--help` lists them in `console.cli.grammar.GRAMMARS`' order.
HANDLERS: dict[str, Handler] = {
    "status": cmd_status,
    "launch": cmd_launch,
    "watch": cmd_watch,
    "stacks": cmd_stacks,
    "kill": cmd_kill,
    "relaunch": cmd_relaunch,
    "free-gpus": cmd_free_gpus,
    "logs": cmd_logs,
    "metrics": cmd_metrics,
    "export": cmd_export,
    "doctor": cmd_doctor,
    "convert": cmd_convert,
    "serve": cmd_serve,
    "bench": cmd_bench,
    "extract": cmd_stage,
    "train": cmd_stage,
}
COMMANDS: dict[str, Command] = {g.name: Command(g, HANDLERS[g.name]) for g in grammar.GRAMMARS}


def build_parser(completing: bool = False) -> Parser:
    return grammar.build_parser(grammar.GRAMMARS, completing)


def command_transport(ns: argparse.Namespace) -> Transport:
    """A command's transport: over SSH through the host's shared connection (`console.link.reuse`) unless
    --no-reuse; the direct one, with its host key checks, when none serves yet."""
    if ns.host == "local" or ns.no_reuse:
        return make_transport(ns, terminal_trust(ns))
    from console.link import reuse
    from console.link.reuse_transport import ReusingTransport  # asyncssh only when a direct connection is needed

    return ReusingTransport(reuse.Target.of(ns), lambda: make_transport(ns, terminal_trust(ns)))


async def run_command(command: Command, ns: argparse.Namespace, tail: list[str]) -> int:
    client = AgentClient(command_transport(ns), ns.timeout_s)
    client.say = note
    try:
        await client.start()
        return await command.run(client, ns, tail)
    finally:
        await client.close()


def open_console(ns: argparse.Namespace, hosts: list[str], settings: config.Config) -> int:
    """The terminal console (Textual) on HOST, or on several hosts at once (a HOST column, each link its own)."""
    if not sys.stdout.isatty():
        raise UsageError("the console needs a terminal; give a COMMAND (e.g. 'status') for scripts")
    from console.fleet.hosts import HostsClient
    from console.tui.app import ConsoleApp

    # A new host key is for the console to decide: it asks in a dialog (the app exists by then).
    def transport_of(own: argparse.Namespace) -> Transport:
        return make_transport(
            own,
            lambda offered: app.trust_new_key(offered),
            lambda text: app.notify(text, severity="warning", timeout=30, markup=False),
        )

    if hosts == [ns.host]:
        config.apply_settings(ns, settings)
        trust, limit = ns.accept_new_host_key, ns.timeout_s
        app = ConsoleApp(transport_of(ns), readonly=bool(ns.readonly), accept_new_host_key=trust, timeout=limit)
    else:
        every = links(ns, hosts, settings, transport_of)
        readonly = any(link.ns.readonly for link in every)  # one read-only host makes the whole console so
        client = HostsClient({link.name: link.client for link in every})
        app = ConsoleApp(client, readonly=readonly, accept_new_host_key=ns.accept_new_host_key)
    app.run()
    return EXIT_FAILED if app.return_code else EXIT_OK


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
        out(render.hosts_table(hosts))
    else:
        out(f"no hosts yet: name them in {settings.path}, or as Host entries in ~/.ssh/config")
    return EXIT_OK


def complete_and_exit() -> None:
    """The shell asks for completions (argcomplete's hook set _ARGCOMPLETE): answer from the grammar, and exit."""
    import argcomplete

    argcomplete.autocomplete(build_parser(completing=True))


def main(args: list[str] | None = None) -> int:
    words = sys.argv[1:] if args is None else args
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
        command = COMMANDS[ns.command] if ns.command is not None else None
        if command is not None:
            command.grammar.check_tail(tail)
            if command.grammar.tail == "rest":
                stage, tail = stage_options(ns.command, tail)
                vars(ns).update(vars(stage))
        if command is not None and ns.command in CHANGES and not getattr(ns, "dry_run", False):
            refuse_if_readonly(ns, hosts, settings)
        nodes = getattr(ns, "nodes", None)  # a stage's or serve's: a job over the hosts
        if nodes is not None and (nodes > 1 or hosts != [ns.host]):
            return asyncio.run(job_launch.launch_job(ns, tail, hosts, settings, command_transport, follow_job))
        if command is None:
            return open_console(ns, hosts, settings)
        if hosts != [ns.host]:  # a list or a group, even of one: the answer has the same shape for any size
            many_hosts.check(ns, tail)
            return asyncio.run(many_hosts.run(ns, hosts, settings, command_transport))
        ns.host = hosts[0]
        config.apply_settings(ns, settings)
        return asyncio.run(run_command(command, ns, tail))
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


if __name__ == "__main__":
    sys.exit(main())
