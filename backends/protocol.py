"""Every message between the console and the host agent: JSON lines over stdio.

One request per line: {"v": 1, "id": ID, "op": OP, "args": {...}}.
One reply per request: {"v": 1, "id": ID, "ok": true, "result": {...}}
                    or {"v": 1, "id": ID, "ok": false, "error": {"code", "message"}}.
Subscriptions push stream messages: {"v": 1, "sub": N, "stream": ..., ...}; the last is
"end", with the run's state (and a failed run's "failure" line), and an "error" when the stream ended
otherwise than with the run (its folder removed, a file of its record corrupt, a file that cannot be read).
Through the shared connection a stream may instead stop with "behind" (BEHIND): the command read too slowly,
and subscribes again from the offsets it reached.
Log bytes travel base64-encoded (they may be invalid UTF-8); metric and event
rows travel parsed. Offsets are byte offsets into the run's files, so a client
that reconnects resumes exactly where it stopped. No message carries more than
FRAME_BYTES of a run's files: a line of any length comes in several.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

PROTOCOL_VERSION = 1
# What every reader of messages takes (the console's, the multiplexer's, the agent's): a line past it is
# dropped whole, and stands for an error (`too_large_reply`, `too_large_end`), never for a lost link.
MAX_LINE_BYTES = 16 * 1024 * 1024
# The most bytes of a run's files one message carries: a reply to `logs`, `metrics` or `events`, a stream
# message. A line of any length (a progress bar that never ends its line) travels in such frames, the client
# asking again from next_offset, so each message stays far under MAX_LINE_BYTES: its output base64-encoded is
# 4/3 of a frame, its rows as JSON (escapes, numbers spelled out again) a few times it at worst.
FRAME_BYTES = 256 * 1024
# The shortest time between two looks a client may ask for (watch, GPU samples, status polls):
# any shorter only spins the host's CPU.
MIN_INTERVAL_S = 0.2

RunKind = Literal["extract", "train", "serve", "command"]
RUN_KINDS: tuple[str, ...] = ("extract", "train", "serve", "command")
RunState = Literal["starting", "running", "ready", "stalled", "exited", "failed", "killed", "lost", "corrupt"]
# `corrupt`: a file of the run's record cannot be read, so nothing more can be told of it until it is repaired.
TERMINAL_STATES: frozenset[str] = frozenset({"exited", "failed", "killed", "lost", "corrupt"})
GpuSourceName = Literal["nvml", "nvidia-smi", "none"]


class Metric:
    """The names of a metric row's series (one JSON object per line of a run's metrics.jsonl, each value a number):
    what our trainer and extractor write, what SGLang's decode lines and other trainers' logs are read as
    (`backends.runs.metrics_sources`), and what the console plots. Per-position series are `acc_0`, `ploss_0`..."""

    STEP = "step"
    EPOCH = "epoch"
    TIME = "t"  # seconds since the epoch: the x of a serve run's rows, which have no step
    # training, every --log-every steps
    LOSS = "loss"
    LR = "lr"
    GRAD_NORM = "grad_norm"
    TOKENS_PER_S = "tokens_per_s"  # also extraction's rate
    # evaluation, every --eval-every steps
    VAL_LOSS = "val_loss"
    VAL_ACC = "val_acc"
    VAL_SIM_ACCEPT_LEN = "val_sim_accept_len"  # Σ_k Π_{j≤k} val_acc_j: the acceptance length the accuracies predict
    PLATEAU = "plateau"  # the validation loss has stopped improving
    # extraction, per shard
    STAGE = "stage"
    SAMPLES = "samples"
    TOKENS = "tokens"
    ETA_S = "eta_s"
    SHARD = "shard"
    # serving, per decode log line, or every few seconds from the server's own /metrics when it has them
    ACCEPT_LEN = "accept_len"
    GEN_THROUGHPUT = "gen_throughput"
    RUNNING_REQ = "running_req"
    QUEUE_REQ = "queue_req"
    TOKEN_USAGE = "token_usage"
    # serving, from /metrics only; latencies in seconds, percentiles of the requests finished since the last scrape
    ACCEPT_RATE = "accept_rate"
    CACHE_HIT_RATE = "cache_hit_rate"
    TTFT_P50 = "ttft_p50"
    TTFT_P99 = "ttft_p99"
    ITL_P50 = "itl_p50"
    ITL_P99 = "itl_p99"
    E2E_P50 = "e2e_p50"
    # other trainers' rows (`backends.runs.metrics_sources`)
    SOURCE = "source"  # the --metrics-from source the row was read from: a name, not a number
    BATCH = "batch"  # a progress bar's count within its epoch, in rows that have no step

    @staticmethod
    def acc(position: int) -> str:
        return f"acc_{position}"

    @staticmethod
    def ploss(position: int) -> str:
        return f"ploss_{position}"

    @staticmethod
    def val_acc(position: int) -> str:
        return f"val_acc_{position}"

    @staticmethod
    def val_ploss(position: int) -> str:
        return f"val_ploss_{position}"

    @staticmethod
    def epoch_acc(position: int) -> str:
        """Over a whole training epoch, as EAGLE and SpecForge report it."""
        return f"epoch_acc_{position}"

    @staticmethod
    def epoch_ploss(position: int) -> str:
        return f"epoch_ploss_{position}"

    @staticmethod
    def val_acceptance_rate(position: int) -> str:
        """SpecForge's `eval/acceptance_rate_k`."""
        return f"val_acceptance_rate_{position}"


