"""Plain-text rendering of agent results for the CLI (tables, n/a, times).

The functions that show a run, a status or a relaunch preview take any mapping of the reply's fields: the
faults tests feed them hand-made, hostile ones.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from backends.bench.table import figures_table
from backends.protocol import (
    Finding,
    FreeGpusResult,
    GpuInfo,
    HeldProcess,
    InferredHolder,
    KillResult,
    Metric,
    MetricRow,
    RunInfo,
    nonfinite_spelled,
    not_metric_values,
)
from console.fleet.names import own_id
from console.visible import printable

NA = "n/a"


def command_line(argv: list[str]) -> str:
    """A run's argv as one shell-quoted, printable line."""
    return printable(shlex.join(argv))


def cell(value: object) -> str:
    if value is None:
        return NA
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


NONFINITE_MARK = "\u00d7"  # before a metric value that is NaN or infinite, as the charts mark such points


def metric_cell(value: object) -> str:
    """A metric row's value: as `cell` shows it, a NaN or infinite one (a float, or text spelling one) marked."""
    number = nonfinite_spelled(value) if isinstance(value, str) else value
    if isinstance(number, float) and not math.isfinite(number):
        return f"{NONFINITE_MARK}{number}"
    return cell(value)


def nonfinite_note(run: str, rows: Sequence[MetricRow]) -> str | None:
    """`run R: loss is nan at step 5 (first of 3 NaN or infinite values)`: the rows' NaN and infinities; None when
    there are none."""
    bad = [(row, name) for row in rows for name, value in row.items() if metric_cell(value).startswith(NONFINITE_MARK)]
    if not bad:
        return None
    row, name = bad[0]
    at = f" at step {row[Metric.STEP]}" if Metric.STEP in row else ""
    more = f" (first of {len(bad)} NaN or infinite values)" if len(bad) > 1 else ""
    return printable(f"run {run}: {name} is {metric_cell(row[name]).removeprefix(NONFINITE_MARK)}{at}{more}")


