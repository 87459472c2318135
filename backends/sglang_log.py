"""What a run's output says: SGLang's startup phases and the failures of SGLang, NCCL and CUDA, explained.

The lines are SGLang 0.5.5's and 0.5.23's (`sglang.md`); NCCL's and PyTorch's
are the same for every run kind, so training runs are read with the same table.
`OutputReader` is fed the output as it arrives (bytes, `\\r` progress bars
included) and reports each phase change and each failure once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# A line's scheduler prefix: `[2026-11-29 07:00:00 TP0] message` (TPn/DPn/PPn/EPn only when that size > 1).
_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\s+[A-Z]{2}\d+)*\]\s*")
# A tqdm bar's count: `Loading safetensors checkpoint shards:  45% Completed | 29/64 [...]`.
_PROGRESS = re.compile(r"(\d+)/(\d+)\s*\[")

MAX_LINE = 4096  # longer lines are judged by their first bytes


@dataclass(frozen=True)
class Failure:
    """A failure recognised in the output: a stable code, what it means, and what to try."""

    code: str
    pattern: re.Pattern[str]
    words: tuple[str, ...]  # a line the pattern matches holds one of these (the cheap test before the pattern)
    meaning: str
    hint: str


FAILURES: tuple[Failure, ...] = (
    Failure(
        "cuda-graph-capture",
        re.compile(r"Capture cuda graph failed"),
        ("Capture cuda graph failed",),
        "SGLang could not capture its CUDA graphs (usually out of memory while capturing)",
        "lower --mem-fraction-static, or the graph batch size (--cuda-graph-max-bs on 0.5.5, "
        "--cuda-graph-max-bs-decode on 0.5.23), or relaunch with --disable-cuda-graph",
    ),
    Failure(
        "cuda-oom",
        re.compile(r"CUDA out of memory|torch\.OutOfMemoryError"),
        ("CUDA out of memory", "OutOfMemoryError"),
        "a GPU ran out of memory",
        "lower --mem-fraction-static or the batch size; `free-gpus --dry-run` shows stray processes holding memory",
    ),
    Failure(
        "nccl-timeout",
        re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)"),
        ("WorkNCCL",),
        "an NCCL collective never completed: one rank stopped taking part (hung, crashed or far behind)",
        "compare the ranks' stacks (stacks/ in the run folder); relaunch with NCCL_DEBUG=INFO, "
        "--disable-custom-all-reduce, or NCCL_ALGO=Tree",
    ),
    Failure(
        "scheduler-watchdog",
        re.compile(r"Scheduler watchdog timeout|Watchdog timeout \(self\.watchdog_timeout="),
        ("Scheduler watchdog timeout", "Watchdog timeout ("),
        "a batch ran longer than --watchdog-timeout, so SGLang killed the server",
        "a hung kernel or collective is the usual cause: relaunch with --disable-cuda-graph or "
        "--disable-custom-all-reduce; raise --watchdog-timeout only for truly slow batches",
    ),
    Failure(
        "scheduler-died",
        re.compile(r"Rank \d+ scheduler (?:is dead|died during initialization)|Subprocess \S+ \(pid=\d+\) crashed"),
        ("scheduler is dead", "scheduler died during initialization", "Subprocess "),
        "a scheduler process died",
        "its own error is earlier in the log; exit code -9 usually means the OS OOM killer (host memory)",
    ),
    Failure(
        "scheduler-exception",
        re.compile(r"Scheduler hit an exception"),
        ("Scheduler hit an exception",),
        "a scheduler process raised an exception and the server is shutting down",
        "the traceback that follows in the log says where",
    ),
    Failure(
        "no-aux-capture",
        re.compile(r"does not implement set_eagle3_layers_to_capture"),
        ("set_eagle3_layers_to_capture",),
        "this SGLang cannot capture the target's aux layers, which an EAGLE-3 draft needs",
        "use an SGLang release whose target class has set_eagle3_layers_to_capture (doctor lists them)",
    ),
    Failure(
        "context-length",
        re.compile(r"context_length \(\d+\) is greater than the derived context_length \(\d+\)"),
        ("is greater than the derived context_length",),
        "the target's context is longer than the draft's max_position_embeddings allows",
        "set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, or give the draft a longer max_position_embeddings",
    ),
    Failure(
        "port-in-use",
        re.compile(r"\[Errno 98\] Address already in use"),
        ("Address already in use",),
        "the server's port is taken by another process",
        "choose another --port, or find the other server with `status` and stop it",
    ),
    Failure(
        "warmup-failed",
        re.compile(r"Initialization failed\. warmup error"),
        ("warmup error",),
        "the server loaded but its first request failed",
        "the error after 'warmup error:' says why; --skip-server-warmup only hides it",
    ),
    Failure(
        "health-check-failed",
        re.compile(r"Health check failed\. Server couldn't get a response"),
        ("Health check failed",),
        "the server stopped answering its own health check (no token in 20 s)",
        "the scheduler is hung or overloaded: look at its stack (stacks/), or raise SGLANG_HEALTH_CHECK_TIMEOUT",
    ),
)


@dataclass(frozen=True)
class Phase:
    name: str
    pattern: re.Pattern[str]
    words: tuple[str, ...]  # as for Failure


# In startup order; a line matching a later entry moves the run to that phase.
PHASES: tuple[Phase, ...] = (
    Phase(
        "init",
        re.compile(r"^(?:Init torch distributed begin|Init parallel begin)"),
        ("Init torch distributed begin", "Init parallel begin"),
    ),
    Phase(
        "load-weights",
        re.compile(r"^Load weight begin"),
        ("Load weight begin",),
    ),
    Phase(
        "memory-pool",
        re.compile(r"^(?:Load weight end|KV Cache is allocated|Memory pool end)"),
        ("Load weight end", "KV Cache is allocated", "Memory pool end"),
    ),
    Phase(
        "cuda-graph",
        re.compile(r"^Capture (?:cuda graph|target verify CUDA graph) begin"),
        ("Capture cuda graph begin", "Capture target verify CUDA graph begin"),
    ),
    Phase(
        "draft-cuda-graph",
        re.compile(r"^Capture draft (?:decode |extend )?(?:cuda|CUDA) graph begin"),
        ("Capture draft ",),
    ),
    Phase(
        "http",
        re.compile(r"Uvicorn running on"),
        ("Uvicorn running on",),
    ),
    Phase(
        "ready",
        re.compile(r"^The server is fired up and ready to roll"),
        ("The server is fired up and ready to roll",),
    ),
)
_DRAFT_TYPE = re.compile(r"type=\w*Eagle3\w*")
# SGLang's decode line: `Decode batch, #running-req: N, ... accept len: X.XX, ... gen throughput (token/s): Y,
# #queue-req: Z` (accept len only with speculative decoding); each figure becomes a metric.
DECODE_LINE = "Decode batch"
DECODE_FIGURES = {
    "accept_len": re.compile(r"accept len: ([\d.]+)"),
    "gen_throughput": re.compile(r"gen throughput \(token/s\): ([\d.]+)"),
    "running_req": re.compile(r"#running-req: (\d+)"),
    "queue_req": re.compile(r"#queue-req: (\d+)"),
    "token_usage": re.compile(r"token usage: ([\d.]+)"),
}
# tqdm's bar (`45%|###`) and SGLang's own (`45% Completed | 29/64`): where a phase's progress is read.
PROGRESS_WORDS = ("%|", "Completed |")
# A line holding none of these words cannot matter (most lines: decode stats, user prints); a substring
# test is many times cheaper than the patterns.
_KEYWORDS = (
    *PROGRESS_WORDS,
    DECODE_LINE,
    *(word for failure in FAILURES for word in failure.words),
    *(word for phase in PHASES for word in phase.words),
)
_LINE_END = re.compile(r"[\r\n]")


@dataclass
class Event:
    """Something the output said: a phase change (`phase`), a failure (`failure`), or serving figures
    (`decode`: SGLang's decode log line as a metric row)."""

    kind: str  # "phase" | "failure" | "decode"
    name: str  # the phase, the failure's code, or "decode"
    line: str
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class OutputReader:
    """Reads a run's output incrementally; remembers the phase, its progress bar and the failures seen."""

    phase: str | None = None
    progress: str | None = None  # "29/64" from the phase's last progress bar
    target_loaded: bool = False  # a `Load weight end` named a class that is not a draft
    draft: bool = False  # the draft worker's steps have begun (0.5.5 repeats init and loading for it)
    seen: set[str] = field(default_factory=set)
    _partial: bytes = b""

    def feed(self, data: bytes) -> list[Event]:
        """Events for the complete lines (ended by \\n or \\r) in `data`; the rest waits for more."""
        buffer = self._partial + data
        end = max(buffer.rfind(b"\n"), buffer.rfind(b"\r")) + 1
        self._partial = buffer[end:][-MAX_LINE:]
        events: list[Event] = []
        for text in _LINE_END.split(buffer[:end].decode("utf-8", errors="replace")):
            if any(word in text for word in _KEYWORDS):
                events += self.line(text[:MAX_LINE])
        return events

    def line(self, text: str) -> list[Event]:
        message = _PREFIX.sub("", text.strip())
        events: list[Event] = []
        # A line is one failure, the most specific (FAILURES' order): a capture failure's text mentions OOM too.
        known = next((f for f in FAILURES if f.pattern.search(message)), None)
        if known is not None and known.code not in self.seen:
            self.seen.add(known.code)
            events.append(Event("failure", known.code, message))
        if message.startswith(DECODE_LINE):
            figures = {k: float(m.group(1)) for k, pattern in DECODE_FIGURES.items() if (m := pattern.search(message))}
            return [*events, Event("decode", "decode", message, figures)] if figures else events
        bar = _PROGRESS.search(message)
        if bar is not None:
            self.progress = f"{bar.group(1)}/{bar.group(2)}"
        for phase in PHASES:
            if phase.pattern.search(message):
                name = self._named(phase.name, message)
                if name != self.phase:
                    self.phase, self.progress = name, None
                    events.append(Event("phase", name, message))
                break
        return events

    def _named(self, phase: str, message: str) -> str:
        """The phase, told apart for the draft: init and loading after the target's weights are the draft's."""
        if phase == "memory-pool" and "type=" in message:
            if _DRAFT_TYPE.search(message):
                self.draft = True
            else:
                self.target_loaded = True
        if phase in ("init", "load-weights") and self.target_loaded:
            self.draft = True
        return f"draft-{phase}" if self.draft and phase in ("init", "load-weights", "memory-pool") else phase

    def where(self) -> str | None:
        """The phase and its progress, for a person: `load-weights (29/64)`."""
        if self.phase is None:
            return None
        return f"{self.phase} ({self.progress})" if self.progress else self.phase


def failure(code: str) -> Failure:
    return next(f for f in FAILURES if f.code == code)
