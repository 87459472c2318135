"""The console's panels: runs and the selected run's details (the GPUs': gpu_panel.py). They only render what the
agent sent."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from rich.text import Text
from textual.theme import Theme
from textual.widgets import DataTable, Static

from backends.protocol import TERMINAL_STATES, GpuInfo, RunInfo
from console.fleet import jobs
from console.fleet.names import own_id
from console.render import (
    FAILED_STATES,
    STALL_ADVICE,
    attention_rank,
    bench_beside,
    bench_lines,
    changed_flags,
    command_line,
    corrupt_text,
    exit_text,
    run_gpus,
    stall_text,
)
from console.tui.timeline import (
    HEALTH_CELLS,
    Timeline,
    comparison_steps,
    health_strip,
    seconds,
    summary_lines,
    wrap_steps,
)
from console.visible import printable
from themes import signals

# A state is shown by its word and a colour together (never by colour alone).
STATE_STYLES = {
    "ready": "bold green",
    "running": "green",
    "starting": "cyan",
    "stalled": "bold black on yellow",
    "exited": "dim",
    "failed": "bold red",
    "killed": "magenta",
    "lost": "bold red",
    "corrupt": "bold white on red",
}
COMMAND_CHARS = 160  # a long command line (a whole script in -c) would push the rest out of view
RUN_COLUMNS = ("RUN", "NAME", "KIND", "STATE", "PHASE", "PID", "EXIT", "GPUS")
# The columns given up first when the table is narrow (the detail panel shows them all for the selected run).
DROPPED_FIRST = ("PID", "KIND", "GPUS", "EXIT")
# How narrow a column may be squeezed before a low-value one is dropped (a cut cell ends in …; the run id keeps
# its unique tail); past that, any column goes down to TIGHTEST.
MIN_WIDTHS = {"HOST": 8, "RUN": 9, "NAME": 12, "STATE": 7, "PHASE": 16, "GPUS": 6, "EXIT": 4}
TIGHTEST = 3
CELL_PADDING = 1  # DataTable's, on each side of a cell
NEW_FAILURE = "● "  # marks a failure nobody has selected yet


def state_text(state: str) -> Text:
    return Text(printable(state), style=STATE_STYLES.get(state, ""))


def run_row(
    run: Mapping[str, Any], on_gpus: dict[str, str], phase: str | None = None, new: bool = False, stale: bool = False
) -> list[Text]:
    """A run's cells in the runs table: Text, never markup, each character a terminal would act on escaped.
    `phase` is what the run's rows tell of its progress (step/total, ETA), shown where it has no phase; `stale`:
    its host cannot be reached, so the row is as last seen (its host cell says so)."""

    def shown(value: str) -> Text:
        return Text(printable(value))

    state = state_text(run["state"])
    if new:
        state = Text(NEW_FAILURE, style=STATE_STYLES["failed"]) + state
    host = []  # a console over several hosts: HOST/RUN
    if "host" in run:
        host = [Text(printable(f"{run['host']} (down)"), style="dim") if stale else shown(run["host"])]
    return [
        *host,
        shown(own_id(run["id"])),
        shown(run["name"]),
        shown(run["kind"]),
        state,
        shown(run.get("phase") or phase or "-"),
        shown(str(run["pid"] or "-")),
        shown(exit_text(run)),
        shown(on_gpus.get(run["id"], "-")),
    ]


JOB_KEY = "job:"  # the row key of a multi-node job's line: JOB_KEY + its id
NODE_MARK = "└ "  # before the name of a node's run, under its job's line


def job_row(
    job: jobs.Job, progress: Mapping[str, str], marked: bool, unreachable: Mapping[str, float] | None = None
) -> list[Text]:
    """A multi-node job's line: its hosts, id, state from its nodes (`unknown` while a host of it cannot be
    reached), and node 0's progress or how many nodes (no pid, exit or GPUs: its nodes' rows have them)."""
    head = job.nodes[0].run
    phase = head.get("phase") or progress.get(head["id"]) or f"{len(job.nodes)}/{job.nnodes} nodes"
    line = {**head, "id": f"job {job.id}", "state": job.state(unreachable)[0], "phase": phase, "pid": None}
    line.update(exit_code=None, error=None, signal=None)
    if "host" in head:
        line["host"] = ",".join(dict.fromkeys(node.host for node in job.nodes))
    return run_row(line, {}, new=marked)


def row_columns(runs: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The table's columns: a HOST column first when the runs come from several hosts."""
    return ("HOST", *RUN_COLUMNS) if any("host" in run for run in runs) else RUN_COLUMNS