# Where a run's child writes its metric rows (one JSON object per line): set by the supervisor for every run.
ENV_METRICS_FILE = "EAGLE3_METRICS_FILE"
# Set for every child, so that its own code (and ours) can find the run; ENV_RUN_ID also marks
# every process of the run (children inherit it), which is one way `RunDir.processes` proves them ours.
ENV_RUN_ID = "EAGLE3_RUN_ID"
ENV_RUN_DIR = "EAGLE3_RUN_DIR"
# What the supervisor sets for a run's child alone: the agent, the supervisors and the console's local agent
# start without them, so that a run launched from inside a run is its own, never counted as the outer run's.
CHILD_ONLY_ENV = (ENV_RUN_ID, ENV_RUN_DIR, ENV_METRICS_FILE)
# Where a `train` run's metrics come from when its trainer is not ours (`--metrics-from`; read by
# `backends.runs.metrics_sources`).
METRICS_SOURCES: tuple[str, ...] = ("jsonl", "specforge", "speculators", "eagle", "tensorboard")
SOURCES_HELP = "jsonl, specforge, speculators, eagle or tensorboard:DIR"


def parse_source(text: str) -> str:
    """The `--metrics-from` value, normalised; ValueError with what to write instead.

    A launch's argument, checked where the run spec is (RunSpec.validate) and by the console before it asks.
    """
    name, colon, arg = text.strip().partition(":")
    name = name.strip().lower()
    if name not in METRICS_SOURCES:
        raise ValueError(f"unknown metrics source {text!r}; use one of {SOURCES_HELP}")
    if name != "tensorboard":
        if colon:
            raise ValueError(f"metrics source {name!r} takes no argument (got {text!r}); use one of {SOURCES_HELP}")
        return name
    folder = arg.strip()
    if not folder:
        raise ValueError("tensorboard needs the folder of its event files: tensorboard:DIR (e.g. tensorboard:runs)")
    if "\0" in folder:
        raise ValueError("the tensorboard folder name contains a NUL byte")
    return f"tensorboard:{folder}"


# A metric row: series names (`Metric`) to numbers (a flag such as `plateau` is a bool, extraction's `stage` a name).
MetricRow = dict[str, Any]
SIGNAL_NAMES: tuple[str, ...] = ("TERM", "INT", "KILL")
STREAMS: tuple[str, ...] = ("log", "metrics", "events")


class Diagnosis(TypedDict):
    """A failure recognised in a run's output (`backends.sglang.log`): what it means and what to try."""

    code: str
    meaning: str
    hint: str
    line: str


class CorruptFile(TypedDict):
    """Why a run is `corrupt`: which file of its folder, and what is wrong with it."""

    file: str
    reason: str


