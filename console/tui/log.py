"""The selected run's log: it follows its tail, wraps on request, finds text (`/`, `n`, `N`), scrolls cut lines
sideways, copies lines (`y`) and lets the mouse select text.

A run's bytes are data: each line is shown as `log_text` makes it (colours parsed, every other escape written out,
never sent to the terminal), a progress bar redrawn with `\r` as its last state, a very long line cut with its
size said (`LineReader`), so the log keeps what it holds bounded and its rows drawable.

It is a ScrollView of its own rather than a RichLog: it keeps how many rows each line took, so a found line's
place stays right as lines arrive and fall off and when wrapping changes, and it draws the offsets that
Textual's mouse selection reads (RichLog draws none: a drag over it selects nothing).
"""

from __future__ import annotations

import bisect
import codecs
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.actions import SkipAction
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.events import Resize
from textual.geometry import Size
from textual.screen import ModalScreen
from textual.scroll_view import ScrollView
from textual.selection import Selection
from textual.strip import Strip
from textual.timer import Timer
from textual.widgets import Input, Label

from console.tui.pacing import until_beat
from console.visible import visible, visible_keeping_sgr

WRAP_WIDTH = 78  # wrapping before the log knows its width (it wraps again at its own width once it does)
COPIED = "(OSC 52: your terminal must allow it)"
SHOWN_BYTES = 16 * 1024  # of one line (SGLang's server_args line, a few KB, stays whole); `logs` has it all
PROGRESS_BYTES = 1024  # kept of the end of the line being written, for the progress bar under the log
CUT = "…"
DROP_FRACTION = 10  # the oldest lines go a tenth of max_lines at a time: rows keep their places in between
DRAWN_ROWS = 200  # rows kept as drawn: a few views' worth


def log_text(line: str) -> Text:
    """A run's log line as the log shows it: its colours (SGR) parsed by Rich, every other character a terminal
    would act on written out (`\x1b]52;...`: see console.visible), tabs expanded."""
    if line.isprintable():
        text = Text(line)
    elif "\x1b[" in line:
        text = Text.from_ansi(visible_keeping_sgr(line))
    else:
        text = Text(visible(line, keep="\t"))
    text.expand_tabs()
    return text


def size_text(size: int) -> str:
    """`812 B`, `12.3 kB`, `1.9 MB`, `2.0 GB`."""
    if size < 1000:
        return f"{size} B"
    value, unit = size / 1000, "kB"
    for bigger in ("MB", "GB"):
        if value < 999.95:
            break
        value, unit = value / 1000, bigger
    return f"{value:.1f} {unit}"


def shown_line(head: bytes | bytearray, size: int) -> str:
    """A line of `size` bytes that starts with `head` (at most SHOWN_BYTES of it), as a line of the log: whole, or
    its head and how much more there was (`… [+1.9 MB]`)."""
    if size == len(head):
        return head.decode(errors="replace")
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(bytes(head))  # its torn end dropped
    return f"{text} {CUT} [+{size_text(size - len(head))}]"


class Row:
    """A row of the log as kept: its segments and width. A Strip carries seven caches of its own, empty or not,
    about a kilobyte a row over the 5,000 lines kept; the row is made a Strip as it is drawn."""

    __slots__ = ("cell_length", "segments")

    def __init__(self, segments: tuple[Segment, ...], cell_length: int) -> None:
        self.segments = segments
        self.cell_length = cell_length

    def __iter__(self) -> Iterator[Segment]:
        return iter(self.segments)

    @property
    def text(self) -> str:
        return "".join(segment.text for segment in self.segments)


