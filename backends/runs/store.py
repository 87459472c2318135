"""The run store: the on-disk layout of runs, which is the whole truth.

    WORKDIR/runs/<run-id>/
        spec.json      what to run (RunSpec), written once at launch
        proc.json      supervisor and child identities (pid + start time), the child's session
        output.log     the child's stdout+stderr, byte-exact
        events.jsonl   launch, state changes, signals sent, exit
        metrics.jsonl  metric rows written by the run
        metrics_source.json  how far the supervisor has turned another trainer's output into metric rows
        exit.json      how the child ended (and, when it failed, why: `failure_reason`)
        supervisor.log the supervisor's own errors, if any
    WORKDIR/launches/<launch-id>   the agent that claimed a launch of the console's, then the run it made
                                   (`backends.runs.once`: a launch asked again returns that run)
    WORKDIR/index.json             which runs ended for good, and when: a cache that `status` reads so that it
                                   need not read every run (`backends.runs.index`), rebuilt from runs/

Everything the agent reports is derived from these files plus a check of
whether the recorded processes are still the same processes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from backends.fileio import (
    PRIVATE_DIR,
    Reserved,
    append_jsonl,
    atomic_write_json,
    open_private,
    parse_record,
    private_dir,
    read_json,
    shallow,
)
from backends.host import diskspace, procinfo
from backends.masking import mask_argv, mask_env
from backends.protocol import (
    BENCH_SHOWN,
    ENV_RUN_ID,
    PROGRESS_METRICS,
    RUN_KINDS,
    TERMINAL_STATES,
    BenchResult,
    Diagnosis,
    JobNode,
    Metric,
    NonfiniteValue,
    RunInfo,
    env_name_problem,
    nonfinite_spelled,
    parse_source,
    passable_problem,
)
from backends.runs.failure_reason import failure_line
from backends.runs.job import node_problem

DEFAULT_WORKDIR = Path("~/.eagle3-console")
SPEC = "spec.json"
PROC = "proc.json"
OUTPUT = "output.log"
EVENTS = "events.jsonl"
TORN_EVENT = "torn"  # an event written after a line found without its newline (a power cut), with its size
METRICS = "metrics.jsonl"
PROGRESS_TAIL = 16 * 1024  # the end of metrics.jsonl a status poll reads for a run's progress
PROGRESS_KINDS = ("train", "extract")
METRICS_SOURCE = "metrics_source.json"
EXIT = "exit.json"
SUPERVISOR_LOG = "supervisor.log"
WATCH = "watch.json"  # the supervisor's watch: running/ready/stalled, phase, health, stack dumps
STACKS = "stacks"  # a folder: one file of every process's stack per stall
BENCH = "bench.jsonl"  # a serve run's bench results (backends.bench), one JSON line per bench
BENCH_TAIL = 64 * 1024  # the end of bench.jsonl a status poll reads
RUNS = "runs"  # in WORKDIR: one folder per run, named by its id
LAUNCHES = "launches"  # in WORKDIR, beside runs/: one small file per launch id
INDEX = "index.json"  # in WORKDIR, beside runs/: the settled runs (`backends.runs.index`)
# Room reserved at launch for the records that must survive a disk that fills while the run runs:
# the child's identity and its exit (`Reserved`; they lie as .NAME.reserved until used).
RESERVED = (PROC, EXIT)
# A supervisor that has not recorded itself this long after launch never started.
SUPERVISOR_START_TIMEOUT_S = 30.0
# A run folder without spec.json is being made this long after it appeared; later, it is corrupt.
SPEC_WRITE_GRACE_S = 5.0

RUN_ID_RE = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9]{3}-[0-9a-f]{4}$")


class StoreError(Exception):
    """A run store problem a user can act on; the message says what to do."""


class SpecError(StoreError):
    pass


class RunNotFound(StoreError):
    pass


class CorruptFile(StoreError):
    """A file of a run's record (spec, proc, exit, events) cannot be read as one: the run is `corrupt`."""

    def __init__(self, run_id: str, file: str, reason: str) -> None:
        super().__init__(f"run {run_id} is corrupt: {file}: {reason}; repair that file or move runs/{run_id} away")
        self.file = file
        self.reason = reason


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
    job: JobNode | None = None  # this run's node of a multi-node job (backends.runs.job)
    # A serve run's: the host Python whose SGLang checks it when the command does not show it (a wrapper, a
    # container), and the server's metrics endpoint when it is not beside the health URL.
    sglang_python: str | None = None
    metrics_url: str | None = None
    launch_id: str | None = None  # the console's name for the launch that made it (`backends.runs.once`)

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
        for name in ("cwd", "health_url", "parent", "sglang_python", "metrics_url"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise SpecError(f"{name} must be a string or null")
        self._validate_passable()
        if self.stall_after is not None and (not _is_number(self.stall_after) or not 0 < self.stall_after < math.inf):
            raise SpecError("stall window must be positive seconds")
        if not _is_number(self.created_at) or not math.isfinite(self.created_at):
            raise SpecError("created_at must be a time in seconds")
        if self.metrics_from is not None:
            self._validate_metrics_from()
        if self.job is not None and (problem := node_problem(self.job)) is not None:
            raise SpecError(problem)

    def _validate_passable(self) -> None:
        """What the supervisor hands to exec (argv, env, cwd) must be something exec can take."""
        texts = [(f"argv[{i}]", arg) for i, arg in enumerate(self.argv)]
        texts += [(f"env[{name!r}]", value) for name, value in self.env.items()]
        texts += [("cwd", self.cwd)] if self.cwd is not None else []
        problems = [f"{at} {problem}" for at, text in texts if (problem := passable_problem(text))]
        problems += list(filter(None, map(env_name_problem, self.env)))
        if problems:
            raise SpecError(problems[0])

    def _validate_metrics_from(self) -> None:
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


def progress_of(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """The last step, shard and ETA that metric rows (newest first) name."""
    found: dict[str, float] = {}
    for row in rows:
        for key in PROGRESS_METRICS:
            value = row.get(key)
            if key not in found and _is_number(value):
                found[key] = value
        if Metric.STEP in found or Metric.SHARD in found:
            break
    return found or None


def nonfinite_of(rows: list[dict[str, Any]]) -> NonfiniteValue | None:
    """The newest NaN or infinite value of metric rows (newest first), even where newer rows hold that metric
    finite again: a console polling every 2 s tells a one-step NaN of a run it does not follow only through
    this. One older than the rows read (the metrics' last PROGRESS_TAIL bytes) is no longer news."""
    for row in rows:
        for name, value in row.items():
            number = nonfinite_spelled(value) if isinstance(value, str) else value
            if isinstance(number, float) and not math.isfinite(number):
                step = row.get(Metric.STEP)
                return {"metric": name, "step": step if _is_int(step) else None, "value": str(number)}
    return None


def _last_objects(path: Path, limit: int) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines file's last `limit` bytes, newest first; torn lines and other values are
    passed over (a missing or unreadable file has none)."""
    try:
        with open(path, "rb") as lines:
            start = max(lines.seek(0, os.SEEK_END) - limit, 0)
            lines.seek(start)
            data = lines.read(limit).split(b"\n")
    except OSError:
        return
    for line in reversed(data[1:] if start else data):  # from the middle of a file: its first line is cut
        try:
            row = json.loads(line)
        except ValueError:  # a torn first or last line, or not JSON
            continue
        if isinstance(row, dict):
            yield row


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_record(run_id: str, path: Path, finite: bool = False) -> Any:
    """A record file of a run, parsed; None when it does not exist (yet); CorruptFile when it cannot be read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CorruptFile(run_id, path.name, f"cannot be read ({exc.strerror or exc})") from None
    try:
        return parse_record(data, finite)
    except ValueError as exc:
        raise CorruptFile(run_id, path.name, f"not valid JSON ({exc})") from None


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
        data = read_record(self.id, self.file(SPEC))
        if data is None:
            raise CorruptFile(self.id, SPEC, "missing")
        try:
            return RunSpec.from_json(data)
        except SpecError as exc:
            raise CorruptFile(self.id, SPEC, str(exc)) from None

    def append_event(self, event_type: str, /, **fields: Any) -> None:
        append_jsonl(self.file(EVENTS), event(event_type, **fields), torn=lambda size: event(TORN_EVENT, bytes=size))

    def events(self) -> list[dict[str, Any]]:
        """Every event; CorruptFile when a whole line is not one (a last line without its newline is
        still being written), unless a `torn` event right after it says it was found torn and ended (a
        power cut): that line is passed over, and the `torn` event keeps its size for anyone to see."""
        try:
            with open(self.file(EVENTS), "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CorruptFile(self.id, EVENTS, f"cannot be read ({exc.strerror or exc})") from None
        rows: list[dict[str, Any]] = []
        bad: CorruptFile | None = None  # the last line's fault, forgiven if a torn event follows it
        for number, line in enumerate(data[: data.rfind(b"\n") + 1].split(b"\n"), 1):
            if not line.strip():
                continue
            fault: str | None = None
            try:
                row = parse_record(line)
            except ValueError as exc:
                row, fault = None, f"line {number} is not valid JSON ({exc})"
            if fault is None and not (isinstance(row, dict) and shallow(row)):
                fault = f"line {number} is not an event"
            if bad is not None and not (fault is None and row.get("type") == TORN_EVENT):
                raise bad
            bad = CorruptFile(self.id, EVENTS, fault) if fault is not None else None
            if fault is None:
                rows.append(row)
        if bad is not None:
            raise bad
        return rows

    def proc(self) -> dict[str, Any]:
        """proc.json ({} before the supervisor wrote it); CorruptFile when it names no process it could be."""
        data = read_record(self.id, self.file(PROC), finite=True)
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise CorruptFile(self.id, PROC, "not a JSON object")
        for role in ("supervisor", "child"):
            if data.get(role) is not None and procinfo.ProcIdentity.from_json(data[role]) is None:
                raise CorruptFile(self.id, PROC, f"its {role} is not a process identity (pid, start_ticks, boot_id)")
        return data

    def child(self) -> procinfo.ProcIdentity | None:
        """The child's recorded identity; None when none is recorded, or proc.json is corrupt."""
        return self._identity("child")

    def _identity(self, role: str) -> procinfo.ProcIdentity | None:
        try:
            return procinfo.ProcIdentity.from_json(self.proc().get(role))
        except CorruptFile:
            return None

    def reserved(self, name: str) -> Reserved:
        """The slot `RunStore.create` reserved for `name` (one of RESERVED)."""
        return Reserved(self.file(f".{name}.reserved"))

    def trusted_spec(self) -> RunSpec:
        """The spec, when nobody but its owner could have written it: what relaunch and the supervisor run."""
        me = os.geteuid()
        for path in (self.path, self.file(SPEC)):
            try:
                st = path.stat()
            except OSError:
                raise SpecError(f"run {self.id}: {path.name} is missing") from None
            if st.st_uid != me or st.st_mode & 0o022:
                raise SpecError(
                    f"run {self.id}: {path.name} could have been changed by someone else (mode "
                    f"{st.st_mode & 0o777:o}, owner {procinfo.user_name(st.st_uid)}); not running it: check who did"
                )
        return self.spec()

    def processes(self, stats: list[procinfo.ProcStat] | None = None) -> dict[int, procinfo.ProcIdentity]:
        """The run's live processes, each proven to be the run's (see procinfo.run_processes). Once the exit
        record is written the child is gone (a zombie at most): its pid alone proves nothing; its session, as
        proc.json recorded it (older stores did not), does while the child's pid is still its own."""
        try:
            reaped = self.exit() is not None
        except CorruptFile:
            reaped = False
        try:
            session = self.proc().get("session")
        except CorruptFile:
            session = None
        marker = f"{ENV_RUN_ID}={self.id}".encode()
        session = session if type(session) is int else None
        return procinfo.run_processes(marker, self.child(), stats, child_reaped=reaped, session=session)

    def supervisor(self) -> procinfo.ProcIdentity | None:
        return self._identity("supervisor")

    def exit(self) -> dict[str, Any] | None:
        data = read_record(self.id, self.file(EXIT), finite=True)
        if data is not None and not isinstance(data, dict):
            raise CorruptFile(self.id, EXIT, "not a JSON object")
        return data

    def last_metrics(self) -> list[dict[str, Any]]:
        """Its last metric rows, newest first, from the end of metrics.jsonl (a status poll reads this for every
        run, once: at most PROGRESS_TAIL bytes each)."""
        return list(_last_objects(self.file(METRICS), PROGRESS_TAIL))

    def silent_s(self) -> float | None:
        """Seconds since output.log last changed, by this host's clock; None when there is none."""
        try:
            return max(time.time() - self.file(OUTPUT).stat().st_mtime, 0.0)
        except OSError:
            return None

    def bench(self) -> list[BenchResult]:
        """The latest BENCH_SHOWN bench results, oldest first, each without the served command line (the run's
        own argv says it); read from the end of bench.jsonl."""
        found: list[BenchResult] = []
        for row in _last_objects(self.file(BENCH), BENCH_TAIL):
            if _is_number(row.get("t")) and isinstance(row.get("figures"), dict):
                row.pop("argv", None)
                found.append(row)  # type: ignore[arg-type]  # written by backends.bench as a BenchResult
            if len(found) == BENCH_SHOWN:
                break
        return found[::-1]

    def watch(self) -> dict[str, Any]:
        """The supervisor's watch (see backends.runs.watch); {} before its first verdict."""
        data = read_json(self.file(WATCH))
        return data if isinstance(data, dict) else {}

    def state(self) -> str:
        """`derive_state`, or `corrupt` as `info` tells it: when its spec, its proc.json, or a record
        the state is derived from cannot be read."""
        try:
            self.spec()
            self.proc()
            return derive_state(self)
        except CorruptFile:
            return "corrupt"

    def being_created(self) -> bool:
        """True for a folder `RunStore.create` has just made and not yet written spec.json into."""
        try:
            return not self.file(SPEC).exists() and time.time() - self.path.stat().st_mtime < SPEC_WRITE_GRACE_S
        except OSError:
            return False

    def info(self) -> RunInfo:
        """What `status` tells of the run; a run whose record cannot be read is `corrupt`, with the file and why."""
        try:
            return self._read_info()
        except CorruptFile as exc:
            return self.corrupt_info(exc.file, exc.reason)

    def corrupt_info(self, file: str, reason: str) -> RunInfo:
        """The run as `corrupt` because of `file`: its spec's fields if the spec is whole, its child's pid."""
        spec: RunSpec | None = None
        with contextlib.suppress(CorruptFile):
            spec = self.spec()
        child = self.child()
        return {
            "id": self.id,
            "name": spec.name if spec else "",
            "kind": spec.kind if spec else "unknown",
            "state": "corrupt",
            "phase": None,
            "pid": child.pid if child else None,
            "argv": mask_argv(spec.argv) if spec else [],
            "env": mask_env(spec.env) if spec else {},
            "gpus": spec.gpus if spec else [],
            "started_at": None,
            "ended_at": None,
            "exit_code": None,
            "signal": None,
            "error": None,
            "parent": spec.parent if spec else None,
            "health": None,
            "stalled_since": None,
            "stall_kind": None,
            "stack_dumps": None,
            "diagnoses": [],
            "corrupt": {"file": file, "reason": reason},
            "truncated": [],
            "progress": None,
        }

    def _read_info(self) -> RunInfo:
        spec = self.spec()
        proc = self.proc()
        child = procinfo.ProcIdentity.from_json(proc.get("child"))
        ended = self.exit() or {}
        watch = self.watch()
        dumps = watch.get("stack_dumps")
        metrics = self.last_metrics()
        info: RunInfo = {
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
            "diagnoses": [*(watch.get("diagnoses") or []), *disk_full_diagnosis(ended)],
            "corrupt": None,
            "truncated": [],
            "progress": progress_of(metrics) if spec.kind in PROGRESS_KINDS else None,
        }
        if bench := self.bench():
            info["bench"] = bench
        if spec.job is not None:
            info["job"] = spec.job
        stalled = watch.get("stalled_processes")
        if info["state"] == "stalled" and isinstance(stalled, list):
            info["stalled_processes"] = stalled
        if info["state"] == "failed" and (failure := failure_line(ended)) is not None:
            info["failure"] = failure
        if info["state"] not in TERMINAL_STATES and (silent := self.silent_s()) is not None:
            info["silent_s"] = round(silent, 1)
        if nonfinite := nonfinite_of(metrics):
            info["nonfinite"] = nonfinite
        return info


def disk_full_diagnosis(ended: dict[str, Any]) -> list[Diagnosis]:
    """The full disk the supervisor met while the run ran (exit.json's `disk_full`), as a diagnosis."""
    said = ended.get("disk_full")
    if not isinstance(said, str):
        return []
    return [
        {
            "code": "disk_full",
            "meaning": said,
            "hint": "free space on that device; the run's log and metrics may have gaps from then on",
            "line": "",
        }
    ]


def signalled_by_us(run: RunDir, before: float | None = None) -> bool:
    """Whether we signalled the run (kill, free-gpus) before `before`: a signal sent to what was left
    of a run after it ended does not change how it ended."""
    return signalled_in(run.events(), before)


def signalled_in(events: list[dict[str, Any]], before: float | None = None) -> bool:
    return any(
        e.get("type") == "signal" and (before is None or (_is_number(e.get("t")) and e["t"] <= before)) for e in events
    )


def derive_state(run: RunDir, watch: dict[str, Any] | None = None) -> str:
    """The run's state from its files and a liveness check of its processes (`watch`: watch.json, if read). Only
    reads: `lost` is recorded by the agent that sees it (`record_lost`). events.jsonl is read once at most."""
    events = functools.cache(run.events)
    ended = run.exit()
    if ended is not None:
        return _ended_state(ended, events)
    proc = run.proc()  # read once: it names both processes
    child = procinfo.ProcIdentity.from_json(proc.get("child"))
    supervisor = procinfo.ProcIdentity.from_json(proc.get("supervisor"))
    if child is not None and procinfo.is_alive(child):
        # ready and stalled are the watch's verdicts; without its supervisor nobody keeps them current.
        watched = (run.watch() if watch is None else watch).get("state")
        alive = supervisor is not None and procinfo.is_alive(supervisor)
        return watched if alive and watched in ("ready", "stalled") else "running"
    if child is not None and signalled_in(events()):
        # Our signal ended the child; its supervisor (stopped, or gone) has not written exit.json.
        return "killed"
    if supervisor is not None and procinfo.is_alive(supervisor):
        # Between spawn and the child's record, or between its exit and exit.json.
        return "running" if child is not None else "starting"
    if supervisor is None:
        created = run.spec().created_at
        if time.time() - created < SUPERVISOR_START_TIMEOUT_S:
            return "starting"
    if (ended := run.exit()) is not None:
        # The supervisor wrote exit.json and left while we looked: the run ended normally.
        return _ended_state(ended, events)
    # The supervisor is gone without writing exit.json: the exit is unknown. Only a run whose events read whole
    # is `lost`: a corrupt events.jsonl makes it `corrupt`.
    events()
    return "lost"


def _ended_state(ended: dict[str, Any], events: Callable[[], list[dict[str, Any]]]) -> str:
    """The state exit.json tells, with our signals (from `events`) telling a kill from a failure."""
    if ended.get("error"):
        return "failed"
    ended_at = ended.get("ended_at")
    if signalled_in(events(), ended_at if _is_number(ended_at) else None):
        return "killed"
    return "exited" if ended.get("code") == 0 else "failed"


def record_lost(run: RunDir) -> None:
    """`lost` in the run's events, once. Its supervisor, which owns the run's fate and records every other
    state, is gone without a word: the agent that finds the run lost writes it, in its place. A store it
    cannot write still answers status."""
    with contextlib.suppress(OSError, CorruptFile):
        if not any(e.get("type") == "state" and e.get("state") == "lost" for e in run.events()):
            run.append_event("state", state="lost")


def _refused(exc: OSError) -> str:
    """The system's error and where: the nearest existing of the path it names and that path's parents, since
    a folder or file that could not be made was refused by the folder it was to go in."""
    if exc.filename is None:
        return str(exc.strerror or exc)
    where = Path(os.fsdecode(exc.filename))
    while not where.exists() and where.parent != where:
        where = where.parent
    return f"{where}: {exc.strerror}"


class RunStore:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.expanduser()
        self.runs = self.workdir / RUNS

    def secure(self) -> None:
        """Refuse a store another user owns; make one that others could enter (older versions made
        it 755) private. StoreError when it cannot be used."""
        for folder in (self.workdir, self.runs):
            try:
                st = folder.stat()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StoreError(f"cannot read the run store {folder}: {exc.strerror or exc}") from None
            if st.st_uid != os.geteuid():
                raise StoreError(
                    f"the run store {folder} belongs to user {procinfo.user_name(st.st_uid)}; "
                    "choose a --workdir of your own"
                )
            if st.st_mode & 0o077:
                try:
                    os.chmod(folder, st.st_mode & 0o700)
                except OSError as exc:
                    raise StoreError(f"cannot make the run store {folder} private: {exc.strerror or exc}") from None

    def create(self, spec: RunSpec) -> RunDir:
        """Make the run folder and write spec.json; StoreError when it cannot."""
        spec.validate()
        path: Path | None = None
        try:
            private_dir(self.workdir)
            private_dir(self.runs)
            while path is None:
                candidate = self.runs / new_run_id()
                with contextlib.suppress(FileExistsError):
                    candidate.mkdir(mode=PRIVATE_DIR)
                    path = candidate
            os.chmod(path, PRIVATE_DIR)
            atomic_write_json(path / SPEC, spec.to_json())
            # Made here, private, so that whoever appends to them later (the run itself) keeps them so.
            for name in (OUTPUT, EVENTS, METRICS, SUPERVISOR_LOG):
                os.close(open_private(path / name, os.O_WRONLY))
            for name in RESERVED:
                RunDir(path).reserved(name).make()
        except OSError as exc:
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)  # no half-made run left behind
            if diskspace.is_full(exc):
                raise StoreError(
                    f"{diskspace.no_space_message(self.runs)}: the run was not created; free some space there "
                    "or choose another --workdir"
                ) from None
            raise StoreError(
                f"cannot write the run store at {self.runs}: {_refused(exc)}; "
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