PROGRESS_METRICS = (Metric.STEP, Metric.SHARD, Metric.ETA_S)  # what RunInfo.progress may hold
# JSON has no NaN or infinity: a writer that keeps to JSON spells them as text (our trainer writes str(value)).
NONFINITE_SPELLINGS: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def nonfinite_spelled(value: object) -> float | None:
    """A metric row's text value that spells NaN or an infinity (`nan`, `inf`, `-inf`, any case), as a float."""
    return NONFINITE_SPELLINGS.get(value.strip().lower()) if isinstance(value, str) else None


def metric_number(name: str, value: object) -> float | None:
    """A metric row's value as a point of its series, or None if it is not one (text other than `nan`/`inf`, None,
    a flag other than `plateau`): what the console plots and what the agent's thinned view keeps extremes of."""
    if isinstance(value, bool):
        return float(value) if name == Metric.PLATEAU else None
    if isinstance(value, float):
        return value
    if isinstance(value, str):  # NaN or an infinity as a JSON-only writer spells it (our trainer's), else text
        return nonfinite_spelled(value)
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:  # an int beyond a double: as far off the chart as it gets (copysign would overflow too)
            return math.inf if value > 0 else -math.inf
    return None


METRIC_X_KEYS = (Metric.STEP, Metric.TIME)  # a row's x, the first of them its first row has; never a series


def metric_x(value: object) -> float | None:
    """A metric row's value as an x (its `step` or `t`): a finite number, never a flag."""
    x = metric_number("", value)  # a bool is no point of a series named "": None
    return x if x is not None and math.isfinite(x) else None


class NonfiniteValue(TypedDict):
    """A metric value that is NaN or infinite among a run's latest rows: its series, its row's step (None: the row
    has none) and the value as text (`nan`, `inf`, `-inf`)."""

    metric: str
    step: int | None
    value: str


# A metric row's values are numbers; these names alone hold text (what the row was read from, which stage) and
# this one a flag (our trainer's plateau), as their writers write them.
METRIC_TEXTS = frozenset({Metric.SOURCE, Metric.STAGE})
METRIC_FLAGS = frozenset({Metric.PLATEAU})


def metric_value_ok(name: str, value: object) -> bool:
    """Whether a metric row may hold `value` as `name`: a number (NaN and the infinities too, as numbers or spelled
    as nonfinite_spelled reads them), text as source or stage, true/false as plateau; never a list, an object,
    null, other text or another flag."""
    if isinstance(value, bool):
        return name in METRIC_FLAGS
    if isinstance(value, int | float):
        return True
    return isinstance(value, str) and (name in METRIC_TEXTS or nonfinite_spelled(value) is not None)


def not_metric_values(row: MetricRow) -> dict[str, object]:
    """The values of a row that are not metric values (`metric_value_ok`), by name."""
    return {name: value for name, value in row.items() if not metric_value_ok(name, value)}


class LatencyStats(TypedDict):
    """A latency's spread over a bench's requests, in milliseconds (bench_serving's figures: numpy's mean, median
    and linear percentiles, and the max)."""

    mean: float
    median: float
    p95: float
    p99: float
    max: float


class AcceptSpread(TypedDict):
    """The acceptance lengths of a bench's requests, one each (completion tokens / verify steps)."""

    min: float
    p5: float
    median: float
    p95: float
    max: float
    mean: float


class BenchSettings(TypedDict, total=False):
    prompts: str  # "builtin", "random", or the prompt file's path on the host
    requests: int
    concurrency: int  # the most requests in flight at once
    max_tokens: int  # the most tokens per answer (random prompts: every answer's length)
    api: str  # "chat" (/v1/chat/completions) or "completions" (/v1/completions)
    input_len: int  # random prompts: tokens per prompt
    request_rate: float | None  # requests sent per second, Poisson; None: all at once (bench_serving's inf)
    warmup: int  # requests sent first and left out of the figures
    seed: int  # random prompts and the Poisson arrivals


