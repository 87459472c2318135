"""A shell string (the TEXT of `bash -c TEXT`) split into words as a POSIX shell splits it, each word keeping how it
was written: a command line edited inside such a string is written back with the words it did not change exactly
as they were (`$FLAGS` still split by the shell, `'pa$$w'` still literal), and each new word quoted literally.

Python's shlex loses that: its words carry no quoting, so a rebuilt `$FLAGS` became one word and a single-quoted
`$` began to expand. What is read: blanks, newlines (a command's end, read as `;`), comments at a word's start,
backslashes, single and double quotes, `$NAME`, `${...}`, `$(...)` and backquotes as parts of a word, and the
operators and redirections below. Not read: here-documents' bodies, aliases, globs (kept as written).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import PurePath

SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
# What ends one simple command and begins the next.
OPERATORS = frozenset({"&&", "||", ";", "|", "|&", "&", ";;", "(", ")"})
REDIRECTS = frozenset({">", ">>", "<", ">&", "<&", "&>", "&>>", ">|", "<<", "<<<"})
_BY_LENGTH = sorted(OPERATORS | REDIRECTS, key=len, reverse=True)  # the longest operator at a place wins
_OPERATOR_CHARS = frozenset(";&|<>()")
_BLANKS = frozenset(" \t\r")
_WHOLE_PARAMETER = re.compile(r"\$(?:\w+|\{\w+\})")  # a word that is one unquoted parameter: split when expanded


class ShellWord(str):
    """A word's value (quotes removed, escapes applied), with how it was written (`raw`), whether the shell
    expands anything in it (`expands`: a `$` or backquote outside single quotes), whether it is one unquoted
    parameter, which the shell splits into words at its blanks once expanded (`splits`), and the word it was
    written against, with no blank between (`glued_to`: `2` for the `>&` of `2>&1`, which redirects descriptor 2
    only so)."""

    raw: str
    expands: bool
    splits: bool
    glued_to: ShellWord | None

    def __new__(cls, value: str, raw: str, expands: bool = False, glued_to: ShellWord | None = None) -> ShellWord:
        word = super().__new__(cls, value)
        word.raw = raw
        word.expands = expands
        word.splits = expands and _WHOLE_PARAMETER.fullmatch(raw) is not None
        word.glued_to = glued_to
        return word


def split(text: str) -> list[ShellWord]:
    """The words of a shell string; ValueError for an unclosed quote or substitution, or a trailing backslash."""
    words: list[ShellWord] = []
    index = 0

    def glued_to() -> ShellWord | None:
        return words[-1] if words and text[index - 1] not in _BLANKS and words[-1].raw != "\n" else None

    while index < len(text):
        char = text[index]
        if char in _BLANKS:
            index += 1
        elif text.startswith("\\\n", index):  # a line continued: nothing
            index += 2
        elif char == "\n":
            words.append(ShellWord(";", "\n"))
            index += 1
        elif char == "#":  # a comment, to the line's end
            end = text.find("\n", index)
            index = len(text) if end < 0 else end
        elif char in _OPERATOR_CHARS:
            operator = next(op for op in _BY_LENGTH if text.startswith(op, index))
            words.append(ShellWord(operator, operator, glued_to=glued_to()))
            index += len(operator)
        else:
            word, end = _word(text, index, glued_to())
            words.append(word)
            index = end
    return words


def _word(text: str, start: int, glued_to: ShellWord | None) -> tuple[ShellWord, int]:
    value: list[str] = []
    expands = False
    index = start
    while index < len(text) and text[index] not in _BLANKS and text[index] != "\n":
        char = text[index]
        if char in _OPERATOR_CHARS:
            break
        if char == "\\":
            if index + 1 >= len(text):
                raise ValueError("a backslash ends the string")
            index = _escaped(text, index, value)
        elif char == "'":
            end = text.find("'", index + 1)
            if end < 0:
                raise ValueError("no closing quotation")
            value.append(text[index + 1 : end])
            index = end + 1
        elif char == '"':
            index, inside = _double_quoted(text, index + 1, value)
            expands = expands or inside
        elif char in "$`":
            index, inside = _substitution(text, index, value)
            expands = expands or inside
        else:
            value.append(char)
            index += 1
    return ShellWord("".join(value), text[start:index], expands, glued_to), index


def _double_quoted(text: str, index: int, value: list[str]) -> tuple[int, bool]:
    """Appends to `value` what the double quotes opened before `index` hold; the index after the closing one, and
    whether anything in them expands."""
    expands = False
    while index < len(text):
        char = text[index]
        if char == '"':
            return index + 1, expands
        if char == "\\" and index + 1 < len(text) and text[index + 1] in '$`"\\\n':
            index = _escaped(text, index, value)
        elif char in "$`":
            index, inside = _substitution(text, index, value)
            expands = expands or inside
        else:
            value.append(char)
            index += 1
    raise ValueError("no closing quotation")


def _escaped(text: str, index: int, value: list[str]) -> int:
    """Appends the character the backslash at `index` escapes (none for a newline: the line goes on); the index
    after it."""
    if text[index + 1] != "\n":
        value.append(text[index + 1])
    return index + 2


def _substitution(text: str, index: int, value: list[str]) -> tuple[int, bool]:
    """Appends the `$...` or backquoted part at `index` to `value` as written; the index after it, and whether it
    expands (a lone `$` is a character)."""
    end = _substitution_end(text, index)
    value.append(text[index:end])
    return end, end > index + 1 or text[index] == "`"


def _substitution_end(text: str, index: int) -> int:
    """The index after the `$NAME`, `${...}`, `$(...)` or backquoted part that starts at `index` (a lone `$`: just
    after it)."""
    if text[index] == "`":
        end = index + 1
        while end < len(text) and text[end] != "`":
            end += 2 if text[end] == "\\" else 1
        if end >= len(text):
            raise ValueError("no closing backquote")
        return end + 1
    opener = text[index + 1 : index + 2]
    if opener in ("(", "{"):
        closer, depth, end = ")" if opener == "(" else "}", 0, index + 1
        while end < len(text):
            char = text[end]
            if char == "\\":
                end += 2
                continue
            if char == "'" and opener == "(":
                quote_end = text.find("'", end + 1)
                end = (len(text) if quote_end < 0 else quote_end) + 1
                continue
            depth += char == opener
            depth -= char == closer
            end += 1
            if depth == 0:
                return end
        raise ValueError(f"no closing {closer!r}")
    name = re.match(r"\w+|[@*#?$!0-9-]", text[index + 1 :])
    return index + 1 + (len(name[0]) if name else 0)


def command_string(argv: Sequence[str]) -> int | None:
    """Where the command string of `sh -c STRING [NAME ARGS...]` stands in argv (`bash -lc` too); None when argv
    runs no shell string (`bash script.sh` runs a script)."""
    if not argv or PurePath(argv[0]).name not in SHELLS:
        return None
    index = next(
        (i for i, w in enumerate(argv[1:], 1) if w.startswith("-") and not w.startswith("--") and "c" in w), None
    )
    return index + 1 if index is not None and index + 1 < len(argv) else None


def simple_commands(words: Sequence[str]) -> list[tuple[int, int]]:
    """The (start, end) of each simple command of a string's words, between its operators."""
    found, start = [], 0
    for index, word in enumerate(words):
        if is_operator(word):
            if index > start:
                found.append((start, index))
            start = index + 1
    if start < len(words):
        found.append((start, len(words)))
    return found


