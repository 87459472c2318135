"""Editing a command line's flags for relaunch: set, replace or remove `--flag [value]`.

Both spellings are understood: `--flag value` and `--flag=value`. A flag's
value is the next token when that token does not itself start with `-`; this
matches launchers such as SGLang's, whose arguments are all flags.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends import shellwords


class ArgvEditError(ValueError):
    pass


def _check_flag(flag: str) -> None:
    if not flag.startswith("-") or flag in ("-", "--") or "=" in flag or " " in flag:
        raise ArgvEditError(f"{flag!r} is not a flag; write it like --disable-cuda-graph")


def _takes_value(argv: list[str], index: int) -> bool:
    return index + 1 < len(argv) and not argv[index + 1].startswith("-")


def _find(argv: list[str], flag: str) -> list[tuple[int, int]]:
    """(start, end) slices of every occurrence of `flag`, with its value."""
    spans = []
    for i, arg in enumerate(argv):
        if arg == flag:
            spans.append((i, i + 2 if _takes_value(argv, i) else i + 1))
        elif arg.startswith(flag + "="):
            spans.append((i, i + 1))
    return spans


def flag_value(argv: list[str], flags: tuple[str, ...]) -> str | None:
    """The value given last to any of `flags` (aliases of one option), as argparse would take it."""
    found: list[tuple[int, str]] = []
    tail = argv[1:]
    for flag in flags:
        for start, end in _find(tail, flag):
            if "=" in tail[start]:
                found.append((start, tail[start].split("=", 1)[1]))
            elif end - start == 2:
                found.append((start, tail[start + 1]))
    return max(found)[1] if found else None


def unset_flag(argv: list[str], flag: str) -> list[str]:
    """argv without any occurrence of `flag` (argv[0], the program, is never touched)."""
    _check_flag(flag)
    head, tail = argv[:1], argv[1:]
    for start, end in reversed(_find(tail, flag)):
        del tail[start:end]
    return head + tail


def set_flag(argv: list[str], flag: str, value: str | None) -> list[str]:
    """argv with `flag` set to `value` (or present as a switch when value is None).

    The first occurrence is replaced in place, keeping its spelling; later ones
    are removed; a flag that was absent is appended.
    """
    _check_flag(flag)
    head, tail = argv[:1], argv[1:]
    spans = _find(tail, flag)
    for start, end in reversed(spans[1:]):
        del tail[start:end]
    start, end = spans[0] if spans else (len(tail), len(tail))
    if value is None:
        replacement = [flag]
    elif value.startswith("-") or value == "" or (spans and "=" in tail[start]):
        # A value that looks like a flag (or is empty) only survives as --flag=value.
        replacement = [f"{flag}={value}"]
    else:
        replacement = [flag, value]
    return head + tail[:start] + replacement + tail[end:]


def parse_set(item: str) -> tuple[str, str | None]:
    """'--flag=value' -> ('--flag', 'value'); '--flag' -> ('--flag', None)."""
    flag, sep, value = item.partition("=")
    _check_flag(flag)
    return flag, (value if sep else None)


def edit_argv(argv: list[str], sets: list[str], unsets: list[str]) -> list[str]:
    """argv with `sets` set and `unsets` removed. A shell's command string (`sh -c 'cd /w && python train.py --lr
    1; echo done'`) is edited inside, its other words kept as written: on the last of its commands that has one of
    the flags, else on its last command that is no shell chore (`cd`, `echo`...); unless the string hands the
    command line's own words on ("$@"): those are edited."""
    at = shellwords.command_string(argv)
    if at is None:
        return _edit_words(argv, sets, unsets)
    try:
        words = shellwords.split(argv[at])
    except ValueError as exc:
        raise ArgvEditError(f"the command's shell string cannot be read ({exc}); edit it by hand") from None
    commands = shellwords.simple_commands(words)
    if {"$@", "$*"} & set(words) or not commands:
        return _edit_words(argv, sets, unsets)
    begin, end = _target([words[b:e] for b, e in commands], [parse_set(i)[0] for i in sets] + unsets, commands)
    command, written = shellwords.command_at(words, begin, end)
    return [*argv[:at], written(_edit_words(list(command), sets, unsets)), *argv[at + 1 :]]


# What a shell string runs around its command (`cd /w && python train.py ...; echo done`), never what takes flags.
_CHORES = frozenset({"cd", "echo", "printf", "export", "source", ".", "set", "unset", "true", ":", "sleep", "wait"})


def _target(commands: Sequence[Sequence[str]], flags: list[str], spans: list[tuple[int, int]]) -> tuple[int, int]:
    with_flag = [i for i, words in enumerate(commands) if any(_find(list(words), flag) for flag in flags)]
    chores = [i for i, words in enumerate(commands) if words[0] not in _CHORES]
    return spans[(with_flag or chores or [len(commands) - 1])[-1]]


def _edit_words(argv: list[str], sets: list[str], unsets: list[str]) -> list[str]:
    for flag in unsets:
        argv = unset_flag(argv, flag)
    for item in sets:
        flag, value = parse_set(item)
        argv = set_flag(argv, flag, value)
    return argv
