"""The selected run's log as someone used to less reads it (Textual's pilot, a real local agent, real runs that
print when the test lets them): `/` finds text and holds the view on it, `n`/`N` step through the matches, `w`
and new lines keep the match in view, Escape follows the tail again, `y` copies, cut lines scroll sideways, a
mouse drag selects text; a run's escapes are shown, never sent to the terminal, its colours kept, a progress bar
shown as it stands, a line of megabytes cut with its size."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from console.tui.app import ConsoleApp
from console.tui.dialogs import RelaunchScreen
from console.tui.log import FindPrompt, TailLog
from console.tui.panels import RunsTable
from console.visible import printable
from tests.conftest import until
from tests.test_terminal_safety import C1, CLEAR, DCS, LINK, OSC52, TITLE, obeyed
from tests.test_tui_attention import console, launch

# 300 lines, every 25th of the first 250 an `acc` line (10 of them, the last 75 lines before the end), the others
# `loss` lines; once told, 20 more `loss` lines.
TRAINER = (
    "import os, sys, time\n"
    "def wait(name):\n"
    "    while not os.path.exists(name):\n"
    "        time.sleep(0.05)\n"
    "wait(sys.argv[1])\n"
    "for i in range(300):\n"
    "    print(f'step {i} ' + (f'acc 0.{i:03d} ' if i % 25 == 0 and i < 250 else 'loss ') + 'x' * 150, flush=True)\n"
    "wait(sys.argv[2])\n"
    "for i in range(300, 320):\n"
    "    print(f'step {i} LOSS late', flush=True)\n"
    "time.sleep(120)\n"
)
WIDE = (
    "import time\nfor i in range(40):\n    print(f'line {i} ' + 'x' * 300 + f' end {i}', flush=True)\ntime.sleep(120)\n"
)


def drawn(log: TailLog) -> list[str]:
    """The log's rows as the screen shows them."""
    return [log.render_line(y).text for y in range(log.scrollable_content_region.height)]


def shows(log: TailLog, text: str) -> bool:
    return any(text in row for row in drawn(log))


def highlighted(log: TailLog) -> list[str]:
    """The text drawn reversed or in the current match's colour."""
    view = range(log.scrollable_content_region.height)
    return [s.text for y in view for s in log.render_line(y) if s.style and (s.style.reverse or s.style.bold)]


async def find(pilot: Pilot[None], app: ConsoleApp, text: str) -> None:
    await pilot.press("slash")
    await until(pilot, lambda: isinstance(app.screen, FindPrompt), what="the find prompt")
    await pilot.press(*text, "enter")
    await until(pilot, lambda: not isinstance(app.screen, FindPrompt), what="the prompt to close")


async def test_slash_finds_text_n_and_N_step_through_it_and_the_view_holds_on_the_match(
    workdir: Path, nvml_state: Path, tmp_path: Path
) -> None:
    go, more = tmp_path / "go", tmp_path / "more"
    run_id = await launch(workdir, [sys.executable, "-c", TRAINER, str(go), str(more)], name="trainer")
    async with console(workdir, size=(120, 50)) as (app, pilot, notes):
        log = app.query_one(TailLog)
        await until(pilot, lambda: app.query_one(RunsTable).selected_run() == run_id, what="the run")
        go.touch()
        await until(pilot, lambda: shows(log, "step 299 loss"), what="the tail in view")

        await find(pilot, app, "acc")
        # the nearest match above the tail, shown and highlighted, with where it is among them
        await until(pilot, lambda: log.border_title == "/acc  10 of 10", what="the status")
        assert shows(log, "step 225 acc 0.225") and not shows(log, "step 299 loss")
        assert "acc" in highlighted(log)
        await pilot.press("n")
        await until(pilot, lambda: log.border_title == "/acc  9 of 10", what="the older match")
        assert shows(log, "step 200 acc 0.200") and not shows(log, "step 225 acc")
        await pilot.press("N")
        await until(pilot, lambda: log.border_title == "/acc  10 of 10", what="the newer match")
        await pilot.press("N")  # past the newest: round to the oldest, and said so
        await until(pilot, lambda: log.border_title == "/acc  1 of 10", what="the wrap to the oldest")
        assert shows(log, "step 0 acc 0.000")
        assert any(n.message == "search wrapped" for n in notes)
        await pilot.press("n")
        await until(pilot, lambda: log.border_title == "/acc  10 of 10", what="the wrap to the newest")

        await pilot.press("w")
        await until(pilot, lambda: log.wrap and len(log.lines) > 300, what="wrapped rows")
        assert shows(log, "step 225 acc 0.225") and log.border_title == "/acc  10 of 10"

        await pilot.press("escape")  # following the tail again, a new search starts from the end
        await find(pilot, app, "loss")  # the last line matches: the view is at the bottom, on it
        await until(pilot, lambda: log.border_title == "/loss  290 of 290", what="the new search")
        view = drawn(log)
        assert shows(log, "step 299 loss") and log.scroll_y == log.max_scroll_y
        more.touch()  # the run goes on printing, matches among its lines: the view stays on what is read
        await until(pilot, lambda: log.border_title == "/loss  290 of 310", what="the new lines counted")
        await pilot.pause()
        assert drawn(log) == view

        await pilot.press("y")
        await until(pilot, lambda: app.clipboard == "step 299 loss " + "x" * 150, what="the match's line copied")
        assert any(n.message.startswith("copied 1 line (OSC 52") for n in notes)

        await pilot.press("escape")
        await until(pilot, lambda: log.border_title is None, what="the search to go")
        await until(pilot, lambda: shows(log, "step 319 LOSS late"), what="the tail again")
        assert not highlighted(log)
        await pilot.press("y")  # no search: the lines in view
        await until(pilot, lambda: app.clipboard.endswith("step 319 LOSS late"), what="the lines in view copied")
        copied = app.clipboard.splitlines()
        assert len(copied) > 1 and "\n".join(copied) == "\n".join(line.plain for line in list(log.kept)[-len(copied) :])
        assert any(n.message.startswith(f"copied {len(copied)} lines (OSC 52") for n in notes)