class BenchFigures(TypedDict, total=False):
    """A bench's figures, with bench_serving's definitions (backends/bench/measure.py says which)."""

    ok: int  # requests streamed to their end
    errors: int  # answered with an HTTP error or an error chunk, or not answered at all
    cut: int  # streams that ended before their last chunk
    input_tokens: int  # the server's prompt tokens of the requests that ended well
    output_tokens: int
    duration_s: float  # the timed part: from the first request after the warm-up to the last answer
    request_s: float | None  # requests per second
    input_tok_s: float | None
    output_tok_s: float | None
    total_tok_s: float | None
    concurrency: float | None  # summed E2E latency over the duration
    # The server's own count over the bench's requests: completion tokens / verify steps (None: it gave none)
    accept_len: float | None
    accept_len_per_request: AcceptSpread | None
    ttft_ms: LatencyStats | None  # time to the first token
    tpot_ms: LatencyStats | None  # time per output token after the first
    itl_ms: LatencyStats | None  # between tokens (a chunk's gap spread over its tokens), as /metrics' itl
    e2e_ms: LatencyStats | None  # from the send to the last line


class BenchResult(TypedDict):
    """One `bench` of a served draft: a line of bench.jsonl in the served run's folder (or the bench run's own)."""

    t: float  # when it ended
    bench_run: str | None  # the run that drove it
    served_run: str | None  # the serve run it measured (None: a URL)
    url: str
    argv: list[str] | None  # the served run's command line, secrets masked (RunInfo.bench leaves it out)
    draft: str | None
    settings: BenchSettings
    figures: BenchFigures
    first_error: str | None


BENCH_SHOWN = 5  # the latest bench results a run's status carries


class JobNode(TypedDict):
    """A run's place in a multi-node job: the job's id (the same on every host), its node and the node count."""

    id: str
    node_rank: int
    nnodes: int


@dataclass(frozen=True)
class ServeNode:
    """One node of a serving engine's own multi-node: its rank, the node count, node 0's HOST:PORT to meet at."""

    rank: int
    nnodes: int
    dist_init_addr: str


class StalledProcess(TypedDict):
    """One process of a stalled run as the stall found it: its rank in a distributed group (RANK of its
    environment; None outside one), its kernel state (`T`: stopped) and where it sits (its innermost Python
    frame, else the kernel's wait channel)."""

    pid: int
    rank: int | None
    state: str
    where: str | None


class _RunExtras(TypedDict, total=False):
    # The latest BENCH_SHOWN bench results stored with the run, oldest first; absent when it has none
    bench: list[BenchResult]
    job: JobNode  # absent for a run of one node
    host: str  # set by a client over several hosts (the run's id is then HOST/RUN); never on the wire
    stalled_processes: list[StalledProcess]  # absent unless the run is stalled
    # A failed run's one line: why (backends.runs.failure_reason's rule) and its exit code or signal, or why it
    # could not start; absent for other states and for an exit record written before reasons were
    failure: str
    silent_s: float  # seconds since its output.log last changed, by the host's clock as of this reply; absent if ended
    nonfinite: NonfiniteValue  # the newest NaN or infinite value its latest metric rows hold; absent when none


class RunInfo(_RunExtras):
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
    # A training's or an extraction's last step, shard and its own ETA, as its latest metric rows name them
    # (None for other kinds, or before a row names any)
    progress: dict[str, float] | None


class GpuProcess(TypedDict):
    pid: int
    user: str | None
    mem_mib: int | None
    run_id: str | None


class InferredHolder(TypedDict):
    run_id: str
    inferred_from: str  # what placed the run here: "CUDA_VISIBLE_DEVICES"


class _GpuInferred(TypedDict, total=False):
    # Live runs no listed process was matched to (in a container NVML lists the host's pids), placed on this GPU by
    # their CUDA_VISIBLE_DEVICES: for the eye only, never a reason to signal anything. Absent when there is none.
    inferred: list[InferredHolder]
    host: str  # set by a client over several hosts; never on the wire


class GpuInfo(_GpuInferred):
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


class _StatusPage(TypedDict, total=False):
    # What a status of one page of ended runs (its `ended` and `page`) left out; absent from older agents' replies
    ended_total: int  # the ended runs the store holds, shown or not
    hidden: int  # of them, those not asked for: older (or newer) than the page


class StatusResult(_StatusPage):
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


