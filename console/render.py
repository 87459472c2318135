"""Plain-text rendering of agent results for the CLI (tables, n/a, times)."""

from __future__ import annotations

import re
import shlex
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from backends.serve_flags import server_command

NA = "n/a"
# What a terminal acts on rather than shows: controls (ESC, newline, BEL), format characters (bidi
# overrides), line and paragraph separators; and lone surrogates, which no terminal can be sent.
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """`text` safe to show in one cell or line: each character a terminal would act on is written
    as its escape (`\\x1b`, `\\n`, `\\u202e`), so a run's name or command cannot move the cursor,
    recolour the screen or break a table's row."""
    if text.isprintable():
        return text
    return "".join(_escaped(ch) if unicodedata.category(ch) in HIDDEN_CATEGORIES else ch for ch in text)


def _escaped(ch: str) -> str:
    code = ord(ch)
    if ch in NAMED_ESCAPES:
        return NAMED_ESCAPES[ch]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def command_line(argv: list[str]) -> str:
    """A run's argv as one shell-quoted, printable line."""
    return printable(shlex.join(argv))


def cell(value: object) -> str:
    if value is None:
        return NA
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    headers = [printable(h) for h in headers]
    rows = [[printable(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def clock(t: float | None) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def exit_text(run: dict[str, Any]) -> str:
    if run.get("error"):
        return "error"
    if run.get("signal"):
        return f"SIG{run['signal']}"
    return "-" if run.get("exit_code") is None else str(run["exit_code"])


def run_gpus(gpus: list[dict[str, Any]]) -> dict[str, str]:
    """Each run's GPUs, where NVML lists one of its processes, with their utilisation: `0:97% 1:0%`."""
    held: dict[str, list[str]] = {}
    for gpu in gpus:
        util = "n/a" if gpu["util"] is None else f"{gpu['util']}%"
        for run_id in dict.fromkeys(p["run_id"] for p in gpu["processes"] if p.get("run_id")):
            held.setdefault(run_id, []).append(f"{gpu['index']}:{util}")
    return {run_id: " ".join(on) for run_id, on in held.items()}


def runs_table(runs: list[dict[str, Any]], gpus: list[dict[str, Any]] | None = None) -> str:
    on_gpus = run_gpus(gpus or [])
    rows = [
        [
            r["id"],
            truncate(printable(r["name"]), 20),
            r["kind"],
            r["state"],
            truncate(printable(r.get("phase") or "-"), 24),
            cell(r["pid"]) if r["pid"] else "-",
            exit_text(r),
            truncate(on_gpus.get(r["id"], "-"), 24),
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


def stall_text(run: dict[str, Any]) -> str:
    """A stalled run's stall: where, since when, how it sits still, and where its stacks are."""
    dumps = run.get("stack_dumps") or []
    where = f" in {run['phase']}" if run.get("phase") else ""
    how = STALL_KINDS.get(run.get("stall_kind") or "idle", STALL_KINDS["idle"])
    return (
        f"stalled{where} since {clock(run.get('stalled_since'))}: {how}; "
        f"stacks: runs/{run['id']}/{dumps[-1] if dumps else '(none)'}"
    )


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


def state_changes(before: dict[str, str], runs: list[dict[str, Any]]) -> list[StateChange]:
    """What changed since `before` (run id -> state): new runs and every change of state."""
    changes: list[StateChange] = []
    for run in runs:
        was, now = before.get(run["id"]), run["state"]
        if was == now:
            continue
        why = f" in {run['phase']}" if now == "stalled" and run.get("phase") else ""
        if now == "failed" and run.get("diagnoses"):
            why = f": {run['diagnoses'][0]['code']}"
        move = f"{was} → {now}" if was is not None else f"new {run['kind']} run, {now}"
        severity = ANNOUNCED.get(now) if was is not None else None
        text = printable(f"{run['name']} ({run['id']}): {move}{why}")
        changes.append(StateChange(run["id"], was, text, severity))
    return changes


def run_notes(runs: list[dict[str, Any]]) -> list[str]:
    """What a person must see about a run beyond its row: a stall and its stacks, failures explained."""
    notes: list[str] = []
    for r in runs:
        if r["state"] == "stalled":
            notes.append(f"run {r['id']} {stall_text(r)}")
        for d in r.get("diagnoses") or []:
            notes.append(f"run {r['id']}: {d['code']}: {d['meaning']}; try: {d['hint']}")
        if r.get("corrupt"):
            notes.append(corrupt_text(r))
    return [printable(note) for note in notes]


def corrupt_text(run: dict[str, Any]) -> str:
    corrupt = run["corrupt"]
    return (
        f"run {run['id']} is corrupt: {corrupt['file']}: {corrupt['reason']}; "
        f"repair that file or move runs/{run['id']} away"
    )


def run_text(run: dict[str, Any]) -> str:
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


def gpus_table(gpus: list[dict[str, Any]]) -> str:
    rows = []
    for g in gpus:
        procs = ", ".join(
            f"{p['pid']}({p['user'] or NA}{', ' + p['run_id'] if p.get('run_id') else ''}: {cell(p['mem_mib'])} MiB)"
            for p in g["processes"]
        )
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


def status_text(status: dict[str, Any]) -> str:
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
    if status["gpus"]:
        parts.append(f"GPUs (via {status['gpu_source']})\n" + gpus_table(status["gpus"]))
    else:
        parts.append(f"GPUs: none found (source: {status['gpu_source']})")
    if status.get("gpu_error"):
        parts[-1] += f"\n{status['gpu_error']}"
    return "\n\n".join(parts)


def metrics_table(rows: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    return table(columns, [[cell(row.get(c)) if c in row else "" for c in columns] for row in rows])


def kill_text(result: dict[str, Any]) -> str:
    lines = [f"run {result['run']}: {result['state']}"]
    for p in result["processes"]:
        fate = "died" if p["died"] else "STILL ALIVE"
        lines.append(f"  pid {p['pid']}: sent {'+'.join(p['signals']) or 'nothing'}, {fate}")
    for r in result["refused"]:
        lines.append(f"  pid {r['pid']}: not signalled ({r['reason']})")
    if result["escalated"]:
        lines.append("  escalated to SIGKILL after the grace period")
    return "\n".join(lines)


def free_text(result: dict[str, Any]) -> str:
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
            owner = f"{p['user'] or NA}" + (f", run {p['run_id']}" if p.get("run_id") else "")
            lines.append(f"  pid {p['pid']} ({owner}, {cell(p['mem_mib'])} MiB): {p['action']}")
        if not result["dry_run"]:
            for p in g["still_held"]:
                lines.append(f"  still held: pid {p['pid']} by {p['user'] or NA} ({cell(p['mem_mib'])} MiB)")
        if not g["processes"]:
            lines.append("  no compute processes")
    if result["dry_run"]:
        lines.append("dry run: nothing was signalled; add --yes to do it")
    return "\n".join(lines)


POSITION_KEY = re.compile(r"^(val_)?(acc|ploss)_(\d+)$")


def compact_columns(row: dict[str, Any]) -> list[str]:
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
        return "  ".join(c.rjust(max(self.min_width, len(name))) for c, name in zip(cells, names, strict=True))

    def lines(self, rows: list[dict[str, Any]]) -> list[str]:
        out: list[str] = []
        for row in rows:
            keys = list(row) if self.wide else compact_columns(row)
            if any(k.startswith("val_") for k in row):
                out.append(printable("eval " + "  ".join(f"{k}={cell(row[k])}" for k in keys)))
                continue
            new = [k for k in keys if k not in self.columns]
            if new or not self.columns:
                self.columns += new
                out.append(self._line(self.columns))
            out.append(self._line([cell(row.get(c)) if c in row else "" for c in self.columns]))
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
    return None


def flags_text(flags: dict[str, Any]) -> str:
    """SGLang's parser on a serve command's flags (its refusal, its warnings, or why it was not asked), and for a
    warning what to write instead."""
    text = f"{flags['severity']}: {flags['message']}"
    return text + (f"\n  fix: {flags['fix']}" if flags["severity"] == "warning" and flags.get("fix") else "")


def relaunch_preview(result: dict[str, Any]) -> str:
    """What a relaunch would start, and what the pre-launch checks said of it (nothing was stopped)."""
    if result["would_stop"]:
        head = f"would stop run {result['parent']} and start:"
    else:
        head = f"run {result['parent']} has no live process to stop; would start:"
    lines = [head, f"  {command_line(result['argv'])}"]
    flags, verdict = result.get("flags"), result.get("doctor")
    if flags is not None:
        lines += flags_text(flags).splitlines()
    elif server_command(result["argv"]) is not None:
        lines.append("SGLang's parser: accepted")
    if verdict is not None:
        lines.append(f"doctor: {verdict['errors']} error(s), {verdict['warnings']} warning(s)")
        notable = [f for f in verdict["findings"] if f["severity"] != "info"]
        lines += [f"  {f['severity'].upper()} {f['code']}: {f['message']}" for f in notable]
    return "\n".join(printable(line) for line in lines)
