"""The run store: the on-disk layout of runs, which is the whole truth.

    WORKDIR/runs/<run-id>/
        spec.json      what to run (RunSpec), written once at launch
        proc.json      supervisor and child identities (pid + start time)
        output.log     the child's stdout+stderr, byte-exact
        events.jsonl   launch, state changes, signals sent, exit
        metrics.jsonl  metric rows written by the run
        metrics_source.json  how far the supervisor has turned another trainer's output into metric rows
        exit.json      how the child ended
        supervisor.log the supervisor's own errors, if any

Everything the agent reports is derived from these files plus a check of
whether the recorded processes are still the same processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from backends import procinfo
from backends.masking import mask_argv, mask_env
from backends.protocol import RUN_KINDS, RunInfo

DEFAULT_WORKDIR = Path("~/.eagle3-console")
SPEC = "spec.json"
PROC = "proc.json"
OUTPUT = "output.log"
EVENTS = "events.jsonl"
METRICS = "metrics.jsonl"
METRICS_SOURCE = "metrics_source.json"
EXIT = "exit.json"
SUPERVISOR_LOG = "supervisor.log"
WATCH = "watch.json"  # the supervisor's watch: running/ready/stalled, phase, health, stack dumps
STACKS = "stacks"  # a folder: one file of every process's stack per stall
# A supervisor that has not recorded itself this long after launch never started.
SUPERVISOR_START_TIMEOUT_S = 30.0

RUN_ID_RE = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9]{3}-[0-9a-f]{4}$")


class StoreError(Exception):
    """A run store problem a user can act on; the message says what to do."""


class SpecError(StoreError):
    pass


class RunNotFound(StoreError):
    pass


def new_run_id(now: float | None = None) -> str:
    """Sortable by launch time (UTC), unique, and safe as a file name."""
    t = time.time() if now is None else now
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(t))
    return f"{stamp}-{int(t * 1000) % 1000:03d}-{secrets.token_hex(2)}"


@dataclass
class RunSpec:
    kind: str
    argv: list[str]
    name: str = ""
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    gpus: list[int] = field(default_factory=list)
    health_url: str | None = None
    stall_after: float | None = None
    parent: str | None = None
    created_at: float = field(default_factory=time.time)
    metrics_from: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: object) -> RunSpec:
        if not isinstance(data, dict):
            raise SpecError("spec.json is not a JSON object")
        try:
            spec = RunSpec(**data)
        except TypeError as exc:
            raise SpecError(f"spec.json has unexpected fields: {exc}") from None
        spec.validate()
        return spec

    def validate(self) -> None:
        if self.kind not in RUN_KINDS:
            raise SpecError(f"unknown run kind {self.kind!r}; use one of {', '.join(RUN_KINDS)}")
        if not isinstance(self.argv, list) or not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise SpecError("argv must be a non-empty list of strings")
        if not isinstance(self.env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise SpecError("env must map strings to strings")
        if not isinstance(self.gpus, list) or not all(_is_int(g) and g >= 0 for g in self.gpus):
            raise SpecError("gpus must be a list of GPU indices")
        if not isinstance(self.name, str):
            raise SpecError("name must be a string")
        for name in ("cwd", "health_url", "parent"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise SpecError(f"{name} must be a string or null")
        if self.stall_after is not None and (not _is_number(self.stall_after) or self.stall_after <= 0):
            raise SpecError("stall window must be positive seconds")
        if not _is_number(self.created_at):
            raise SpecError("created_at must be a time in seconds")
        if self.metrics_from is not None:
            self._validate_metrics_from()

    def _validate_metrics_from(self) -> None:
        # Imported here: metrics_sources imports this module.
        from backends.metrics_sources import parse_source

        if not isinstance(self.metrics_from, str):
            raise SpecError("metrics_from must be a string or null")
        if self.kind != "train":
            raise SpecError(f"a metrics source goes with train runs, not {self.kind!r} runs")
        try:
            parse_source(self.metrics_from)
        except ValueError as exc:
            raise SpecError(str(exc)) from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temp file beside `path`, fsync, then rename over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: object) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1).encode() + b"\n")


def append_jsonl(path: Path, obj: object) -> None:
    """One write(2) with O_APPEND, so lines from agent and supervisor never interleave."""
    line = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_json(path: Path) -> Any:
    """Parsed JSON, or None when the file is missing or not (yet) valid."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def read_jsonl(path: str | Path, offset: int = 0, max_bytes: int = 64 * 1024 * 1024) -> tuple[list[Any], int, int]:
    """Complete lines from `offset`: (rows, skipped garbage lines, next offset).

    A trailing line without its newline is still being written: it is left for
    the next read rather than counted as garbage.
    """
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(max_bytes)
    except FileNotFoundError:
        return [], 0, offset
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) == max_bytes:
        # One line longer than a whole read: skip past it rather than stall here.
        return [], 1, offset + len(data)
    rows: list[Any] = []
    skipped = 0
    # Split on \n only: a stray \r inside a line must not make two lines of it.
    for line in data[:end].split(b"\n"):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            skipped += 1
    return rows, skipped, offset + end


