"""What a run's output says: SGLang's startup phases and the failures of SGLang, NCCL and CUDA, explained.

The lines are SGLang 0.5.5's and 0.5.23's (`sglang.md`); NCCL's and PyTorch's
are the same for every run kind, so training runs are read with the same table.
`OutputReader` is fed the output as it arrives (bytes, `\\r` progress bars
included) and reports each phase change and each failure once; it also keeps
the lines that end a crash (each traceback's exception line, a shell's report
of a signal): the last of them is a failed run's reason when no failure that
names its cause was recognised (`backends.runs.failure_reason`), and a run
killed by a signal that was not ours is explained (`crash`): `crashed: ...SIGKILL`.
"""

from __future__ import annotations

import re
import signal
from collections import deque
from dataclasses import dataclass, field

from backends.protocol import Diagnosis, Metric
from backends.sglang import facts

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
    # False: the line says that a process died, not why; the run's last exception line then says why.
    names_cause: bool = True


# Both releases' spelling of "no CUDA graphs" (0.5.23 deprecates 0.5.5's flag).
_NO_CUDA_GRAPHS = f"--disable-cuda-graph (0.5.23: {' '.join(facts.deprecated_flags('0.5.23')['--disable-cuda-graph'])})"

FAILURES: tuple[Failure, ...] = (
    Failure(
        "cuda-graph-capture",
        re.compile(r"Capture cuda graph failed"),
        ("Capture cuda graph failed",),
        "SGLang could not capture its CUDA graphs (usually out of memory while capturing)",
        "lower --mem-fraction-static, or the graph batch size (--cuda-graph-max-bs on 0.5.5, "
        f"--cuda-graph-max-bs-decode on 0.5.23), or relaunch with {_NO_CUDA_GRAPHS}",
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
        f"a hung kernel or collective is the usual cause: relaunch with {_NO_CUDA_GRAPHS} or "
        "--disable-custom-all-reduce; raise --watchdog-timeout only for truly slow batches",
    ),
    Failure(
        "scheduler-died",
        # Not a child ended by SIGTERM or SIGINT (-15, -2): that is the whole server being stopped (0.5.23 says
        # "crashed with exit code -15" of a scheduler stopped with it, as `kill` does).
        re.compile(
            r"Rank \d+ scheduler (?:is dead|died during initialization \(exit code: (?!-15\b|-2\b))"
            r"|Subprocess \S+ \(pid=\d+\) crashed with exit code (?!-15\b|-2\b)"
        ),
        ("scheduler is dead", "scheduler died during initialization", "Subprocess "),
        "a scheduler process died",
        "its own error is earlier in the log; exit code -9 usually means the OS OOM killer (host memory)",
        names_cause=False,
    ),
    Failure(
        "scheduler-exception",
        re.compile(r"Scheduler hit an exception"),
        ("Scheduler hit an exception",),
        "a scheduler process raised an exception and the server is shutting down",
        "the traceback that follows in the log says where",
        names_cause=False,
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
        "no-accelerator",
        # 0.5.23's get_device(), raised while the server's arguments are resolved, before any model loads.
        re.compile(r"No accelerator \([\w, ]+\) or platform plugin is available"),
        ("No accelerator",),
        "SGLang found no GPU visible to this process",
        "check CUDA_VISIBLE_DEVICES (the run's --gpus), the driver (nvidia-smi on the host), and that the "
        "serve command's interpreter has a CUDA build of torch (python -c 'import torch; "
        "print(torch.cuda.is_available())')",
    ),
    Failure(
        "triton-no-driver",
        # Triton's driver lookup. On CPU, 0.5.23 reaches it with any speculative algorithm: the KV pool warms up
        # its copy kernel (a Triton kernel) once the target and draft weights are loaded.
        re.compile(r"\d+ active drivers \(\[.*\]\)\. There should only be one"),
        ("active drivers",),
        "Triton found no GPU driver, so one of SGLang's Triton kernels could not run",
        "on a GPU host, the serve command's environment cannot see the CUDA driver (nvidia-smi, libcuda.so in a "
        "container); without a GPU, SGLang 0.5.23 cannot serve speculative decoding: serve the target alone",
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
    # 0.5.5: `Capture cuda graph begin` (`cpu graph` on CPU). 0.5.23: the target's prefill graph, then its verify
    # graph with speculative decoding or its decode graph without (`Capture target decode CUDA graph begin.
    # backend=...`; `CPU graph` and the like elsewhere).
    Phase(
        "cuda-graph",
        re.compile(r"^Capture (?:cuda graph|cpu graph|target (?:prefill|verify|decode) \w+ graph) begin"),
        ("Capture cuda graph begin", "Capture cpu graph begin", "Capture target "),
    ),
    # 0.5.5: `Capture draft cuda graph begin`, `Capture draft extend cuda graph begin`; 0.5.23: the draft's
    # prefill, decode and extend graphs (`Capture draft decode CUDA graph begin. backend=...`).
    Phase(
        "draft-cuda-graph",
        re.compile(r"^Capture draft (?:\w+ )?\w+ graph begin"),
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
    Metric.ACCEPT_LEN: re.compile(r"accept len: ([\d.]+)"),
    Metric.GEN_THROUGHPUT: re.compile(r"gen throughput \(token/s\): ([\d.]+)"),
    Metric.RUNNING_REQ: re.compile(r"#running-req: (\d+)"),
    Metric.QUEUE_REQ: re.compile(r"#queue-req: (\d+)"),
    Metric.TOKEN_USAGE: re.compile(r"token usage: ([\d.]+)"),
}
# Python's traceback: its frames are indented, and the first line after them that is not names the exception
# (`RuntimeError: ...`, `torch.OutOfMemoryError: ...`, `KeyboardInterrupt`); lines of other processes may come
# between. A traceback longer than this is given up (nothing more of it would be read).
TRACEBACK = "Traceback (most recent call last)"
MAX_TRACEBACK_LINES = 1000
_EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]*)(?::(?:\s.*)?)?")
# A shell's report of a child it lost to a signal: bash's `bash: line 1: 4242 Killed    python ...`, dash's `Killed`.
SHELL_SIGNALS = {"Killed": "KILL", "Segmentation fault": "SEGV", "Aborted": "ABRT", "Bus error": "BUS"}
_SHELL_REPORT = re.compile(
    r"(?:\S+: (?:line \d+: )?\d+ +)?(" + "|".join(SHELL_SIGNALS) + r")(?: \(core dumped\))?(?:\s|$)"
)
# tqdm's bar (`45%|###`) and SGLang's own (`45% Completed | 29/64`): where a phase's progress is read.
PROGRESS_WORDS = ("%|", "Completed |")
# A line holding none of these words cannot matter (most lines: decode stats, user prints); a substring
# test is many times cheaper than the patterns.
_KEYWORDS = (
    *PROGRESS_WORDS,
    DECODE_LINE,
    *(word for failure in FAILURES for word in failure.words),
    *(word for phase in PHASES for word in phase.words),
    TRACEBACK,
    *SHELL_SIGNALS,
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
    # The target's KV cache is allocated (`Memory pool end`, or graphs captured): 0.5.23 loads the draft's
    # weights before it, so a memory pool after the draft's weights is the target's until then.
    target_pool: bool = False
    seen: set[str] = field(default_factory=set)
    first_cause: Diagnosis | None = None  # the first failure seen that names its cause
    # The lines that end a crash, newest last: each traceback's exception line, a shell's report of a signal.
    crash_lines: deque[str] = field(default_factory=lambda: deque(maxlen=16))
    _traceback: int | None = None  # lines read inside the traceback being read; None: outside one
    _partial: bytes = b""

    def feed(self, data: bytes) -> list[Event]:
        """Events for the complete lines (ended by \\n or \\r) in `data`; the rest waits for more."""
        buffer = self._partial + data
        end = max(buffer.rfind(b"\n"), buffer.rfind(b"\r")) + 1
        self._partial = buffer[end:][-MAX_LINE:]
        events: list[Event] = []
        for text in _LINE_END.split(buffer[:end].decode("utf-8", errors="replace")):
            if self._traceback is not None or any(word in text for word in _KEYWORDS):
                events += self.line(text[:MAX_LINE])
        # SGLang's bars lead each state with a carriage return (`\r... 4/8 [...]`): the newest state waits
        # unended until the next one, so a load that hangs shows where it hangs only from here.
        tail = self._partial.decode("utf-8", errors="replace")
        if any(word in tail for word in PROGRESS_WORDS) and (bar := _PROGRESS.search(tail)) is not None:
            self.progress = f"{bar.group(1)}/{bar.group(2)}"
        return events

    def line(self, text: str) -> list[Event]:
        self._crash_line(text)
        message = _PREFIX.sub("", text.strip())
        events: list[Event] = []
        # A line is one failure, the most specific (FAILURES' order): a capture failure's text mentions OOM too.
        known = next((f for f in FAILURES if f.pattern.search(message)), None)
        if known is not None and known.code not in self.seen:
            self.seen.add(known.code)
            events.append(Event("failure", known.code, message))
            if known.names_cause and self.first_cause is None:
                self.first_cause = self.diagnosis(known.code, message)
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

    def _crash_line(self, text: str) -> None:
        """Keep the line that ends a traceback (its exception) or that reports a signal."""
        if self._traceback is not None:
            self._traceback += 1
            exception = None if text[:1].isspace() else _EXCEPTION_LINE.fullmatch(text.rstrip())
            if exception is not None and is_exception_name(exception.group(1)):
                self.crash_lines.append(text.strip())
                self._traceback = None
            elif self._traceback > MAX_TRACEBACK_LINES:
                self._traceback = None
            return  # a frame, its source, a caret line, or another process's line between them
        if TRACEBACK in text:
            self._traceback = 0
        elif (report := _SHELL_REPORT.match(text)) is not None:
            self.crash_lines.append(report.group(1))

    def _named(self, phase: str, message: str) -> str:
        """The phase, told apart for the draft: init and loading after the target's weights are the draft's, and
        so is a memory pool once the target's is done (0.5.5); before that it is the target's (0.5.23)."""
        if phase == "memory-pool" and "type=" in message:
            if _DRAFT_TYPE.search(message):
                self.draft = True
            else:
                self.target_loaded = True
        if phase in ("init", "load-weights") and self.target_loaded:
            self.draft = True
        own = self.draft and (phase != "memory-pool" or self.target_pool)
        if phase == "cuda-graph" or message.startswith("Memory pool end"):
            self.target_pool = True
        return f"draft-{phase}" if own and phase in ("init", "load-weights", "memory-pool") else phase

    def where(self) -> str | None:
        """The phase and its progress, for a person: `load-weights (29/64)`."""
        if self.phase is None:
            return None
        return f"{self.phase} ({self.progress})" if self.progress else self.phase

    def diagnosis(self, code: str, line: str) -> Diagnosis:
        """What the failure `code` that `line` showed means, as a run's diagnosis."""
        known = failure(code)
        return Diagnosis(code=known.code, meaning=known.meaning, hint=known.hint, line=line)

    def cause(self) -> Diagnosis | None:
        """The first failure seen whose line names what went wrong (not one that only says a process died)."""
        return self.first_cause

    def last_exception(self) -> str | None:
        """The line that ended the last traceback (a child's, before a launcher's line that only says the child
        died), or a shell's report of a signal; None when the output had neither."""
        consequences = [f.pattern for f in FAILURES if not f.names_cause]
        causes = [line for line in self.crash_lines if not any(pattern.search(line) for pattern in consequences)]
        last = (causes or list(self.crash_lines))[-1:]
        return last[0] if last else None

    def crash_diagnosis(self, returncode: int) -> Diagnosis | None:
        """How a run that ended with `returncode` was killed by a signal, and what to try (`crash`)."""
        found = crash(self, returncode)
        if found is None:
            return None
        return Diagnosis(code=CRASHED, meaning=found.meaning, hint=found.hint, line=found.line)


def failure(code: str) -> Failure:
    return next(f for f in FAILURES if f.code == code)


def is_exception_name(name: str) -> bool:
    """`RuntimeError`, `torch.OutOfMemoryError`, `KeyboardInterrupt`: a class name ends the dotted path (not a
    logger's `INFO` or a word of prose)."""
    last = name.rpartition(".")[2]
    return last[:1].isupper() and any(c.islower() for c in last)


CRASHED = "crashed"
# What a signal that ended a process usually means, for a crash that printed no exception of its own.
SIGNAL_HINTS = {
    "SIGKILL": "SIGKILL is most often the OS out-of-memory killer (host memory): `dmesg` or `journalctl -k` on the "
    "host says; lower what the run holds in host memory",
    "SIGSEGV": "a crash in native code (CUDA, NCCL or a compiled kernel): the lines before it in the log say where; "
    "relaunch with NCCL_DEBUG=INFO or CUDA_LAUNCH_BLOCKING=1 to narrow it down",
}
SIGNAL_HINTS["SIGABRT"] = SIGNAL_HINTS["SIGBUS"] = SIGNAL_HINTS["SIGSEGV"]


@dataclass(frozen=True)
class Crash:
    """How a run that exited non-zero was killed by a signal, when no failure that names a cause was recognised."""

    meaning: str
    hint: str
    line: str


def crash(reader: OutputReader, returncode: int) -> Crash | None:
    """The crash diagnosis of a run killed by a signal: its own (`returncode` negative), a shell's report of a
    child killed (its last exception line `Killed`), or a shell's exit code 128+N; with what that signal usually
    means. None for an exit of its own (its failure line, its last exception or error line, says why) or a
    failure already explained."""
    if returncode == 0 or any(failure(code).names_cause for code in reader.seen):
        return None
    killer = ending_signal(returncode)
    how = f"signal {killer}" if returncode < 0 else f"exit code {returncode}"
    if returncode > 0 and killer is not None:
        how += f" (128+{returncode - 128}: {killer})"
    line = reader.last_exception()
    if line in SHELL_SIGNALS:
        name = "SIG" + SHELL_SIGNALS[line]
        meaning = f"{line}: a process of the run was killed by {name}; it ended with {how}"
        return Crash(meaning, SIGNAL_HINTS[name], line)
    if killer is None:
        return None
    hint = SIGNAL_HINTS.get(killer, "the last lines of its log say what it was doing")
    return Crash(f"the run ended with {how}, a signal this console did not send", hint, "")


def ending_signal(returncode: int) -> str | None:
    """The signal that ended the process (`SIGKILL`): its own (negative), or a shell's 128+N; None for an exit."""
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    try:
        return signal.Signals(number).name if number else None
    except ValueError:
        return None