@dataclass
class Part:
    """One part of a line between carriage returns, bounded: its first SHOWN_BYTES, its last PROGRESS_BYTES and
    its size."""

    head: bytearray = field(default_factory=bytearray)
    tail: bytes = b""
    size: int = 0

    def add(self, data: bytes) -> None:
        if len(self.head) < SHOWN_BYTES:
            self.head += data[: SHOWN_BYTES - len(self.head)]
        self.tail = (self.tail + data[-PROGRESS_BYTES:])[-PROGRESS_BYTES:]
        self.size += len(data)

    @property
    def blank(self) -> bool:
        return self.size == len(self.head) and not self.head.strip()

    def shown(self) -> str:
        return shown_line(self.head, self.size)

    def end(self) -> str:
        """The part's last characters, for the progress bar (a torn first character dropped)."""
        tail = self.tail
        while tail and 0x80 <= tail[0] < 0xC0:
            tail = tail[1:]
        return tail.decode(errors="replace")


class LineReader:
    """A run's log bytes, in chunks of any size, into the lines the log shows. A line shows its last state, as a
    terminal would once a progress bar has redrawn it with `\r`: its last part holding more than blanks; a line
    over SHOWN_BYTES is cut (see `Part.shown`). What it keeps is bounded, however long a line grows."""

    def __init__(self) -> None:
        self.part = Part()  # the part being written
        self.last: Part | None = None  # the last part before it that held more than blanks

    def feed(self, data: bytes) -> list[str]:
        """The lines `data` ended."""
        if b"\r" not in data:  # most output: whole lines, split at C speed
            *ended, rest = data.split(b"\n")
            if not ended:
                self.part.add(rest)
                return []
            self.part.add(ended[0])
            lines = [self.state().shown()]
            lines += [shown_line(line[:SHOWN_BYTES], len(line)) for line in ended[1:]]
            self.part, self.last = Part(), None
            self.part.add(rest)
            return lines
        lines = []
        at = 0
        for found in re.finditer(rb"[\r\n]", data):
            self.part.add(data[at : found.start()])
            at = found.end()
            if found.group() == b"\r":
                if not self.part.blank:
                    self.last = self.part
                self.part = Part()
            else:
                lines.append(self.state().shown())
                self.part, self.last = Part(), None
        self.part.add(data[at:])
        return lines

    def end(self) -> list[str]:
        """The line the output stopped in, had it no newline after it (a bar's last redraw), as its last line."""
        state = self.state()
        self.part, self.last = Part(), None
        return [] if state.blank else [state.shown()]

    def state(self) -> Part:
        return self.last if self.part.blank and self.last is not None else self.part

    def progress(self) -> str:
        """The end of the line being written, as it stands (a bar's last redraw); empty after a line's end."""
        return self.state().end()


@dataclass
class Search:
    """What `/` found: plain text in any case. Lines are numbered from the first line the log ever held, so a
    number stays right as old lines fall off."""

    text: str
    pattern: re.Pattern[str]
    found: list[int] = field(default_factory=list)  # the numbers of the lines that match, oldest first
    at: int | None = None  # the current match's line

    def status(self) -> Text:
        where = f"{bisect.bisect_left(self.found, self.at) + 1} of {len(self.found)}" if self.at is not None else ""
        return Text(f"/{self.text}  {where or 'no match left'}")


def plain_pattern(text: str) -> re.Pattern[str]:
    """`text` as typed, in any case: a less user's `.` or `[` is looked for as itself, never as a regex."""
    return re.compile(re.escape(text), re.IGNORECASE)


