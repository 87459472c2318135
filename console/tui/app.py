"""The console app: runs, GPUs, the selected run's curves, log and diagnosis, and one-key actions.

Workers do all I/O through the agent client: one polls `status` every 2 s and
owns the connection (when the link drops it says so in a banner, reconnects
with backoff and carries on), one follows the selected run's log and metrics
from their offsets (after a reconnect it resumes where it stopped). Dangerous
actions (kill, relaunch, free GPUs) ask first, with the focus on Cancel;
`--readonly` removes them.

What the person chose lasts: config.toml's keys and theme come in as `Preferences` (`console.tui.preferences`,
the keys over its bindings in `console.tui.keys`), and the theme chosen with `t` is kept for the next start.
"""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, cast

from rich.text import Text
from textual import on, work
from textual.actions import SkipAction
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.notifications import SeverityLevel
from textual.widgets import DataTable, Footer, Header, Static

from backends.protocol import TERMINAL_STATES, MetricRow, NonfiniteValue, RunInfo, StatusResult
from console import actions, render
from console.fleet import jobs
from console.fleet.hosts import Fleet, HostsStatus
from console.link.transport import AgentError, AgentOps, TransportError, lasting
from console.tui.chart import ChartPicker, ChartsPanel, RunMetrics, choices, default_charts, spec_label
from console.tui.commands import RunCommands
from console.tui.dialogs import ConfirmScreen, HelpScreen, RelaunchScreen, TextScreen
from console.tui.gpu_panel import GpuPanel
from console.tui.heap import TRIM_EVERY_S, release_free_heap
from console.tui.keys import BINDINGS, rebound
from console.tui.log import FindPrompt, LineReader, TailLog, log_text
from console.tui.metric_store import MAX_POINTS, MetricStore
from console.tui.panels import JOB_KEY, RunDetail, RunFacts, RunsTable, health_styles, lineage_edits
from console.tui.preferences import Preferences, read_state, write_state
from console.tui.progress import Progress, total_steps
from console.tui.timeline import kept_events, timeline
from console.visible import printable, visible
from themes import DEFAULT as DEFAULT_THEME
from themes import register_themes

if TYPE_CHECKING:
    from console.link.client import Subscription
    from console.link.host_keys import OfferedKey

POLL_S = 2.0
FLASH_S = 6.0  # how long a passing message stays
LOG_TAIL_LINES = 200
PROGRESS_CHARS = 200
LOUD_TIMEOUT_S = 15.0  # errors and stalls stay up longer than news
MAX_LINEAGE = 50  # attempts followed back through their parents for the last one that logged
# Ended runs the table lists besides the live ones, the newest ended first: open for weeks, a poll every 2 s of
# every run the host ever kept grew with each one (the agent's look and the reply alike)
ENDED_LISTED = 50
FIRST_LOOK_POINTS = 1024  # rows of a coarse first look at a long history: a few per column of the widest chart
FEED_ROWS = 500  # metric rows added to a store between two looks at the screen: a long history loads, the UI lives
THEME_PREFIX = "eagle3-"  # the console's own themes; Textual's others are not made for its colours
KEPT_STORES = 3  # runs whose metric stores are kept (the followed, its overlay, the last looked at): a week open
# following relaunch after relaunch held a store of every run it had shown


