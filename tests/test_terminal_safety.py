"""A run's output is data, never a command to the operator's terminal: OSC 52 (a clipboard write), OSC 0/2 (the
window's title), OSC 8 (a link), CSI 2J (a cleared screen), a DCS, C1 controls as UTF-8 (U+009B) and as raw bytes
(0x9b), written by a run into its log, its argv or a metric name, are shown written out (`\\x1b]52;...`) by every
renderer, the CLI's `logs` (to a terminal; byte for byte into a pipe, or with --raw), `stacks --now` and its
notes, and by the console's log, whose lines keep their colours (SGR, parsed by Rich) and show a progress bar's
last state and a very long line cut with its size.

Real: the renderers, the CLI in its own process (on a pty where a terminal is meant), the local agent, the runs;
and the console in tmux over OpenSSH's sshd, with tmux taking clipboard writes and titles from what it runs.
"""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.style import Style

from console.cli import output
from console.tui.log import PROGRESS_BYTES, SHOWN_BYTES, LineReader, log_text, size_text
from console.visible import SGR, TerminalLog, printable, visible, visible_keeping_sgr
from tests.conftest import CLI, launch, wait_for, wait_state
from tests.sshd import Sshd
from tests.test_tui_tmux import console, host_python
from tests.test_tui_tmux import launch as launch_in

__all__ = ["host_python"]  # the fixture, used by name

# What a run may write to take over the operator's terminal.
OSC52 = "\x1b]52;c;ZWNobyBQV05FRA==\x1b\\"  # "echo PWNED" into the clipboard
TITLE = "\x1b]0;pwned-title\x07\x1b]2;pwned-title\x1b\\"
LINK = "\x1b]8;;https://evil.example/\x1b\\click here\x1b]8;;\x1b\\"
CLEAR = "\x1b[2J\x1b[H"
DCS = "\x1bP+q544e\x1b\\"
C1 = "\u009b31m\u009d0;c1-title\u009c"
ATTACKS = (OSC52, TITLE, LINK, CLEAR, DCS, C1)
# Pieces the hypothesis draws mix with any text: whole and broken sequences, colours, separators.
PIECES = (
    *ATTACKS,
    "\x1b[31m",
    "\x1b[0m",
    "\x1b[38;5;208m",
    "\x1b[",
    "\x1b]8;;",
    "\x1b\\",
    "\x1b",
    "\x9b",
    "\r",
    "\n",
    "\t",
    "\x7f",
    "\u202e",
    "\u2028",
    "[bold red]x[/]",
    "[link=https://evil.example/]y[/link]",
)
hostile = st.lists(st.sampled_from(PIECES) | st.text(max_size=8), max_size=12).map("".join)


def obeyed(text: str, keep: str = "") -> list[str]:
    """The characters of `text` a terminal would act on: C0 controls but `keep`, DEL, C1, format characters, line
    and paragraph separators, surrogates."""
    return [
        ch
        for ch in text
        if ch not in keep
        and (ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F or unicodedata.category(ch) in ("Cf", "Cs", "Zl", "Zp"))
    ]


# --- the renderers ------------------------------------------------------------------------------


@given(st.text() | hostile)
def test_printable_leaves_nothing_a_terminal_acts_on(text: str) -> None:
    shown = printable(text)
    assert not obeyed(shown)
    assert shown == text or "\\" in shown


@given(st.text() | hostile)
def test_visible_keeps_the_lines_and_tabs_and_nothing_else_a_terminal_acts_on(text: str) -> None:
    shown = visible(text)
    assert not obeyed(shown, keep="\n\t")
    assert shown.split("\n") == [visible(line) for line in text.split("\n")]  # the same lines, each shown


def test_every_attack_is_written_out_the_same_way() -> None:
    assert printable(OSC52) == "\\x1b]52;c;ZWNobyBQV05FRA==\\x1b\\"
    assert visible(C1 + "\n") == "\\x9b31m\\x9d0;c1-title\\x9c\n"
    assert printable(CLEAR + "\t") == "\\x1b[2J\\x1b[H\\t"
    assert visible("plain, ünïcode and 🦅\tok") == "plain, ünïcode and 🦅\tok"