def fit_columns(width: int, rows: Sequence[Sequence[Text]], columns: Sequence[str] = RUN_COLUMNS) -> dict[str, int]:
    """The columns shown in `width` cells and each one's width: low-value columns dropped first, then the widest
    squeezed, so that no column runs past the table."""
    natural = {name: max([len(name), *(row[i].cell_len for row in rows)]) for i, name in enumerate(columns)}
    shown = list(columns)

    def needed(names: Sequence[str], sizes: Mapping[str, int]) -> int:
        return sum(sizes[n] + 2 * CELL_PADDING for n in names)

    least = {name: min(natural[name], MIN_WIDTHS.get(name, natural[name])) for name in columns}
    for name in DROPPED_FIRST:
        if needed(shown, least) <= width:
            break
        shown.remove(name)
    widths = {name: natural[name] for name in shown}
    for floor in (least, dict.fromkeys(shown, TIGHTEST)):
        while needed(shown, widths) > width:
            widest = max((n for n in shown if widths[n] > floor[n]), key=lambda n: widths[n] - floor[n], default=None)
            if widest is None:
                break
            widths[widest] -= 1
    return widths


def cut(cell: Text, width: int, keep_tail: bool = False) -> Text:
    """`cell` in `width` cells, a cut shown by … (at the start when its tail tells it apart: a run id)."""
    if cell.cell_len <= width:
        return cell
    if keep_tail:
        return Text("…") + cell[cell.cell_len - width + 1 :]
    return cell[: width - 1] + Text("…")


def keys_of(lines: Sequence[tuple[str, object]]) -> list[str]:
    return [key for key, _ in lines]