def command_at(
    words: Sequence[ShellWord], begin: int, end: int
) -> tuple[list[ShellWord], Callable[[Sequence[str]], str]]:
    """The simple command `words[begin:end]` less its redirections, and the string written back with other words
    in its place (the redirections after them: one means the same anywhere in its command)."""
    command, redirects = _without_redirects(words[begin:end])
    return command, lambda new: join([*words[:begin], *new, *redirects, *words[end:]])


def _without_redirects(words: Sequence[ShellWord]) -> tuple[list[ShellWord], list[ShellWord]]:
    """A simple command's words less its redirections (`> log`, `2>&1`: a descriptor only when written against its
    redirection; `--tp 2 > log` keeps its 2), and those."""
    kept: list[ShellWord] = []
    redirects: list[ShellWord] = []
    skip = False
    for index, word in enumerate(words):
        after = words[index + 1] if index + 1 < len(words) else None
        descriptor = word.isdigit() and after is not None and is_redirect(after) and after.glued_to is word
        if skip or is_redirect(word) or descriptor:
            redirects.append(word)
            skip = is_redirect(word)
            continue
        kept.append(word)
    return kept, redirects


def is_operator(word: str) -> bool:
    """Whether a word of `split` ends a simple command (`;`, `&&`, a newline...), not a quoted `';'`."""
    return isinstance(word, ShellWord) and (word.raw in OPERATORS or word.raw == "\n")


def is_redirect(word: str) -> bool:
    """Whether a word of `split` is a redirection (`>`, `2>&1`'s `>&`), not a quoted `'>'`."""
    return isinstance(word, ShellWord) and word.raw in REDIRECTS


def join(words: Sequence[str]) -> str:
    """Words back into a shell string: each word of `split` as it was written (operators included, against the
    word it was written against if that word still comes before it), any other word quoted so that the shell
    takes it literally (a relaunch's new value never expands nor runs anything)."""
    out: list[str] = []
    for index, word in enumerate(words):
        if not isinstance(word, ShellWord):
            out.append(shlex.quote(word))
        elif index and word.glued_to is not None and words[index - 1] is word.glued_to:
            out[-1] += word.raw
        else:
            out.append(word.raw)
    return " ".join(out)