class FindPrompt(ModalScreen[str | None]):
    """The `/` prompt on the bottom line, as in less: Enter finds, Escape cancels; the last text is offered."""

    DEFAULT_CSS = """
    FindPrompt { align: left bottom; background: $background 0%; }
    FindPrompt > Horizontal { dock: bottom; height: 1; background: $panel; }
    FindPrompt Label { width: 2; padding-left: 1; }
    FindPrompt Input, FindPrompt Input:focus { width: 1fr; height: 1; border: none; padding: 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel", show=False)]

    def __init__(self, last: str) -> None:
        super().__init__()
        self.last = last

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Label("/")
            yield Input(self.last, placeholder="text to find in the log, any case: Enter finds, Esc cancels")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class TailLog(ScrollView, can_focus=True):
    """The selected run's log. It follows the tail unless the person scrolled up (back at the bottom, it follows
    again) or a search is shown; long lines are cut (scroll sideways) or wrapped (`w`)."""

    DEFAULT_CSS = """
    TailLog {
        background: $surface;
        color: $foreground;
        overflow-y: scroll;
        &:focus { background-tint: $foreground 5%; }
    }
    """

    def __init__(self, max_lines: int, id: str | None = None) -> None:
        super().__init__(id=id)
        self.max_lines = max_lines
        self.kept: deque[Text] = deque()  # the lines as shown (see `log_text`)
        self.heights: deque[int] = deque()  # how many rows each kept line takes
        self.lines: list[Row] = []  # the rows drawn, every kept line's in turn
        self.dropped = 0  # lines fallen off the top so far: the first kept line's number
        self.widest = 0
        self.wrap = False
        self.wrapped_at = 0  # the width the rows were wrapped to
        self.tail = True
        self.search: Search | None = None
        self.last_find = ""  # offered again by the next `/`
        self.pending: list[str] = []  # lines added, not drawn yet
        self._row_style: tuple[object, Style] = (None, Style())
        self.flush_timer: Timer | None = None
        # The rows as last drawn, by row, for one (scroll_x, width, style): a scroll to the tail draws every row in
        # view again, and most of them were drawn already. Forgotten when rows move (see `moved`).
        self.drawn: dict[int, Strip] = {}
        self.drawn_for: tuple[int, int, Style] | None = None

    def on_mount(self) -> None:
        self.watch(self.app, "theme", self.theme_changed, init=False)
        # Textual's anchor keeps the tail in view at every layout, whatever changed the rows in view (CI once saw
        # the log stay short of its tail after a scroll to it); a person's scroll releases it, and each scroll to
        # the end below takes it up again.
        self.anchor()

    # --- lines in, rows out -------------------------------------------------------------------

    def add(self, line: str) -> None:
        """A line (the run's or the console's own) at the end, shown at the next beat with the others that came
        meanwhile: a log that scrolls at every line draws every row in view again each time, at 10 lines a second
        most of the console's work."""
        self.pending.append(line)
        if self.flush_timer is None:
            self.flush_timer = self.set_timer(until_beat(), self.flush)

    def flush(self) -> None:
        """The lines added since the last flush, into the log (a look at it, a find or a wrap flushes first)."""
        if self.flush_timer is not None:
            self.flush_timer.stop()
            self.flush_timer = None
        pending, self.pending = self.pending, []
        if not pending:
            return
        dropped_rows = 0
        for line in pending:
            dropped_rows += self.append(line)
        self.grow(Size(self.widest, len(self.lines)))
        self.show_bars()
        if self.following:
            # force: Textual drops a scroll made before layout has granted the scrollbar (a flake seen in CI)
            self.scroll_end(animate=False, immediate=False, x_axis=False, force=True)
        elif dropped_rows:  # the person is reading: what they read stays where it was
            self.scroll_to(y=self.scroll_y - dropped_rows, animate=False, immediate=True)
        self.refresh()

    def grow(self, size: Size) -> None:
        """The rows' new extent. Setting `virtual_size` lays the whole screen out again, twice a second while a run
        writes (a fifth of the console's work following a run); when only the rows' count changed the log's own
        scrollbars are brought up to date instead: nothing else on the screen moves."""
        if size.width != self.virtual_size.width:
            self.virtual_size = size
        elif size != self.virtual_size:
            self.set_reactive(TailLog.virtual_size, size)
            self._scroll_update(size)

    def append(self, line: str) -> int:
        """One line into the rows; returns how many rows fell off the top to make room."""
        number = self.dropped + len(self.kept)
        text = log_text(line)
        if self.search is not None and self.search.pattern.search(text.plain):
            self.search.found.append(number)
            self.border_title = self.search.status()
        rows = self.rows_of(text, number)
        self.kept.append(text)
        self.heights.append(len(rows))
        self.lines.extend(rows)
        self.widest = max(self.widest, *(row.cell_length for row in rows))
        if len(self.kept) <= self.max_lines + self.max_lines // DROP_FRACTION:
            return 0
        return self.drop_oldest(len(self.kept) - self.max_lines)

    def drop_oldest(self, count: int) -> int:
        """The oldest `count` lines go (and their matches); returns how many rows they took."""
        self.moved()
        height = 0
        for _ in range(count):
            self.kept.popleft()
            height += self.heights.popleft()
        gone = self.lines[:height]
        del self.lines[:height]
        self.dropped += count
        if any(row.cell_length >= self.widest for row in gone):
            self.widest = max((row.cell_length for row in self.lines), default=0)
        if self.search is not None:
            search = self.search
            del search.found[: bisect.bisect_left(search.found, self.dropped)]
            if search.at is not None and search.at < self.dropped:
                search.at = search.found[0] if search.found else None
                self.restyle({search.at} if search.at is not None else set())
            self.border_title = search.status()
        return height

    def moved(self) -> None:
        """Rows changed or took other places: none drawn before is drawn the same again."""
        self.drawn.clear()

    @property
    def following(self) -> bool:
        return self.tail and self.search is None

    def show_bars(self) -> None:
        """The scrollbars only while the person reads back (scrolled up or finding): at the tail they say nothing
        a person needs, and redrawing them at every line was a fair share of the console's time."""
        visibility = "hidden" if self.following else "visible"
        if self.styles.scrollbar_visibility != visibility:
            self.styles.scrollbar_visibility = visibility

    def rows_of(self, text: Text, number: int) -> list[Row]:
        """A line's rows: one cut row, or as many as wrapping at the log's width takes; matches highlighted."""
        if self.search is not None:
            text = text.copy()
            match_style, current_style = self.match_styles()
            style = current_style if number == self.search.at else match_style
            for match in self.search.pattern.finditer(text.plain):
                text.stylize(style, match.start(), match.end())
        console = self.app.console
        if not self.wrap:
            return [Row(tuple(text.render(console)), text.cell_len)]
        rows = console.render_lines(text, console.options.update_width(self.wrapped_at), pad=False)
        return [Row(tuple(row), Segment.get_line_length(row)) for row in rows] or [Row((), 0)]

    def match_styles(self) -> tuple[Style, Style]:
        """Every match reversed; the current one in the theme's warning colour, so it shows in any theme."""
        theme = self.app.current_theme
        return Style(reverse=True), Style.parse(f"bold {theme.background or 'black'} on {theme.warning or 'yellow'}")

    def restyle(self, numbers: Iterable[int]) -> None:
        """Draw these lines' rows again (a match came or went); their place does not change."""
        wanted = set(numbers)
        row = 0
        for index, (line, height) in enumerate(zip(self.kept, list(self.heights), strict=True)):
            if self.dropped + index in wanted:
                self.lines[row : row + height] = self.rows_of(line, self.dropped + index)
            row += height
        self.moved()
        self.refresh()

    def rewrite(self) -> None:
        """Draw every row again (wrapping changed), keeping the same line in view: the match being read, the
        line at the top, or the tail."""
        top = self.line_at(round(self.scroll_y))
        self.wrapped_at = self.scrollable_content_region.width or WRAP_WIDTH
        self.moved()
        self.lines, self.heights = [], deque()
        for index, line in enumerate(self.kept):
            rows = self.rows_of(line, self.dropped + index)
            self.lines.extend(rows)
            self.heights.append(len(rows))
        self.widest = max((row.cell_length for row in self.lines), default=0)
        self.virtual_size = Size(self.widest, len(self.lines))
        if self.search is not None and self.search.at is not None:
            self.show_match()
        elif self.following:
            self.scroll_end(animate=False, immediate=False, x_axis=False, force=True)
        else:
            self.scroll_to(y=self.row_of(top), animate=False, immediate=True)
        self.refresh()

    def clear(self) -> TailLog:
        self.pending = []
        if self.flush_timer is not None:
            self.flush_timer.stop()
            self.flush_timer = None
        self.kept.clear()
        self.heights.clear()
        self.lines = []
        self.moved()
        self.dropped = self.widest = 0
        self.tail = True
        self.search = None
        self.border_title = None
        self.virtual_size = Size(0, 0)
        self.refresh()
        return self

    def toggle_wrap(self) -> None:
        self.flush()
        self.wrap = not self.wrap
        self.rewrite()

    def on_resize(self, event: Resize) -> None:
        if self.wrap and self.scrollable_content_region.width != self.wrapped_at:
            self.rewrite()
        elif self.following:
            self.scroll_end(animate=False, immediate=False, x_axis=False, force=True)

    def theme_changed(self) -> None:
        if self.search is not None:
            self.restyle(self.search.found)

    # --- where lines are ------------------------------------------------------------------

    def row_of(self, index: int) -> int:
        """The first row of the kept line `index`."""
        return sum(islice(self.heights, index))

    def line_at(self, row: int) -> int:
        """The kept line drawn on `row` (the last one past the end)."""
        for index, height in enumerate(self.heights):
            row -= height
            if row < 0:
                return index
        return max(len(self.heights) - 1, 0)

    def lines_in_view(self) -> tuple[int, int]:
        """The first and last kept lines with a row in view."""
        top = round(self.scroll_y)
        return self.line_at(top), self.line_at(top + self.scrollable_content_region.height - 1)

    # --- finding --------------------------------------------------------------------------

    def find(self, text: str | None) -> None:
        """Find `text` (None: the prompt was cancelled; empty: stop finding): highlight every line that has it and
        show the nearest at or above the bottom of the view, as less does after G."""
        self.flush()
        if text is None:
            return
        if not text.strip():
            self.stop_finding()
            return
        self.last_find = text
        pattern = plain_pattern(text)
        found = [self.dropped + index for index, line in enumerate(self.kept) if pattern.search(line.plain)]
        if not found:
            self.notify(f"no match for {text}", title="find", severity="warning", markup=False)
            return
        bottom = self.dropped + (len(self.kept) - 1 if self.following else self.lines_in_view()[1])
        above = bisect.bisect_right(found, bottom)
        if not above:
            self.notify("search wrapped", title="find", timeout=2)
        before = self.search.found if self.search is not None else []
        self.search = Search(text, pattern, found, found[above - 1])  # found[-1] when none is above
        self.tail = False
        self.show_bars()
        self.restyle([*before, *found])
        self.show_match()

    def step(self, older: bool) -> None:
        """The next match up (`older`) or down, wrapping around at either end."""
        self.flush()
        search = self.search
        if search is None:
            self.notify("nothing to step through: / finds text in the log", title="find", severity="warning")
            return
        if search.at is None:
            self.notify(f"no match for {search.text} left in the log", title="find", severity="warning", markup=False)
            return
        index = bisect.bisect_left(search.found, search.at) + (-1 if older else 1)
        if not 0 <= index < len(search.found):
            self.notify("search wrapped", title="find", timeout=2)
        before, search.at = search.at, search.found[index % len(search.found)]
        self.restyle([before, search.at])
        self.show_match()

    def show_match(self) -> None:
        """Bring the current match into view (centred if it was out of it), and sideways when lines are cut."""
        search = self.search
        if search is None or search.at is None:
            return
        index = search.at - self.dropped
        row, height = self.row_of(index), self.heights[index]
        view = self.scrollable_content_region
        y: float | None = None
        if not self.scroll_y <= row <= self.scroll_y + view.height - height:
            y = row - (view.height - height) // 2
        x: float | None = 0 if self.wrap else None
        match = search.pattern.search(self.kept[index].plain)
        if not self.wrap and match is not None:
            start, end = cell_len(match.string[: match.start()]), cell_len(match.string[: match.end()])
            if start < self.scroll_x or end > self.scroll_x + view.width:
                x = max(start - view.width // 4, 0)
        self.scroll_to(x=x, y=y, animate=False, immediate=True)
        self.border_title = search.status()

    def stop_finding(self) -> bool:
        """No more highlights; the log follows its tail again. False: no search was shown."""
        self.flush()
        if self.search is None:
            return False
        found, self.search = self.search.found, None
        self.border_title = None
        self.restyle(found)
        self.tail = True
        self.show_bars()
        self.scroll_end(animate=False, immediate=False, x_axis=False, force=True)
        return True

    # --- copying and selecting --------------------------------------------------------------

    def copy(self) -> None:
        """The current match's line, or the lines in view, to the clipboard (OSC 52, through SSH and tmux)."""
        self.flush()
        if not self.kept:
            self.notify("the log is empty: nothing to copy", title="copy", severity="warning")
            return
        if self.search is not None and self.search.at is not None:
            first = last = self.search.at - self.dropped
        else:
            first, last = self.lines_in_view()
        self.app.copy_to_clipboard("\n".join(line.plain for line in islice(self.kept, first, last + 1)))
        count = last - first + 1
        self.notify(f"copied {count} line{'s' if count != 1 else ''} {COPIED}", title="copy")

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        """The text a mouse drag selected (ctrl+c copies it), read from the rows as drawn."""
        return selection.extract("\n".join(row.text for row in self.lines)), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self.refresh()

    def selected(self, row: Strip, span: tuple[int, int]) -> Strip:
        """`row` with the selected span (character offsets, -1: to its end) in the screen's selection style."""
        start, end = span
        text = row.text
        start_cell = cell_len(text[:start])
        end_cell = row.cell_length if end == -1 else cell_len(text[:end])
        before, inside, after = row.divide([start_cell, end_cell, row.cell_length])
        style = self.screen.get_component_rich_style("screen--selection")
        return Strip.join([before, Strip(Segment.apply_style(inside, post_style=style)), after])

    # --- drawing and scrolling ---------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = scroll_y + y
        width = self.scrollable_content_region.width
        style = self.row_style()
        if row >= len(self.lines):
            return Strip.blank(width, style)
        selection = self.text_selection
        span = selection.get_span(row) if selection is not None else None
        if span is None and self.drawn_for == (scroll_x, width, style) and (drawn := self.drawn.get(row)):
            return drawn
        # A Strip made for this drawing: Strip caches each crop, offset and style it makes on itself, and a row is
        # drawn at a new offset every time lines fall off, so those caches kept on the 5,000 kept rows were most
        # of what the console's memory grew by. They go with the frame (the last drawn rows stay in `drawn`).
        kept = self.lines[row]
        strip = Strip(kept.segments, kept.cell_length)
        if span is not None:
            strip = self.selected(strip, span)
        strip = strip.crop_extend(scroll_x, scroll_x + width, style).apply_offsets(scroll_x, row).apply_style(style)
        if span is None:
            if self.drawn_for != (scroll_x, width, style) or len(self.drawn) > DRAWN_ROWS:
                self.drawn, self.drawn_for = {}, (scroll_x, width, style)
            self.drawn[row] = strip
        return strip

    def row_style(self) -> Style:
        """The log's own style, looked up once per theme and focus rather than for every row drawn (the lookup
        walks the widget's ancestors: at 40 rows a redraw it was a fair share of the console's time)."""
        key = (self.app.theme, self.has_focus)
        if self._row_style[0] != key:
            self._row_style = (key, self.rich_style)
        return self._row_style[1]

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value >= self.max_scroll_y:
            self.tail = True
        elif new_value < old_value:  # only a person scrolls up
            self.tail = False
        self.show_bars()

    def action_scroll_left(self) -> None:
        """Half a view sideways, as less's arrows go (one cell a press reads a long line too slowly)."""
        if not self.allow_horizontal_scroll:
            raise SkipAction()
        self.scroll_to(x=self.scroll_x - self.sideways_step(), animate=False)

    def action_scroll_right(self) -> None:
        if not self.allow_horizontal_scroll:
            raise SkipAction()
        self.scroll_to(x=self.scroll_x + self.sideways_step(), animate=False)

    def sideways_step(self) -> int:
        return max(self.scrollable_content_region.width // 2, 1)
