"""A run's text as a terminal may show it: data, never a command to the operator's terminal.

Everything a run writes (its log, its metric names, its argv, its stack dumps) reaches the person through a
terminal, and a terminal acts on control characters: an OSC 52 writes their clipboard, OSC 0/2 their window's
title, OSC 8 makes a link, CSI 2J clears the screen, a C1 byte starts any of those on an 8-bit terminal. Here each
such character is written as its escape (`\\x1b`, `\\x9b`, `\\r`, `\\u202e`), the same spelling everywhere: in
the CLI's tables and lines and in every panel, dialog and notification of the console.

What is kept: newlines and tabs where a text has lines (`visible`); SGR sequences (colours, bold) in the
console's log, and only as input to Rich's parser, never passed to a terminal (`visible_keeping_sgr`); carriage
returns in `logs` to a terminal, which only move the cursor to the line's start (`TerminalLog`).
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from typing import BinaryIO

# What a terminal acts on rather than shows: controls (C0, DEL, C1: ESC, newline, BEL, CSI), format characters
# (bidi overrides), line and paragraph separators; and lone surrogates, which no terminal can be sent.
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
LINES = "\n\t"  # what a text of several lines keeps

# Runs of characters other than printable ASCII: the only places a hidden character can be (one C-speed scan
# finds them; a log is mostly ASCII).
_SUSPECT = re.compile(r"[^\x20-\x7e]+")
# Select Graphic Rendition: colours and attributes, nothing else (no cursor, no title, no clipboard, no link).
SGR = re.compile(r"\x1b\[[0-9;:]{0,64}m")


def printable(text: str) -> str:
    """`text` safe to show in one cell or line: each character a terminal would act on is written as its escape
    (`\\x1b`, `\\n`, `\\u202e`), so a run's name or command cannot move the cursor, recolour the screen or break a
    table's row."""
    if text.isprintable():
        return text
    return _SUSPECT.sub(lambda found: _escaped_run(found.group(), ""), text)


def visible(text: str, keep: str = LINES) -> str:
    """`text` as `printable` writes it, but for the characters in `keep` (its newlines and tabs): a text of
    several lines (a stack dump, doctor's report, a table) shown as lines."""
    if text.isprintable():
        return text
    return _SUSPECT.sub(lambda found: _escaped_run(found.group(), keep), text)


def visible_keeping_sgr(line: str) -> str:
    """A log line as `visible` writes it (tabs kept, a newline written out), its SGR sequences (colours) left as
    they are: for Rich's `from_ansi` to turn into styles, never for a terminal."""
    if "\x1b[" not in line:
        return visible(line, keep="\t")
    pieces: list[str] = []
    at = 0
    for found in SGR.finditer(line):
        pieces += [visible(line[at : found.start()], keep="\t"), found.group()]
        at = found.end()
    pieces.append(visible(line[at:], keep="\t"))
    return "".join(pieces)


def _escaped_run(run: str, keep: str) -> str:
    return "".join(
        ch if ch in keep or unicodedata.category(ch) not in HIDDEN_CATEGORIES else _escaped(ch) for ch in run
    )


def _escaped(ch: str) -> str:
    code = ord(ch)
    if ch in NAMED_ESCAPES:
        return NAMED_ESCAPES[ch]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class TerminalLog:
    """A run's log bytes as `logs` writes them: byte for byte when `shown` is False (a pipe, a file, `--raw`),
    else decoded as UTF-8 as they come (a character split between two reads kept whole), each byte that is not
    UTF-8 written `\\x9b`, and what a terminal would act on made visible. Carriage returns are kept: a progress
    bar redraws in place, as it did on the run's own terminal."""

    def __init__(self, stream: BinaryIO, shown: bool) -> None:
        self.stream = stream
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace") if shown else None

    def write(self, data: bytes, end: bool = False) -> None:
        """`data` out; `end`: the log ends here (bytes of a character it tore are shown, not kept waiting)."""
        if self.decoder is not None:
            data = visible(self.decoder.decode(data, final=end), keep=LINES + "\r").encode()
        self.stream.write(data)
        self.stream.flush()