@given(st.text() | hostile)
def test_a_log_line_keeps_its_colours_parsed_and_shows_every_other_escape(line: str) -> None:
    text = log_text(line)
    assert not obeyed(text.plain)
    if "\t" not in line:  # (tabs are expanded to the next stop)
        assert text.plain == visible(SGR.sub("", line), keep="\t")  # every character shown, only colour sequences taken
    for span in text.spans:  # colours and attributes only: no link, nothing a click acts on
        style = span.style if isinstance(span.style, Style) else Style.parse(span.style)
        assert style.link is None and not style.meta


def test_a_log_lines_colours_become_styles_and_markup_stays_text() -> None:
    text = log_text(f"\x1b[31mred\x1b[0m [bold]{OSC52}{LINK}")
    link = "\\x1b]8;;https://evil.example/\\x1b\\click here\\x1b]8;;\\x1b\\"
    assert text.plain == "red [bold]\\x1b]52;c;ZWNobyBQV05FRA==\\x1b\\" + link
    [red] = text.spans
    assert (red.start, red.end) == (0, 3) and Style.parse(str(red.style)).color is not None
    assert visible_keeping_sgr("\x1b[1;31mbold\x1b[m\x1b[2J") == "\x1b[1;31mbold\x1b[m\\x1b[2J"


@settings(max_examples=200)
@given(st.binary(max_size=300) | hostile.map(lambda s: s.encode(errors="surrogatepass")), st.lists(st.integers(0, 300)))
def test_logs_to_a_terminal_shows_every_byte_and_obeys_none_however_the_bytes_come(
    data: bytes, cuts: list[int]
) -> None:
    whole, pieces = io.BytesIO(), io.BytesIO()
    TerminalLog(whole, shown=True).write(data, end=True)
    log = TerminalLog(pieces, shown=True)
    at = 0
    for cut in sorted(cuts):
        log.write(data[at:cut])
        at = max(at, cut)
    log.write(data[at:], end=True)
    assert pieces.getvalue() == whole.getvalue()  # a character torn between two reads is shown whole
    shown = whole.getvalue().decode()  # strict: UTF-8, no stray byte of 0x80..0x9f for an 8-bit terminal
    assert not obeyed(shown, keep="\n\t\r")
    assert shown.count("\n") == data.count(b"\n")
    raw = io.BytesIO()
    TerminalLog(raw, shown=False).write(data)
    assert raw.getvalue() == data


def test_a_byte_that_is_not_utf8_is_shown_as_its_value() -> None:
    shown = io.BytesIO()
    TerminalLog(shown, shown=True).write(b"a\x9bb \xc2\x9b c\x1b]52;c;eA==\x07\r\n", end=True)
    assert shown.getvalue() == b"a\\x9bb \\x9b c\\x1b]52;c;eA==\\x07\r\n"


@settings(max_examples=200)
@given(st.lists(st.sampled_from(PIECES) | st.text(max_size=6), max_size=20), st.lists(st.integers(0, 200)))
def test_a_log_line_is_its_last_state_however_the_bytes_come(pieces: list[str], cuts: list[int]) -> None:
    data = "".join(pieces).encode(errors="surrogatepass")
    reader = LineReader()
    lines: list[str] = []
    at = 0
    for cut in sorted(cuts):
        lines += reader.feed(data[at:cut])
        at = max(at, cut)
    lines += reader.feed(data[at:])
    expected = []
    for line in data.split(b"\n")[:-1]:  # each ended line, as a terminal shows it once redrawn
        parts = line.split(b"\r")
        filled = [part for part in parts if part.strip()]
        expected.append((parts[-1] if parts[-1].strip() or not filled else filled[-1]).decode(errors="replace"))
    assert lines == expected


def test_a_progress_bar_shows_its_last_state_and_a_crlf_line_its_text() -> None:
    reader = LineReader()
    assert reader.feed(b"\r  0%|     |\r 40%|##   |") == []
    assert reader.progress() == " 40%|##   |"  # the bar as it stands, under the log
    assert reader.feed(b"\r100%|#####|\n") == ["100%|#####|"]
    assert reader.progress() == ""
    assert reader.feed(b"windows\r\nline\n\rcleared 99%\r           \r\n") == ["windows", "line", "cleared 99%"]
    assert reader.feed(b"\r 60%|###  |\r 70%|#### ") == [] and reader.end() == [" 70%|#### "]  # the output ended
    assert reader.end() == [] and reader.feed(b"done\n  ") == ["done"] and reader.end() == []