def event(event_type: str, /, **fields: Any) -> dict[str, Any]:
    return {"t": time.time(), "type": event_type, **fields}


class RunDir:
    """One run's folder and the typed reads of its files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.id = path.name

    def file(self, name: str) -> Path:
        return self.path / name

    def spec(self) -> RunSpec:
        data = read_json(self.file(SPEC))
        if data is None:
            raise SpecError(f"run {self.id}: spec.json is missing or corrupt")
        try:
            return RunSpec.from_json(data)
        except SpecError as exc:
            raise SpecError(f"run {self.id}: {exc}") from None

    def append_event(self, event_type: str, /, **fields: Any) -> None:
        append_jsonl(self.file(EVENTS), event(event_type, **fields))

    def events(self) -> list[dict[str, Any]]:
        rows, _, _ = read_jsonl(self.file(EVENTS))
        return [r for r in rows if isinstance(r, dict)]

    def proc(self) -> dict[str, Any]:
        data = read_json(self.file(PROC))
        return data if isinstance(data, dict) else {}

    def child(self) -> procinfo.ProcIdentity | None:
        return procinfo.ProcIdentity.from_json(self.proc().get("child"))

    def supervisor(self) -> procinfo.ProcIdentity | None:
        return procinfo.ProcIdentity.from_json(self.proc().get("supervisor"))

    def exit(self) -> dict[str, Any] | None:
        data = read_json(self.file(EXIT))
        return data if isinstance(data, dict) else None

    def watch(self) -> dict[str, Any]:
        """The supervisor's watch (see backends.watch); {} before its first verdict."""
        data = read_json(self.file(WATCH))
        return data if isinstance(data, dict) else {}

    def state(self) -> str:
        return derive_state(self)

    def info(self) -> RunInfo:
        spec = self.spec()
        proc = self.proc()
        child = procinfo.ProcIdentity.from_json(proc.get("child"))
        ended = self.exit() or {}
        watch = self.watch()
        dumps = watch.get("stack_dumps")
        return {
            "id": self.id,
            "name": spec.name,
            "kind": spec.kind,
            "state": derive_state(self, watch),
            "phase": watch.get("phase"),
            "pid": child.pid if child else None,
            "argv": mask_argv(spec.argv),
            "env": mask_env(spec.env),
            "gpus": spec.gpus,
            "started_at": proc.get("child_started_at"),
            "ended_at": ended.get("ended_at"),
            "exit_code": ended.get("code"),
            "signal": ended.get("signal"),
            "error": ended.get("error"),
            "parent": spec.parent,
            "health": watch.get("health"),
            "stalled_since": watch.get("stalled_since"),
            "stall_kind": watch.get("stall_kind"),
            "stack_dumps": [f"{STACKS}/{name}" for name in dumps] if isinstance(dumps, list) and dumps else None,
            "diagnoses": watch.get("diagnoses") or [],
        }


