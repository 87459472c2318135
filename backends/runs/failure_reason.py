"""Why a run failed, in one line: one rule for every run kind (serve, extract, train, command).

The reason is, first found: the failure the engine's output reader recognised that names its cause
(`cuda-oom: a GPU ran out of memory`); else the last exception line of a traceback, or a shell's report of a
signal, as that reader kept them from the whole output; else the last `error:`/`Error:`/`fatal:` line
(argparse's `prog: error: ...`, our own CLIs' `error: ...`); else the last non-empty line, said as such
(`its last line: ...`). The supervisor
records it in exit.json (`reason`) before anyone can see the run ended, and the run's status carries it with how
the run ended (`failure`: `ValueError: boom (exit code 1)`), so that every view says the same line.

The output is data: only its last TAIL_BYTES are read, terminal escape sequences are dropped, the run's secrets
are masked, and the line is cut at MAX_CHARS; output that ends in binary data is said to, not quoted.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.masking import mask_text, mask_values
from backends.protocol import Diagnosis

if TYPE_CHECKING:
    from backends import serving

TAIL_BYTES = 64 * 1024
MAX_CHARS = 300
# A line that reports an error as text: `prog: error: ...`, `error: ...`, `Error: ...`, git's `fatal: ...`;
# not an exception's name (`RuntimeError:`, a traceback's own rule) nor a word inside another.
_ERROR_LINE = re.compile(r"(?<![\w.-])(?:error|Error|fatal):")
# CSI (colours, cursor moves) and OSC (titles, links) sequences: formatting, not what the line says.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]")
_LINE_END = re.compile(r"[\r\n]")
NOT_TEXT_SHARE = 0.3  # of a line's characters unprintable or undecodable: binary data, not a line of text
NOT_TEXT = "its output ends in binary data, not text"
NOTHING = "it printed nothing"
LAST_LINE = "its last line: "  # a line that names no error: said as what it is


def read_tail(path: Path, limit: int = TAIL_BYTES) -> tuple[bytes, bool]:
    """The last `limit` bytes of `path` (none when it cannot be read), and whether they start inside the file."""
    try:
        with open(path, "rb") as output:
            start = max(output.seek(0, os.SEEK_END) - limit, 0)
            output.seek(start)
            return output.read(limit), start > 0
    except OSError:
        return b"", False


def output_lines(tail: bytes, cut: bool) -> list[str]:
    """The non-empty lines of an output's tail, without escape sequences; a first line cut by the tail is marked."""
    pieces = _LINE_END.split(tail.decode("utf-8", errors="replace"))
    lines = [_ESCAPES.sub("", piece).strip() for piece in pieces]
    if cut and lines and lines[0]:
        lines[0] = "…" + lines[0]
    return [line for line in lines if line]


def pick(cause: Diagnosis | None, exception: str | None, lines: Sequence[str]) -> str:
    """The rule: a recognised cause, else the last exception line, else the last error line, else the last line."""
    if cause is not None:
        return f"{cause['code']}: {cause['meaning']}"
    if exception:
        return exception
    error = next((line for line in reversed(lines) if _ERROR_LINE.search(line)), None)
    if error is not None:
        return error
    if not lines:
        return NOTHING
    return NOT_TEXT if not_text(lines[-1]) else f"{LAST_LINE}{lines[-1]}"


def not_text(line: str) -> bool:
    """Whether a line is mostly bytes that decode to nothing a person can read (binary data)."""
    unreadable = sum(ch == "\ufffd" or unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn") for ch in line)
    return unreadable > NOT_TEXT_SHARE * len(line)


def one_line(text: str, argv: list[str], env: Mapping[str, str]) -> str:
    """`text` as the reason's one line: escape sequences dropped, secrets masked, tabs as spaces, cut at MAX_CHARS."""
    masked = mask_values(mask_text(_ESCAPES.sub("", text), argv), dict(env))
    line = " ".join(_LINE_END.split(masked.replace("\t", " "))).strip() or NOTHING
    return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 1] + "…"


def reason(output: Path, reader: serving.OutputReader | None, argv: list[str], env: Mapping[str, str]) -> str:
    """Why the run whose output is at `output` failed. `reader`: the one that read all of that output as it came
    (the run's watch); without one, a fresh reader reads the tail. `argv` and `env`: the run's, whose secrets
    are masked."""
    tail, cut = read_tail(output)
    if reader is None:
        # Here alone: the run store reads failure_line on every status, with no SGLang to import for it.
        from backends import serving

        reader = serving.DEFAULT.output_reader()
        reader.feed(tail + b"\n")
    return one_line(pick(reader.cause(), reader.last_exception(), output_lines(tail, cut)), argv, env)


def failure_line(ended: Mapping[str, Any]) -> str | None:
    """A failed run's one line from its exit record: its reason and how it ended (`ValueError: boom (exit code
    1)`), or why it could not start; None when the record says neither (one written before reasons were)."""
    if isinstance(ended.get("error"), str) and ended["error"]:
        return str(ended["error"])
    why = ended.get("reason")
    if not isinstance(why, str):
        return None
    if isinstance(ended.get("signal"), str):
        return f"{why} (signal SIG{ended['signal']})"
    code = ended.get("code")
    return f"{why} (exit code {code})" if isinstance(code, int) and not isinstance(code, bool) else why
