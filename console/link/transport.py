"""The link to a host's agent, as every client and transport shares it: the transport (a byte pipe of lines) and the
line framing every kind of it shares; the agent's operations over it, typed (one method per operation of the
protocol, `protocol.OPS`: its arguments by name, its defaults, its reply, over an untyped `request`); the two ways a
request fails (`TransportError`, `AgentError`); and how long a host has to answer each (its deadline).

Transports: `console.link.local` runs the agent as a subprocess of this machine, `console.link.ssh` on a host over
an SSH channel, `console.link.reuse_transport` through a running multiplexer's connection. Clients:
`console.link.client.AgentClient` (asyncio: subscriptions that stream, reconnects) and
`console.cli.quick.BlockingClient` (one request at a time through a running multiplexer, with no event loop). So
this module imports no asyncio at import time: a short command that needs no loop does not pay for importing one.

Each request has a deadline, as ssh's ServerAliveInterval bounds a silent link: an agent that stopped answering (a
host swapping to death, a process stopped, a file system hung under it) fails the call with one line naming the
host and the call, instead of holding the command, or every host of it, forever.

`--timeout SECONDS` (or `timeout` in config.toml) is the time every call gets; without it, each call gets its
kind's: a quick look, or the longer checks a launch or a doctor runs first. A call that itself waits (a kill's
grace, free-gpus' wait for memory) gets that wait on top.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast, overload

from backends.protocol import (
    FRAME_BYTES,
    MAX_LINE_BYTES,
    BenchLaunchResult,
    DoctorResult,
    EventsResult,
    FreeGpusResult,
    HelloResult,
    KillResult,
    LaunchResult,
    LogChunk,
    MetricsResult,
    PreflightResult,
    RelaunchPresetsResult,
    RelaunchPreview,
    RelaunchResult,
    RendezvousResult,
    RunInfo,
    RunsResult,
    StacksResult,
    StatusResult,
)

if TYPE_CHECKING:
    import asyncio

STDERR_KEEP_LINES = 20
HEAD_BYTES = 256  # what is kept of a line too long to take: enough to tell whom it was for


class OversizedLine(Exception):
    """A line of the agent's longer than a reader takes (MAX_LINE_BYTES), read to its end and dropped, so the link
    stays in step: its first bytes (whom it was for: `protocol.message_head`) and its length."""

    def __init__(self, head: bytes, size: int) -> None:
        super().__init__(f"a line of {size} bytes, over {MAX_LINE_BYTES}")
        self.head = head
        self.size = size


async def whole_line(read_piece: Callable[[], Awaitable[bytes]]) -> bytes:
    """One line of the agent's, from pieces (a reader hands over a long line in parts: asyncssh as much as its
    window holds); b"" once the agent has gone, a line it left unfinished included. A line past MAX_LINE_BYTES
    raises OversizedLine once it is read to its end, without holding more than its head."""
    pieces: list[bytes] = []
    size = 0
    head: bytes | None = None  # set once the line is past the limit
    while True:
        piece = await read_piece()
        if not piece:
            return b""
        size += len(piece)
        if head is None and size > MAX_LINE_BYTES:
            head, pieces = b"".join(pieces)[:HEAD_BYTES], []
        if head is None:
            pieces.append(piece)
        elif len(head) < HEAD_BYTES:
            head += piece[: HEAD_BYTES - len(head)]
        if piece.endswith(b"\n"):
            break
    if head is not None:
        raise OversizedLine(head, size)
    return b"".join(pieces)


async def stream_piece(reader: asyncio.StreamReader) -> bytes:
    """A line from `reader`, or as much of it as the reader's limit holds; b"" at its end."""
    import asyncio  # here, not at the top: the quick way imports this module and no event loop

    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial
    except asyncio.LimitOverrunError as exc:
        return await reader.readexactly(exc.consumed)


