"""The console's panels: runs, GPUs and the selected run's details. They only render what the agent sent."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable, Static

from console.render import command_line, corrupt_text, exit_text, printable, run_gpus, stall_text

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


def state_text(state: str) -> Text:
    return Text(printable(state), style=STATE_STYLES.get(state, ""))


def run_row(run: dict[str, Any], on_gpus: dict[str, str]) -> list[Text]:
    """A run's cells in the runs table: Text, never markup, each character a terminal would act on escaped."""

    def shown(value: str) -> Text:
        return Text(printable(value))

    return [
        shown(run["id"]),
        shown(run["name"]),
        shown(run["kind"]),
        state_text(run["state"]),
        shown(run.get("phase") or "-"),
        shown(str(run["pid"] or "-")),
        shown(exit_text(run)),
        shown(on_gpus.get(run["id"], "-")),
    ]


class RunsTable(DataTable[Any]):
    """One row per run, newest last; the cursor stays on the same run across refreshes."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns(*RUN_COLUMNS)

    def show(self, runs: list[dict[str, Any]], gpus: list[dict[str, Any]]) -> None:
        selected = self.selected_run()
        on_gpus = run_gpus(gpus)
        self.clear()
        for run in runs:
            self.add_row(*run_row(run, on_gpus), key=run["id"])
        ids = [run["id"] for run in runs]
        if ids:
            self.move_cursor(row=ids.index(selected) if selected in ids else len(ids) - 1)

    def selected_run(self) -> str | None:
        if self.row_count == 0:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return str(key.value) if key.value is not None else None


def bar(percent: float | None, width: int = 12) -> Text:
    if percent is None:
        return Text("n/a".center(width + 2), style="dim")
    filled = round(max(0.0, min(percent, 100.0)) / 100 * width)
    style = "red" if percent >= 90 else "yellow" if percent >= 60 else "green"
    return Text("[") + Text("█" * filled, style=style) + Text("·" * (width - filled) + "]")


class GpuPanel(Static):
    """Per-GPU utilisation and memory bars, temperature, power and the processes with their runs."""

    def show(self, status: dict[str, Any]) -> None:
        gpus = status.get("gpus") or []
        if not gpus:
            why = status.get("gpu_error") or "no GPU found"
            self.update(Text(f"GPUs: none ({status.get('gpu_source')}): {why}", style="dim"))
            return
        text = Text(f"{'':11}{'utilisation':<19}{'memory':<19}temp  power\n", style="bold")
        for gpu in gpus:
            total, used = gpu["mem_total_mib"], gpu["mem_used_mib"]
            mem_pct = 100 * used / total if total and used is not None else None
            text.append(f"GPU{gpu['index']} {(gpu['name'] or '').removeprefix('NVIDIA ')[:6]:<6} ")
            text.append_text(bar(gpu["util"]))
            text.append(f"{gpu['util'] if gpu['util'] is not None else 'n/a':>3}% ")
            text.append_text(bar(mem_pct))
            gib = f"{used / 1024:.0f}/{total / 1024:.0f}G" if total and used is not None else "n/a"
            temp = f"{gpu['temp_c']}°C" if gpu["temp_c"] is not None else "n/a"
            power = f"{gpu['power_w']:.0f} W" if gpu["power_w"] is not None else "n/a"
            text.append(f" {gib}  {temp}  {power}\n")
            for proc in gpu["processes"]:
                owner = f"run {proc['run_id']}" if proc.get("run_id") else (proc.get("user") or "?")
                style = "" if proc.get("run_id") else "dim"
                text.append(f"    pid {proc['pid']} {proc['mem_mib'] or 0} MiB ({owner})\n", style=style)
        self.update(text)


class RunDetail(Static):
    """The selected run: state, phase, health, a stall and its stacks, failures explained, the command."""

    def show(self, run: dict[str, Any] | None) -> None:
        self.update(detail_text(run))


def detail_text(run: dict[str, Any] | None) -> Text:
    """What the detail panel shows of a run, one printable line per fact (see `printable`)."""
    if run is None:
        return Text("no run selected", style="dim")
    text = Text(printable(f"{run['id']}  {run['name']}  ({run['kind']})  "))
    text.append_text(state_text(run["state"]))
    text.append("\n" + printable(f"phase {run.get('phase') or '-'}  health {run.get('health') or '-'}") + "\n")
    if run["state"] == "stalled":
        text.append(printable(stall_text(run)) + "\n", style="bold yellow")
    for diagnosis in run.get("diagnoses") or []:
        text.append(printable(f"{diagnosis['code']}: {diagnosis['meaning']}") + "\n", style="bold red")
        text.append(printable(f"  try: {diagnosis['hint']}") + "\n")
    if run.get("error"):
        text.append(printable(f"error: {run['error']}") + "\n", style="red")
    if run.get("corrupt"):
        text.append(printable(corrupt_text(run)) + "\n", style="bold red")
    command = command_line(run["argv"])
    text.append(command if len(command) <= COMMAND_CHARS else command[: COMMAND_CHARS - 1] + "…", style="dim")
    return text