def test_a_very_long_line_is_cut_with_its_size_and_what_is_kept_stays_bounded() -> None:
    reader = LineReader()
    head = b"a" + "é".encode() * (SHOWN_BYTES // 2)  # the cut falls inside a character
    rest = 1_900_000 - len(head) + SHOWN_BYTES
    chunk = b"x" * 65536
    assert reader.feed(head) == []
    for _ in range(rest // len(chunk)):
        assert reader.feed(chunk) == []
        assert len(reader.part.head) == SHOWN_BYTES and len(reader.part.tail) == PROGRESS_BYTES
    line, after = reader.feed(b"x" * (rest % len(chunk)) + b"\nnext\n")
    assert after == "next"
    assert line == "a" + "é" * (SHOWN_BYTES // 2 - 1) + " … [+1.9 MB]"
    assert "\ufffd" not in line
    assert reader.feed(b"a\n" + b"y" * 20_000 + b"\nb") == ["a", "y" * SHOWN_BYTES + " … [+3.6 kB]"]  # within a read
    assert [size_text(n) for n in (0, 999, 1000, 1_949_999, 999_949_999, 5 * 10**9)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "1.9 MB",
        "999.9 MB",
        "5.0 GB",
    ]


@given(hostile)
def test_the_clis_lines_for_a_person_show_a_runs_escapes(text: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        output.out(text)
        output.report(text)
        output.note(text)
    finally:
        sys.stdout, sys.stderr = saved
    assert not obeyed(out.getvalue(), keep="\n\t") and not obeyed(err.getvalue(), keep="\n\t")
    assert err.getvalue().endswith("eagle3-console: " + printable(text) + "\n")  # a note is one line


# --- the CLI on a terminal and into a pipe --------------------------------------------------------

HOSTILE_LOG = b"".join(a.encode() for a in ATTACKS) + b" raw \x9b1m byte\n\x1b[32mgreen\x1b[0m\r\nbar 1\rbar 2\n"


def on_a_terminal(argv: list[str], timeout: float = 60) -> bytes:
    """What a command writes to stdout when stdout is a terminal (a pty; stderr and stdin are not)."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(argv, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    finally:
        os.close(slave)
    shown = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the command ended and closed the terminal
                    break
                if not chunk:
                    break
                shown += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=max(deadline - time.monotonic(), 1)) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        os.close(master)
        if proc.stderr:
            proc.stderr.close()
    return bytes(shown)


def test_logs_is_byte_exact_into_a_pipe_shown_on_a_terminal_and_raw_with_raw(cli: CLI, workdir: Path) -> None:
    writer = f"import sys\nsys.stdout.buffer.write({HOSTILE_LOG!r})\n"
    run_id = launch(cli, "command", "--", sys.executable, "-c", writer)
    wait_state(cli, run_id, {"exited"})
    piped = cli("logs", run_id)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == HOSTILE_LOG  # data: the bytes the run wrote

    argv = [sys.executable, "-m", "console", "--workdir", str(workdir), "local", "logs", run_id]
    shown = on_a_terminal(argv)
    assert not obeyed(shown.decode(), keep="\n\t\r")  # (strict UTF-8: no lone 0x9b either)
    assert b"\\x1b]52;c;ZWNobyBQV05FRA==\\x1b\\" in shown and b"\\x9b31m\\x9d0;c1-title\\x9c" in shown
    assert b" raw \\x9b1m byte" in shown  # a raw 0x9b byte (not UTF-8) is written as its value
    assert b"\\x1b[32mgreen\\x1b[0m\r" in shown and b"bar 1\rbar 2" in shown  # \r kept: a bar redraws in place

    raw = on_a_terminal([*argv, "--raw"])
    assert raw == HOSTILE_LOG.replace(b"\n", b"\r\n")  # as written (the terminal puts \r before each \n)


def test_metrics_csv_is_data_into_a_pipe_and_shown_on_a_terminal(cli: CLI, workdir: Path) -> None:
    name = "loss" + OSC52
    writer = (
        "import json, os\n"
        "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as metrics:\n"
        f"    metrics.write(json.dumps({{'step': 1, {name!r}: 1.5}}) + '\\n')\n"
    )
    run_id = launch(cli, "command", "--", sys.executable, "-c", writer)
    wait_state(cli, run_id, {"exited"})
    piped = cli("metrics", run_id, "--csv")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.decode().splitlines()[0] == f"step,{name}"  # the name as written: data
    shown = on_a_terminal(
        [sys.executable, "-m", "console", "--workdir", str(workdir), "local", "metrics", run_id, "--csv"]
    )
    assert not obeyed(shown.decode(), keep="\n\t\r") and f"step,{printable(name)}" in shown.decode()


def test_stacks_now_shows_an_argv_holding_osc52_written_out(cli: CLI, workdir: Path) -> None:
    sleeper = "import sys, time\nprint('asleep', flush=True)\ntime.sleep(60)\n"
    run_id = launch(cli, "command", "--", sys.executable, "-c", sleeper, OSC52, TITLE)
    output_log = workdir / "runs" / run_id / "output.log"
    wait_for(lambda: output_log.exists() and b"asleep" in output_log.read_bytes(), what="the run asleep")
    try:
        dumped = cli("stacks", run_id, "--now")
        assert dumped.returncode == 0, dumped.stderr
        assert b"\x1b" not in dumped.stdout + dumped.stderr and b"\x07" not in dumped.stdout
        assert b"\\x1b]52;c;ZWNobyBQV05FRA==\\x1b\\" in dumped.stdout  # the argv, in the dump's process line
        shown = cli("status", run_id)  # the run whole, its command line uncut
        assert b"\x1b" not in shown.stdout and b"\\x1b]52;c;ZWNobyBQV05FRA==\\x1b\\" in shown.stdout
    finally:
        cli("kill", run_id, "--signal", "KILL", "--grace", "0")


# --- the console, in a terminal that obeys: tmux with set-clipboard on ----------------------------

METRIC = "loss" + OSC52 + C1  # a metric name holding a clipboard write and C1 controls
TMUX_RUN = (
    "import json, os, sys, time\n"
    "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as metrics:\n"
    f"    metrics.write(json.dumps({{'step': 1, {METRIC!r}: 1.5}}) + '\\n')\n"
    f"    metrics.write(json.dumps({{'step': 2, {METRIC!r}: float('nan')}}) + '\\n')\n"
    f"for name, attack in {list(zip(('osc52', 'title', 'link', 'clear', 'dcs', 'c1'), ATTACKS, strict=True))!r}:\n"
    "    print(f'{name}: {attack} end', flush=True)\n"
    "sys.stdout.buffer.write(b'raw: \\x9b2J byte\\n')\n"
    "print('all written', flush=True)\n"
    "time.sleep(120)\n"
)


def test_the_console_over_ssh_shows_a_runs_escapes_and_the_terminal_obeys_none(
    sshd: Sshd, workdir: Path, host_python: Path, tmp_path: Path
) -> None:
    script = tmp_path / "hostile.py"
    script.write_text(TMUX_RUN)
    with console(sshd, workdir, host_python, (160, 48)) as term:
        term.command("set-option", "-g", "set-clipboard", "on", ";", "set-option", "-g", "set-titles", "on")
        title = term.command("display-message", "-p", "#{pane_title}")
        assert term.command("list-buffers") == ""
        launch_in(workdir, "command", "--name", "hostile", "--", sys.executable, str(script))
        screen = term.wait_text("all written", timeout=60)
        for shown in (
            "osc52: \\x1b]52;c;ZWNobyBQV05FRA==\\x1b\\ end",
            "title: \\x1b]0;pwned-title\\x07\\x1b]2;pwned-title\\x1b\\ end",
            "link: \\x1b]8;;https://evil.example/\\x1b\\click here\\x1b]8;;\\x1b\\ end",
            "clear: \\x1b[2J\\x1b[H end",
            "dcs: \\x1bP+q544e\\x1b\\ end",
            "c1: \\x9b31m\\x9d0;c1-title\\x9c end",
            "raw: \ufffd2J byte",
        ):
            assert shown in screen, screen
        # the metric's name, in its chart's legend and in the toast of its NaN
        term.wait_text("loss\\x1b]52;c;ZWNo", timeout=30)
        assert "eagle3-console" in term.screen()  # the header: nothing cleared the screen
        assert term.command("list-buffers") == ""  # nothing reached the clipboard
        assert term.command("display-message", "-p", "#{pane_title}") == title
