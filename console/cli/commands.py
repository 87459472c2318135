"""What each command of one host does that reads or checks (`logs`, `metrics`, `export`, `bench`, `doctor`,
`convert`), and how a launched run is followed (a stage to its end, a server to its readiness). The short ones
answered by one request are `console.cli.quick`'s; those that act, or work on several hosts alike,
`console.cli.fleet_commands`'. `console.__main__` ties each to its grammar in `console.cli.grammar`.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Literal

from backends.protocol import MetricRow
from console import render
from console.cli.config import UsageError
from console.cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    doctor_text,
    dump,
    note,
    out,
)
from console.link.client import PAST_END, AgentClient, follow, log_bytes
from console.visible import LINES, TerminalLog, visible

# What a command of one host does, given its client, its options and its tail (see `console.cli.grammar.Grammar`);
# its exit code. A command that works on several hosts alike takes the fleet (`fleet_commands.FleetHandler`).
Handler = Callable[[AgentClient, argparse.Namespace, list[str]], Awaitable[int]]


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


# How `metrics --follow` prints rows: a table for a person; JSON Lines or CSV for a script, as without --follow.
MetricsForm = Literal["table", "json", "csv"]


class MetricsPrinter:
    """Metric rows as they arrive, in one of `MetricsForm`'s forms. JSON: each row as `metrics --json` prints it,
    one object a line (json.dumps: floats as their repr, a timestamp never in exponent notation). CSV: the header
    once, fixed by the first rows to arrive (the whole history when the run has one); a name first seen after it
    is left out of the rows and said once on stderr (`metrics RUN --csv` after the run has every column). Table:
    `render.LiveTable`."""

    def __init__(self, run: str, form: MetricsForm, wide: bool = False) -> None:
        self.run, self.form = run, form
        self.table = render.LiveTable(wide)
        self.columns: list[str] | None = None  # the CSV's header, once written
        self.left_out: set[str] = set()  # names the CSV's header lacks, each said once

    def rows(self, rows: list[MetricRow]) -> None:
        if self.form == "json":
            for row in rows:
                out(json.dumps(row))
        elif self.form == "csv":
            self.csv(rows)
        else:
            for line in self.table.lines(rows):
                out(line)

    def csv(self, rows: list[MetricRow]) -> None:
        from console.cli import export  # csv and TensorBoard's writer: only the commands that write them import it

        if not rows:
            return
        text = ""
        if self.columns is None:
            self.columns = export.csv_columns(rows)
            text = export.csv_lines([self.columns])
        if new := [n for n in export.csv_columns(rows) if n not in self.columns and n not in self.left_out]:
            self.left_out.update(new)
            note(
                f"run {self.run}: column(s) {', '.join(new)} appeared after the CSV header and are left out; "
                f"`metrics {self.run} --csv` after the run has every column"
            )
        text += export.csv_lines(export.csv_row(row, self.columns) for row in rows)
        # Data into a file or a pipe; on a terminal, a metric name's escapes shown (as without --follow).
        sys.stdout.write(visible(text, keep=LINES + "\r") if sys.stdout.isatty() else text)
        sys.stdout.flush()


async def follow_metrics(client: AgentClient, run: str, wide: bool = False, form: MetricsForm = "table") -> int:
    """Print metric rows as they arrive (see `MetricsPrinter`) until the run ends; its fate decides the exit code."""
    printer = MetricsPrinter(run, form, wide)
    final = None
    failure = ""  # why a failed run failed, as the end says
    nan_told = False  # a NaN or infinity is said once, on stderr, beside its marked cell
    async for msg in follow(client, run, {"log": PAST_END, "events": PAST_END, "metrics": 0}, note):
        if msg["stream"] == "metrics":
            rows = [r for r in msg["rows"] if isinstance(r, dict)]
            printer.rows(rows)
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
    if ns.csv and ns.json:
        raise UsageError("--csv and --json are two forms of the same rows: choose one")
    if ns.follow:
        return await follow_metrics(client, ns.run, ns.wide, "json" if ns.json else "csv" if ns.csv else "table")
    if ns.tail is not None and ns.tail < 0:
        raise UsageError("--tail needs a count of rows, 0 or more")
    rows = await all_metric_rows(client, ns.run)
    if ns.tail is not None:
        rows = rows[max(0, len(rows) - ns.tail) :]
    if ns.csv:
        from console.cli import export

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
    from console.cli import export

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
    """A bench run on the host, followed to its end: its progress and result table (or, with --json, the result);
    with --compare, two serve runs' latest results side by side."""
    if (ns.compare is None) == (ns.target is None):
        raise UsageError("give a serve run or URL to bench, or --compare RUN RUN")
    if ns.warmup < 0:
        raise UsageError("--warmup needs 0 or more")
    if ns.compare is not None:
        return await compare_benches(client, ns.compare, ns.json)
    launched = await client.bench(
        ns.target,
        prompts=ns.prompts,
        requests=ns.requests,
        concurrency=ns.concurrency,
        max_tokens=ns.max_tokens,
        api=ns.api,
        input_len=ns.input_len,
        request_rate=ns.request_rate,
        warmup=ns.warmup,
        seed=ns.seed,
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


async def compare_benches(client: AgentClient, runs: list[str], as_json: bool) -> int:
    """Each serve run's latest bench, side by side (a column per run)."""
    latest = []
    for run in runs:
        info = await client.run_info(run)
        stored = info.get("bench") or []
        if not stored:
            note(f"run {info['id']} has no bench result yet; bench it first: bench {info['id']}")
            return EXIT_FAILED
        latest.append((info, stored[-1]))
    if as_json:
        dump([{"run": info["id"], **result} for info, result in latest])
    else:
        out("\n".join(render.bench_compare(latest)))
    return EXIT_OK


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


# What each command of one host does (`stacks`, answered by one request, is `console.cli.quick`'s).
HANDLERS: dict[str, Handler] = {
    "logs": cmd_logs,
    "metrics": cmd_metrics,
    "export": cmd_export,
    "doctor": cmd_doctor,
    "convert": cmd_convert,
    "bench": cmd_bench,
}
