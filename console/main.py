"""`eagle3-console`: a one-shot command through a running multiplexer when it can be (`console.cli.quick`: no event
loop to import), else the whole CLI (`console.cli.commands`)."""

from __future__ import annotations

import sys

from console.cli import quick


def main() -> int:
    words = sys.argv[1:]
    code = quick.answer(words)
    if code is None:
        from console.cli import commands

        code = commands.main(words)
    return code
