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

    def crash_diagnosis(self, returncode: int) -> Diagnosis | None:
        """Why a server ended with `returncode` when its output named no cause (None: a clean exit, or explained)."""


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

    def interpreter(self, argv: list[str]) -> str | None:
        """The Python that runs the server, when argv launches this engine's server with one."""

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

    def health_url(self, argv: list[str]) -> str | None:
        """The URL that answers 200 once the server serves; None when argv starts no server of this engine."""

    def check_flags(self, argv: list[str], env: Mapping[str, str] | None, cwd: str | None) -> Finding | None:
        """The engine's own verdict on the command's flags, asked of the interpreter that will serve."""

    def relaunch_presets(
        self, argv: list[str], env: Mapping[str, str] | None, cwd: str | None
    ) -> RelaunchPresetsResult:
        """{"version": V or None, "presets": [...]}: relaunch flags spelled for the release that serves argv."""

    def output_reader(self) -> OutputReader:
        """A fresh reader for one run's output."""

    def metrics_url(self, argv: list[str], health_url: str) -> str | None:
        """The server's own metrics endpoint beside its health URL, when argv turns it on; else None."""

    def server_metrics(self) -> ServerMetrics:
        """A fresh reader of one server's metrics endpoint."""


ENGINES: tuple[ServingEngine, ...] = (SGLANG,)
# The engine of `serve` commands the console builds, and the reader of runs that serve nothing (training and
# extraction print the same NCCL, CUDA and Python failures).
DEFAULT: ServingEngine = SGLANG


def engine_for(argv: list[str]) -> ServingEngine | None:
    """The engine whose server argv launches with a Python of its own (`PYTHON -m sglang.launch_server ...`)."""
    return next((engine for engine in ENGINES if engine.interpreter(argv) is not None), None)


def health_url(argv: list[str]) -> str | None:
    """The health URL of the first engine whose server argv starts."""
    return next((url for engine in ENGINES if (url := engine.health_url(argv)) is not None), None)


def server_metrics(argv: list[str], health_url: str) -> tuple[str, ServerMetrics] | None:
    """The metrics URL of the engine whose server argv starts with its metrics on, and a reader for it."""
    engine = engine_for(argv)
    url = engine.metrics_url(argv, health_url) if engine is not None else None
    return (url, engine.server_metrics()) if engine is not None and url is not None else None


@dataclass(frozen=True)
class ServedDraft:
    """What a serve command serves, for doctor: the draft, the target folder, the context length, and the
    interpreter and environment that will load them (None: the agent's own)."""

    draft: Path
    target: Path | None
    context_length: int | None
    python: str | None
    env: Mapping[str, str] | None


def served_draft(argv: list[str], cwd: str | None, env: Mapping[str, str] | None) -> ServedDraft | None:
    """The draft a serve command names, or None when it names none. A target given as a hub name rather than
    a folder is left out: doctor reads files only."""
    engine = engine_for(argv) or DEFAULT
    draft = _path(flag_value(argv, engine.draft_flags), cwd)
    if draft is None:
        return None
    target = _path(flag_value(argv, engine.target_flags), cwd)
    context = flag_value(argv, (engine.context_length_flag,))
    python = engine.interpreter(argv)
    return ServedDraft(
        draft=draft,
        target=target if target is not None and target.is_dir() else None,
        context_length=int(context) if context is not None and context.isdigit() else None,
        python=python,
        env=env if python is not None else None,
    )


def _path(value: str | None, cwd: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() or cwd is None else Path(cwd) / path