def not_numbers_note(run: str, rows: Sequence[MetricRow]) -> str | None:
    """`run R: 2 metric rows hold values that are not numbers, left out of its charts (first: "loss" = "abc"
    at step 3)`: what the rows hold that no chart can draw (`not_metric_values`); None when nothing."""
    odd = [(row, bad) for row in rows if (bad := not_metric_values(row))]
    if not odd:
        return None
    row, bad = odd[0]
    name, value = next(iter(bad.items()))
    at = f" at step {row[Metric.STEP]}" if isinstance(row.get(Metric.STEP), int) else ""
    # As JSON writes them: a run's text with its control characters escaped, cut short.
    said = f"{json.dumps(name)[:40]} = {json.dumps(value)[:80]}{at}"
    many = f"{len(odd)} metric rows hold values that are not numbers"
    rows_are = "1 metric row holds a value that is not a number" if len(odd) == 1 else many
    return printable(f"run {run}: {rows_are}, left out of its charts (first: {said})")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    headers = [printable(h) for h in headers]
    rows = [[printable(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


CLOCK_WIDTH = len("12-31 23:59:59")  # what `clock` prints


def clock(t: float | None) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def exit_text(run: Mapping[str, Any]) -> str:
    if run.get("error"):
        return "error"
    if run.get("signal"):
        return f"SIG{run['signal']}"
    return "-" if run.get("exit_code") is None else str(run["exit_code"])


def run_gpus(gpus: Sequence[GpuInfo]) -> dict[str, str]:
    """Each run's GPUs, where NVML lists one of its processes, with their utilisation: `0:97% 1:0%`; where it
    lists none (inside a container) but the run's CUDA_VISIBLE_DEVICES names them, with where that came from:
    `0:97% (by CUDA_VISIBLE_DEVICES)`."""
    held: dict[str, list[str]] = {}
    why: dict[str, str] = {}
    for gpu in gpus:
        util = "n/a" if gpu["util"] is None else f"{gpu['util']}%"
        for run_id in dict.fromkeys(filter(None, (p.get("run_id") for p in gpu["processes"]))):
            held.setdefault(run_id, []).append(f"{gpu['index']}:{util}")
        for holder in gpu.get("inferred") or []:
            held.setdefault(holder["run_id"], []).append(f"{gpu['index']}:{util}")
            why[holder["run_id"]] = inferred_note(holder)
    return {run_id: " ".join(on + ([why[run_id]] if run_id in why else [])) for run_id, on in held.items()}


def inferred_note(holder: InferredHolder) -> str:
    """`(by CUDA_VISIBLE_DEVICES)`: a run placed on a GPU by its launch, not by a process NVML listed."""
    return f"(by {holder['inferred_from']})"


def progress_head(step: float | None, shard: float | None, total: int | None = None) -> str | None:
    """`step 1295/3000`, `step 1295`, `shard 3` (shards count from 0 in the rows, from 1 here)."""
    if step is not None:
        return f"step {step:.0f}" + (f"/{total}" if total else "")
    if shard is not None:
        return f"shard {shard + 1:.0f}"
    return None


def progress_text(run: RunInfo) -> str | None:
    """How far a training or an extraction got, as its last metric rows say (see `progress_head`)."""
    progress = run.get("progress") or {}
    return progress_head(progress.get(Metric.STEP), progress.get(Metric.SHARD))


def runs_table(runs: Sequence[RunInfo], gpus: Sequence[GpuInfo] | None = None) -> str:
    on_gpus = run_gpus(gpus or [])
    rows = [
        [
            r["id"],
            truncate(printable(r["name"]), 20),
            r["kind"],
            r["state"],
            truncate(printable(r.get("phase") or progress_text(r) or "-"), 24),
            cell(r["pid"]) if r["pid"] else "-",
            exit_text(r),
            truncate(on_gpus.get(r["id"], "-"), 48),  # room for "(by CUDA_VISIBLE_DEVICES)"
            clock(r["started_at"]),
            truncate(command_line(r["argv"]), 60),
        ]
        for r in runs
    ]
    return table(["RUN", "NAME", "KIND", "STATE", "PHASE", "PID", "EXIT", "GPUS", "STARTED", "COMMAND"], rows)


STALL_KINDS = {
    "idle": "output silent, processes and GPUs idle",
    "spinning": (
        "output silent, its GPUs held by kernels that move no memory "
        "(waiting: a rank in an NCCL collective whose peer never came?)"
    ),
}


# What to try on each kind of stall, after looking at its stack.
STALL_ADVICE = {
    "idle": (
        "if the top frames wait on a download, a lock or a socket, fix that and relaunch (r); "
        "s shows every stack, k kills the run"
    ),
    "spinning": (
        "read the other ranks' logs for the one that never joined; relaunch with NCCL_DEBUG=INFO, "
        "or with fewer GPUs (r)"
    ),
}


def stall_text(run: Mapping[str, Any]) -> str:
    """A stalled run's stall: where, since when, how it sits still, and where its stacks are."""
    dumps = run.get("stack_dumps") or []
    where = f" in {run['phase']}" if run.get("phase") else ""
    how = STALL_KINDS.get(run.get("stall_kind") or "idle", STALL_KINDS["idle"])
    return (
        f"stalled{where} since {clock(run.get('stalled_since'))}: {how}; "
        f"stacks: runs/{own_id(run['id'])}/{dumps[-1] if dumps else '(none)'}"
    )


def top_frames(dump: str, count: int = 3, first: Sequence[int] = ()) -> list[str]:
    """The innermost `count` frames of each thread's stack in a py-spy dump (py-spy prints innermost first); the
    processes `first` (a distributed run's ranks) before the others (torchrun's agent, which only waits)."""
    sections = re.split(r"(?m)^(?==== pid \d+:)", dump)
    pid_of = [int(m.group(1)) if (m := re.match(r"=== pid (\d+):", part)) else None for part in sections]
    ordered = [part for part, pid in sorted(zip(sections, pid_of, strict=True), key=lambda p: p[1] not in first)]
    frames: list[str] = []
    taking = 0
    for line in "".join(ordered).splitlines():
        if line.startswith("Thread "):
            taking = count
        elif taking and line.startswith("    ") and line.strip():
            frames.append(line.strip())
            taking -= 1
        else:
            taking = 0
    return frames


TRACEBACK = "Traceback (most recent call last)"


class ExceptionFinder:
    """The last exception a log names: the first unindented line after a traceback's frames."""

    def __init__(self) -> None:
        self.last: str | None = None
        self.in_traceback = False

    def feed(self, line: str) -> None:
        if TRACEBACK in line:
            self.in_traceback = True
        elif self.in_traceback and line.strip() and not line[:1].isspace():
            self.last = printable(line.strip())
            self.in_traceback = False


def flag_values(argv: Sequence[str]) -> dict[str, str | None]:
    """A command line's `--flags` and their values (None: a switch); `--a=b` and `--a b` alike."""
    flags: dict[str, str | None] = {}
    for i, word in enumerate(argv):
        if not word.startswith("--"):
            continue
        name, eq, value = word.partition("=")
        if eq:
            flags[name] = value
        else:
            following = argv[i + 1] if i + 1 < len(argv) else None
            flags[name] = following if following is not None and not following.startswith("-") else None
    return flags


def changed_flags(before: Sequence[str], after: Sequence[str]) -> list[str]:
    """What a relaunch changed: `added --disable-cuda-graph`, `removed --cuda-graph-max-bs`,
    `--mem-fraction-static 0.9→0.8`."""
    old, new = flag_values(before), flag_values(after)
    changes = [f"removed {name}" for name in old if name not in new]
    for name, value in new.items():
        if name not in old:
            changes.append(f"added {name}" + (f" {value}" if value is not None else ""))
        elif old[name] != value:
            changes.append(f"{name} {old[name] or '(on)'}→{value or '(on)'}")
    return [printable(change) for change in changes]


# Runs that want a person's attention first, most urgent first; and the states that count as a failure.
FAILED_STATES = frozenset({"failed", "lost", "corrupt"})


def attention_rank(state: str) -> int:
    return 0 if state == "stalled" else 1 if state in FAILED_STATES else 2


LIVE_SHOWN = ("ready", "running", "starting")  # the live states the header counts each on its own


def attention_counts(runs: Sequence[Mapping[str, Any]]) -> str:
    """`1 stalled · 1 failed · 1 ready · 2 running`: the runs that need a look, then the live ones by their own
    state (a ready server is not called running; none: empty)."""
    states = [r["state"] for r in runs]
    parts = [(states.count("stalled"), "stalled"), (sum(s in FAILED_STATES for s in states), "failed")]
    parts += [(states.count(live), live) for live in LIVE_SHOWN]
    return " · ".join(f"{n} {what}" for n, what in parts if n)


# State changes worth telling a person who looks elsewhere, and how loudly (Textual's severities).
Severity = Literal["information", "warning", "error"]
ANNOUNCED: dict[str, Severity] = {
    "ready": "information",
    "exited": "information",
    "killed": "information",
    "stalled": "warning",
    "failed": "error",
    "lost": "error",
    "corrupt": "error",
}


@dataclass(frozen=True)
class StateChange:
    run_id: str
    was: str | None  # None: a run not seen before
    text: str  # `name (id): running → stalled in load-weights`
    severity: Severity | None  # None: a step on the way (starting → running), not news


def state_changes(before: dict[str, str], runs: Sequence[Mapping[str, Any]]) -> list[StateChange]:
    """What changed since `before` (run id -> state): new runs and every change of state."""
    changes: list[StateChange] = []
    for run in runs:
        was, now = before.get(run["id"]), run["state"]
        if was == now:
            continue
        why = f" in {run['phase']}" if now == "stalled" and run.get("phase") else ""
        if now == "failed" and (run.get("failure") or run.get("diagnoses")):
            why = f": {run.get('failure') or run['diagnoses'][0]['code']}"
        move = f"{was} → {now}" if was is not None else f"new {run['kind']} run, {now}"
        severity = ANNOUNCED.get(now) if was is not None else None
        text = printable(f"{run['name']} ({run['id']}): {move}{why}")
        changes.append(StateChange(run["id"], was, text, severity))
    return changes


def run_notes(runs: Sequence[Mapping[str, Any]], failures: bool = True) -> list[str]:
    """What a person must see about a run beyond its row: a stall and its stacks, why it failed (unless
    `failures` is False: a line already said it), failures explained."""
    notes: list[str] = []
    for r in runs:
        if r["state"] == "stalled":
            notes.append(f"run {r['id']} {stall_text(r)}")
        if failures and r["state"] == "failed" and r.get("failure"):
            notes.append(f"run {r['id']} failed: {r['failure']}")
        for d in r.get("diagnoses") or []:
            notes.append(f"run {r['id']}: {d['code']}: {d['meaning']}; try: {d['hint']}")
        if r.get("corrupt"):
            notes.append(corrupt_text(r))
    return [printable(note) for note in notes]


def corrupt_text(run: Mapping[str, Any]) -> str:
    corrupt = run["corrupt"]
    return (
        f"run {run['id']} is corrupt: {corrupt['file']}: {corrupt['reason']}; "
        f"repair that file or move runs/{own_id(run['id'])} away"
    )


def run_text(run: RunInfo) -> str:
    """One run whole, a field a line (`status RUN`): nothing of it is cut."""
    fields = [
        ("run", run["id"]),
        ("name", run["name"] or "-"),
        ("kind", run["kind"]),
        ("state", run["state"] + (f" in {run['phase']}" if run.get("phase") else "")),
        ("pid", cell(run["pid"]) if run["pid"] else "-"),
        ("exit", exit_text(run)),
        ("started", clock(run["started_at"])),
        ("ended", clock(run["ended_at"])),
        ("gpus", ",".join(str(g) for g in run["gpus"]) or "-"),
        ("health", run.get("health") or "-"),
        ("parent", run.get("parent") or "-"),
        ("command", command_line(run["argv"])),
        *(("env", f"{name}={value}") for name, value in run["env"].items()),
        *([("error", run["error"])] if run.get("error") else []),
    ]
    lines = [printable(f"{name:<8} {value}") for name, value in fields]
    return "\n".join(lines + run_notes([run]))


def mem(used: int | None, total: int | None) -> str:
    return f"{cell(used)}/{cell(total)} MiB"


def gpus_table(gpus: Sequence[GpuInfo]) -> str:
    rows = []
    for g in gpus:
        listed = [
            f"{p['pid']}({', '.join(filter(None, [p['user'] or NA, p.get('run_id')]))}: {cell(p['mem_mib'])} MiB)"
            for p in g["processes"]
        ]
        procs = ", ".join(listed + [f"run {h['run_id']} {inferred_note(h)}" for h in g.get("inferred") or []])
        rows.append(
            [
                str(g["index"]),
                cell(g["name"]),
                f"{cell(g['util'])}%",
                mem(g["mem_used_mib"], g["mem_total_mib"]),
                f"{cell(g['temp_c'])}C",
                f"{cell(g['power_w'])}W",
                procs or "-",
            ]
        )
    return table(["GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER", "PROCESSES"], rows)


def hidden_line(hidden: int) -> str:
    """The ended runs a status left out (it asked for a page of them), and how to see them."""
    runs = "run" if hidden == 1 else "runs"
    return f"{hidden:,} more ended {runs} not shown: `status --all` lists every run, `status --page 2` the next page"


def status_text(status: Mapping[str, Any]) -> str:
    parts = [f"host {status['host']}"]
    parts.append(runs_table(status["runs"], status.get("gpus")) if status["runs"] else "no runs yet")
    notes = run_notes(status["runs"])
    if notes:
        parts.append("\n".join(notes))
    cut = [r["id"] for r in status["runs"] if r.get("truncated")]
    if cut:
        parts.append(f"cut to keep this reply small: {', '.join(cut)}; `status RUN` shows a run whole")
    if status.get("omitted"):
        parts.append(f"{status['omitted']} older runs not shown, to keep this reply small; `status RUN` shows any run")
    if status.get("hidden"):
        parts.append(hidden_line(status["hidden"]))
    if status["gpus"]:
        parts.append(f"GPUs (via {status['gpu_source']})\n" + gpus_table(status["gpus"]))
    else:
        parts.append("GPUs: none found")  # the source is "none" then: the error below says why
    if status.get("gpu_error"):
        parts[-1] += f"\n{status['gpu_error']}"
    return "\n\n".join(parts)


def metrics_table(rows: Sequence[MetricRow]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]

    def shown(row: MetricRow, column: str) -> str:
        value = row.get(column)
        if column == Metric.TIME and isinstance(value, (int, float)):
            return clock(value)  # seconds since 1970 say nothing at a glance
        return metric_cell(value) if column in row else ""

    return table(columns, [[shown(row, c) for c in columns] for row in rows])


def kill_text(result: KillResult) -> str:
    lines = [f"run {result['run']}: {result['state']}"]
    for p in result["processes"]:
        fate = "died" if p["died"] else "STILL ALIVE"
        lines.append(f"  pid {p['pid']}: sent {'+'.join(p['signals']) or 'nothing'}, {fate}")
    for r in result["refused"]:
        lines.append(f"  pid {r['pid']}: not signalled ({r['reason']})")
    if result["escalated"]:
        lines.append("  escalated to SIGKILL after the grace period")
    return "\n".join(lines)


def holder_text(process: HeldProcess) -> str:
    """Whose a GPU's process is, as free-gpus proved it: which run of which store, the user's own, or not theirs."""
    run, workdir = process["run_id"], process["workdir"]
    said = {
        "run": f"run {run} of this store",
        "other_store": f"run {run} of workdir {workdir}",
        "own": "your process, not a run",
        "not_yours": "not yours: never killed",
        "unknown": "holder unknown",
    }
    return printable(said[process["holder"]])


def free_text(result: FreeGpusResult) -> str:
    lines = []
    if not result["gpus"]:
        return f"no GPUs found (source: {result['gpu_source']})"
    for g in result["gpus"]:
        head = f"GPU {g['index']}:"
        if result["dry_run"]:
            head += f" {cell(g['mem_used_before_mib'])} MiB used"
        else:
            head += f" freed {cell(g['freed_mib'])} MiB ({cell(g['mem_used_after_mib'])} MiB still used)"
        lines.append(head)
        for p in g["processes"]:
            owner = f"{p['user'] or NA}, {holder_text(p)}"
            lines.append(f"  pid {p['pid']} ({owner}, {cell(p['mem_mib'])} MiB): {p['action']}")
        if not result["dry_run"]:
            for p in g["still_held"]:
                by = f"{p['user'] or NA}, {holder_text(p)}"
                lines.append(f"  still held: pid {p['pid']} by {by} ({cell(p['mem_mib'])} MiB)")
        if not g["processes"]:
            lines.append("  no compute processes")
    if result["dry_run"]:
        lines.append("dry run: nothing was signalled; add --yes to do it")
    return "\n".join(lines)


POSITION_KEY = re.compile(r"^(val_)?(acc|ploss)_(\d+)$")


def compact_columns(row: MetricRow) -> list[str]:
    """A row's keys for a narrow table: per-position accuracy only at the first and
    last position, no per-position losses (the console's curves show them all)."""
    positions = [int(m.group(3)) for k in row if (m := POSITION_KEY.match(k)) and m.group(2) == "acc"]
    shown = {0, max(positions)} if positions else set()
    keep = []
    for key in row:
        match = POSITION_KEY.match(key)
        if key == "source" or (match and (match.group(2) == "ploss" or int(match.group(3)) not in shown)):
            continue
        keep.append(key)
    return keep


class LiveTable:
    """Metric rows as aligned lines while they arrive. Training rows share one table
    (its header repeats when new columns appear); evaluation rows, whose keys start
    with `val_`, print as one `eval` line each so they do not widen the table."""

    def __init__(self, wide: bool = False, min_width: int = 9) -> None:
        self.columns: list[str] = []
        self.wide = wide
        self.min_width = min_width

    def _line(self, cells: list[str]) -> str:
        cells, names = [printable(c) for c in cells], [printable(name) for name in self.columns]
        return "  ".join(c.rjust(self._width(name)) for c, name in zip(cells, names, strict=True))

    def _width(self, name: str) -> int:
        return max(self.min_width, len(name), CLOCK_WIDTH if name == Metric.TIME else 0)

    @staticmethod
    def _cell(row: MetricRow, name: str) -> str:
        """A value as `metrics_table` shows it: the wall time as a clock (seconds since 1970 say nothing at a
        glance, and %g would print 1.796e+09)."""
        value = row.get(name)
        if name == Metric.TIME and isinstance(value, (int, float)) and not isinstance(value, bool):
            return clock(value)
        return metric_cell(value)

    def lines(self, rows: Sequence[MetricRow]) -> list[str]:
        out: list[str] = []
        for row in rows:
            keys = list(row) if self.wide else compact_columns(row)
            if any(k.startswith("val_") for k in row):
                out.append(printable("eval " + "  ".join(f"{k}={self._cell(row, k)}" for k in keys)))
                continue
            new = [k for k in keys if k not in self.columns]
            if new or not self.columns:
                self.columns += new
                out.append(self._line(self.columns))
            out.append(self._line([self._cell(row, c) if c in row else "" for c in self.columns]))
        return out


def startup_event(event: dict[str, Any]) -> str | None:
    """One line for a server's startup event worth a person's attention (None for the others)."""
    kind, at = event.get("type"), clock(event.get("t"))
    if kind == "phase":
        return f"{at}  phase {event['phase']}"
    if kind == "health":
        return f"{at}  health {event['status']}"
    if kind == "state" and event.get("state") in ("ready", "stalled", "running"):
        return f"{at}  state {event['state']}"
    if kind == "stalled":
        return f"{at}  STALLED in {event.get('phase') or 'an unknown phase'} after {event['silent_s']} s of silence"
    if kind == "diagnosis":
        return f"{at}  {event['code']}: {event['meaning']}; try: {event['hint']}"
    if kind == "unwatched":
        return f"{at}  {event['message']}"
    return None


def flags_text(flags: Finding) -> str:
    """SGLang's parser on a serve command's flags (its refusal, its warnings, or why it was not asked), and for a
    warning what to write instead."""
    text = f"{flags['severity']}: {flags['message']}"
    # An error's fix is said by the refusal itself; a warning's and an unchecked launch's are what to do.
    return text + (f"\n  fix: {flags['fix']}" if flags["severity"] != "error" and flags.get("fix") else "")


def relaunch_preview(result: Mapping[str, Any]) -> str:
    """What a relaunch would start, and what the pre-launch checks said of it (nothing was stopped)."""
    from backends import serving  # the engine's facts: only a relaunch preview pays for importing them

    if result["would_stop"]:
        head = f"would stop run {result['parent']} and start:"
    else:
        head = f"run {result['parent']} has no live process to stop; would start:"
    lines = [head, f"  {command_line(result['argv'])}"]
    flags, verdict = result.get("flags"), result.get("doctor")
    if flags is not None:
        lines += flags_text(flags).splitlines()
    elif (engine := serving.engine_for(result["argv"])) is not None:
        lines.append(f"{engine.name}'s parser: accepted")
    if verdict is not None:
        lines.append(f"doctor: {verdict['errors']} error(s), {verdict['warnings']} warning(s)")
        notable = [f for f in verdict["findings"] if f["severity"] != "info"]
        lines += [f"  {f['severity'].upper()} {f['code']}: {f['message']}" for f in notable]
    return "\n".join(printable(line) for line in lines)


# --- a run's stored bench results, for `status RUN` and the console's detail panel ---

BENCH_INDENT = "  "


def _seconds(spread_ms: Mapping[str, float] | None, digits: int) -> str:
    """p50/p99 of figures kept in milliseconds, in seconds as /metrics' series of the same names are (a result stored
    before 0.x named the median p50)."""
    if not spread_ms:
        return "n/a"
    median = spread_ms.get("median", spread_ms.get("p50", math.nan))
    return f"{median / 1000:.{digits}f}/{spread_ms['p99'] / 1000:.{digits}f} s"


def bench_fields(result: Mapping[str, Any]) -> list[str]:
    """`11-30 10:00:00`, `accept 2.67`, `340 tok/s`, `ttft_p50/p99 0.048/0.051 s`, `itl_p50/p99 0.0021/0.0030 s`,
    `6/6 ok`, `chat c2 m8` (named as /metrics' series and in their unit, ITL per token as theirs, so that the chart's
    ttft_p50 and the bench's read alike; the api, the concurrency and the most tokens per answer)."""
    f, s = result.get("figures") or {}, result.get("settings") or {}
    accept, rate = f.get("accept_len"), f.get("output_tok_s")
    done = f.get("ok", 0)
    total = done + f.get("errors", 0) + f.get("cut", 0)
    return [
        clock(result.get("t")),
        f"accept {'n/a' if accept is None else f'{accept:.2f}'}",
        f"{'n/a' if rate is None else f'{rate:.0f}'} tok/s",
        f"ttft_p50/p99 {_seconds(f.get('ttft_ms'), 3)}",
        f"itl_p50/p99 {_seconds(f.get('itl_ms'), 4)}",
        f"{done}/{total} ok",
        f"{s.get('api', '?')} c{s.get('concurrency', '?')} m{s.get('max_tokens', '?')}",
    ]


def bench_beside(
    run: Mapping[str, Any], others: Sequence[Mapping[str, Any]], shown: int, width: int | None = None
) -> list[str]:
    """A serve run's latest bench above the latest of up to `shown` other serve runs (the most recently benched),
    each headed by its draft's checkpoint and run name: two drafts side by side in the console's detail. Nothing
    when the run or every other has none."""
    benched = sorted((r for r in others if r.get("bench")), key=lambda r: r["bench"][-1].get("t") or 0)[-shown:]
    if not run.get("bench") or not benched:
        return []

    def fields(of: Mapping[str, Any]) -> list[str]:
        result = of["bench"][-1]
        draft = str(result.get("draft") or "?").rstrip("/").rsplit("/", 1)[-1]
        return [f"{draft} ({of.get('name') or own_id(str(of.get('id')))})", *bench_fields(result)[1:]]

    return [
        "latest bench beside other drafts':",
        *(line for r in (run, *benched) for line in _packed(fields(r), width)),
    ]


def bench_compare(runs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> list[str]:
    """Serve runs' bench results side by side, a column per (run, result) headed by the run and its draft's
    checkpoint (the draft's last folder), then bench_serving's figures."""

    def heads(run: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
        draft = str(result.get("draft") or "?").rstrip("/").rsplit("/", 1)[-1]
        return [printable(str(run.get("name") or own_id(str(run.get("id"))))), printable(draft)]

    return figures_table([(heads(run, r), r.get("figures") or {}) for run, r in runs])


def _packed(fields: list[str], width: int | None) -> list[str]:
    """The fields two spaces apart, a new line (indented under the first) before one that would pass `width`."""
    lines = [BENCH_INDENT + fields[0]]
    for field in fields[1:]:
        if width is not None and len(lines[-1]) + 2 + len(field) > width:
            lines.append(BENCH_INDENT * 2 + field)
        else:
            lines[-1] += "  " + field
    return lines


def bench_lines(results: Sequence[Mapping[str, Any]] | None, width: int | None = None) -> list[str]:
    """A heading and the latest results, newest last; nothing when the run has none."""
    if not results:
        return []
    return ["bench:", *(line for r in results for line in _packed(bench_fields(r), width))]
