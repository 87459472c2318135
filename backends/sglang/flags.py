"""A serve command's flags, checked by the SGLang that will run them, before anything is stopped or started.

SGLang's own argument parser is the only authority on its flags (they change
with every release: `--cuda-graph-max-bs` became ambiguous in 0.5.23). It runs
in a subprocess of the serve command's own interpreter, with the launch's
environment and cwd, so the parser is the one the server would use; importing it
takes seconds (SGLang's imports pull torch and transformers) and needs no GPU. That
import is paid once per interpreter, environment and cwd while the agent lives: a
warm parser process (warm_parser.py) parses each new flag set in a fork of itself,
and is closed after 5 idle minutes; where it gives no verdict, a one-shot
interpreter is asked as before. A command whose interpreter is missing or has
no SGLang at all is refused (the server would die at once); one whose SGLang
cannot import its parser is not checked, and says so.

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

from backends.fileio import atomic_write_json
from backends.masking import mask_text
from backends.protocol import Finding, RelaunchPresetsResult
from backends.sglang import facts, warm_parser
from backends.sglang.launch import SGLANG_PYTHON_FLAG, ServerLaunch, manager

CHECK_TIMEOUT_S = 60.0
CACHE_ENTRIES = 64

# Runs in the serve command's interpreter, one of two ways. One-shot, `-c _PARSE PROGRAM FLAGS...` prints one JSON
# line, the verdict. Warm (warm_parser.py), `-c _PARSE` imports SGLang once, says {"ready": ...} and then answers each
# JSON argv line it reads with a verdict line, each parsed in a fork (SGLang's parser changes globals and logging),
# until its stdin closes. A verdict: FLAGS parsed with SGLang's own prepare_server_args, stopped once its parser has
# parsed (before ServerArgs is built, which needs the model), as SGLang would print it (`sglang serve: error: ...`),
# the warnings the parser logged or warned while parsing (a deprecated flag: 0.5.23's `--disable-cuda-graph`), and
# the SGLang version. An SGLang that cannot be imported is the verdict {"unavailable": ..., "missing": ...} in both.
# sys.argv[0] is the program's name, argparse's default prog where a release sets none (0.5.5).
_PARSE = """
import argparse, importlib.metadata, json, logging, os, re, sys, warnings

class Refused(Exception):
    pass

class Parsed(Exception):
    pass