class RunsTable(DataTable[Any]):
    """One row per run: stalled and failed runs first, then the others, newest last; the columns fit the width
    there is; the cursor stays on the same run across refreshes."""

    runs: Sequence[RunInfo] = ()
    gpus: Sequence[GpuInfo] = ()
    progress: Mapping[str, str] = {}
    unseen: frozenset[str] = frozenset()
    down: Mapping[str, float] = {}  # hosts whose link is down, each since when: their rows are as last seen
    expanded: frozenset[str] = frozenset()  # jobs shown with their nodes' runs under their line
    drawn: Sequence[tuple[str, RunInfo | jobs.Job]] = ()  # the rows of the last refill, by key (see `lines`)
    filled: tuple[list[list[Text]], dict[str, int]] = ([], {})
    keyed: tuple[list[str], tuple[str, ...]] = ([], ())  # the rows' keys and the columns as last filled

    def on_mount(self) -> None:
        self.cursor_type = "row"

    def on_resize(self) -> None:
        self.refill()

    def show(
        self,
        runs: Sequence[RunInfo],
        gpus: Sequence[GpuInfo],
        progress: Mapping[str, str] | None = None,
        unseen: frozenset[str] = frozenset(),
        down: Mapping[str, float] | None = None,
    ) -> None:
        """`progress`: what each run's rows tell of how far it got; `unseen`: failures not selected yet; `down`:
        hosts that cannot be reached now, each since when."""
        self.runs = sorted(runs, key=lambda run: attention_rank(run["state"]))
        self.gpus, self.progress, self.unseen, self.down = gpus, progress or {}, unseen, down or {}
        self.refill()

    def lines(self) -> list[tuple[str, RunInfo | jobs.Job]]:
        """The table's rows by key: each run, except that the runs of a multi-node job are one line (where its
        most urgent node would be), followed by its nodes' runs when it is expanded."""
        found = {job.id: job for job in jobs.gather((run.get("host", ""), [run]) for run in self.runs)}
        lines: list[tuple[str, RunInfo | jobs.Job]] = []
        for run in self.runs:
            node = run.get("job")
            if node is None:
                lines.append((run["id"], run))
            elif (job := found.pop(node["id"], None)) is not None:  # the job's first run seen: its line goes here
                lines.append((JOB_KEY + job.id, job))
                if job.id in self.expanded:
                    members = [r for r in self.runs if r.get("job", {}).get("id") == job.id]
                    lines += [(r["id"], r) for r in sorted(members, key=lambda r: (r["job"]["node_rank"], r["id"]))]
        return lines

    def toggle(self, key: str) -> bool:
        """Expand or fold the job whose line `key` is; False for a run's row."""
        if not key.startswith(JOB_KEY):
            return False
        self.expanded ^= {key.removeprefix(JOB_KEY)}
        self.refill()
        return True

    def key_of(self, run_id: str) -> str:
        """The row that shows the run: its own, or its job's line while the job is folded."""
        if run_id in (key for key, _ in self.drawn):
            return run_id
        run = next((r for r in self.runs if r["id"] == run_id), None)
        return JOB_KEY + run["job"]["id"] if run is not None and "job" in run else run_id

    def job_head(self, key: str) -> RunInfo | None:
        """Of a job's line: node 0's run (the one with the metrics and the health), for the detail and the actions."""
        return next((item.nodes[0].run for k, item in self.drawn if k == key and isinstance(item, jobs.Job)), None)

    def refill(self) -> None:
        selected = self.selected_run()
        on_gpus = run_gpus(self.gpus)
        self.drawn = lines = self.lines()
        rows = []
        for key, item in lines:
            if isinstance(item, jobs.Job):
                rows.append(job_row(item, self.progress, any(r in self.unseen for r in job_runs(item)), self.down))
                continue
            row = run_row(item, on_gpus, self.progress.get(key), key in self.unseen, item.get("host") in self.down)
            if "job" in item:  # a node's run under its job's line
                name_at = 2 if "host" in item else 1
                row[name_at] = Text(NODE_MARK) + row[name_at]
            rows.append(row)
        columns = row_columns(self.runs)
        widths = fit_columns(self.scrollable_content_region.width or self.size.width, rows, columns)
        if (rows, widths) == self.filled:  # the same table: filling it again would cost a whole repaint
            return
        before, self.filled = self.filled, (rows, widths)
        if widths == before[1] and (keys_of(lines), columns) == self.keyed:
            # The same rows and columns, some cells changed (a training's step, every poll): those cells alone are
            # drawn again, where a refill cleared the table and laid the whole screen out again
            for (key, _item), row, old in zip(lines, rows, before[0], strict=True):
                for name, cell, was in zip(columns, row, old, strict=True):
                    if cell != was and name in widths:
                        self.update_cell(key, name, cut(cell, widths[name], keep_tail=name == "RUN"))
            return
        self.keyed = (keys_of(lines), columns)
        self.clear(columns=True)
        for name, width in widths.items():
            self.add_column(name, width=width, key=name)
        for (key, _item), row in zip(lines, rows, strict=True):
            cells = dict(zip(columns, row, strict=True))
            self.add_row(*(cut(cells[n], w, keep_tail=n == "RUN") for n, w in widths.items()), key=key)
        keys = [key for key, _ in lines]
        if keys:
            self.move_cursor(row=keys.index(selected) if selected in keys else len(keys) - 1)

    def selected_run(self) -> str | None:
        """The key of the row under the cursor: a run's id, or JOB_KEY and a job's id."""
        if self.row_count == 0:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return str(key.value) if key.value is not None else None


