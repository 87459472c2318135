"""A serve command's flags, checked by the SGLang that will run them, before anything is stopped or started.

SGLang's own argument parser is the only authority on its flags (they change
with every release: `--cuda-graph-max-bs` became ambiguous in 0.5.23). It runs
in a subprocess of the serve command's own interpreter, with the launch's
environment, so the parser is the one the server would use; importing it takes
a second or two and needs no GPU. A command whose interpreter has no SGLang is
not checked, and says so.

Verdicts are kept in a small cache (~/.cache/eagle3-console/serve-flags.json),
keyed by the interpreter, the flags and the launch's environment, and trusted
only while the parser's source file is the one that gave them: a relaunch with
the same flags is not parsed again, an upgraded SGLang is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from backends.masking import mask_text
from backends.protocol import Finding
from backends.runstore import atomic_write_json
from backends.sglang_facts import SERVER_MODULES

CHECK_TIMEOUT_S = 60.0
CACHE_ENTRIES = 64

# Runs in the serve command's interpreter: parse argv[1:] with ServerArgs' parser and print one JSON line.
_PARSE = """
import argparse, json, sys
try:
    from sglang.srt import server_args
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
    print(json.dumps({"refused": str(exc), "parser": server_args.__file__}))
else:
    print(json.dumps({"ok": True, "parser": server_args.__file__}))
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
    key = _cache_key(python, flags, env, cwd)
    verdict = _cached(key)
    if verdict is None:
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
        if not isinstance(verdict, dict) or not verdict:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return _unchecked(f"SGLang's parser exited {done.returncode} without a verdict: {last}")
        if "refused" in verdict:  # argparse quotes the words it refuses, secret values among them
            verdict["refused"] = mask_text(str(verdict["refused"]), argv)
        _remember(key, verdict)
    if "refused" in verdict:
        return Finding(
            code="launch-flags",
            severity="error",
            message=f"SGLang's argument parser refuses this command line: {verdict['refused']}",
            fix="correct the flag (SGLang would exit at once); launch with --force to start anyway",
        )
    if verdict.get("ok"):
        return None
    return _unchecked(f"{python} cannot import SGLang's server arguments ({verdict.get('unavailable')})")


def _unchecked(why: str) -> Finding:
    return Finding(code="launch-flags-unchecked", severity="info", message=f"flags not checked: {why}", fix=None)


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eagle3-console" / "serve-flags.json"


def _cache_key(python: str, flags: list[str], env: Mapping[str, str] | None, cwd: str | None) -> str:
    # Not the interpreter's real path: two venvs share one, but not their packages.
    where = os.path.abspath(shutil.which(python) or python)
    seen = [where, flags, sorted((env or {}).items()), os.environ.get("PYTHONPATH"), cwd]
    return hashlib.sha256(json.dumps(seen).encode()).hexdigest()


def _parser_stamp(path: object) -> list[int] | None:
    try:
        stat = os.stat(str(path))
    except OSError:
        return None
    return [stat.st_mtime_ns, stat.st_size]


def _read_cache() -> dict[str, Any]:
    try:
        data = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _cached(key: str) -> dict[str, Any] | None:
    """A verdict given before by the very parser file that would parse now."""
    entry = _read_cache().get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("verdict"), dict):
        return None
    verdict: dict[str, Any] = entry["verdict"]
    return verdict if entry.get("stamp") == _parser_stamp(verdict.get("parser")) else None


def _remember(key: str, verdict: dict[str, Any]) -> None:
    stamp = _parser_stamp(verdict.get("parser"))
    if stamp is None or not ("ok" in verdict or "refused" in verdict):
        return  # only a parser's own verdict is worth keeping
    entries = _read_cache()
    entries.pop(key, None)
    entries[key] = {"verdict": verdict, "stamp": stamp}
    with contextlib.suppress(OSError):  # a read-only home only costs the next check its second or two
        cache_file().parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cache_file(), dict(list(entries.items())[-CACHE_ENTRIES:]))
