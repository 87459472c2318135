"""A serve command's flags, checked by the SGLang that will run them, before anything is stopped or started.

SGLang's own argument parser is the only authority on its flags (they change
with every release: `--cuda-graph-max-bs` became ambiguous in 0.5.23). It runs
in a subprocess of the serve command's own interpreter, with the launch's
environment, so the parser is the one the server would use; importing it takes
a second or two and needs no GPU. A command whose interpreter has no SGLang is
not checked, and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from backends.masking import mask_text
from backends.protocol import Finding
from backends.sglang_facts import SERVER_MODULES

CHECK_TIMEOUT_S = 60.0

# Runs in the serve command's interpreter: parse argv[1:] with ServerArgs' parser and print one JSON line.
_PARSE = """
import argparse, json, sys
try:
    from sglang.srt.server_args import ServerArgs
except Exception as exc:
    print(json.dumps({"unavailable": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)

class Refused(Exception):
    pass

class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Refused(message)

parser = Parser(prog="sglang.launch_server")
ServerArgs.add_cli_args(parser)
try:
    parser.parse_args(sys.argv[1:])
except Refused as exc:
    print(json.dumps({"refused": str(exc)}))
else:
    print(json.dumps({"ok": True}))
"""


def server_command(argv: list[str]) -> tuple[str, list[str]] | None:
    """(interpreter, server flags) when argv runs `PYTHON [OPTIONS] -m sglang.launch_server FLAGS...`."""
    if not argv or not Path(argv[0]).name.startswith("python"):
        return None
    for index in range(1, len(argv) - 1):
        if argv[index] == "-m":
            return (argv[0], argv[index + 2 :]) if argv[index + 1] in SERVER_MODULES else None
        if not argv[index].startswith("-"):
            return None  # a script, not a module
    return None


def check(argv: list[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> Finding | None:
    """SGLang's verdict on a serve command's flags: an error finding, an info one when unchecked, None when valid."""
    command = server_command(argv)
    if command is None:
        return None
    python, flags = command
    try:
        done = subprocess.run(
            [python, "-c", _PARSE, *flags],
            env={**os.environ, **(env or {})},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _unchecked(f"{python} could not run SGLang's parser ({exc})")
    lines = done.stdout.strip().splitlines()
    try:
        verdict = json.loads(lines[-1]) if lines else {}
    except ValueError:
        verdict = {}
    if "refused" in verdict:
        return Finding(
            code="launch-flags",
            severity="error",
            # argparse quotes the words it refuses, secret values among them.
            message=f"SGLang's argument parser refuses this command line: {mask_text(verdict['refused'], argv)}",
            fix="correct the flag (SGLang would exit at once); launch with --force to start anyway",
        )
    if verdict.get("ok"):
        return None
    if "unavailable" in verdict:
        return _unchecked(f"{python} cannot import SGLang's server arguments ({verdict['unavailable']})")
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return _unchecked(f"SGLang's parser exited {done.returncode} without a verdict: {last}")


def _unchecked(why: str) -> Finding:
    return Finding(code="launch-flags-unchecked", severity="info", message=f"flags not checked: {why}", fix=None)
