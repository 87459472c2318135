"""The terminal width argparse wraps --help to, read without importing shutil (its import brings bz2 and lzma):
both the instant --help (`console.cli.instant`) and the grammar's formatter (`console.cli.grammar`) ask it."""

from __future__ import annotations

import os
import sys

FALLBACK_COLUMNS = 80  # shutil.get_terminal_size's fallback, which argparse takes


def columns() -> int:
    """The width argparse's HelpFormatter reads (`shutil.get_terminal_size().columns`, without importing shutil):
    $COLUMNS when it is a positive number, else the terminal's of sys.__stdout__, else 80."""
    try:
        named = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        named = 0
    if named > 0:
        return named
    stdout = sys.__stdout__
    if stdout is None:
        return FALLBACK_COLUMNS
    try:
        return os.get_terminal_size(stdout.fileno()).columns or FALLBACK_COLUMNS
    except (AttributeError, ValueError, OSError):
        return FALLBACK_COLUMNS