def _killed_by_us(run: RunDir) -> bool:
    return any(e.get("type") == "signal" for e in run.events())


def derive_state(run: RunDir, watch: dict[str, Any] | None = None) -> str:
    """The run's state from its files and a liveness check of its processes (`watch`: watch.json, if read)."""
    ended = run.exit()
    if ended is not None:
        if ended.get("error"):
            return "failed"
        if _killed_by_us(run):
            return "killed"
        return "exited" if ended.get("code") == 0 else "failed"
    proc = run.proc()  # read once: it names both processes
    child = procinfo.ProcIdentity.from_json(proc.get("child"))
    supervisor = procinfo.ProcIdentity.from_json(proc.get("supervisor"))
    if child is not None and procinfo.is_alive(child):
        # ready and stalled are the watch's verdicts; without its supervisor nobody keeps them current.
        watched = (run.watch() if watch is None else watch).get("state")
        alive = supervisor is not None and procinfo.is_alive(supervisor)
        return watched if alive and watched in ("ready", "stalled") else "running"
    if supervisor is not None and procinfo.is_alive(supervisor):
        # Between spawn and the child's record, or between its exit and exit.json.
        return "running" if child is not None else "starting"
    if supervisor is None:
        created = run.spec().created_at
        if time.time() - created < SUPERVISOR_START_TIMEOUT_S:
            return "starting"
    if run.exit() is not None:
        # The supervisor wrote exit.json and left while we looked: the run ended normally.
        return derive_state(run)
    # The supervisor is gone without writing exit.json: the exit is unknown.
    _record_lost(run)
    return "lost"


def _record_lost(run: RunDir) -> None:
    """`lost` is the one state nobody is alive to write: whoever first sees it records it, once."""
    if not any(e.get("type") == "state" and e.get("state") == "lost" for e in run.events()):
        with contextlib.suppress(OSError):  # a read-only store still answers status
            run.append_event("state", state="lost")


class RunStore:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.expanduser()
        self.runs = self.workdir / "runs"

    def create(self, spec: RunSpec) -> RunDir:
        """Make the run folder and write spec.json; StoreError when it cannot."""
        spec.validate()
        path: Path | None = None
        try:
            self.runs.mkdir(parents=True, exist_ok=True)
            while path is None:
                candidate = self.runs / new_run_id()
                with contextlib.suppress(FileExistsError):
                    candidate.mkdir()
                    path = candidate
            atomic_write_json(path / SPEC, spec.to_json())
            (path / OUTPUT).touch()
        except OSError as exc:
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)  # no half-made run left behind
            raise StoreError(
                f"cannot write the run store at {self.runs}: {exc.strerror or exc}; "
                "fix its permissions or choose another --workdir"
            ) from None
        return RunDir(path)

    def ids(self) -> list[str]:
        try:
            names = os.listdir(self.runs)
        except OSError:
            return []
        return sorted(n for n in names if RUN_ID_RE.match(n))

    def all(self) -> list[RunDir]:
        return [RunDir(self.runs / i) for i in self.ids()]

    def get(self, ref: str) -> RunDir:
        """A run by exact id, unique id prefix, or name (the newest run with it)."""
        if not ref:
            raise RunNotFound("no run given; 'status' lists the runs")
        ids = self.ids()
        if ref in ids:
            return RunDir(self.runs / ref)
        matches = [i for i in ids if i.startswith(ref)]
        if len(matches) == 1:
            return RunDir(self.runs / matches[0])
        if len(matches) > 1:
            raise RunNotFound(f"run id prefix {ref!r} is ambiguous: {', '.join(matches[:5])}; give more of the id")
        for run_id in reversed(ids):
            data = read_json(self.runs / run_id / SPEC)
            if isinstance(data, dict) and data.get("name") == ref:
                return RunDir(self.runs / run_id)
        raise RunNotFound(f"no run {ref!r} in {self.runs}; 'status' lists the runs")