class ConsoleApp(App[None]):
    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "eagle3-console"
    COMMANDS = App.COMMANDS | {RunCommands}
    BINDINGS: ClassVar[list[BindingType]] = list(BINDINGS)

    def __init__(
        self,
        hosts: Fleet,
        readonly: bool = False,
        accept_new_host_key: bool = False,
        preferences: Preferences | None = None,
    ) -> None:
        """`hosts`: the fleet of the hosts shown: of one host given alone, its runs as they are; of several, runs
        named HOST/RUN in a HOST column."""
        super().__init__()
        self.preferences = preferences or Preferences()
        self.set_keymap(dict(self.preferences.keymap))
        self.client = hosts
        self.readonly = readonly
        self.accept_new_host_key = accept_new_host_key
        self.where = self.client.description + ("  (read-only)" if readonly else "")
        self.sub_title = self.where
        self.runs: dict[str, RunInfo] = {}
        self.connected = asyncio.Event()
        self.followed: str | None = None
        self.lost: tuple[float, str] | None = None  # when the link was lost, and why
        self.status_failed = False  # the last status request was refused (its banner is up)
        self.states: dict[str, str] | None = None  # each run's state at the last poll (None: none yet)
        self.run_metrics: dict[str, RunMetrics] = {}  # each run's metric store, of the runs followed so far
        self.unseen: set[str] = set()  # failures not selected since they failed
        self.nan_told: set[str] = set()  # runs whose NaN or infinite metric value was raised as news
        self.fates: dict[str, str] = {}  # relaunched run -> the run it replaced, until it is ready or ends
        self.moving_to: str | None = None  # a run just launched: the cursor moves to it once the poll shows it
        self.progress: dict[str, Progress] = {}  # how far each training got: its status, and its rows if followed
        self.facts = RunFacts()  # the followed run's timeline, silence, stall frames, last exception
        self.events: list[dict[str, object]] = []  # the followed run's events
        self.not_numbers_told: set[str] = set()  # runs whose metric values that are not numbers were said
        self.exceptions = render.ExceptionFinder()  # the last exception its log names
        self.gpu_error: str | None = None  # why the last status found no GPU, as it said
        self.down_since: dict[str, float] = {}  # hosts whose link is down, each since when
        self.polled_at = 0.0  # when the last status came (time.monotonic()): its silences were measured then
        self.output_seen: float | None = None  # when the followed run's output last came (time.monotonic())
        self.frames_of: tuple[str, float | None] | None = None  # the stall whose top frames are shown
        self.overlaid: str | None = None  # the attempt whose curves are drawn dimmer under the followed run's

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="link")
        with Horizontal():
            # Left: the runs, the GPUs, and the log under them, as wide as the runs list (log lines are long);
            # right: the selected run's detail above its charts.
            with Vertical(id="left"):
                yield RunsTable(id="runs")
                yield GpuPanel(id="gpus")
                yield TailLog(max_lines=5000, id="log")
                yield Static("", id="progress")
            with Vertical(id="right"):
                yield RunDetail(id="detail")
                yield ChartsPanel(id="charts")
        yield Footer()

    def on_mount(self) -> None:
        register_themes(self)
        self.theme = self.starting_theme()
        self.query_one("#link").display = False
        # The live counters (silent for, the current phase) move while the selected run lives; else it sleeps
        self.ticker = self.set_interval(1.0, self.show_selected, pause=True)
        self.set_interval(TRIM_EVERY_S, release_free_heap)  # open for weeks: its RSS stays what it holds
        self.poll()

    def own_themes(self) -> list[str]:
        return [name for name in self.available_themes if name.startswith(THEME_PREFIX)]

    def starting_theme(self) -> str:
        """The theme last chosen with `t`, else config.toml's, else the default; config.toml's naming no theme of
        the console's is said (its short name, `day`, names `eagle3-day` too)."""
        names = self.own_themes()
        wanted = self.preferences.theme
        configured = next((n for n in names if wanted in (n, n.removeprefix(THEME_PREFIX))), None)
        saved = self.saved_state().get("theme")
        chosen = saved if isinstance(saved, str) and saved in names else configured or DEFAULT_THEME
        if wanted is not None and configured is None:
            self.notify(
                f"{self.preferences.settings_file}: theme {wanted!r} is not one of the console's "
                f"({', '.join(names)}); it starts on {chosen}",
                title="theme",
                severity="warning",
                timeout=LOUD_TIMEOUT_S,
            )
        return chosen

    def saved_state(self) -> dict[str, object]:
        """What the console remembered at its last start (nothing when it keeps no state, or cannot read it)."""
        path = self.preferences.state_file
        try:
            return {} if path is None else read_state(path)
        except (OSError, ValueError) as exc:
            self.notify(
                f"the console's state {path} cannot be read ({exc}); it starts afresh, and `t` writes it anew",
                severity="warning",
                timeout=LOUD_TIMEOUT_S,
            )
            return {}

    def remember_theme(self) -> None:
        """The theme just chosen, kept for the next start (config.toml is left as the person wrote it)."""
        path = self.preferences.state_file
        if path is None:
            return
        try:
            write_state(path, {"theme": self.theme})
        except OSError as exc:
            self.notify(
                f"cannot remember the theme in {path} ({exc.strerror or exc}); it lasts until the console closes",
                severity="warning",
                timeout=LOUD_TIMEOUT_S,
            )

    def keys_in_force(self) -> list[Binding]:
        """The console's bindings, with the keys config.toml gives their actions."""
        return [rebound(b, self.preferences.keymap) for b in Binding.make_bindings(self.BINDINGS)]

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every toast (the widgets' too, which come here): plain text, never markup, a run's control characters
        shown, not obeyed; most carry a run's words (its name, an error the host quoted, a failure line)."""
        super().notify(visible(message), title=printable(title), severity=severity, timeout=timeout, markup=False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (self.readonly and action in ("kill", "relaunch", "free_gpus"))

    # --- the connection and the status poll -------------------------------------------------

    @work(exclusive=True, group="poll")
    async def poll(self) -> None:
        while True:
            if not self.connected.is_set():
                await self.connect()
            try:
                status = await self.client.status(gpus=True, ended=ENDED_LISTED)
            except AgentError as exc:  # the agent answered but could not say: show it, ask again later
                if lasting(exc):  # asking again gets the same refusal: leave, saying why, as the CLI does
                    await self.leave(f"status: {exc.message}")
                self.status_failed = True
                self.banner(f"status failed: {exc.message}; asking again every {POLL_S:g} s")
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
            await self.leave(str(exc))
        self.connected.set()
        if self.lost is None:
            self.banner(None)
            return
        since, why = self.lost
        self.lost = None
        self.banner(f"link restored after {time.monotonic() - since:.0f} s (it was lost: {why})")
        self.set_timer(FLASH_S, lambda: self.banner(None) if self.lost is None else None)

    async def leave(self, why: str) -> None:
        """Exit 1 with `why` as the console's last line; the worker that calls it goes with the app."""
        self.exit(return_code=1, message=f"eagle3-console: {why}")
        await asyncio.Event().wait()

    def banner(self, text: str | None) -> None:
        link = self.query_one("#link", Static)
        link.display = text is not None
        link.update(Text(printable(text or "")))  # the host's words: plain text, shown

    def show_status(self, status: StatusResult) -> None:
        links = cast(HostsStatus, status).get("links") or {}  # several hosts: each link said on its own
        if links:
            said = [f"{host}: {why}" for host, why in links.items() if why]
            self.banner(f"{'; '.join(said)}; reconnecting on its own, the other hosts shown" if said else None)
        told = self.announce_fates(status["runs"])
        for run in status["runs"]:  # a NaN is news for any run, selected or not: the host's status names it
            if nonfinite := run.get("nonfinite"):
                self.announce_nonfinite(run["id"], nonfinite)
        self.announce_changes(status["runs"], told)
        self.runs = {run["id"]: run for run in status["runs"]}
        self.forget_gone()
        self.down_since = cast(HostsStatus, status).get("down_since") or {}
        self.polled_at = time.monotonic()
        self.gpu_error = status.get("gpu_error")
        counts = render.attention_counts(status["runs"])
        older = f"{hidden:,} older ended runs not listed (status --all)" if (hidden := status.get("hidden")) else ""
        self.sub_title = "  ·  ".join(part for part in (self.where, counts, older) if part)
        now = time.time()
        for run in status["runs"]:  # how far each training and extraction got, followed or not
            if reached := run.get("progress"):
                known = self.progress.setdefault(run["id"], Progress(total_steps(run["argv"])))
                known.ended = run["state"] in TERMINAL_STATES
                known.add([dict(reached)], now, live=not known.ended)
        progress = {run_id: text for run_id, p in self.progress.items() if (text := p.text(now))}
        with self.batch_update():
            table = self.query_one(RunsTable)
            table.show(status["runs"], status.get("gpus") or [], progress, frozenset(self.unseen), self.down_since)
            self.query_one(GpuPanel).show(status)
            if self.moving_to in self.runs:
                self.select_run(self.moving_to)
                self.moving_to = None
            self.show_selected()

    def forget_gone(self) -> None:
        """What the console holds of each run, kept only for the runs the status still lists: open for weeks, it
        would otherwise keep something of every run it ever saw."""
        shown = set(self.runs) | {run_id for run_id in (self.followed, self.overlaid) if run_id}
        self.progress = {run_id: p for run_id, p in self.progress.items() if run_id in shown}
        self.unseen &= shown
        self.nan_told &= shown
        self.not_numbers_told &= shown

    def announce_fates(self, runs: list[RunInfo]) -> set[str]:
        """A relaunched run's fate, once it is known: ready, or how it ended (whatever the poll saw before)."""
        told: set[str] = set()
        for run in runs:
            parent = self.fates.get(run["id"])
            if parent is None or (run["state"] != "ready" and run["state"] not in TERMINAL_STATES):
                continue
            del self.fates[run["id"]]
            told.add(run["id"])
            failed = run["state"] in render.FAILED_STATES
            ended = f" ({render.exit_text(run)})" if run["state"] in TERMINAL_STATES else ""
            how = run["state"] + (f": {run['failure']}" if run.get("failure") else ended)
            self.notify(
                printable(f"run {run['id']}, the relaunch of {parent}: {how}"),
                title="relaunch",
                severity="error" if failed else "information",
                timeout=LOUD_TIMEOUT_S if failed else None,
                markup=False,
            )
        return told

    def announce_changes(self, runs: list[RunInfo], told: set[str]) -> None:
        """Say which runs changed state since the last poll (not what the first poll finds); a failure stays
        marked until its run is selected. `told`: runs whose news was already given."""
        if self.states is not None:
            failed = {run["id"] for run in runs if run["state"] in render.FAILED_STATES}
            for change in render.state_changes(self.states, runs):
                if change.run_id in failed:  # a new run seen first as failed too
                    self.unseen.add(change.run_id)
                if change.severity is not None and change.run_id not in told:
                    timeout = LOUD_TIMEOUT_S if change.severity != "information" else None
                    self.notify(change.text, severity=change.severity, timeout=timeout, markup=False)
        self.states = {run["id"]: run["state"] for run in runs}

    def select_run(self, run_id: str) -> None:
        table = self.query_one(RunsTable)
        table.move_cursor(row=table.get_row_index(table.key_of(run_id)))
        table.focus()

    def selected(self) -> RunInfo | None:
        """The run under the cursor; on a multi-node job's line, its node 0's run (which has its metrics)."""
        table = self.query_one(RunsTable)
        key = table.selected_run()
        if key is not None and key.startswith(JOB_KEY):
            return table.job_head(key)
        return self.runs.get(key) if key else None

    def show_selected(self) -> None:
        run = self.selected()
        self.query_one(GpuPanel).select(run)
        if run is not None and run["id"] != self.followed:
            self.followed = run["id"]
            self.follow(run["id"])
        if run is not None:
            if run["id"] in self.unseen:  # seen now: its mark goes
                self.unseen.discard(run["id"])
                table = self.query_one(RunsTable)
                table.unseen = frozenset(self.unseen)
                table.refill()
            self.update_facts(run)
        self.query_one(RunDetail).show(run, self.facts)
        if run is not None and run["state"] not in TERMINAL_STATES:
            self.ticker.resume()
        else:
            self.ticker.pause()

    def update_facts(self, run: RunInfo) -> None:
        """The followed run's facts as of now: its silence, its parent, the top frames of its stall."""
        self.facts.silent_s = self.silence(run)
        self.facts.parent = self.runs.get(run["parent"] or "")
        self.facts.job = jobs.node_line(run, self.runs.values(), self.down_since)
        self.facts.benched = [r for r in self.runs.values() if r["kind"] == "serve" and r["id"] != run["id"]]
        self.facts.progress = progress.text(time.time()) if (progress := self.progress.get(run["id"])) else None
        stall = (run["id"], run["stalled_since"])
        if run["state"] != "stalled":
            self.facts.frames = []
            self.frames_of = None
        elif self.frames_of != stall:
            self.frames_of = stall
            self.fetch_frames(run["id"])

    def silence(self, run: RunInfo) -> float | None:
        """How long the run's output has been silent: the host's figure at the last poll (its output.log's age by
        its own clock, whenever the console started looking) plus the time since, or less if output came since."""
        host = run.get("silent_s")
        if host is None or run.get("host") in self.down_since:  # a host out of reach: its figure is no longer true
            return None
        now = time.monotonic()
        silent = host + now - self.polled_at
        return silent if self.output_seen is None else min(silent, now - self.output_seen)

    @work(exclusive=True, group="frames")
    async def fetch_frames(self, run_id: str) -> None:
        """The top frames of the stacks the watch took when the run stalled."""
        try:
            dump = await self.client.stacks(run_id)
        except (AgentError, TransportError):
            return
        if self.followed == run_id:
            run = self.runs.get(run_id)
            stalled = run.get("stalled_processes") or [] if run is not None else []
            ranks = [process["pid"] for process in stalled if process["rank"] is not None]
            self.facts.frames = render.top_frames(dump["text"], first=ranks)
            self.show_selected()

    @on(DataTable.RowHighlighted)
    def row_changed(self) -> None:
        self.show_selected()

    @on(DataTable.RowSelected)
    def row_chosen(self, event: DataTable.RowSelected) -> None:
        """Enter on a multi-node job's line shows its nodes' runs under it, or folds them again."""
        if event.row_key.value is not None:
            self.query_one(RunsTable).toggle(str(event.row_key.value))

    # --- the selected run's log and curves --------------------------------------------------

    @work(exclusive=True, group="follow")
    async def follow(self, run_id: str) -> None:
        log = self.query_one(TailLog)
        log.clear()
        self.facts, self.events, self.exceptions = RunFacts(), [], render.ExceptionFinder()
        self.output_seen, self.frames_of, self.overlaid = None, None, None
        argv = self.runs[run_id]["argv"] if run_id in self.runs else []
        progress = self.progress.setdefault(run_id, Progress(total_steps(argv)))
        self.show_progress("")
        metrics = self.run_metrics.pop(run_id, None) or RunMetrics()
        self.run_metrics[run_id] = metrics  # the last followed last: the oldest go first
        for older in list(self.run_metrics)[:-KEPT_STORES]:
            del self.run_metrics[older]
        run = self.runs.get(run_id)
        self.query_one(ChartsPanel).show(run["kind"] if run else "", metrics.store)
        if run is not None and run["parent"]:
            self.load_lineage(run_id, run["parent"])
        past = await self.history_view(run_id, metrics)
        if past is not None:
            progress.add(past, time.time(), False)
        history = past is None  # else the first rows the stream brings are the run's past: no step rate from them
        await self.feed(run_id)
        while True:
            await self.connected.wait()
            try:
                chunk = await self.client.logs(run_id, tail=LOG_TAIL_LINES)
                break
            except AgentError as exc:  # its output.log is gone: say so where the log would be
                log.add(f"— {exc.message} —")
                return
            except TransportError:  # the link went as the run was chosen: its log comes once it is back
                await asyncio.sleep(POLL_S)
        reader = LineReader()  # this run's lines, however long, a progress bar's redraws, as they come
        self.write_log(log, reader, base64.b64decode(chunk["data_b64"]))
        offsets = {"log": chunk["next_offset"], "metrics": metrics.offset, "events": 0}
        told = False  # a failure to subscribe that may pass is said once, until a subscription is made
        while True:
            await self.connected.wait()
            generation = self.client.generation
            try:
                sub = await self.client.subscribe(run=run_id, offsets=offsets)
            except (AgentError, TransportError) as exc:
                if lasting(exc):  # the run is gone, or the host refuses it for good: said where its log was
                    log.add(f"— {exc}; no longer followed —")
                    return
                # A lost link is the poll's to say (its banner); a failure of the agent's is said here.
                if isinstance(exc, AgentError) and not told:
                    told = True
                    self.notify(
                        f"run {run_id}: cannot follow its log and curves ({exc.message}); trying again every "
                        f"{POLL_S:g} s",
                        severity="warning",
                    )
                await asyncio.sleep(POLL_S)
                continue
            told = False
            try:
                async for msg in sub:
                    if msg["stream"] == "log":
                        self.write_log(log, reader, base64.b64decode(msg["data_b64"]))
                        self.output_seen = time.monotonic()
                    elif msg["stream"] == "events":
                        self.events = kept_events(self.events + [row for row in msg["rows"] if isinstance(row, dict)])
                        self.facts.line = timeline(self.events)
                        self.show_selected()
                    elif msg["stream"] == "metrics":
                        progress.add([row for row in msg["rows"] if isinstance(row, dict)], time.time(), not history)
                        history = False
                        metrics.receive(msg["rows"], msg["next_offset"])
                        await self.feed(run_id)
                    elif msg["stream"] == "end":
                        ended = msg.get("error") or f"run {run_id} {msg['state']}"
                        self.write_log(log, reader, b"", end=True)
                        log.add(f"— {ended} —")
                        return
            except BaseException:
                # Left for another run (cancelled), or failed: the host stops sending what no one reads. A stream
                # that ended, or whose link dropped, has nothing left at the host to stop; an unsubscribe then went
                # out on the dead link and made a second reconnect.
                self.run_worker(self.let_go(sub, generation), group="unsubscribe", exit_on_error=False)
                raise
            offsets = dict(sub.offsets)  # the link dropped: resume here once the poll has reconnected
            while self.client.generation == generation:
                await asyncio.sleep(0.2)

    async def let_go(self, sub: Subscription, generation: int) -> None:
        """The host stops sending what the follow no longer reads (another run chosen, its run ended). Left open, the
        agent streamed it on and the client queued it all for no one: 12 MiB a minute after leaving a run that wrote
        100 rows and lines a second, until the link dropped. Not over a link made since: there its number may be
        another subscription's."""
        if self.client.generation == generation:
            await sub.close()

    def write_log(self, log: TailLog, reader: LineReader, data: bytes, end: bool = False) -> None:
        """Write the complete lines (at the run's `end`, the last one too, had it no newline); a progress bar being
        redrawn (\\r, no newline yet) shows below the log."""
        for line in reader.feed(data) + (reader.end() if end else []):
            self.exceptions.feed(line)
            log.add(line or " ")
        self.facts.last_exception = self.exceptions.last
        self.show_progress(reader.progress()[-PROGRESS_CHARS:])

    def show_progress(self, text: str) -> None:
        """The progress bar line below the log; an update lays the screen out again, so only when it changed."""
        progress = self.query_one("#progress", Static)
        shown = log_text(text)  # the run's bytes, as the log shows them: never markup, its escapes written out
        if shown.plain != str(progress.content):
            progress.update(shown)

    async def history_view(self, run_id: str, metrics: RunMetrics) -> list[MetricRow] | None:
        """A run's metric history, asked for once before its stream as a view thinned to what its charts keep: the
        stream then carries only what is new (100,000 rows streamed whole took 4.2 s to show). The rows got; None
        when its store holds rows already or the view was refused (the stream then reads on, and says why)."""
        if metrics.offset:
            return None
        try:
            reply = await self.client.metrics(run_id, points=FIRST_LOOK_POINTS, coarse=True)
        except (AgentError, TransportError):
            return None
        metrics.receive(reply["rows"], reply["next_offset"])
        await self.feed(run_id)
        if self.followed == run_id:
            self.query_one(ChartsPanel).arrived()
        if reply["thinned"]:
            metrics.since_coarse = []  # from here: the look's own rows are in the full view
            self.refine(run_id, metrics, reply["next_offset"])
        return reply["rows"]

    @work(group="refine", exit_on_error=False)
    async def refine(self, run_id: str, metrics: RunMetrics, until: int) -> None:
        """The full view of a run's history in place of the coarse first look, as soon as it comes (a pass over
        every row at the host, a second or so for 100,000): every series' spikes, y range and NaN kept. The rows
        plotted since are added again after it; if it fails, the coarse look stays."""
        try:
            reply = await self.client.metrics(run_id, points=MAX_POINTS, until=until)
        except (AgentError, TransportError):
            metrics.since_coarse = None
            return
        if not reply["thinned"] or metrics.since_coarse is None or self.run_metrics.get(run_id) is not metrics:
            metrics.since_coarse = None
            return
        store = MetricStore()
        for start in range(0, len(reply["rows"]), FEED_ROWS):  # a long history freezes nothing
            for row in reply["rows"][start : start + FEED_ROWS]:
                store.add_row(row)
            await asyncio.sleep(0)
        for row in metrics.since_coarse:
            store.add_row(row)
        metrics.store, metrics.since_coarse = store, None
        if self.followed == run_id:
            run, lineage = self.runs.get(run_id), self.run_metrics.get(self.overlaid or "")
            self.query_one(ChartsPanel).show(run["kind"] if run else "", store, lineage.store if lineage else None)
            if (nonfinite := store.first_nonfinite) is not None:
                self.announce_nonfinite(run_id, nonfinite)

    async def feed(self, run_id: str) -> None:
        """The run's rows received but not yet in its store, FEED_ROWS at a time: a long history freezes nothing."""
        metrics = self.run_metrics[run_id]
        while metrics.backlog:
            self.plot(run_id, metrics.take(FEED_ROWS))
            await asyncio.sleep(0)

    def plot(self, run_id: str, rows: list[MetricRow]) -> None:
        """Rows into the run's store; the charts showing a series that got a point redraw; a NaN loss is news once."""
        metrics = self.run_metrics[run_id]
        got: set[str] = set()
        for row in rows:
            got |= metrics.store.add_row(row)
        if metrics.since_coarse is not None:
            metrics.since_coarse.extend(rows)
        if run_id in (self.followed, self.overlaid):
            self.query_one(ChartsPanel).touch(got)
        if run_id == self.followed and (nonfinite := metrics.store.first_nonfinite) is not None:
            self.announce_nonfinite(run_id, nonfinite)
        if run_id not in self.not_numbers_told and (said := render.not_numbers_note(run_id, rows)) is not None:
            self.not_numbers_told.add(run_id)  # once per run: a trainer that logs text does so every row
            self.notify(said, title="metrics", severity="warning", markup=False)

    def announce_nonfinite(self, run_id: str, nonfinite: NonfiniteValue) -> None:
        """A run's metric gone NaN or infinite, said once per run."""
        if run_id in self.nan_told:
            return
        self.nan_told.add(run_id)
        at = f" at step {nonfinite['step']}" if nonfinite["step"] is not None else ""
        text = printable(f"run {run_id}: {nonfinite['metric']} is {nonfinite['value']}{at}")
        self.notify(text, title="metrics", severity="warning", timeout=LOUD_TIMEOUT_S, markup=False)

    @work(exclusive=True, group="lineage")
    async def load_lineage(self, run_id: str, parent_id: str) -> None:
        """The attempts before the run, back through its parents to the last one that logged metrics: that one's
        metrics, read whole once, drawn dimmer under the run's own; every edit since, in the detail."""
        chain: list[RunInfo] = []  # from the parent back, ending at the attempt that logged (or the first)
        ancestor: str | None = parent_id
        while ancestor is not None and len(chain) < MAX_LINEAGE:
            metrics = await self.fetched_metrics(ancestor)
            info = self.runs.get(ancestor) or await self.run_info(ancestor)
            if metrics is None or info is None:  # gone: the chain ends before it
                break
            chain.append(info)
            if metrics.store.names():
                break
            ancestor = info["parent"]
        run = self.runs.get(run_id)
        if not chain or run is None or self.followed != run_id:
            return
        logged = self.run_metrics[chain[-1]["id"]].store
        self.overlaid = chain[-1]["id"] if logged.names() else None
        self.query_one(ChartsPanel).show(run["kind"], self.run_metrics[run_id].store, logged)
        self.facts.edits = lineage_edits([*reversed(chain), run]) if len(chain) > 1 else []
        self.facts.edits_logged = self.overlaid is not None
        parent_line = timeline(await self.all_events(parent_id))
        if self.followed == run_id:
            self.facts.parent_line = parent_line
            self.show_selected()

    async def fetched_metrics(self, run_id: str) -> RunMetrics | None:
        """A run's metrics read whole once (None when they are gone)."""
        metrics = self.run_metrics.setdefault(run_id, RunMetrics())
        while not metrics.fetched:
            await self.connected.wait()
            try:
                reply = await self.client.metrics(run_id, offset=metrics.offset, points=MAX_POINTS)
            except AgentError:
                return None
            except TransportError:
                await asyncio.sleep(POLL_S)
                continue
            metrics.fetched = reply["next_offset"] == metrics.offset
            metrics.receive(reply["rows"], reply["next_offset"])
            await self.feed(run_id)
        return metrics

    async def run_info(self, run_id: str) -> RunInfo | None:
        """A run the status left out (an old attempt), asked for alone; None when it is gone."""
        try:
            return await self.client.run_info(run_id)
        except (AgentError, TransportError):
            return None

    async def all_events(self, run_id: str) -> list[dict[str, object]]:
        """A run's events as they stand (none when they are gone or the link is down)."""
        rows: list[dict[str, object]] = []
        offset, read_to = -1, 0
        while read_to != offset:  # a reply holds a few MB at most: read on until one adds nothing
            offset = read_to
            try:
                reply = await self.client.events(run_id, offset=offset)
            except (AgentError, TransportError):
                break
            rows += reply["rows"]
            read_to = reply["next_offset"]
        return rows

    # --- actions -------------------------------------------------------------------------

    def action_kill(self) -> None:
        run = self.selected()
        if run is None or run["state"] in TERMINAL_STATES:
            self.notify("select a live run to kill", severity="warning")
            return
        ranks = [r for r in self.job_nodes(run) if r["state"] not in TERMINAL_STATES]
        if len(ranks) > 1:  # a node of a job: the job goes whole, every node on every host
            where = ", ".join(dict.fromkeys(r.get("host", "this host") for r in ranks))
            job = printable(run["job"]["id"])
            question = f"Send SIGTERM to job {job}: its {len(ranks)} live node runs ({where})?"
        else:
            ranks = [run]
            question = f"Send SIGTERM to run {run['id']} ({printable(run['name'])}, pid {run['pid']})?"
        details = f"SIGKILL follows after {actions.KILL_GRACE_S:.0f} s for whatever is left of them."

        def answered(yes: bool | None) -> None:
            if yes:
                self.kill([r["id"] for r in ranks])

        self.push_screen(ConfirmScreen(question, details), answered)

    @work(group="actions")
    async def kill(self, run_ids: list[str]) -> None:
        for result in await actions.kill(self.client, run_ids):
            if isinstance(result, Exception):
                self.notify(str(result), severity="error")
            else:
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
        presets = (await self.client.relaunch_presets(run_id))["presets"]
        self.relaunch(run_id, await self.push_screen_wait(RelaunchScreen(run_id, argv, presets)))

    def job_nodes(self, run: RunInfo) -> list[RunInfo]:
        """Of a node of a job in view: the newest run of each of its nodes, by rank; of any other run, itself."""
        found = jobs.in_view(run, self.runs.values())
        return [node.run for node in found.nodes] if found is not None and len(found.nodes) > 1 else [run]

    @work(group="actions")
    async def relaunch(self, run_id: str, flags: tuple[list[str], list[str]] | None) -> None:
        """Show the new command line and what the checks say, stop nothing until the person agrees; a node of a
        job relaunches the whole job, every node with the same edit."""
        if flags is None:
            return
        edit = actions.Edit(*flags)
        run = self.runs.get(run_id)
        nodes = self.job_nodes(run) if run is not None else []
        if len(nodes) > 1:
            await self.relaunch_job(nodes, edit)
            return
        self.notify("checking the new command line; nothing is stopped yet", timeout=8)
        try:
            preview = await actions.preview(self.client, run_id, edit)
            if not await self.push_screen_wait(ConfirmScreen("Relaunch?", render.relaunch_preview(preview))):
                return
            result = await actions.relaunch(self.client, run_id, edit)
        except AgentError as exc:
            self.notify(exc.message, title="relaunch refused", severity="error", timeout=15)
            return
        except TransportError as exc:
            self.notify(str(exc), severity="error")
            return
        self.notify(f"run {result['run']} started, replacing {run_id}", title="relaunch")
        self.fates[result["run"]] = run_id
        self.moving_to = result["run"]

    async def relaunch_job(self, nodes: list[RunInfo], edit: actions.Edit) -> None:
        """Every node of the job previewed, then (once agreed) every node stopped and each started again."""
        job = nodes[0]["job"]["id"]
        self.notify(f"checking job {job}'s new command lines; nothing is stopped yet", timeout=8)
        try:
            previews = await asyncio.gather(*(actions.preview(self.client, n["id"], edit) for n in nodes))
        except (AgentError, TransportError) as exc:
            self.notify(str(exc), title="relaunch refused", severity="error", timeout=15)
            return
        shown = "\n".join(
            f"node {n['job']['node_rank']} ({n.get('host', 'this host')}): {render.relaunch_preview(p)}"
            for n, p in zip(nodes, previews, strict=True)
        )
        if not await self.push_screen_wait(ConfirmScreen(f"Relaunch job {job} on every node?", shown)):
            return
        pairs: list[tuple[AgentOps, RunInfo]] = [(self.client, n) for n in nodes]
        for node, result in zip(nodes, await actions.relaunch_nodes(pairs, edit), strict=True):
            if isinstance(result, Exception):
                self.notify(f"node {node['job']['node_rank']}: {result}", title="relaunch", severity="error")
            else:
                self.fates[result["run"]] = node["id"]
                self.moving_to = self.moving_to or result["run"]
        self.notify(f"job {job} relaunched on {len(nodes)} nodes", title="relaunch")

    @work(group="actions")
    async def action_free_gpus(self) -> None:
        try:
            plan = await actions.free_gpus_plan(self.client)
        except (AgentError, TransportError) as exc:
            self.notify(str(exc), severity="error")
            return
        if not plan["gpus"]:
            why = f": {self.gpu_error}" if self.gpu_error else ""
            self.notify(
                printable(f"this host shows no GPU (GPU source: {plan['gpu_source']}){why}; nothing to free"),
                title="free GPUs",
                severity="warning",
                markup=False,
            )
            return
        if not any(gpu["processes"] for gpu in plan["gpus"]):
            self.notify("no process of yours holds GPU memory", title="free GPUs")
            return
        question = "Kill these processes to free their GPU memory?"
        if not await self.push_screen_wait(ConfirmScreen(question, render.free_text(plan))):
            return
        try:
            result = await actions.free_gpus(self.client)
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
            result = await self.client.stacks(run["id"], now=live)
        except (AgentError, TransportError) as exc:
            self.notify(str(exc), severity="error")
            return
        title = f"run {run['id']}: {result['file']} (taken {render.clock(result['taken_at'])})"
        self.push_screen(TextScreen(title, result["text"]))

    def action_pick_chart(self) -> None:
        """What the current chart shows: any series the selected run has."""
        chart = self.query_one(ChartsPanel).current
        run = self.runs.get(self.followed or "")
        names = chart.run_store.names() if chart.run_store else []
        offered = choices(names, default_charts(run["kind"] if run else ""))
        title = f"What the chart shows (now {spec_label(chart.spec)}): type to narrow, Enter to pick"

        def picked(spec: tuple[str, ...] | None) -> None:
            if spec:
                chart.pick(spec)

        self.push_screen(ChartPicker(title, offered, chart.spec), picked)

    def action_next_chart(self) -> None:
        """The other chart becomes the current one (shown alone where only one fits)."""
        self.query_one(ChartsPanel).next_chart()

    def action_chart_toggle(self, flag: str) -> None:
        self.query_one(ChartsPanel).current.toggle(flag)

    def action_help(self) -> None:
        """This console's keys, grouped, and what each state's colour means."""
        keys = [
            (self.get_key_display(binding), binding.tooltip or binding.description, binding.action)
            for binding in self.keys_in_force()
            if self.check_action(binding.action, ())
        ]
        self.push_screen(HelpScreen(keys, health_styles(self.current_theme)))

    def action_next_theme(self) -> None:
        names = self.own_themes()
        self.theme = names[(names.index(self.theme) + 1) % len(names)] if self.theme in names else names[0]
        self.notify(f"theme: {self.theme}", title="theme", timeout=3)
        self.remember_theme()

    def action_wrap(self) -> None:
        log = self.query_one(TailLog)
        log.toggle_wrap()
        self.notify("log lines wrap" if log.wrap else "log lines are cut (scroll sideways)", timeout=3)

    def action_find_in_log(self) -> None:
        log = self.query_one(TailLog)
        self.push_screen(FindPrompt(log.last_find), log.find)

    def action_log_match(self, older: bool) -> None:
        self.query_one(TailLog).step(older)

    def action_stop_finding(self) -> None:
        if not self.query_one(TailLog).stop_finding():
            raise SkipAction()  # no search shown: Escape is not ours

    def action_copy_log(self) -> None:
        self.query_one(TailLog).copy()

    async def action_quit(self) -> None:
        await self.client.close()
        self.exit()