async def test_a_search_that_finds_nothing_says_so_and_slash_in_a_text_field_is_typed(
    workdir: Path, nvml_state: Path
) -> None:
    run_id = await launch(workdir, [sys.executable, "-c", WIDE], name="wide")
    async with console(workdir, size=(120, 40)) as (app, pilot, notes):
        log = app.query_one(TailLog)
        await until(pilot, lambda: app.query_one(RunsTable).selected_run() == run_id, what="the run")
        await until(pilot, lambda: len(log.kept) == 40, what="the log")
        await find(pilot, app, "loss.*nan")  # plain text, not a regex: nothing has it
        await until(pilot, lambda: any(n.message == "no match for loss.*nan" for n in notes), what="no match")
        assert log.border_title is None and log.following
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RelaunchScreen), what="the relaunch dialog")
        await pilot.press("slash", "n", "y")
        assert app.screen.query_one("#flags").value == "/ny"  # type: ignore[attr-defined]
        assert isinstance(app.screen, RelaunchScreen)


async def test_cut_lines_scroll_sideways_and_a_mouse_drag_selects_and_copies_text(
    workdir: Path, nvml_state: Path
) -> None:
    run_id = await launch(workdir, [sys.executable, "-c", WIDE], name="wide")
    async with console(workdir, size=(120, 40)) as (app, pilot, _):
        log = app.query_one(TailLog)
        await until(pilot, lambda: app.query_one(RunsTable).selected_run() == run_id, what="the run")
        await until(pilot, lambda: shows(log, "line 39 x"), what="the log")
        await pilot.click("#log")
        assert app.focused is log
        await pilot.press("right")
        await until(pilot, lambda: log.scroll_x > 0 and not shows(log, "line 39"), what="the view to move right")
        await pilot.press("left")
        await until(pilot, lambda: log.scroll_x == 0 and shows(log, "line 39"), what="the view back")

        row = drawn(log)[0]
        await pilot.mouse_down("#log", offset=(0, 1))  # the first row under the log's top border
        await pilot.hover("#log", offset=(6, 1))
        await pilot.mouse_up("#log", offset=(6, 1))
        await until(pilot, lambda: app.screen.get_selected_text() == row[:7], what="the selection")
        await pilot.press("ctrl+c")
        await until(pilot, lambda: app.clipboard == row[:7], what="the selection copied")

        await pilot.press("w")
        await until(pilot, lambda: log.wrap and shows(log, "end 39"), what="wrapped lines")
        assert log.max_scroll_x == 0  # wrapped at the log's width: nothing is cut


ATTACKS = OSC52 + TITLE + LINK + CLEAR + DCS + C1
HOSTILE_NAME = "loss" + OSC52 + C1
# A run that writes every attack into its log and a metric name, coloured words, markup, a raw 0x9b byte, a line of
# 2 MB, a finished progress bar and one being drawn; it ends when told, its bar never ended by a newline.
HOSTILE = (
    "import json, os, sys, time\n"
    "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as metrics:\n"
    f"    metrics.write(json.dumps({{'step': 1, {HOSTILE_NAME!r}: 1.5}}) + '\\n')\n"
    f"sys.stdout.write({ATTACKS + ' attacks'!r} + '\\n')\n"
    "sys.stdout.write('\\x1b[31mred words\\x1b[0m [bold red]not bold[/] [link=https://x.example/]no link[/link]\\n')\n"
    "sys.stdout.flush()\n"
    "sys.stdout.buffer.write(b'raw \\x9b byte\\n' + b'L' * 2_000_000 + b'\\n')\n"
    "sys.stdout.write(''.join(f'\\r{p:3d}%|' + '#' * (p // 10) for p in range(0, 101, 10)) + '\\n')\n"
    "sys.stdout.write('\\r 40%|####      |\\r 50%|#####     |')\n"
    "sys.stdout.flush()\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    time.sleep(0.05)\n"
)