# Whose a process on a GPU is, as free-gpus proves it: a run of this store (`run_id`), a run of another workdir
# (`run_id` of `workdir`, proven by that store's own record), the user's own process that is no run's, another
# user's (never signalled), or unknown (gone, or not proven to hold the GPU: nothing said of it is its holder's).
HolderKind = Literal["run", "other_store", "own", "not_yours", "unknown"]


class HeldProcess(TypedDict):
    pid: int
    user: str | None
    mem_mib: int | None
    run_id: str | None
    action: str  # "kill", "skip: <reason>", "killed", "survived"
    holder: HolderKind
    workdir: str | None  # the other store's workdir, for holder "other_store"


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
    state: str  # the run's, when the chunk was read


class RowsChunk(TypedDict):
    """Rows of one of a run's JSON-lines files from an offset: its metrics, or its events (phases, health
    answers, stalls); `skipped`: lines that were not JSON objects."""

    rows: list[dict[str, Any]]
    skipped: int
    next_offset: int


class MetricsResult(RowsChunk):
    """A run's metric rows from an offset; `thinned`: asked with `points` over more rows than that, the rows are
    a view of the range (`backends.runs.metric_view`), not all of it, and a coarse view's `skipped` counts the
    garbage among the lines it read, not all of the range's."""

    thinned: bool


EventsResult = RowsChunk


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


class RendezvousResult(TypedDict):
    """Where the other nodes of a job can meet this host: its address as the console reached it, a free port."""

    address: str
    port: int


class HelloResult(TypedDict):
    """Who answers: the protocol it speaks, its release, and where it runs."""

    version: int  # PROTOCOL_VERSION
    agent: str  # the backends package's version
    host: str
    workdir: str  # the run store
    pid: int
    python: str


class RunsResult(TypedDict):
    """`list_runs`: the runs as `status` gives them, without the GPUs."""

    runs: list[RunInfo]
    omitted: int


class LaunchResult(TypedDict):
    """A new run: its first state, and what the pre-launch checks found (as in `PreflightResult`)."""

    run: str
    state: str
    pid: int | None
    error: str | None  # why it could not start
    doctor: DoctorResult | None
    flags: Finding | None


class BenchLaunchResult(LaunchResult):
    """The run `bench` started, and the serve run whose folder will hold its result (None: its own)."""

    served_run: str | None


class RelaunchResult(LaunchResult):
    """The copy `relaunch` started: its parent, its command line (secrets masked) and the parent's stop."""

    parent: str
    argv: list[str]
    stopped_parent: KillResult | None  # None: the parent had no live process


class RelaunchPreview(TypedDict):
    """`relaunch` with dry_run: what it would stop and start, and what the checks found; nothing was done."""

    parent: str
    would_stop: bool
    argv: list[str]
    flags: Finding | None
    doctor: DoctorResult | None


class RelaunchPresetsResult(TypedDict):
    version: str | None  # the serving release that parses the run's flags; None: not known
    presets: list[str]  # a preset of several flags is one space-separated string


class SubscribeResult(TypedDict):
    sub: int
    run: str | None  # None: GPU samples only


