"""The serving seam: everything the run engine, the pre-launch gate and the console ask of a serving engine.

SGLang (`backends/sglang/`) is the one engine today. A second would be a package beside it whose engine
object satisfies `ServingEngine`, listed in `ENGINES`: the watch, the gate, the agent and the console
reach engines only through this module, so nothing else would change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from backends.argv_edit import flag_value
from backends.protocol import Diagnosis, Finding, RelaunchPresetsResult, ServeNode
from backends.sglang.engine import SGLANG
from backends.sglang.launch import ServerLaunch

# What a command line launches (its shape, flags, interpreter, container): one reader's result for every engine.
Launch = ServerLaunch


class OutputEvent(Protocol):
    """Something a run's output said: `phase` (a startup phase), `failure` (a known failure's code) or
    `decode` (serving figures, whose `values` are a metric row)."""

    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def line(self) -> str: ...
    @property
    def values(self) -> dict[str, float]: ...


class OutputReader(Protocol):
    """One run's output read as it arrives: its events, the startup phase reached (`ready` once serving), and
    what its failures mean."""

    @property
    def phase(self) -> str | None: ...

    def feed(self, data: bytes) -> Sequence[OutputEvent]:
        """The events of the complete lines in `data`; a partial line waits for more."""

    def where(self) -> str | None:
        """The phase and its progress, for a person: `load-weights (29/64)`."""

    def diagnosis(self, code: str, line: str) -> Diagnosis:
        """What a `failure` event's code means."""

    def cause(self) -> Diagnosis | None:
        """The first failure seen whose line names what went wrong (not one that only says a process died)."""

    def last_exception(self) -> str | None:
        """The line that ended the last traceback (a child's, before a launcher's echo of it), or a shell's
        report of a signal; None when the output had neither."""

    def crash_diagnosis(self, returncode: int) -> Diagnosis | None:
        """How a run that ended with `returncode` was killed by a signal, and what to try (None: it exited on its
        own, or a failure named its cause)."""


class ServerMetrics(Protocol):
    """A server's own metrics endpoint read scrape after scrape, each scrape's text a metric row."""

    @property
    def names(self) -> frozenset[str]:
        """Every name its rows can hold: the output's figures of the same names are not written beside them."""

    def unavailable(self) -> str | None:
        """Why this host cannot read them (a missing parser), else None."""

    def row(self, text: str) -> dict[str, float]:
        """The metric row of one scrape's text; never raises, whatever the text."""


class ServingEngine(Protocol):
    name: str  # as people know it: "SGLang"
    default_port: int
    draft_flags: tuple[str, ...]  # the launch flags that name the draft, the target, the context length
    target_flags: tuple[str, ...]
    context_length_flag: str
    fallback_presets: tuple[str, ...]  # relaunch flags offered when the host cannot say which release it serves

    def launch(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, sglang_python: str | None = None
    ) -> Launch | None:
        """What argv launches when it starts this engine's server, however it is spelled; None otherwise."""

    def wrapper(self, argv: Sequence[str], sglang_python: str | None) -> Launch:
        """A serve command in none of the shapes the engine reads: its flags are not visible."""

    def serve_command(
        self,
        python: str,
        target: str,
        draft: str,
        *,
        port: int,
        gpus: int,
        extra: list[str],
        metrics: bool = True,
        node: ServeNode | None = None,
    ) -> list[str]:
        """The server command for a target and its EAGLE-3 draft, its own metrics endpoint on unless `metrics` is
        False; one node of the engine's own multi-node with `node`; `extra` flags come last and win."""

    def health_url(self, found: Launch) -> str | None:
        """The URL that answers 200 once the server serves, as the host reaches it; None when it cannot be known."""

    def check_flags(self, found: Launch, env: Mapping[str, str] | None, cwd: str | None) -> Finding | None:
        """The engine's own verdict on the command's flags, asked of the interpreter that will serve."""

    def relaunch_presets(
        self, found: Launch | None, env: Mapping[str, str] | None, cwd: str | None
    ) -> RelaunchPresetsResult:
        """{"version": V or None, "presets": [...]}: relaunch flags spelled for the release that serves argv."""

    def output_reader(self) -> OutputReader:
        """A fresh reader for one run's output."""

    def metrics_url(self, found: Launch, health_url: str) -> str | None:
        """The server's own metrics endpoint beside its health URL, when argv turns it on; else None."""

    def server_metrics(self) -> ServerMetrics:
        """A fresh reader of one server's metrics endpoint."""


