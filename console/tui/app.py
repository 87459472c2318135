"""The console app: runs, GPUs, the selected run's curves, log and diagnosis, and one-key actions.

Workers do all I/O through the agent client: one polls `status` every 2 s and
owns the connection (when the link drops it says so in a banner, reconnects
with backoff and carries on), one follows the selected run's log and metrics
from their offsets (after a reconnect it resumes where it stopped). Dangerous
actions (kill, relaunch, free GPUs) ask first, with the focus on Cancel;
`--readonly` removes them.
"""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Header, HelpPanel, RichLog, Static

from backends.protocol import TERMINAL_STATES
from backends.sglang_facts import RELAUNCH_PRESETS
from console import render
from console.client import PAST_END, AgentClient, AgentError
from console.transport import Transport, TransportError
from console.tui.chart import LineChart
from console.tui.commands import RunCommands
from console.tui.dialogs import ConfirmScreen, RelaunchScreen, TextScreen
from console.tui.panels import GpuPanel, RunDetail, RunsTable
from themes import register_themes

if TYPE_CHECKING:
    from console.host_keys import OfferedKey

POLL_S = 2.0
FLASH_S = 6.0  # how long a passing message stays
LOG_TAIL_LINES = 200
PROGRESS_CHARS = 200
MAX_PARTIAL = 64 * 1024  # a line without an end is kept to this length
KILL_GRACE_S = 10.0
# The two curves shown for a run: the first of each list that its rows carry.
CURVES = (
    ("loss", "val_loss", "accept_len", "tokens_per_s"),
    ("acc_0", "val_acc_0", "val_sim_accept_len", "gen_throughput", "samples"),
)
LOUD_TIMEOUT_S = 15.0  # errors and stalls stay up longer than news
# What each kind of run is expected to plot, named before its first row arrives.
EXPECTED_CURVES = {"serve": ("accept_len", "gen_throughput"), "extract": ("tokens_per_s", "samples")}