class Said(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []
    def emit(self, record):
        self.messages.append(record.getMessage())

def load():
    try:
        from sglang.srt import server_args
        from sglang.srt.server_args import ServerArgs
    except Exception as exc:
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        return None, {"unavailable": f"{type(exc).__name__}: {exc}", "missing": missing}
    return server_args, None

def parse(server_args, argv):
    sys.argv = argv
    parse_args = argparse.ArgumentParser.parse_args

    def error(self, message):
        raise Refused(f"{self.prog}: error: {message}")

    def parse_then_stop(self, args=None, namespace=None):
        parse_args(self, args, namespace)
        raise Parsed

    def prepare(flags):
        parser = argparse.ArgumentParser()
        server_args.ServerArgs.add_cli_args(parser)
        parser.parse_args(flags)

    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = None
    argparse.ArgumentParser.error = error
    argparse.ArgumentParser.parse_args = parse_then_stop
    said = Said()
    logging.getLogger().addHandler(said)
    verdict = {"parser": server_args.__file__, "version": version}
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            getattr(server_args, "prepare_server_args", prepare)(argv[1:])
        except Refused as exc:
            verdict["refused"] = str(exc)
        except Parsed:
            verdict["ok"] = True
    ansi = re.compile(r"\\x1b\\[[0-9;]*m")  # SGLang colours its deprecation warnings
    verdict["warnings"] = [ansi.sub("", text).strip() for text in [*said.messages, *(str(w.message) for w in warned)]]
    return verdict

def parse_in_fork(server_args, argv):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            with os.fdopen(write, "w") as out:
                out.write(json.dumps(parse(server_args, argv)))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as said:
        text = said.read()
    os.waitpid(pid, 0)
    try:
        return json.loads(text)
    except ValueError:
        return {}  # it exited before its verdict (--help): the one-shot path says how

def serve(server_args, answers):
    print(json.dumps({"ready": True, "parser": server_args.__file__}), file=answers, flush=True)
    for line in sys.stdin:
        print(json.dumps(parse_in_fork(server_args, json.loads(line))), file=answers, flush=True)

argv = sys.argv[1:]
if argv:
    sys.argv = argv
    answers = sys.stdout
else:
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what SGLang prints itself is not an answer
server_args, unavailable = load()
if unavailable is not None:
    print(json.dumps(unavailable), file=answers, flush=True)
elif argv:
    print(json.dumps(parse(server_args, argv)))
else:
    serve(server_args, answers)
"""


class _Unchecked(Exception):
    """SGLang's parser gave no verdict (the message says why)."""


class _NoPython(_Unchecked):
    """The serve command's interpreter is not a program on the host."""


def check(found: ServerLaunch, env: Mapping[str, str] | None = None, cwd: str | None = None) -> Finding | None:
    """SGLang's verdict on a serve command's flags: an error finding when refused, a warning one when accepted with
    warnings (a deprecated flag), an info one when they cannot be checked here (saying why and what makes it
    work), None when valid."""
    unseen = unchecked_why(found)
    if unseen is not None:
        return _unchecked(*unseen)
    assert found.python is not None and found.flags is not None
    python, flags = found.python, list(found.flags)
    try:
        verdict = _verdict(found, {**(env or {}), **found.env}, cwd)
    except _NoPython as exc:
        return _no_sglang(str(exc), found)
    except _Unchecked as exc:
        return _unchecked(str(exc), None)
    warned = " ".join(verdict["warnings"])
    if "refused" in verdict:
        return Finding(
            code="launch-flags",
            severity="error",
            message=f"SGLang's argument parser refuses this command line: {verdict['refused']}"
            + (f" (it also warns: {warned})" if warned else ""),
            fix="correct the flag (SGLang would exit at once); launch with --force to start anyway",
        )
    if verdict.get("missing") == "sglang":
        return _no_sglang(f"{python} has no SGLang (No module named 'sglang')", found)
    if not verdict.get("ok"):
        return _unchecked(f"{python} cannot import SGLang's server arguments ({verdict.get('unavailable')})", None)
    if warned:
        return Finding(
            code="launch-flags-warned",
            severity="warning",
            message=f"SGLang {verdict.get('version') or '?'}'s argument parser accepts this command line but warns: "
            + warned,
            fix=deprecation_fix(verdict.get("version"), flags),
        )
    return None


def unchecked_why(found: ServerLaunch) -> tuple[str, str | None] | None:
    """Why SGLang's parser cannot be asked about this launch from the host, and what makes it work; None: it can."""
    if found.flags is None:
        fix = (
            "write the server's command on the launch's command line (sglang serve FLAGS, or PYTHON -m "
            "sglang.launch_server FLAGS, behind env or a shell if need be) to have its flags checked"
        )
        return f"the command is {found.describe()}: SGLang's flags are not on its command line", fix
    if found.unexpanded:
        return (
            f"its flags use shell variables the launch's environment does not set ({' '.join(found.unexpanded)})",
            "set them with --env NAME=VALUE",
        )
    if found.python is None:
        return f"the Python that runs SGLang is not known: {python_unknown_why(found)}", python_fix(found)
    return None


def python_unknown_why(found: ServerLaunch) -> str:
    """Why the interpreter that runs SGLang cannot be known from the command line."""
    if found.container is not None:
        return f"SGLang runs inside the container ({found.container.image})"
    if (env_manager := manager(found.via)) is not None:
        return f"{env_manager} runs SGLang with its environment's Python"
    return f"{found.describe()} runs SGLang through a wrapper"


def python_fix(found: ServerLaunch) -> str:
    """What the user gives to have SGLang checked from the host."""
    if found.container is not None:
        return f"give {SGLANG_PYTHON_FLAG} PATH, a host Python with the image's SGLang, to check from the host"
    if (env_manager := manager(found.via)) is not None:
        printed = "python -c 'import sys; print(sys.executable)'"
        return f"give {SGLANG_PYTHON_FLAG} PATH, that environment's Python (`{printed}` run by {env_manager} prints it)"
    return f"give {SGLANG_PYTHON_FLAG} PATH, the Python the wrapper runs"


def deprecation_fix(version: str | None, flags: list[str]) -> str | None:
    """What to write instead of the deprecated flags among `flags`, as `version` spells it (None: none known)."""
    renames = facts.deprecated_flags(version)
    used = [flag for flag in dict.fromkeys(f.partition("=")[0] for f in flags) if flag in renames]
    if not used:
        return None
    return "; ".join(f"write {' '.join(renames[flag])} instead of {flag}" for flag in used)


def relaunch_presets(
    found: ServerLaunch | None, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> RelaunchPresetsResult:
    """The relaunch presets for a serve command, spelled for the SGLang that parses its flags (its verdict is
    usually cached from the launch): {"version": V or None, "presets": [...]}."""
    version = None
    if found is not None and unchecked_why(found) is None:
        with contextlib.suppress(_Unchecked):
            version = _verdict(found, {**(env or {}), **found.env}, cwd).get("version")
    return {"version": version, "presets": list(facts.relaunch_presets(version))}


def _verdict(found: ServerLaunch, env: Mapping[str, str], cwd: str | None) -> dict[str, Any]:
    """The parser's verdict on the launch's flags (cached, or asked now), its quotes of secret values masked;
    _Unchecked when the interpreter gives none."""
    assert found.python is not None and found.flags is not None
    python, flags = found.python, [found.program, *found.flags]
    key = _cache_key(python, flags, env, cwd)
    verdict = _cached(key)
    if verdict is not None:
        return verdict
    verdict = warm_parser.ask(python, _PARSE, {**os.environ, **env}, cwd, flags, CHECK_TIMEOUT_S)
    if verdict is None:
        verdict = _one_shot_verdict(python, flags, env, cwd)
    # argparse quotes the words it refuses, and a warning may quote a flag: secret values among them.
    if "refused" in verdict:
        verdict["refused"] = mask_text(str(verdict["refused"]), flags)
    verdict["warnings"] = [mask_text(str(w), flags) for w in verdict.get("warnings") or []]
    _remember(key, verdict)
    return verdict


def _one_shot_verdict(python: str, flags: list[str], env: Mapping[str, str], cwd: str | None) -> dict[str, Any]:
    """The verdict of an interpreter started for this one parse; _Unchecked when it gives none."""
    try:
        done = facts.run_python(python, ["-c", _PARSE, *flags], {**os.environ, **env}, cwd, CHECK_TIMEOUT_S)
    except (FileNotFoundError, PermissionError) as exc:
        raise _NoPython(f"{python} is not a Python on the host ({exc.strerror})") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _Unchecked(f"{python} could not run SGLang's parser ({exc})") from None
    lines = done.stdout.strip().splitlines()
    try:
        verdict = json.loads(lines[-1]) if lines else {}
    except ValueError:
        verdict = {}
    if not isinstance(verdict, dict) or not verdict:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise _Unchecked(f"SGLang's parser exited {done.returncode} without a verdict: {last}")
    return verdict


def _no_sglang(why: str, found: ServerLaunch) -> Finding:
    """The server could not even start: its interpreter is missing or has no SGLang."""
    if found.python_from == SGLANG_PYTHON_FLAG:
        fix = f"give {SGLANG_PYTHON_FLAG} PATH, a host Python that has SGLang (or launch with --force)"
    else:
        fix = "name the host's Python that has SGLang in the command (serve --python PATH), or launch with --force"
    return Finding(code="launch-python", severity="error", message=why, fix=fix)


def _unchecked(why: str, fix: str | None) -> Finding:
    return Finding(code="launch-flags-unchecked", severity="info", message=f"flags not checked: {why}", fix=fix)


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eagle3-console" / "serve-flags.json"


def _cache_key(python: str, flags: list[str], env: Mapping[str, str] | None, cwd: str | None) -> str:
    # Not the interpreter's real path: two venvs share one, but not their packages.
    where = os.path.abspath(shutil.which(python) or python)
    seen = [where, flags, sorted((env or {}).items()), os.environ.get("PYTHONPATH"), cwd]
    return hashlib.sha256(json.dumps(seen).encode()).hexdigest()


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
    if not isinstance(verdict.get("warnings"), list):
        return None  # kept by an older version, which did not keep the parser's warnings: ask again
    return verdict if entry.get("stamp") == warm_parser.file_stamp(verdict.get("parser")) else None


def _remember(key: str, verdict: dict[str, Any]) -> None:
    stamp = warm_parser.file_stamp(verdict.get("parser"))
    if stamp is None or not ("ok" in verdict or "refused" in verdict):
        return  # only a parser's own verdict is worth keeping
    entries = _read_cache()
    entries.pop(key, None)
    entries[key] = {"verdict": verdict, "stamp": stamp}
    with contextlib.suppress(OSError):  # a read-only home only costs the next check its second or two
        cache_file().parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cache_file(), dict(list(entries.items())[-CACHE_ENTRIES:]))
