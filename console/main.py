"""`eagle3-console`: a one-shot command through a running multiplexer when it can be (`console.quick`: no event
loop to import), else the whole CLI (`console.cli`)."""

from __future__ import annotations

import sys

from console import quick


def main() -> int:
    words = sys.argv[1:]
    code = quick.answer(words)
    if code is None:
        from console import cli

        code = cli.main(words)
    return code