class ConsoleApp(App[None]):
    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "eagle3-console"
    COMMANDS = App.COMMANDS | {RunCommands}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("k", "kill", "kill run"),
        Binding("r", "relaunch", "relaunch"),
        Binding("f", "free_gpus", "free GPUs"),
        Binding("s", "stacks", "stacks"),
        Binding("t", "next_theme", "theme"),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, transport: Transport, readonly: bool = False, accept_new_host_key: bool = False) -> None:
        super().__init__()
        self.client = AgentClient(transport)
        self.readonly = readonly
        self.accept_new_host_key = accept_new_host_key
        self.sub_title = transport.description + ("  (read-only)" if readonly else "")
        self.runs: dict[str, dict[str, Any]] = {}
        self.connected = asyncio.Event()
        self.followed: str | None = None
        self.lost: tuple[float, str] | None = None  # when the link was lost, and why
        self.generation = 0  # connections made so far: a follower resubscribes on the next one
        self.status_failed = False  # the last status request was refused (its banner is up)
        self.states: dict[str, str] | None = None  # each run's state at the last poll (None: none yet)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="link")
        with Horizontal():
            with Vertical(id="left"):
                yield RunsTable(id="runs")
                yield GpuPanel(id="gpus")
            with Vertical(id="right"):
                yield RunDetail(id="detail")
                with Horizontal(id="charts"):
                    yield LineChart("loss", id="curve-a")
                    yield LineChart("acc_0", id="curve-b")
                yield RichLog(id="log", max_lines=5000, wrap=False)
                yield Static("", id="progress")
        yield Footer()

    def on_mount(self) -> None:
        register_themes(self)
        self.query_one("#link").display = False
        self.poll()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (self.readonly and action in ("kill", "relaunch", "free_gpus"))

    # --- the connection and the status poll -------------------------------------------------

    @work(exclusive=True, group="poll")
    async def poll(self) -> None:
        while True:
            if not self.connected.is_set():
                await self.connect()
            try:
                status = await self.client.request("status", gpus=True)
            except AgentError as exc:  # the agent answered but could not say: show it, ask again later
                self.status_failed = True
                self.banner(f"status failed: {exc.message}")
                await asyncio.sleep(POLL_S)
                continue
            except TransportError as exc:
                self.connected.clear()
                self.lost = (time.monotonic(), str(exc))
                self.banner(f"link lost: {exc}; reconnecting")
                continue
            if self.status_failed:
                self.status_failed = False
                self.banner(None)
            self.show_status(status)
            await asyncio.sleep(POLL_S)

    async def trust_new_key(self, offered: OfferedKey) -> bool:
        """A host key seen for the first time: trusted by --accept-new-host-key (and said so), else asked."""
        if self.accept_new_host_key:
            self.notify(offered.trusted(), timeout=30)
            return True
        details = (
            f"{offered.algorithm} key fingerprint {offered.fingerprint}\n"
            f"Yes adds it to {offered.known_hosts}. Compare it with the host's own first "
            "(ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub, run there)."
        )
        question = f"{offered.spec} ({offered.name}) is not a known host. Trust its key?"
        return await self.push_screen_wait(ConfirmScreen(question, details))

    async def connect(self) -> None:
        def retrying(exc: TransportError) -> None:
            self.banner(f"cannot reach the host: {exc}; retrying")

        try:
            await self.client.reconnect_until_back(retrying)
        except TransportError as exc:  # retrying cannot help (a refused host key or key): leave, as the CLI does
            self.exit(return_code=1, message=f"eagle3-console: {exc}")
            await asyncio.Event().wait()  # the app is closing; this worker goes with it
        self.generation += 1
        self.connected.set()
        if self.lost is None:
            self.banner(None)
            return
        since, why = self.lost
        self.lost = None
        self.banner(f"link restored after {time.monotonic() - since:.0f} s (it was lost: {why})")
        self.set_timer(FLASH_S, lambda: self.banner(None) if self.lost is None else None)

    def banner(self, text: str | None) -> None:
        link = self.query_one("#link", Static)
        link.display = text is not None
        link.update(text or "")

    def show_status(self, status: dict[str, Any]) -> None:
        self.announce_changes(status["runs"])
        self.runs = {run["id"]: run for run in status["runs"]}
        with self.batch_update():
            self.query_one(RunsTable).show(status["runs"], status.get("gpus") or [])
            self.query_one(GpuPanel).show(status)
            self.show_selected()

    def announce_changes(self, runs: list[dict[str, Any]]) -> None:
        """Say which runs changed state since the last poll (not what the first poll finds)."""
        if self.states is not None:
            for change in render.state_changes(self.states, runs):
                if change.severity is not None:
                    timeout = LOUD_TIMEOUT_S if change.severity != "information" else None
                    self.notify(change.text, severity=change.severity, timeout=timeout, markup=False)
        self.states = {run["id"]: run["state"] for run in runs}

    def select_run(self, run_id: str) -> None:
        table = self.query_one(RunsTable)
        table.move_cursor(row=table.get_row_index(run_id))
        table.focus()

    def selected(self) -> dict[str, Any] | None:
        run_id = self.query_one(RunsTable).selected_run()
        return self.runs.get(run_id) if run_id else None

    def show_selected(self) -> None:
        run = self.selected()
        self.query_one(RunDetail).show(run)
        if run is not None and run["id"] != self.followed:
            self.followed = run["id"]
            self.follow(run["id"])

    @on(DataTable.RowHighlighted)
    def row_changed(self) -> None:
        self.show_selected()

    # --- the selected run's log and curves --------------------------------------------------

    @work(exclusive=True, group="follow")
    async def follow(self, run_id: str) -> None:
        log = self.query_one(RichLog)
        charts = [self.query_one("#curve-a", LineChart), self.query_one("#curve-b", LineChart)]
        log.clear()
        self.query_one("#progress", Static).update("")
        kind = self.runs[run_id]["kind"] if run_id in self.runs else ""
        for chart, title in zip(charts, EXPECTED_CURVES.get(kind, ("loss", "acc_0")), strict=True):
            chart.clear(title)
        await self.connected.wait()
        try:
            chunk = await self.client.request("logs", run=run_id, tail=LOG_TAIL_LINES)
        except AgentError as exc:  # its output.log is gone: say so where the log would be
            log.write(f"— {exc.message} —")
            return
        except TransportError:
            return
        partial = self.write_log(log, b"", chunk["data_b64"])
        offsets = {"log": chunk["next_offset"], "metrics": 0, "events": PAST_END}
        while True:
            await self.connected.wait()
            generation = self.generation
            try:
                sub = await self.client.subscribe(run=run_id, offsets=offsets)
            except (AgentError, TransportError):
                await asyncio.sleep(POLL_S)
                continue
            async for msg in sub:
                if msg["stream"] == "log":
                    partial = self.write_log(log, partial, msg["data_b64"])
                elif msg["stream"] == "metrics":
                    self.plot([row for row in msg["rows"] if isinstance(row, dict)], charts)
                elif msg["stream"] == "end":
                    ended = msg.get("error") or f"run {run_id} {msg['state']}"
                    log.write(f"— {ended} —")
                    return
            offsets = dict(sub.offsets)  # the link dropped: resume here once the poll has reconnected
            while self.generation == generation:
                await asyncio.sleep(0.2)

    def write_log(self, log: RichLog, partial: bytes, data_b64: str) -> bytes:
        """Write the complete lines; a progress bar being redrawn (\\r, no newline yet) shows below the log."""
        *lines, rest = (partial + base64.b64decode(data_b64)).split(b"\n")
        for line in lines:
            log.write(line.decode(errors="replace").split("\r")[-1] or " ")
        bar = next((part for part in reversed(rest.split(b"\r")) if part.strip()), b"")
        self.query_one("#progress", Static).update(bar.decode(errors="replace")[-PROGRESS_CHARS:])
        return rest[-MAX_PARTIAL:]

    @staticmethod
    def plot(rows: list[dict[str, Any]], charts: list[LineChart]) -> None:
        for chart, keys in zip(charts, CURVES, strict=True):
            key = next((k for k in keys if any(k in row for row in rows)), None)
            if key is None:
                continue
            if chart.title != key:
                chart.clear(key)
            values = [row[key] for row in rows if isinstance(row.get(key), (int, float))]
            chart.extend([float(v) for v in values])

    # --- actions -------------------------------------------------------------------------

    def action_kill(self) -> None:
        run = self.selected()
        if run is None or run["state"] in TERMINAL_STATES:
            self.notify("select a live run to kill", severity="warning")
            return
        question = f"Send SIGTERM to run {run['id']} ({render.printable(run['name'])}, pid {run['pid']})?"
        details = f"SIGKILL follows after {KILL_GRACE_S:.0f} s for whatever is left of it."

        def answered(yes: bool | None) -> None:
            if yes:
                self.kill(run["id"])

        self.push_screen(ConfirmScreen(question, details), answered)

    @work(group="actions")
    async def kill(self, run_id: str) -> None:
        try:
            result = await self.client.request("kill", run=run_id, signal="TERM", grace=KILL_GRACE_S)
        except (AgentError, TransportError) as exc:
            self.notify(str(exc), severity="error")
            return
        self.notify(render.kill_text(result), title="kill")

    def action_relaunch(self) -> None:
        run = self.selected()
        if run is None:
            self.notify("select a run to relaunch", severity="warning")
            return

        self.relaunch_dialog(run["id"], run["argv"])

    @work(group="actions")
    async def relaunch_dialog(self, run_id: str, argv: list[str]) -> None:
        """The flags to change, with presets spelled for the run's SGLang (the spelling every release accepts
        when the host cannot say)."""
        try:
            presets = (await self.client.request("relaunch_presets", run=run_id))["presets"]
        except (AgentError, TransportError):
            presets = list(RELAUNCH_PRESETS)
        self.relaunch(run_id, await self.push_screen_wait(RelaunchScreen(run_id, argv, presets)))

    @work(group="actions")
    async def relaunch(self, run_id: str, flags: tuple[list[str], list[str]] | None) -> None:
        """Show the new command line and what the checks say, stop nothing until the person agrees."""
        if flags is None:
            return
        sets, unsets = flags
        self.notify("checking the new command line (SGLang's parser, doctor); nothing is stopped yet", timeout=8)
        change = {"run": run_id, "set": sets, "unset": unsets, "grace": KILL_GRACE_S, "force": False}
        try:
            preview = await self.client.request("relaunch", **change, dry_run=True)
            if not await self.push_screen_wait(ConfirmScreen("Relaunch?", render.relaunch_preview(preview))):
                return
            result = await self.client.request("relaunch", **change, dry_run=False)
        except AgentError as exc:
            self.notify(exc.message, title="relaunch refused", severity="error", timeout=15)
            return
        except TransportError as exc:
            self.notify(str(exc), severity="error")
            return
        self.notify(f"run {result['run']} started, replacing {run_id}", title="relaunch")

    @work(group="actions")
    async def action_free_gpus(self) -> None:
        try:
            plan = await self.client.request("free_gpus", dry_run=True)
        except (AgentError, TransportError) as exc:
            self.notify(str(exc), severity="error")
            return
        if not any(gpu["processes"] for gpu in plan["gpus"]):
            self.notify("no process of yours holds GPU memory", title="free GPUs")
            return
        question = "Kill these processes to free their GPU memory?"
        if not await self.push_screen_wait(ConfirmScreen(question, render.free_text(plan))):
            return
        try:
            result = await self.client.request("free_gpus", dry_run=False)
        except (AgentError, TransportError) as exc:
            self.notify(str(exc), severity="error")
            return
        self.notify(render.free_text(result), title="free GPUs", timeout=15)

    @work(group="actions")
    async def action_stacks(self) -> None:
        """Every process's stack of the selected run: a fresh dump while it lives, else its last one."""
        run = self.selected()
        if run is None:
            self.notify("select a run", severity="warning")
            return
        live = run["state"] not in TERMINAL_STATES
        try:
            result = await self.client.request("stacks", run=run["id"], now=live)
        except (AgentError, TransportError) as exc:
            self.notify(str(exc), severity="error")
            return
        title = f"run {run['id']}: {result['file']} (taken {render.clock(result['taken_at'])})"
        self.push_screen(TextScreen(title, result["text"]))

    def action_help(self) -> None:
        """Toggle Textual's panel of the keys that work here, each with what it does."""
        if self.screen.query(HelpPanel):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def action_next_theme(self) -> None:
        names = [name for name in self.available_themes if name.startswith("eagle3-")]
        self.theme = names[(names.index(self.theme) + 1) % len(names)] if self.theme in names else names[0]

    async def action_quit(self) -> None:
        await self.client.close()
        self.exit()