class Transport(abc.ABC):
    """A byte pipe to one agent: lines out, lines in."""

    description: str

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def send(self, line: bytes) -> None: ...

    @abc.abstractmethod
    async def receive(self) -> bytes:
        """One line from the agent; b"" once the agent has gone; OversizedLine for one too long to take."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    def last_words(self) -> str:
        """What the agent said on stderr before it went, for error messages."""


class TransportError(Exception):
    """The agent could not be reached or went away; the message says what to do.

    `transient` is False where retrying cannot help (a refused host key, a key the host does not accept).
    """

    def __init__(self, message: str, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class AgentError(Exception):
    """The agent refused a request; `code` is machine-readable, the message is for people."""

    def __init__(self, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


# The refusals asking again may not meet: a failure inside the agent (a bug, an I/O error of the host's).
PASSING_CODES = frozenset({"internal"})


def lasting(exc: AgentError | TransportError) -> bool:
    """Whether asking again cannot change this failure: a refusal of the request itself (no such run, arguments or
    an operation this agent does not take), or a link retrying cannot make (a refused host key, another protocol
    version). A loop that asks again stops on it, saying why; a lost link, or a failure inside the agent, may pass."""
    if isinstance(exc, AgentError):
        return exc.code not in PASSING_CODES
    return not exc.transient


def reply_result(msg: dict[str, Any]) -> Any:
    """A reply's result; AgentError when it is a refusal."""
    if msg.get("ok"):
        return msg.get("result")
    error = msg.get("error") or {}
    raise AgentError(str(error.get("code")), str(error.get("message")), error.get("details"))


QUICK_S = 30.0  # status, logs, kill's first signal: the agent answers these in milliseconds
LONG_S = 300.0  # a launch (SGLang's parser and doctor run first), doctor, convert, a fresh stack dump
DRY_LOAD_S = 900.0  # doctor --dry-load: SGLang's own loader reads the draft's weights
LONG_OPS = frozenset({"launch", "relaunch", "bench", "preflight", "doctor", "convert", "relaunch_presets"})
WAITS = {"kill": ("grace",), "relaunch": ("grace",), "free_gpus": ("timeout", "grace")}  # the call's own waits
# What the line calls an operation when the protocol's name is not the command's.
SAID = {"run_info": "status RUN", "list_runs": "list", "free_gpus": "free-gpus", "relaunch_presets": "relaunch"}


class NoAnswer(TransportError):
    """The agent did not answer within the call's deadline: the link is given up (it stays transient: the
    host may answer again on a new one)."""


def seconds_for(op: str, args: Mapping[str, Any], given: float | None) -> float:
    """The deadline of one call: `given` (the --timeout), else its kind's; plus the waits it asks for."""
    if given is not None:
        base = given
    elif op == "doctor" and args.get("dry_load"):
        base = DRY_LOAD_S
    elif op in LONG_OPS or (op == "stacks" and args.get("now")):
        base = LONG_S
    else:
        base = QUICK_S
    waits = [args.get(name) for name in WAITS.get(op, ())]
    return base + sum(w for w in waits if isinstance(w, (int, float)) and not isinstance(w, bool))


def no_answer(host: str, op: str, seconds: float) -> NoAnswer:
    return NoAnswer(
        f"{host}: no answer to {SAID.get(op, op)} in {seconds:g} s (the agent stopped answering); "
        "check the host, or give it longer with --timeout SECONDS"
    )