ENGINES: tuple[ServingEngine, ...] = (SGLANG,)
# The engine of `serve` commands the console builds, and the reader of runs that serve nothing (training and
# extraction print the same NCCL, CUDA and Python failures).
DEFAULT: ServingEngine = SGLANG


def launch_of(
    argv: Sequence[str], env: Mapping[str, str] | None = None, sglang_python: str | None = None
) -> tuple[ServingEngine, Launch] | None:
    """The engine whose server argv launches (in any shape it reads), and what it launches."""
    for engine in ENGINES:
        found = engine.launch(argv, env, sglang_python)
        if found is not None:
            return engine, found
    return None


def serve_launch(
    argv: Sequence[str], env: Mapping[str, str] | None = None, sglang_python: str | None = None
) -> tuple[ServingEngine, Launch]:
    """What a serve run launches: a shape an engine reads, else the default engine behind a wrapper."""
    return launch_of(argv, env, sglang_python) or (DEFAULT, DEFAULT.wrapper(argv, sglang_python))


def engine_for(argv: Sequence[str]) -> ServingEngine | None:
    """The engine whose server argv launches, in any shape it reads."""
    found = launch_of(argv)
    return found[0] if found is not None else None


def health_url(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """The health URL of the server argv starts, as the host reaches it."""
    found = launch_of(argv, env)
    return found[0].health_url(found[1]) if found is not None else None


def server_metrics(
    argv: Sequence[str], health_url: str, env: Mapping[str, str] | None = None
) -> tuple[str, ServerMetrics] | None:
    """The metrics URL of the server argv starts with its metrics on, and a reader for it."""
    found = launch_of(argv, env)
    url = found[0].metrics_url(found[1], health_url) if found is not None else None
    return (url, found[0].server_metrics()) if found is not None and url is not None else None


def edited(argv: Sequence[str], sets: list[str], unsets: list[str], env: Mapping[str, str] | None) -> list[str] | None:
    """argv with the server's flags set or removed where they are written (inside a shell string, before a
    container's image...); None when argv starts no server an engine reads (ArgvEditError for a bad flag)."""
    found = launch_of(argv, env)
    return found[1].edited(sets, unsets) if found is not None else None


@dataclass(frozen=True)
class ServedDraft:
    """What a serve command serves, for doctor: the draft, the target folder, the context length, and the
    interpreter and environment that will load them (None: the agent's own, unless `unknown_python` says that the
    one that serves cannot be known)."""

    draft: Path
    target: Path | None
    context_length: int | None
    python: str | None
    env: Mapping[str, str] | None
    unknown_python: str | None = None  # set when the interpreter that serves is not known here: the launch's shape


def served_draft(
    argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None, sglang_python: str | None = None
) -> ServedDraft | None:
    """The draft a serve command names, as the host sees it, or None when it names none (or the host cannot see
    it: `draft_unseen` says why). A target given as a hub name rather than a folder is left out: doctor reads
    files only."""
    engine, found = serve_launch(argv, env, sglang_python)

    def named(*flags: str) -> str | None:
        # A wrapper's own words, when its flags are not visible: wrappers pass them on ("$@").
        return found.flag(*flags) if found.flags is not None else flag_value(list(argv), flags)

    draft = _seen(found, named(*engine.draft_flags), cwd)
    if draft is None:
        return None
    target = _seen(found, named(*engine.target_flags), cwd)
    context = named(engine.context_length_flag)
    return ServedDraft(
        draft=draft,
        target=target if target is not None and target.is_dir() else None,
        context_length=int(context) if context is not None and context.isdigit() else None,
        python=found.python,
        env={**(env or {}), **found.env} if found.python is not None else None,
        unknown_python=None if found.python is not None else found.describe(),
    )


def draft_unseen(argv: Sequence[str], env: Mapping[str, str] | None) -> str | None:
    """Why the draft a serve command names cannot be read from the host (a path inside a container that no bind
    mount shows), with what makes it readable; None otherwise."""
    engine, found = serve_launch(argv, env)
    named = found.flag(*engine.draft_flags)
    if named is None or found.path(named) is not None:
        return None
    return f"the draft {named} is inside the container, where no -v HOST:CONTAINER mount shows it"


def _seen(found: Launch, value: str | None, cwd: str | None) -> Path | None:
    """A path the server reads, on the host (through a container's mounts); None when absent or not visible."""
    on_host = found.path(value) if value is not None else None
    return _path(on_host, None if found.container is not None else cwd)


def _path(value: str | None, cwd: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() or cwd is None else Path(cwd) / path
