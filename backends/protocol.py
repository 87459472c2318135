"""Every message between the console and the host agent: JSON lines over stdio.

One request per line: {"v": 1, "id": ID, "op": OP, "args": {...}}.
One reply per request: {"v": 1, "id": ID, "ok": true, "result": {...}}
                    or {"v": 1, "id": ID, "ok": false, "error": {"code", "message"}}.
Subscriptions push stream messages: {"v": 1, "sub": N, "stream": ..., ...}; the last is
"end", with the run's state, and an "error" when the stream ended otherwise than with the run
(its folder removed, a file of its record corrupt, a file that cannot be read).
Log bytes travel base64-encoded (they may be invalid UTF-8); metric and event
rows travel parsed. Offsets are byte offsets into the run's files, so a client
that reconnects resumes exactly where it stopped.
"""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 16 * 1024 * 1024
# The shortest time between two looks a client may ask for (watch, GPU samples, status polls):
# any shorter only spins the host's CPU.
MIN_INTERVAL_S = 0.2

RunKind = Literal["extract", "train", "serve", "command"]
RUN_KINDS: tuple[str, ...] = ("extract", "train", "serve", "command")
RunState = Literal["starting", "running", "ready", "stalled", "exited", "failed", "killed", "lost", "corrupt"]
# `corrupt`: a file of the run's record cannot be read, so nothing more can be told of it until it is repaired.
TERMINAL_STATES: frozenset[str] = frozenset({"exited", "failed", "killed", "lost", "corrupt"})
GpuSourceName = Literal["nvml", "nvidia-smi", "none"]
SIGNAL_NAMES: tuple[str, ...] = ("TERM", "INT", "KILL")
STREAMS: tuple[str, ...] = ("log", "metrics", "events")


class Diagnosis(TypedDict):
    """A failure recognised in a run's output (`backends.sglang_log`): what it means and what to try."""

    code: str
    meaning: str
    hint: str
    line: str


class CorruptFile(TypedDict):
    """Why a run is `corrupt`: which file of its folder, and what is wrong with it."""

    file: str
    reason: str


class RunInfo(TypedDict):
    id: str
    name: str
    kind: str
    state: str
    phase: str | None
    pid: int | None
    argv: list[str]
    env: dict[str, str]
    gpus: list[int]
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    signal: str | None
    error: str | None
    parent: str | None
    health: str | None
    stalled_since: float | None
    stall_kind: str | None  # idle | spinning (GPUs held by kernels that do no work)
    stack_dumps: list[str] | None
    diagnoses: list[Diagnosis]
    corrupt: CorruptFile | None  # set when state is `corrupt`
    truncated: list[str]  # fields cut to keep a reply bounded (`status RUN` gives the run whole)


class GpuProcess(TypedDict):
    pid: int
    user: str | None
    mem_mib: int | None
    run_id: str | None


class GpuInfo(TypedDict):
    """One GPU; any field NVML could not give is None (shown as "n/a")."""

    index: int
    name: str | None
    util: int | None  # % of time a kernel ran
    mem_util: int | None  # % of time device memory was read or written
    mem_used_mib: int | None
    mem_total_mib: int | None
    temp_c: int | None
    power_w: float | None
    processes: list[GpuProcess]


class StatusResult(TypedDict):
    host: str
    gpu_source: GpuSourceName
    gpu_error: str | None  # why the source is not NVML, or what the last sample could not read
    runs: list[RunInfo]
    gpus: list[GpuInfo]
    omitted: int  # runs left out to keep the reply bounded (the oldest ended ones first)


class KilledProcess(TypedDict):
    pid: int
    signals: list[str]
    died: bool


class KillResult(TypedDict):
    run: str
    state: str
    processes: list[KilledProcess]
    refused: list[dict[str, Any]]
    escalated: bool


class HeldProcess(TypedDict):
    pid: int
    user: str | None
    mem_mib: int | None
    run_id: str | None
    action: str  # "kill", "skip: <reason>", "killed", "survived"


class GpuFreeReport(TypedDict):
    index: int
    mem_used_before_mib: int | None
    mem_used_after_mib: int | None
    freed_mib: int | None
    processes: list[HeldProcess]
    still_held: list[HeldProcess]


class FreeGpusResult(TypedDict):
    dry_run: bool
    gpu_source: GpuSourceName
    gpus: list[GpuFreeReport]


class LogChunk(TypedDict):
    offset: int
    next_offset: int
    size: int
    data_b64: str


class MetricsResult(TypedDict):
    rows: list[dict[str, Any]]
    skipped: int
    next_offset: int


Severity = Literal["error", "warning", "info"]


class Finding(TypedDict):
    """One thing `doctor` found: a stable code, how bad, what, and what to do."""

    code: str
    severity: Severity
    message: str
    fix: str | None