async def test_a_runs_escapes_are_shown_its_colours_kept_its_bar_as_it_stands_and_a_huge_line_cut(
    workdir: Path, nvml_state: Path, tmp_path: Path
) -> None:
    end = tmp_path / "end"
    run_id = await launch(workdir, [sys.executable, "-c", HOSTILE, str(end)], name="hostile")
    async with console(workdir, size=(120, 40)) as (app, pilot, notes):
        log = app.query_one(TailLog)
        await until(pilot, lambda: app.query_one(RunsTable).selected_run() == run_id, what="the run")
        await until(pilot, lambda: any(line.plain.startswith("100%") for line in log.kept), what="the log")
        shown = [line.plain for line in log.kept]
        assert shown == [
            printable(ATTACKS) + " attacks",
            "red words [bold red]not bold[/] [link=https://x.example/]no link[/link]",
            "raw \ufffd byte",  # not UTF-8: the replacement character
            "L" * 16384 + " … [+2.0 MB]",
            "100%|##########",
        ]
        assert "\\x1b]52;c;ZWNobyBQV05FRA==\\x1b\\" in shown[0] and "\\x9b31m" in shown[0]
        for row in log.lines:  # what reaches the terminal: no control, no link
            for segment in row:
                assert not obeyed(segment.text) and (segment.style is None or segment.style.link is None)
        [red] = [s for s in log.lines[1] if s.text == "red words"]
        assert red.style is not None and red.style.color is not None and red.style.color.number == 1  # SGR 31: red
        progress = app.query_one("#progress", Static)
        await until(pilot, lambda: str(progress.content) == " 50%|#####     |", what="the bar as it stands")
        assert printable(HOSTILE_NAME) in app.run_metrics[run_id].store.names()

        app.notify(f"[b]{ATTACKS}[/b]", title=f"run{OSC52}")  # any toast: plain text, its escapes shown
        note = await until(pilot, lambda: next((n for n in notes if n.title.startswith("run")), None), what="it")
        assert not note.markup and note.message == f"[b]{printable(ATTACKS)}[/b]"
        assert note.title == "run" + printable(OSC52)

        end.touch()  # the run ends inside its bar's line: its last state is the log's last line, not left under it
        await until(pilot, lambda: log.kept[-1].plain == f"— run {run_id} exited —", what="the end")
        assert log.kept[-2].plain == " 50%|#####     |" and str(progress.content) == ""


async def test_a_page_up_holds_the_view_while_lines_come_and_end_follows_the_tail_again(
    workdir: Path, nvml_state: Path
) -> None:
    script = "import time\nfor i in range(100000):\n    print(f'line {i}', flush=True)\n    time.sleep(0.02)\n"
    run_id = await launch(workdir, [sys.executable, "-c", script], name="chatty")
    async with console(workdir, size=(100, 30)) as (app, pilot, _):
        log = app.query_one(TailLog)
        await until(pilot, lambda: app.query_one(RunsTable).selected_run() == run_id, what="the run")
        await until(pilot, lambda: len(log.lines) > 100, what="lines to scroll back over")
        log.focus()
        await pilot.press("pageup")
        # A page up scrolls in an animation, which a loaded machine draws over more than a few frames: what is
        # held is the view once it has settled.
        held = drawn(log)
        for _ in range(60):
            await pilot.pause(0.3)
            if drawn(log) == held and log.scroll_y < log.max_scroll_y:
                break
            held = drawn(log)
        else:
            pytest.fail("the view never settled above the tail after a page up")
        grown = len(log.lines)
        await until(pilot, lambda: len(log.lines) > grown + 40, what="more lines")
        assert drawn(log) == held  # what the person reads stays put while lines come
        await pilot.press("end")
        await until(pilot, lambda: log.scroll_y == log.max_scroll_y, what="the tail again")
        grown = len(log.lines)
        await until(pilot, lambda: len(log.lines) > grown + 40, what="more lines")
        await until(pilot, lambda: log.scroll_y == log.max_scroll_y, what="the tail followed")