class AgentOps(abc.ABC):
    @abc.abstractmethod
    async def request(self, op: str, **args: Any) -> Any:
        """One request and its reply's result, untyped: the transport of the typed methods below."""

    async def hello(self) -> HelloResult:
        return cast(HelloResult, await self.request("hello"))

    async def status(self, *, gpus: bool = True, ended: int | None = None, page: int = 1) -> StatusResult:
        """Every live run, and of the ended ones (newest ended first) page `page` of `ended` runs (None: all)."""
        if ended is None:  # sent only when asked for: an agent of an older release refuses arguments it does not know
            return cast(StatusResult, await self.request("status", gpus=gpus))
        try:
            return cast(StatusResult, await self.request("status", gpus=gpus, ended=ended, page=page))
        except AgentError as exc:
            if exc.code != "bad_args" or "unknown argument" not in exc.message:
                raise
        # An agent that pages nothing (one of this protocol from before, which a multiplexer still runs): every run.
        return cast(StatusResult, await self.request("status", gpus=gpus))

    async def list_runs(self) -> RunsResult:
        return cast(RunsResult, await self.request("list_runs"))

    async def run_info(self, run: str) -> RunInfo:
        """One run whole: every field that `status` cuts to keep its reply bounded."""
        return cast(RunInfo, await self.request("run_info", run=run))

    async def launch(
        self,
        kind: str,
        argv: Sequence[str],
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        gpus: Sequence[int] = (),
        health_url: str | None = None,
        stall_after: float | None = None,
        module: str | None = None,
        python: str | None = None,
        nproc: int | None = None,
        metrics_from: str | None = None,
        force: bool = False,
        job: str | None = None,
        node_rank: int | None = None,
        nnodes: int | None = None,
        rendezvous: str | None = None,
        metrics_url: str | None = None,
        sglang_python: str | None = None,
        launch_id: str | None = None,
    ) -> LaunchResult:
        """A new run; with job, node_rank and nnodes, one node of a multi-node job (its torchrun meeting the
        others at `rendezvous` when it runs one of our stages). A serve run's `sglang_python` is the host Python
        whose SGLang checks it when its command does not show one; `metrics_url` its metrics endpoint.
        `launch_id` names the launch, the same when it is asked again (None: the client names it)."""
        # Sent only when given: an agent of an older release refuses arguments it does not know.
        given = {k: v for k, v in (("metrics_url", metrics_url), ("sglang_python", sglang_python)) if v is not None}
        result = await self.request(
            "launch",
            **given,
            kind=kind,
            argv=list(argv),
            name=name,
            env=dict(env or {}),
            cwd=cwd,
            gpus=list(gpus),
            health_url=health_url,
            stall_after=stall_after,
            module=module,
            python=python,
            nproc=nproc,
            metrics_from=metrics_from,
            force=force,
            job=job,
            node_rank=node_rank,
            nnodes=nnodes,
            rendezvous=rendezvous,
            launch_id=launch_id,
        )
        return cast(LaunchResult, result)

    async def rendezvous(self) -> RendezvousResult:
        """Where a job's other nodes can meet this host: its address as reached, and a free port there."""
        return cast(RendezvousResult, await self.request("rendezvous"))

    async def stacks(self, run: str, *, now: bool = False) -> StacksResult:
        return cast(StacksResult, await self.request("stacks", run=run, now=now))

    async def kill(self, run: str, *, signal: str = "TERM", grace: float = 10.0) -> KillResult:
        return cast(KillResult, await self.request("kill", run=run, signal=signal, grace=grace))

    @overload
    async def relaunch(
        self,
        run: str,
        *,
        set: Sequence[str] = ...,
        unset: Sequence[str] = ...,
        grace: float = ...,
        force: bool = ...,
        dry_run: Literal[False] = ...,
        launch_id: str | None = ...,
    ) -> RelaunchResult: ...

    @overload
    async def relaunch(
        self,
        run: str,
        *,
        set: Sequence[str] = ...,
        unset: Sequence[str] = ...,
        grace: float = ...,
        force: bool = ...,
        dry_run: Literal[True],
        launch_id: str | None = ...,
    ) -> RelaunchPreview: ...

    async def relaunch(
        self,
        run: str,
        *,
        set: Sequence[str] = (),
        unset: Sequence[str] = (),
        grace: float = 10.0,
        force: bool = False,
        dry_run: bool = False,
        launch_id: str | None = None,
    ) -> RelaunchResult | RelaunchPreview:
        """A copy of the run with flags set and removed (its parent stopped first); with `dry_run`, what that
        would do, doing nothing."""
        result = await self.request(
            "relaunch",
            run=run,
            set=list(set),
            unset=list(unset),
            grace=grace,
            force=force,
            dry_run=dry_run,
            launch_id=launch_id,
        )
        return cast("RelaunchResult | RelaunchPreview", result)

    async def free_gpus(
        self, *, gpus: Sequence[int] | None = None, dry_run: bool = True, timeout: float = 15.0, grace: float = 5.0
    ) -> FreeGpusResult:
        """Your processes that hold GPU memory (all GPUs, or `gpus`): the plan, or with dry_run=False, done."""
        result = await self.request(
            "free_gpus", gpus=None if gpus is None else list(gpus), dry_run=dry_run, timeout=timeout, grace=grace
        )
        return cast(FreeGpusResult, result)

    async def logs(
        self, run: str, *, offset: int | None = None, tail: int | None = None, max_bytes: int = FRAME_BYTES
    ) -> LogChunk:
        """A piece of the run's output, at most FRAME_BYTES: from `offset`, or its last `tail` lines, or from its
        start; `next_offset` says where the next piece begins."""
        result = await self.request("logs", run=run, offset=offset, tail=tail, max_bytes=max_bytes)
        return cast(LogChunk, result)

    async def metrics(
        self, run: str, *, offset: int = 0, points: int | None = None, coarse: bool = False, until: int | None = None
    ) -> MetricsResult:
        """The run's metric rows from `offset`, a frame of them; with `points`, all of them to the end (or to
        `until`) thinned to about that many when there are more (`thinned`), for a chart: sampled if `coarse`,
        else keeping every series' extremes (`backends.runs.metric_view`)."""
        reply = await self.request("metrics", run=run, offset=offset, points=points, coarse=coarse, until=until)
        return cast(MetricsResult, reply)

    async def events(self, run: str, *, offset: int = 0) -> EventsResult:
        """The run's events from `offset`: its phases, health answers and stalls (a timeline's source)."""
        return cast(EventsResult, await self.request("events", run=run, offset=offset))

    async def doctor(
        self,
        draft: str,
        *,
        target: str | None = None,
        data: str | None = None,
        sglang_version: str | None = None,
        context_length: int | None = None,
        dry_load: bool = False,
        sglang_python: str | None = None,
        cwd: str | None = None,
    ) -> DoctorResult:
        result = await self.request(
            "doctor",
            draft=draft,
            target=target,
            data=data,
            sglang_version=sglang_version,
            context_length=context_length,
            dry_load=dry_load,
            sglang_python=sglang_python,
            cwd=cwd,
        )
        return cast(DoctorResult, result)

    async def bench(
        self,
        target: str,
        *,
        prompts: str = "builtin",
        requests: int = 32,
        concurrency: int = 4,
        max_tokens: int = 256,
        api: str = "chat",
        input_len: int = 1024,
        request_rate: float | None = None,
        warmup: int = 1,
        seed: int = 1,
        name: str | None = None,
        cwd: str | None = None,
        launch_id: str | None = None,
    ) -> BenchLaunchResult:
        """A run that benches `target` (a serve run, or a URL) from the host; its result is kept with the serve run."""
        result = await self.request(
            "bench",
            target=target,
            prompts=prompts,
            requests=requests,
            concurrency=concurrency,
            max_tokens=max_tokens,
            api=api,
            input_len=input_len,
            request_rate=request_rate,
            warmup=warmup,
            seed=seed,
            name=name,
            cwd=cwd,
            launch_id=launch_id,
        )
        return cast(BenchLaunchResult, result)

    async def relaunch_presets(self, run: str) -> RelaunchPresetsResult:
        """The relaunch presets spelled for the release that serves the run; when the host cannot say (an older
        run, a link down), the spelling every release accepts."""
        try:
            return cast(RelaunchPresetsResult, await self.request("relaunch_presets", run=run))
        except (AgentError, TransportError):
            from backends import serving  # only here: a command that never relaunches need not import the engine

            return {"version": None, "presets": list(serving.DEFAULT.fallback_presets)}

    async def preflight(
        self, kind: str, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> PreflightResult:
        result = await self.request("preflight", kind=kind, argv=list(argv), cwd=cwd, env=dict(env or {}))
        return cast(PreflightResult, result)

    async def convert(self, src: str, dst: str, *, to: str = "sglang", cwd: str | None = None) -> DoctorResult:
        return cast(DoctorResult, await self.request("convert", src=src, dst=dst, to=to, cwd=cwd))