class DoctorResult(TypedDict):
    draft: str
    format: str  # "sglang" | "speculators" | "eagle-bin" | "unknown"
    sglang_versions: list[str]  # the versions checked against
    findings: list[Finding]
    errors: int
    warnings: int


class PreflightResult(TypedDict):
    """The pre-launch checks of a serve command: SGLang's parser on its flags, doctor on its draft."""

    # launch-flags (error), launch-flags-warned (warning: accepted, with the parser's warnings),
    # launch-flags-unchecked (info); None: the flags parse cleanly
    flags: Finding | None
    doctor: DoctorResult | None  # None: the command names no draft


class StacksResult(TypedDict):
    """A run's stack dump: every process's stack, as `watch.dump_stacks` wrote it."""

    file: str  # relative to the run's folder
    text: str
    taken_at: float


class ErrorBody(TypedDict, total=False):
    code: str
    message: str
    details: Any  # e.g. the doctor findings that refused a launch


@dataclass(frozen=True)
class Request:
    id: int | str
    op: str
    args: dict[str, Any]


class ProtocolError(Exception):
    """A request the agent cannot serve; becomes an error reply, never a crash."""

    def __init__(self, code: str, message: str, request_id: int | str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


# Argument schema per op: name -> (accepted types, required, default).
_ArgSpec = dict[str, tuple[tuple[type, ...], bool, Any]]
_INT: tuple[type, ...] = (int,)
_NUM: tuple[type, ...] = (int, float)
_STR: tuple[type, ...] = (str,)
_BOOL: tuple[type, ...] = (bool,)
_LIST: tuple[type, ...] = (list,)
_DICT: tuple[type, ...] = (dict,)
_OPT_LIST: tuple[type, ...] = (list, type(None))
_OPT_STR: tuple[type, ...] = (str, type(None))
_OPT_NUM: tuple[type, ...] = (int, float, type(None))
_OPT_INT: tuple[type, ...] = (int, type(None))

OPS: dict[str, _ArgSpec] = {
    "hello": {},
    "status": {"gpus": (_BOOL, False, True)},
    "list_runs": {},
    "run_info": {"run": (_STR, True, None)},
    "launch": {
        "kind": (_STR, True, None),
        "argv": (_LIST, True, None),
        "name": (_OPT_STR, False, None),
        "env": (_DICT, False, {}),
        "cwd": (_OPT_STR, False, None),
        "gpus": (_LIST, False, []),
        "health_url": (_OPT_STR, False, None),
        "stall_after": (_OPT_NUM, False, None),
        "module": (_OPT_STR, False, None),
        "nproc": (_OPT_INT, False, None),
        "metrics_from": (_OPT_STR, False, None),
        "force": (_BOOL, False, False),
    },
    "stacks": {"run": (_STR, True, None), "now": (_BOOL, False, False)},
    "kill": {
        "run": (_STR, True, None),
        "signal": (_STR, False, "TERM"),
        "grace": (_NUM, False, 10.0),
    },
    "relaunch": {
        "run": (_STR, True, None),
        "set": (_LIST, False, []),
        "unset": (_LIST, False, []),
        "grace": (_NUM, False, 10.0),
        "force": (_BOOL, False, False),
        "dry_run": (_BOOL, False, False),
    },
    "free_gpus": {
        "gpus": (_OPT_LIST, False, None),
        "dry_run": (_BOOL, False, True),
        "timeout": (_NUM, False, 15.0),
        "grace": (_NUM, False, 5.0),
    },
    "logs": {
        "run": (_STR, True, None),
        "offset": (_OPT_INT, False, None),
        "tail": (_OPT_INT, False, None),
        "max_bytes": (_INT, False, 4 * 1024 * 1024),
    },
    "metrics": {"run": (_STR, True, None), "offset": (_INT, False, 0)},
    "subscribe": {
        "run": (_OPT_STR, False, None),
        "offsets": (_DICT, False, {}),
        "gpu_interval": (_OPT_NUM, False, None),
    },
    "unsubscribe": {"sub": (_INT, True, None)},
    "doctor": {
        "draft": (_STR, True, None),
        "target": (_OPT_STR, False, None),
        "data": (_OPT_STR, False, None),
        "sglang_version": (_OPT_STR, False, None),
        "context_length": (_OPT_INT, False, None),
        "dry_load": (_BOOL, False, False),
        "sglang_python": (_OPT_STR, False, None),
        "cwd": (_OPT_STR, False, None),
    },
    "relaunch_presets": {"run": (_STR, True, None)},
    "preflight": {
        "kind": (_STR, True, None),
        "argv": (_LIST, True, None),
        "cwd": (_OPT_STR, False, None),
        "env": (_DICT, False, {}),
    },
    "convert": {
        "src": (_STR, True, None),
        "dst": (_STR, True, None),
        "to": (_STR, False, "sglang"),
        "cwd": (_OPT_STR, False, None),
    },
}


def parse_request(line: bytes) -> Request:
    """Decode and validate one request line (without its args' meaning)."""
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError) as exc:  # bad UTF-8/JSON, absurd nesting or integers
        raise ProtocolError("bad_json", f"request is not JSON: {exc}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("bad_request", "request must be a JSON object")
    request_id = msg.get("id")
    if not isinstance(request_id, (int, str)) or isinstance(request_id, bool):
        raise ProtocolError("bad_request", "request needs an integer or string 'id'")
    version = msg.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(
            "bad_version",
            f"protocol version {version!r} not supported; this agent speaks {PROTOCOL_VERSION}",
            request_id,
        )
    op = msg.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise ProtocolError("unknown_op", f"unknown op {op!r}; known: {', '.join(OPS)}", request_id)
    args = msg.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError("bad_args", "'args' must be a JSON object", request_id)
    return Request(request_id, op, _check_args(op, args, request_id))


def _check_args(op: str, args: dict[str, Any], request_id: int | str) -> dict[str, Any]:
    schema = OPS[op]
    unknown = sorted(set(args) - set(schema))
    if unknown:
        raise ProtocolError("bad_args", f"{op}: unknown argument(s) {', '.join(unknown)}", request_id)
    checked: dict[str, Any] = {}
    for name, (types, required, default) in schema.items():
        if name not in args:
            if required:
                raise ProtocolError("bad_args", f"{op}: missing argument '{name}'", request_id)
            checked[name] = copy.deepcopy(default)  # never hand out the schema's own list
            continue
        value = args[name]
        # bool is an int subclass; accept it only where bool is asked for.
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            wanted = "/".join("null" if t is type(None) else t.__name__ for t in types)
            raise ProtocolError("bad_args", f"{op}: '{name}' must be {wanted}", request_id)
        # Every number in a request (offsets, counts, seconds) is finite and non-negative.
        if isinstance(value, float) and not math.isfinite(value):
            raise ProtocolError("bad_args", f"{op}: '{name}' must be a finite number, not {value}", request_id)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ProtocolError("bad_args", f"{op}: '{name}' must not be negative", request_id)
        problem = _text_problem(name, value)
        if problem is None and isinstance(value, dict) and name == "env":
            problem = next(filter(None, map(env_name_problem, value)), None)
        if problem is not None:
            raise ProtocolError("bad_args", f"{op}: {problem}", request_id)
        checked[name] = value
    return checked


def passable_problem(text: str) -> str | None:
    """Why `text` cannot reach a program as an argument, an environment entry or a path; None if it can."""
    if "\x00" in text:
        return "contains a NUL byte, which no command line, environment or path can hold"
    try:
        os.fsencode(text)
    except UnicodeEncodeError as exc:
        return f"contains {text[exc.start]!r}, which no command line, environment or path can hold"
    return None


def env_name_problem(name: str) -> str | None:
    """Why `name` cannot be an environment variable's name; None if it can."""
    if not name:
        return "an environment variable needs a name: give NAME=VALUE"
    if "=" in name:
        return f"environment variable name {_shown(name)} contains '=': give NAME=VALUE"
    problem = passable_problem(name)
    return None if problem is None else f"environment variable name {_shown(name)} {problem}"


def _shown(text: str, limit: int = 40) -> str:
    """`text` quoted for a one-line message: escaped, and cut when long."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _text_problem(where: str, value: object) -> str | None:
    """The first string in `value` (an argument, with its items and keys) that cannot reach a program."""
    pending: list[tuple[str, object]] = [(where, value)]  # a stack, not recursion: JSON nests deep
    while pending:
        at, item = pending.pop()
        if isinstance(item, str):
            problem = passable_problem(item)
            if problem is not None:
                return f"{at} {problem}"
        elif isinstance(item, list):
            pending += [(f"{at}[{i}]", inner) for i, inner in reversed(list(enumerate(item)))]
        elif isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                pending += [(f"{at}[{_shown(key)}]", inner), (f"{at} name {_shown(key)}", key)]
    return None


def request_line(request_id: int | str, op: str, args: dict[str, Any]) -> bytes:
    return encode({"v": PROTOCOL_VERSION, "id": request_id, "op": op, "args": args})


def ok_reply(request_id: int | str, result: object) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "id": request_id, "ok": True, "result": result}


def error_reply(request_id: int | str | None, code: str, message: str, details: Any = None) -> dict[str, Any]:
    error: ErrorBody = {"code": code, "message": message}
    if details is not None:
        error["details"] = details
    return {"v": PROTOCOL_VERSION, "id": request_id, "ok": False, "error": error}


def stream_message(sub: int, stream: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "sub": sub, "stream": stream, **body}


def encode(msg: object) -> bytes:
    # NaN stays allowed: a loss that went NaN is exactly what a user must see.
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"