class UnsubscribeResult(TypedDict):
    sub: int


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
    # Every live run, and of the ended ones (newest ended first) page `page` of `ended` runs; ended None: all of them
    "status": {"gpus": (_BOOL, False, True), "ended": (_OPT_INT, False, None), "page": (_INT, False, 1)},
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
        "metrics_url": (_OPT_STR, False, None),
        "sglang_python": (_OPT_STR, False, None),  # a serve run's: the host Python whose SGLang checks it
        "stall_after": (_OPT_NUM, False, None),
        "module": (_OPT_STR, False, None),
        "python": (_OPT_STR, False, None),
        "nproc": (_OPT_INT, False, None),
        "metrics_from": (_OPT_STR, False, None),
        "force": (_BOOL, False, False),
        # A node of a multi-node job; with `module`, its torchrun meets the others at `rendezvous` (HOST:PORT)
        "job": (_OPT_STR, False, None),
        "node_rank": (_OPT_INT, False, None),
        "nnodes": (_OPT_INT, False, None),
        "rendezvous": (_OPT_STR, False, None),
        # The console's name for this launch, the same when it asks again after a lost link: one run, not two
        "launch_id": (_OPT_STR, False, None),
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
        "launch_id": (_OPT_STR, False, None),
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
        "max_bytes": (_INT, False, FRAME_BYTES),  # at most FRAME_BYTES, whatever is asked
    },
    "metrics": {
        "run": (_STR, True, None),
        "offset": (_INT, False, 0),
        "points": (_OPT_INT, False, None),  # a view of about this many rows, to the end (`until`), for a chart
        "coarse": (_BOOL, False, False),  # that view sampled: a first look in milliseconds, before the full one
        "until": (_OPT_INT, False, None),
    },
    "events": {"run": (_STR, True, None), "offset": (_INT, False, 0)},
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
    "bench": {
        "target": (_STR, True, None),  # a serve run, or a URL
        "prompts": (_STR, False, "builtin"),
        "requests": (_INT, False, 32),
        "concurrency": (_INT, False, 4),
        "max_tokens": (_INT, False, 256),
        "api": (_STR, False, "chat"),
        "input_len": (_INT, False, 1024),
        "request_rate": (_OPT_NUM, False, None),  # None: all at once
        "warmup": (_INT, False, 1),
        "seed": (_INT, False, 1),
        "name": (_OPT_STR, False, None),
        "cwd": (_OPT_STR, False, None),
        "launch_id": (_OPT_STR, False, None),
    },
    "preflight": {
        "kind": (_STR, True, None),
        "argv": (_LIST, True, None),
        "cwd": (_OPT_STR, False, None),
        "env": (_DICT, False, {}),
    },
    "rendezvous": {},
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


def too_large_reply(request_id: int | str | None, op: str, size: int) -> dict[str, Any]:
    """What stands for a reply of `size` bytes, more than a reader takes: the request's failure, naming it."""
    message = (
        f"{op}: the agent's reply was {size} bytes, more than one message may carry ({MAX_LINE_BYTES}); "
        "it was dropped, and nothing else was lost (please report it: no reply should be that large)"
    )
    return error_reply(request_id, "too_large", message)


def too_large_end(sub: int, stream: str, size: int) -> dict[str, Any]:
    """What stands for a stream message of `size` bytes, more than a reader takes: its subscription's end,
    saying why (the run's state is not known from it)."""
    error = (
        f"a {stream} message of the agent's was {size} bytes, more than one message may carry ({MAX_LINE_BYTES}); "
        "the stream stopped there (please report it: no message should be that large)"
    )
    return stream_message(sub, "end", {"run": None, "state": None, "error": error})


# The shared connection stops a stream with this message where its command has fallen this far behind (a paused
# `logs -f | less`, a 100 MB line read by a slow terminal) rather than keep the rest in memory for it.
BEHIND = "behind"


def behind_message(sub: int, waiting: int) -> dict[str, Any]:
    """The last message of a stream whose command read too slowly, `waiting` bytes held for it: it subscribes
    again from the offsets it reached, on the same link."""
    return stream_message(sub, BEHIND, {"waiting": waiting})


# The first bytes of a reply to a request of an integer id, and of a stream message, as `encode` writes them:
# whom a message is for, read without decoding all of it (a log frame, a line too large to read).
REPLY_HEAD = re.compile(rb'^\{"v":\d+,"id":(\d+),')
STREAM_HEAD = re.compile(rb'^\{"v":\d+,"sub":(\d+),"stream":"(\w+)"')


def message_head(line: bytes) -> tuple[Literal["id", "sub"], int, str] | None:
    """Whom a message is for, from its first bytes: ("id", request id, "") for a reply to a request of an
    integer id, ("sub", subscription, stream) for a stream message; None for anything else."""
    reply = REPLY_HEAD.match(line)
    if reply is not None:
        return "id", int(reply[1]), ""
    stream = STREAM_HEAD.match(line)
    if stream is not None:
        return "sub", int(stream[1]), stream[2].decode()
    return None


def encode(msg: object) -> bytes:
    # NaN stays allowed: a loss that went NaN is exactly what a user must see.
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"
