"""Shell completion (argcomplete) from the command line's grammar, with RUN completed from the host itself: its run
ids and names, and for `kill` and `relaunch` over several hosts the ids of its multi-node jobs.

A shell waits on this while the person presses TAB, so the host is asked through its running multiplexer when one
serves it (`console.cli.quick.BlockingClient`: one request, no event loop), else directly, and the whole ask has
DEADLINE_S; any failure completes nothing and says nothing. An answer is kept CACHE_S seconds per host and run
store (a private folder of the user's cache), so that TAB pressed again does not reach the host again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from argcomplete.finders import CompletionFinder

from console.cli import config, connect, grammar, quick
from console.link import reuse

DEADLINE_S = 2.5  # the longest a TAB waits on the host, whichever way it is asked
CACHE_S = 5.0  # how long an answer stands for the next TAB
JOB_COMMANDS = ("kill", "relaunch")  # over several hosts, these take a multi-node job's id


class Finder(CompletionFinder):
    """argcomplete, with HOST put in where the words leave it out (config.toml's default_host), as the command
    line itself does (`grammar.with_host`): `eagle3-console logs <TAB>` completes the default host's runs."""

    # argcomplete's step from the shell's words to the completions: the one place the words can be amended.
    def _get_completions(self, comp_words: list[str], *rest: Any) -> list[str]:
        return super()._get_completions(with_default_host(comp_words), *rest)  # type: ignore[no-untyped-call,no-any-return]


def complete() -> None:
    """Answer the shell that asks for completions (argcomplete's hook set _ARGCOMPLETE), and exit."""
    parser = grammar.build_parser(grammar.GRAMMARS, completing=True)
    for action in run_arguments(parser):
        action.completer = runs_of  # type: ignore[attr-defined]  # argcomplete's hook
    Finder()(parser)


def run_arguments(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """Every argument of every command that names a run (`grammar.RunArgument`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from run_arguments(sub)
        elif isinstance(action, grammar.RunArgument):
            yield action


def with_default_host(comp_words: list[str]) -> list[str]:
    """The words (the program first) with config.toml's default_host where HOST is left out before a command."""
    args = comp_words[1:]
    at = grammar.first_word(args)
    if not args[at:] or not grammar.host_left_out(args[at:]):
        return comp_words
    try:
        default_host = config.load(grammar.config_flag(args)).default_host
    except config.ConfigError:
        return comp_words
    if default_host is None:
        return comp_words
    return [comp_words[0], *args[:at], default_host, *args[at:]]


def runs_of(prefix: str, parsed_args: argparse.Namespace, **_: object) -> dict[str, str]:
    """RUN's completions, each with what it is: a run's id (its name beside), a name (the newest run with it), or
    over several hosts a job's id. Nothing when the host cannot say (a shell's line is no place for an error)."""
    try:
        settings = config.load(parsed_args.config)
        hosts = settings.expand(parsed_args.host)
        ns = connect.host_options(parsed_args, hosts[0], settings)
        runs = known_runs(ns)
    except Exception:  # whatever went wrong, the person is typing: complete nothing, say nothing
        return {}
    if runs is None:
        return {}
    if len(hosts) > 1:
        choices = job_choices(runs) if parsed_args.command in JOB_COMMANDS else {}
    else:
        choices = run_choices(runs)
    return {word: said for word, said in choices.items() if word.startswith(prefix)}


def run_choices(runs: list[dict[str, Any]]) -> dict[str, str]:
    """Each run's id, and each name for the newest run with it (the one the commands take for the name)."""
    choices = {run["id"]: f"{run['name']} ({run['state']})" for run in runs}
    for run in sorted(runs, key=lambda run: run["started_at"] or 0.0):
        if run["name"]:
            choices[run["name"]] = f"{run['id']} ({run['state']})"
    return choices


def job_choices(runs: list[dict[str, Any]]) -> dict[str, str]:
    return {run["job"]: f"job of {run['nodes']} nodes" for run in runs if run["job"]}


def known_runs(ns: argparse.Namespace) -> list[dict[str, Any]] | None:
    """The host's runs as completion keeps them: from the cache while it stands, else asked of the host."""
    target = config.target_of(ns)
    cached = cache_file(target)
    if cached is not None:
        runs = read_cache(cached)
        if runs is not None:
            return runs
    runs = ask_host(ns, target)
    if runs is not None and cached is not None:
        write_cache(cached, runs)
    return runs


def ask_host(ns: argparse.Namespace, target: reuse.Target) -> list[dict[str, Any]] | None:
    """The host's runs, or None when it did not answer within DEADLINE_S. The ask runs on a thread the process
    leaves behind at the deadline: argcomplete ends the process with os._exit once it has answered."""
    answer: list[list[dict[str, Any]]] = []

    def ask() -> None:
        with contextlib.suppress(Exception):  # any failure: no answer, nothing said
            runs = through_multiplexer(ns, target)
            answer.append(kept(runs if runs is not None else directly(ns)))

    silence_stderr()
    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    return answer[0] if answer else None


def silence_stderr() -> None:
    """What a transport or a library would say (a warning, a log line) would land in the middle of the shell's line."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def through_multiplexer(ns: argparse.Namespace, target: reuse.Target) -> dict[str, Any] | None:
    """`list_runs` through the multiplexer that serves the host, or None when none does."""
    if ns.host == "local" or ns.no_reuse:
        return None
    try:
        path = reuse.socket_path(target)
    except reuse.ReuseUnavailable:
        return None
    client = quick.BlockingClient(target.spec, DEADLINE_S)
    try:
        client.connect(path)
        return dict(quick.drive(client.list_runs()))
    except reuse.ReuseUnavailable:
        return None
    finally:
        client.close()


def directly(ns: argparse.Namespace) -> dict[str, Any]:
    """`list_runs` over a connection of its own; a host key seen for the first time is refused, never asked about."""
    import asyncio  # only when no multiplexer serves the host

    from console.link.client import AgentClient

    async def ask() -> dict[str, Any]:
        client = AgentClient(connect.make_transport(ns, None, lambda _text: None), DEADLINE_S)
        try:
            await client.start()
            return dict(await client.list_runs())
        finally:
            await client.close()

    return asyncio.run(asyncio.wait_for(ask(), DEADLINE_S))


def kept(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """What completion keeps of each run of a `list_runs` answer."""
    return [
        {
            "id": str(run["id"]),
            "name": str(run.get("name") or ""),
            "state": str(run.get("state") or ""),
            "started_at": run.get("started_at"),
            "job": str(run["job"]["id"]) if run.get("job") else "",
            "nodes": run["job"]["nnodes"] if run.get("job") else 0,
        }
        for run in answer["runs"]
    ]


def cache_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle3-console" / "completion"


def cache_file(target: reuse.Target) -> Path | None:
    """The cache of `target`'s runs, in a folder only this user may enter; None when there is no such folder."""
    folder = cache_folder()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)  # lstat: a link planted in the folder's place is refused, not followed
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(folder, 0o700)
    except OSError:
        return None
    return folder / f"runs-{target.key()}.json"


def read_cache(path: Path) -> list[dict[str, Any]] | None:
    """The runs cached at `path` if written less than CACHE_S ago, else None."""
    try:
        age = time.time() - path.stat().st_mtime
        if not 0 <= age < CACHE_S:
            return None
        runs = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return runs if isinstance(runs, list) else None


def write_cache(path: Path, runs: list[dict[str, Any]]) -> None:
    """Written whole or not at all (a temp file renamed over it), readable by this user alone (mkstemp's 0600)."""
    with contextlib.suppress(OSError):
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".runs-")
        try:
            with open(fd, "w", encoding="utf-8") as file:
                json.dump(runs, file)
            os.replace(temp, path)
        except OSError:
            os.unlink(temp)
            raise
