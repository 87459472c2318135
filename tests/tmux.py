"""A terminal for end-to-end tests: a program run in a detached tmux session of a given size, on a private server.

The test types keys into it (`send-keys`) and reads its screen as text (`capture-pane -p`), as a person would;
`wait_for` polls the screen until a predicate on it holds. Each Tmux has its own server, so it neither sees nor
disturbs a person's tmux, and `close` ends its server with whatever runs in it.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

TMUX = shutil.which("tmux") or "/usr/bin/tmux"  # installed by `make test`
POLL_S = 0.2

T = TypeVar("T")


class ScreenTimeout(AssertionError):
    """The screen never showed what was waited for; the message holds the last screen seen."""


class Tmux:
    """One program in a detached tmux session `width` x `height`, on a server of its own."""

    def __init__(self, argv: Sequence[str], *, width: int, height: int, env: dict[str, str], cwd: Path) -> None:
        # A socket of its own (in a folder removed at the end: tmux leaves it behind), no configuration file read,
        # and UTF-8 (braille curves) whatever the locale says.
        self._folder = Path(tempfile.mkdtemp(prefix="eagle3-tmux-"))
        self._server = ("-S", str(self._folder / "socket"), "-f", "/dev/null", "-u")
        # The terminal's size is the session's: COLUMNS and LINES (pytest-xdist's workers set 80 and 24) would
        # override it for Textual.
        self.env = {name: value for name, value in env.items() if name not in ("COLUMNS", "LINES")}
        # `remain-on-exit`, set before the program starts: if it exits, what it said last stays on the screen.
        keep = ("set-option", "-g", "remain-on-exit", "on", ";")
        session = ("new-session", "-d", "-x", str(width), "-y", str(height), "-c", str(cwd), shlex.join(argv))
        try:
            self._tmux(*keep, *session)
        except BaseException:
            self.close()
            raise

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            [TMUX, *self._server, *args], env=self.env, capture_output=True, text=True, timeout=30, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args[:2])} failed: {done.stderr.strip()}")
        return done.stdout

    def command(self, *args: str) -> str:
        """A command to this terminal's tmux server (`set-option`, `list-buffers`, `display-message`); its output."""
        return self._tmux(*args)

    def screen(self) -> str:
        """What the terminal shows now, one line per row (trailing blanks cut)."""
        return self._tmux("capture-pane", "-p", "-t", "0")

    def send(self, *keys: str) -> None:
        """Keys by tmux's names (`Enter`, `Tab`, `Down`) or single characters."""
        self._tmux("send-keys", "-t", "0", *keys)

    def write(self, text: str) -> None:
        """Text typed as it is (no key names)."""
        self._tmux("send-keys", "-t", "0", "-l", "--", text)

    def wait_for(self, predicate: Callable[[str], T], timeout: float, what: str) -> T:
        """The first truthy value of `predicate(screen)`, polled until `timeout` seconds have passed."""
        deadline = time.monotonic() + timeout
        while True:
            shown = self.screen()
            value = predicate(shown)
            if value:
                return value
            if time.monotonic() > deadline:
                # With what scrolled off it: a program that exited said its last words there.
                shown = self._tmux("capture-pane", "-p", "-S", "-", "-t", "0")
                raise ScreenTimeout(f"timed out after {timeout:.0f} s waiting for {what}; the screen:\n{shown}")
            time.sleep(POLL_S)

    def wait_text(self, text: str, timeout: float) -> str:
        """The screen once it shows `text`."""
        return self.wait_for(lambda shown: shown if text in shown else "", timeout, repr(text))

    def close(self) -> None:
        subprocess.run([TMUX, *self._server, "kill-server"], env=self.env, capture_output=True, check=False)
        shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> Tmux:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