def lineage_edits(attempts: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """Each attempt of a chain of relaunches, oldest first, with the flags it changed from the one before (the
    first: none)."""
    edits: list[tuple[str, list[str]]] = [(attempts[0]["id"], [])]
    edits += [(after["id"], changed_flags(before["argv"], after["argv"])) for before, after in pairwise(attempts)]
    return edits


def job_runs(job: jobs.Job) -> set[str]:
    return {node.run["id"] for node in job.nodes}


@dataclass
class RunFacts:
    """What the console learned of the selected run beyond its status row: its events read as a timeline, how
    long its output has been silent, the top of its stall's stacks, its last exception, the run it replaced."""

    line: Timeline | None = None
    silent_s: float | None = None
    frames: list[str] = field(default_factory=list)
    last_exception: str | None = None
    parent: Mapping[str, Any] | None = None
    progress: str | None = None  # what its rows tell of how far it got (step/total, ETA)
    parent_line: Timeline | None = None  # the startup of the run it replaced, to compare phase by phase
    job: str | None = None  # of a node of a multi-node job: the job's state from the nodes in view
    # Of a relaunch whose parent logged nothing: the attempt whose curves are drawn, then each attempt since with
    # its edits (the run's own last)
    edits: list[tuple[str, list[str]]] = field(default_factory=list)
    edits_logged: bool = True  # the first of `edits` logged metrics (else none of them did)
    benched: list[RunInfo] = field(default_factory=list)  # the other serve runs in view, to set benches beside


SILENT_SHOWN_S = 5.0  # a run quiet for less is not worth a line
BENCH_SHOWN = 3  # the latest bench results the detail shows (`status RUN` shows all the status carries)
BENCH_BESIDE = 2  # other serve runs whose latest bench the detail sets beside the run's
DETAIL_WIDTH = 60  # when the panel's width is not known yet
HEALTH_LABELS = 14  # the health strip's own words around its cells: "health " and its span (" 2 m 05 s")


def health_styles(theme: Theme | None) -> dict[str, str]:
    """A health answer class's colour in the theme: 200 as success, 503 as a warning, refused and errors as errors."""
    colours = signals(theme)
    return {"ok": colours.success, "http": colours.warning, "refused": colours.error, "error": f"bold {colours.error}"}


def silence_text(silent_s: float) -> str:
    """`83 s`, then `12 min`, then `2 h 05 min`: by the second while a second tells something; past two minutes the
    panel is drawn again once a minute, not every second, for as long as the run stays silent (days, at times)."""
    if silent_s < 120:
        return f"{silent_s:.0f} s"
    if silent_s < 3600:
        return f"{int(silent_s // 60)} min"
    return f"{int(silent_s // 3600)} h {int(silent_s % 3600 // 60):02d} min"


class RunDetail(Static):
    """The selected run: state, phase, health while it lives, its startup timeline and health history, a stall
    with its top frames and what to try, failures explained, the run it replaced, the command."""

    shown: Text | None = None
    height: int = 0  # of the text shown, wrapped at its width

    def show(self, run: RunInfo | None, facts: RunFacts | None = None) -> None:
        width = self.content_region.width or DETAIL_WIDTH
        text = detail_text(run, facts, time.time(), width, health_styles(self.app.current_theme))
        if text != self.shown:  # only when something changed
            self.shown = text
            # The screen is laid out again only when the panel's height changes: a counter that moves costs a
            # redraw of the panel alone
            height = len(text.wrap(self.app.console, width))
            self.update(text, layout=height != self.height)
            self.height = height


def ended_text(run: Mapping[str, Any]) -> str:
    """How the run ended: for a failed run, why (the host's one line, with its exit code or signal)."""
    if run.get("failure"):
        return str(run["failure"])
    if run.get("signal"):
        return f"ended by signal SIG{run['signal']}"
    if run.get("exit_code") is not None:
        return f"exit code {run['exit_code']}"
    return "ended, exit unknown"


def health_text(line: Timeline, now: float, width: int, styles: Mapping[str, str]) -> Text:
    """The health answers from launch to now (or the end) as one cell per slice: refused · 503 ▒ 200 █."""
    start = line.launched_at if line.launched_at is not None else (line.health[0].at if line.health else now)
    end = line.ended_at if line.ended_at is not None else now
    text = Text("health ")
    for answer in health_strip(line, start, end, width):
        text.append(HEALTH_CELLS[answer] if answer else " ", style=styles.get(answer or "", ""))
    text.append(f" {seconds(end - start)}", style="dim")
    return text


def hanging(line: str, width: int) -> str:
    """`line` wrapped to `width` with its continuation lines indented under its first word's end (`  try: ...`),
    printable, ending in a newline."""
    indent = " " * (len(line) - len(line.lstrip()) + len("try: "))
    wrapped = textwrap.wrap(printable(line), width, subsequent_indent=indent, drop_whitespace=True)
    return "\n".join(wrapped or [""]) + "\n"


def bench_block(run: Mapping[str, Any], facts: RunFacts, width: int) -> list[str]:
    """A benched server's figures, placed before how it started: once benched, they are what its detail is read for,
    and at 100x30 whatever follows its startup timeline and notes is cut. Beside other drafts' benches (which lead
    with its own latest), that comparison alone; else its latest BENCH_SHOWN."""
    beside = bench_beside(run, facts.benched, BENCH_BESIDE, width)
    return beside or bench_lines((run.get("bench") or [])[-BENCH_SHOWN:], width)


def detail_text(
    run: Mapping[str, Any] | None,
    facts: RunFacts | None = None,
    now: float | None = None,
    width: int = DETAIL_WIDTH,
    styles: Mapping[str, str] | None = None,
) -> Text:
    """What the detail panel shows of a run, one printable line per fact (see `printable`)."""
    if run is None:
        return Text("no run selected", style="dim")
    facts = facts or RunFacts()
    now = time.time() if now is None else now
    alive = run["state"] not in TERMINAL_STATES
    text = Text(printable(f"{run['id']}  {run['name']}  ({run['kind']})  "))
    text.append_text(state_text(run["state"]))
    # A training or an extraction has no phase: how far its rows say it got is its status.
    status = f"phase {run['phase']}" if run.get("phase") else (facts.progress or "phase -")
    if alive and run.get("health"):
        status += f"  health {run['health']}"  # a dead server answers nothing: its last answer is not shown
    if alive and run["state"] != "ready" and facts.silent_s is not None and facts.silent_s >= SILENT_SHOWN_S:
        status += f"  silent for {silence_text(facts.silent_s)}"
    text.append("\n" + printable(status) + "\n")
    if facts.job:
        text.append(hanging(facts.job, width), style="bold")
    if not alive:
        text.append(printable(ended_text(run)) + "\n", style="bold red" if run["state"] in FAILED_STATES else "")
    for line in bench_block(run, facts, width):
        text.append(printable(line) + "\n")
    if facts.line is not None and run["kind"] == "serve":
        for line in summary_lines(facts.line, now, width):
            text.append(printable(line) + "\n")
        for note, fix in facts.line.notes:
            text.append(hanging(note, width), style="yellow")
            if fix:
                text.append(hanging(f"  fix: {fix}", width), style="dim")
        if facts.parent_line is not None and facts.parent_line.phases:
            compared = comparison_steps(facts.line, facts.parent_line, now)
            for line in wrap_steps(["vs the run it replaced:", *compared], width):
                text.append(printable(line) + "\n", style="dim")
        if facts.line.health and alive:
            strip = max(width - HEALTH_LABELS, 8)
            text.append_text(health_text(facts.line, now, strip, styles or health_styles(None)))
            text.append("\n")
    if run["state"] == "stalled":
        text.append(printable(stall_text(run)) + "\n", style="bold yellow")
        for frame in facts.frames:
            text.append(printable(f"  at {frame}") + "\n")
        advice = STALL_ADVICE.get(run.get("stall_kind") or "idle", STALL_ADVICE["idle"])
        text.append(hanging(f"  try: {advice}", width))
    for diagnosis in run.get("diagnoses") or []:
        text.append(printable(f"{diagnosis['code']}: {diagnosis['meaning']}") + "\n", style="bold red")
        text.append(hanging(f"  try: {diagnosis['hint']}", width))
    if run.get("error") and run["error"] != run.get("failure"):
        text.append(printable(f"error: {run['error']}") + "\n", style="red")
    if not alive and facts.last_exception and not run.get("failure"):  # the host's line says why, by its rule
        text.append(printable(f"last exception: {facts.last_exception}") + "\n", style="red")
    if run.get("corrupt"):
        text.append(printable(corrupt_text(run)) + "\n", style="bold red")
    if run.get("parent"):
        changes = changed_flags(facts.parent["argv"], run["argv"]) if facts.parent else []
        changed = f": {', '.join(changes)}" if changes else ""
        text.append(printable(f"relaunch of {run['parent']}{changed}") + "\n")
    if facts.edits:
        (logged, _), *since = facts.edits
        steps = "; ".join(f"{attempt}: {', '.join(edits) or 'no flag changed'}" for attempt, edits in since)
        base = "the last attempt that logged" if facts.edits_logged else "the first attempt (none logged metrics)"
        text.append(hanging(f"edits since {logged}, {base}: {steps}", width), style="dim")
    command = command_line(run["argv"])
    text.append(command if len(command) <= COMMAND_CHARS else command[: COMMAND_CHARS - 1] + "…", style="dim")
    return text
