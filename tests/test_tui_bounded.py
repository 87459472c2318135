"""What the console holds stays bounded however long it stays open, and it draws nothing while nothing moves: the
log keeps its lines and no drawing of them (Textual cached each crop, offset and style made of a row, on the row),
the runs table changes the cells that changed, a silence long past reads by the minute, and a run's events keep
their startup and a bounded health history; a run left for another stops streaming to it. All of it on real
Textual widgets under its pilot; the metric store's own bound is in test_metric_store."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult

from console.tui.log import DRAWN_ROWS, TailLog
from console.tui.panels import RunFacts, RunsTable, detail_text, silence_text
from console.tui.timeline import MAX_EVENTS, HealthMark, kept_events, timeline
from tests.conftest import until
from tests.test_tui_attention import console, launch

LINE = "step {} | loss 2.9118 | acc_0 0.77 acc_1 0.70 acc_2 0.64"
KEPT = 1000


class LogApp(App[None]):
    def compose(self) -> ComposeResult:
        yield TailLog(max_lines=KEPT)


async def test_the_log_keeps_its_lines_and_no_drawing_of_each_as_rows_move_under_the_view() -> None:
    app = LogApp()
    async with app.run_test(size=(100, 30)) as pilot:
        log = app.query_one(TailLog)
        for i in range(KEPT):
            log.add(LINE.format(i))
        log.flush()
        await pilot.pause()
        height = log.scrollable_content_region.height
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            arrived = KEPT
            for _ in range(6):  # lines arrive, the oldest go, every row is drawn where it now is
                for _ in range(KEPT // 8):
                    log.add(LINE.format(arrived))
                    arrived += 1
                log.flush()
                for top in range(0, len(log.lines), height):
                    log.scroll_to(y=top, animate=False, immediate=True)
                    rows = [log.render_line(y).text for y in range(height)]
                    assert rows[0].startswith("step "), rows
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert KEPT <= len(log.kept) <= KEPT * 1.1  # the oldest go by tenths
        assert len(log.drawn) <= DRAWN_ROWS
        # 750 more lines than it holds, every row drawn 6 times at moving places: what it holds grew by the tenth
        # of lines over KEPT and the rows drawn last (1.2 MB), where the drawings Textual cached on each row took
        # 2.4 MB
        assert grown < 2_000_000, grown


class TableApp(App[None]):
    CSS: ClassVar[str] = "RunsTable { height: auto; }"

    def compose(self) -> ComposeResult:
        yield RunsTable()


def run(run_id: str, step: int) -> dict[str, object]:
    return {
        "id": run_id,
        "name": "draft",
        "kind": "train",
        "state": "running",
        "pid": 4021,
        "argv": ["python", "train.py"],
        "parent": None,
        "phase": None,
        "progress": {"step": step},
    }


async def test_a_step_that_moves_changes_its_cell_and_the_cursor_stays_on_its_run() -> None:
    app = TableApp()
    async with app.run_test(size=(120, 10)) as pilot:
        table = app.query_one(RunsTable)
        ids = ["20261204-223245-316-49e4", "20261204-223245-316-49e5"]
        table.show([run(i, 10) for i in ids], [], {i: "step 10" for i in ids})  # type: ignore[misc]
        table.move_cursor(row=0)
        await pilot.pause()
        cleared = 0
        clear = table.clear

        def counted(columns: bool = False) -> RunsTable:
            nonlocal cleared
            cleared += 1
            return clear(columns)

        table.clear = counted  # type: ignore[method-assign]
        table.show([run(i, 20) for i in ids], [], {ids[0]: "step 20", ids[1]: "step 10"})  # type: ignore[misc]
        await pilot.pause()
        shown = [[str(cell) for cell in table.get_row_at(row)] for row in range(2)]
        assert "step 20" in shown[0] and "step 10" in shown[1], shown
        assert table.selected_run() == ids[0]
        assert cleared == 0  # the two rows stayed: the table was not emptied and filled again


def test_a_silence_reads_by_the_second_then_by_the_minute() -> None:
    assert [silence_text(s) for s in (5.4, 83.0, 119.6, 120.0, 754.0, 3599.0, 7500.0)] == [
        "5 s",
        "83 s",
        "120 s",
        "2 min",
        "12 min",
        "59 min",
        "2 h 05 min",
    ]
    facts = RunFacts(silent_s=754.0)
    shown = detail_text(run("20261204-223245-316-49e4", 10), facts, width=80)
    assert isinstance(shown, Text) and "silent for 12 min" in shown.plain


def test_a_server_whose_health_flaps_for_days_keeps_its_startup_and_a_bounded_health_history() -> None:
    events: list[dict[str, object]] = [
        {"t": 0.0, "type": "launch"},
        {"t": 5.0, "type": "phase", "phase": "load_weights"},
        {"t": 60.0, "type": "phase", "phase": "ready"},
    ]
    for first in range(0, 30_000, 50):  # a change of answer every 10 s for 3.5 days, 50 to a message
        came = [
            {"t": 60.0 + 10 * i, "type": "health", "status": "ok" if i % 2 else "refused"}
            for i in range(first, first + 50)
        ]
        events = kept_events([*events, *came])
        assert len(events) <= MAX_EVENTS
    line = timeline(events)
    assert line.launched_at == 0.0 and line.ready_at == 60.0
    assert [p.name for p in line.phases] == ["launch", "load_weights"]
    assert line.health[-1] == HealthMark(60.0 + 10 * 29_999, "ok")  # the latest answer is the one in force


CHATTY = "import time\nwhile True:\n    print('line ' + 'x' * 60, flush=True)\n    time.sleep(0.01)\n"


async def test_a_run_left_for_another_stops_streaming_to_the_console(workdir: Path, nvml_state: Path) -> None:
    """A real agent and two real runs, one printing 100 lines a second: once the person moves to the other run, the
    host stops sending the first one's (the client queued it for no one, 12 MiB a minute, until the link dropped)."""
    chatty = await launch(workdir, [sys.executable, "-c", CHATTY], name="chatty")
    quiet = await launch(workdir, [sys.executable, "-c", "import time; time.sleep(120)"], name="quiet")
    async with console(workdir) as (app, pilot, _):
        await until(pilot, lambda: chatty in app.runs and quiet in app.runs, what="both runs")
        app.select_run(chatty)
        await until(pilot, lambda: app.followed == chatty and app.query_one(TailLog).kept, what="chatty's lines")
        app.select_run(quiet)
        link = app.client.alone
        assert link is not None
        await until(pilot, lambda: app.followed == quiet and len(link._subs) == 1, what="chatty's stream to stop")
        await pilot.pause(1.0)
        assert len(link._subs) == 1 and all(sub.queue.qsize() < 10 for sub in link._subs.values())
