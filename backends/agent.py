"""The host agent: `python -m backends.agent [--workdir DIR]`, JSON lines on stdio.

Started per connection (over SSH, or as a local subprocess). It holds no state
the run store does not: subscriptions are offsets the client also knows, so a
client that reconnects to a fresh agent resumes where it stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import backends
from backends import protocol
from backends.bounded import bounded_info, within_budget
from backends.fileio import last_lines_start, read_jsonl
from backends.host import procinfo
from backends.host.gpus import GpuSampler, infer_by_visible_devices
from backends.masking import mask_argv
from backends.protocol import (
    CHILD_ONLY_ENV,
    FRAME_BYTES,
    MAX_LINE_BYTES,
    MIN_INTERVAL_S,
    PROTOCOL_VERSION,
    STREAMS,
    TERMINAL_STATES,
    DoctorResult,
    EventsResult,
    FreeGpusResult,
    GpuInfo,
    HelloResult,
    KillResult,
    LogChunk,
    MetricsResult,
    PreflightResult,
    ProtocolError,
    RelaunchPresetsResult,
    RendezvousResult,
    Request,
    RowsChunk,
    RunInfo,
    RunsResult,
    StacksResult,
    StatusResult,
    SubscribeResult,
    UnsubscribeResult,
)
from backends.runs import control as runctl
from backends.runs import index as runindex
from backends.runs import job, once
from backends.runs.metric_view import MAX_VIEW_POINTS, MIN_VIEW_POINTS, metrics_view
from backends.runs.store import (
    DEFAULT_WORKDIR,
    EVENTS,
    METRICS,
    OUTPUT,
    RUNS,
    RunDir,
    RunNotFound,
    RunStore,
    StoreError,
    record_lost,
)

# What an op alone needs (serving SGLang, doctor, bench, convert, free-gpus) is imported by that op's first request:
# the agent that every command starts answers `status` without them (~180 ms of imports before, issue 28).
if TYPE_CHECKING:
    from backends.host.freegpus import FreePlan

STREAM_FILES = {"log": OUTPUT, "metrics": METRICS, "events": EVENTS}
# Poll fast while data flows, back off when idle (idle CPU vs. streaming lag).
POLL_MIN_S = 0.02
POLL_MAX_S = 0.2
# A quiet run's state (process liveness) is re-derived at most this often.
STATE_CHECK_S = 1.0


def unchanged_before_import(*modules: str) -> None:
    """Before an op's first request imports what only it needs, long after the launcher verified this agent's
    copy: the copy checked unchanged (OpError `agent_altered` otherwise), as before a supervisor imports it anew
    (`backends.runs.control.unchanged_agent`). Nothing to check once they are imported."""
    if not all(module in sys.modules for module in modules):
        runctl.unchanged_agent()


def read_bytes(path: str | Path, offset: int, max_bytes: int) -> bytes:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(max_bytes)
    except FileNotFoundError:
        return b""


def rows_chunk(path: Path, offset: int) -> RowsChunk:
    """A JSON-lines file's object rows from `offset`, at most FRAME_BYTES of them."""
    rows, skipped, next_offset = read_jsonl(path, offset, FRAME_BYTES)
    objects = [r for r in rows if isinstance(r, dict)]
    return {"rows": objects, "skipped": skipped + len(rows) - len(objects), "next_offset": next_offset}


def file_size(path: str | Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def tail_offset(path: Path, lines: int) -> int:
    """Offset where the last `lines` lines of the file begin."""
    size = file_size(path)
    if lines <= 0:
        return size
    with open(path, "rb") as fh:
        return last_lines_start(fh, size, lines)


@dataclass
class RunsPage:
    """What a look at the runs found: the runs to show, how many did not fit in a reply, how many ended runs the
    store holds, and how many of them were not asked for."""

    runs: list[RunInfo]
    omitted: int
    ended_total: int
    hidden: int


@dataclass
class Subscription:
    id: int
    run: RunDir | None
    offsets: dict[str, int]
    gpu_interval: float | None
    next_gpu_at: float = 0.0
    last_state: str | None = None
    next_state_at: float = 0.0
    # Built once: path joins in the poll loop were most of the idle CPU.
    paths: dict[str, str] = field(default_factory=dict)
    ended: bool = False


class Agent:
    def __init__(self, store: RunStore, writer: asyncio.StreamWriter) -> None:
        self.store = store
        self.writer = writer
        self.subs: dict[int, Subscription] = {}
        self.next_sub = 1
        self._sampler: GpuSampler | None = None
        self._poller: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Live run children by pid, refreshed before each GPU sample.
        self._owners: dict[int, str] = {}
        self.cwd = os.getcwd()
        self._looking = asyncio.Lock()
        self._next_look_at = 0.0
        self._lost_recorded: set[str] = set()  # runs this agent recorded as lost

    # ----- plumbing -----
    async def send(self, msg: dict[str, Any], op: str = "") -> None:
        """One message; one that no reader would take (over MAX_LINE_BYTES) is never sent: in its place the
        request (`op`) fails, or the subscription ends, saying why, and the link keeps serving."""
        line = protocol.encode(msg)
        if len(line) > MAX_LINE_BYTES and "sub" in msg:
            if (sub := self.subs.get(msg["sub"])) is not None:
                sub.ended = True
            line = protocol.encode(protocol.too_large_end(msg["sub"], msg["stream"], len(line)))
        elif len(line) > MAX_LINE_BYTES:
            line = protocol.encode(protocol.too_large_reply(msg.get("id"), op, len(line)))
        self.writer.write(line)
        await self.writer.drain()

    @property
    def sampler(self) -> GpuSampler:
        if self._sampler is None:
            self._sampler = GpuSampler(owner_of=self._owner_of)
        return self._sampler

    def _owner_of(self, pid: int) -> str | None:
        return runctl.owner_of(pid, self._owners)

    def gpu_error(self) -> str | None:
        return self.sampler.fallback_reason or self.sampler.last_error

    def sample_gpus(self, live: list[RunDir] | None = None) -> list[GpuInfo]:
        """Every GPU, each process with its run (of `live`, when the caller knows which runs are: else of the store's
        every run); a live run none of whose processes NVML lists (its pids are the host's, inside a container)
        placed by its CUDA_VISIBLE_DEVICES, flagged as inferred. free-gpus samples without this: it acts only on
        processes proven ours."""
        self._owners = runctl.owner_lookup(self.store, live)
        gpus = self.sampler.sample()
        infer_by_visible_devices(gpus, self._owners.values(), self._visible_devices, self.sampler.uuids)
        return gpus

    def _visible_devices(self, runs: Iterable[str]) -> dict[str, str]:
        """Asked only for a live run that NVML lists no process of: it reads the run's environment as its
        supervisor made it (`backends.runs.supervise`, which imports the run's watch)."""
        unchanged_before_import("backends.runs.visible_devices")
        from backends.runs.visible_devices import visible_devices

        return visible_devices(self.store, runs)

    async def serve(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                line = exc.partial  # the last line, without its newline, at EOF
                if not line:
                    break
            except asyncio.LimitOverrunError as exc:
                await self._discard_line(reader, exc.consumed)
                await self.send(protocol.error_reply(None, "too_long", f"request over {MAX_LINE_BYTES} bytes"))
                continue
            if not line.strip():
                continue
            task = asyncio.create_task(self.handle_line(line))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._poller is not None:
            self._poller.cancel()
        # Requests already sent (a kill, a launch) still run to completion.
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _discard_line(self, reader: asyncio.StreamReader, consumed: int) -> None:
        """Drop the rest of an oversized line, up to and including its newline."""
        while True:
            await reader.readexactly(consumed)
            try:
                await reader.readuntil(b"\n")
                return
            except asyncio.LimitOverrunError as exc:
                consumed = exc.consumed
            except asyncio.IncompleteReadError:
                return

    async def handle_line(self, line: bytes) -> None:
        request_id: int | str | None = None
        try:
            request = protocol.parse_request(line)
            request_id = request.id
            result = await self.dispatch(request)
            await self.send(protocol.ok_reply(request.id, result), request.op)
        except ProtocolError as exc:
            reply_id = exc.request_id if exc.request_id is not None else request_id
            await self.send(protocol.error_reply(reply_id, exc.code, exc.message))
        except runctl.OpError as exc:
            await self.send(protocol.error_reply(request_id, exc.code, exc.message, exc.details))
        except RunNotFound as exc:
            await self.send(protocol.error_reply(request_id, "not_found", str(exc)))
        except StoreError as exc:
            await self.send(protocol.error_reply(request_id, "store", str(exc)))
        except Exception as exc:  # a bug must cost one request, never the agent
            await self.send(protocol.error_reply(request_id, "internal", f"{type(exc).__name__}: {exc}"))

    def _noticed(self, run: RunDir, state: str) -> None:
        """Record `lost` for a run found so (`record_lost`): its supervisor, which records every other state, died
        without a word, and no process of the run is left to say it. Reading its state writes nothing: the agent,
        which finds it, records it, once in its life (the store keeps one)."""
        if state == "lost" and run.id not in self._lost_recorded:
            self._lost_recorded.add(run.id)
            record_lost(run)

    async def dispatch(self, request: Request) -> Any:
        handler = getattr(self, f"op_{request.op}")
        return await handler(**request.args)

    # ----- operations -----
    async def op_hello(self) -> HelloResult:
        return {
            "version": PROTOCOL_VERSION,
            "agent": backends.__version__,
            "host": socket.gethostname(),
            "workdir": str(self.store.workdir),
            "pid": os.getpid(),
            "python": sys.version.split()[0],
        }

    def _info(self, run: RunDir) -> RunInfo:
        try:
            info = run.info()
        except Exception as exc:  # whatever one run's files hold costs that run's row, never the status
            info = run.corrupt_info("?", f"cannot be read ({type(exc).__name__}: {exc})")
        self._noticed(run, info["state"])
        return info

    def _runs(self, ended: int | None = None, page: int = 1) -> RunsPage:
        """Every live run and, of the ended ones (newest ended first), page `page` of `ended` runs (None: all), each
        field within its bound, as many as fit in one reply. Only the runs shown are read: the index
        (`backends.runs.index`) knows which runs ended for good, and when."""
        if (ended is not None and ended < 0) or page < 1:
            raise runctl.OpError("bad_args", "a page of ended runs is 0 runs or more, from page 1")
        look = runindex.look(self.store)
        infos: list[RunInfo] = []
        derived: dict[str, RunInfo] = {}  # the ended runs derived in this look
        loose: list[tuple[float, str]] = []  # of them, those not settled
        for run in list(look.unsettled):
            if run.being_created():
                continue
            info = self._info(run)
            if info["state"] not in TERMINAL_STATES:
                infos.append(info)
                continue
            derived[run.id] = info
            if not look.settle(run, info):
                loose.append((runindex.ended_time(run, info), run.id))
        # Of the ended runs, newest ended first: the page asked for, read from its runs' folders.
        last = None if ended is None else page * ended
        ending = sorted([*look.newest(last), *loose], reverse=True)
        shown = ending if ended is None else ending[(page - 1) * ended : page * ended]
        for _, run_id in shown:
            infos.append(derived.get(run_id) or self._info(RunDir(self.store.runs / run_id)))
        look.save()
        infos.sort(key=lambda info: info["id"])
        runs, omitted = within_budget([bounded_info(info) for info in infos])
        total = look.count() + len(loose)
        return RunsPage(runs, omitted, total, total - len(shown))

    @contextlib.asynccontextmanager
    async def _paced_look(self) -> AsyncIterator[None]:
        """One look at every run at a time, each MIN_INTERVAL_S after the last one ended: a client
        that polls in a loop waits here rather than spinning the host's CPU."""
        async with self._looking:
            await asyncio.sleep(self._next_look_at - time.monotonic())
            try:
                yield
            finally:
                self._next_look_at = time.monotonic() + MIN_INTERVAL_S

    async def op_status(self, gpus: bool, ended: int | None, page: int) -> StatusResult:
        async with self._paced_look():
            found = self._runs(ended, page)
            live = [RunDir(self.store.runs / run["id"]) for run in found.runs if run["state"] not in TERMINAL_STATES]
            gpu_list = await asyncio.to_thread(self.sample_gpus, live) if gpus else []
        return {
            "host": socket.gethostname(),
            "gpu_source": self.sampler.source if gpus else "none",
            "gpu_error": self.gpu_error() if gpus else None,
            "runs": found.runs,
            "gpus": gpu_list,
            "omitted": found.omitted,
            "ended_total": found.ended_total,
            "hidden": found.hidden,
        }

    async def op_list_runs(self) -> RunsResult:
        async with self._paced_look():
            found = self._runs()
        return {"runs": found.runs, "omitted": found.omitted}

    async def op_run_info(self, run: str) -> RunInfo:
        """One run whole: every field that `status` cuts to keep its reply bounded."""
        rundir = self.store.get(run)
        info = rundir.info()
        self._noticed(rundir, info["state"])
        return info

    async def op_launch(
        self,
        kind: str,
        argv: list[Any],
        name: str | None,
        env: dict[str, Any],
        cwd: str | None,
        gpus: list[Any],
        health_url: str | None,
        metrics_url: str | None,
        sglang_python: str | None,
        stall_after: float | None,
        module: str | None,
        python: str | None,
        nproc: int | None,
        metrics_from: str | None,
        force: bool,
        job: str | None,
        node_rank: int | None,
        nnodes: int | None,
        rendezvous: str | None,
        launch_id: str | None,
    ) -> dict[str, Any]:
        async def start() -> dict[str, Any]:
            spec = runctl.checked_spec(
                self.cwd,
                kind=kind,
                argv=argv,
                name=name,
                env=env,
                cwd=cwd,
                gpus=gpus,
                health_url=health_url,
                metrics_url=metrics_url,
                sglang_python=sglang_python,
                stall_after=stall_after,
                module=module,
                python=python,
                nproc=nproc,
                metrics_from=metrics_from,
                job=job,
                node_rank=node_rank,
                nnodes=nnodes,
                rendezvous=rendezvous,
                launch_id=launch_id,
            )
            unchanged_before_import("backends.runs.preflight")  # the gate's
            checked = await asyncio.to_thread(runctl.gate, spec, force)
            return await asyncio.to_thread(runctl.launch, self.store, spec, checked)

        return await self._once(launch_id, start, lambda _run: {})

    async def _once(
        self,
        launch_id: str | None,
        start: Callable[[], Awaitable[dict[str, Any]]],
        asked_again: Callable[[RunDir], dict[str, Any]],
    ) -> dict[str, Any]:
        """`start`, unless the launch named `launch_id` was asked for before: then the run it started, as
        `asked_again` tells it (`backends.runs.once`)."""
        if launch_id is None:
            return await start()
        earlier = await asyncio.to_thread(once.claim, self.store, launch_id)
        if earlier is not None:
            return {**asked_again(earlier), **once.again(earlier), "again": True}
        try:
            result = await start()
        except BaseException:
            await asyncio.to_thread(once.release, self.store, launch_id)
            raise
        await asyncio.to_thread(once.done, self.store, launch_id, result["run"])
        return result

    async def op_rendezvous(self) -> RendezvousResult:
        """Where a job's other nodes meet this one (node 0): this host's address as the console reached it."""
        return {"address": job.reachable_address(os.environ.get("SSH_CONNECTION")), "port": job.free_port()}

    def _path(self, value: str, cwd: str | None) -> Path:
        return Path(cwd or self.cwd) / Path(value).expanduser()

    async def op_doctor(
        self,
        draft: str,
        target: str | None,
        data: str | None,
        sglang_version: str | None,
        context_length: int | None,
        dry_load: bool,
        sglang_python: str | None,
        cwd: str | None,
    ) -> DoctorResult:
        unchanged_before_import("backends.doctor.full")
        from backends.doctor.full import full_diagnosis

        if sglang_python is not None and os.sep in sglang_python:  # a bare name is looked up on PATH
            sglang_python = str(self._path(sglang_python, cwd))
        return await asyncio.to_thread(
            full_diagnosis,
            self._path(draft, cwd),
            target=self._path(target, cwd) if target else None,
            data=self._path(data, cwd) if data else None,
            sglang_version=sglang_version,
            context_length=context_length,
            dry_load=dry_load,
            sglang_python=sglang_python,
        )

    async def op_bench(
        self,
        target: str,
        prompts: str,
        requests: int,
        concurrency: int,
        max_tokens: int,
        api: str,
        input_len: int,
        request_rate: float | None,
        warmup: int,
        seed: int,
        name: str | None,
        cwd: str | None,
        launch_id: str | None,
    ) -> protocol.BenchLaunchResult:
        """A run that benches a serve run (or a URL): its result goes beside the serve run (or into its own folder)."""
        unchanged_before_import("backends.bench.cli")
        from backends.bench import cli as bench
        from backends.bench.stream import BenchError

        async def start() -> dict[str, Any]:
            try:
                spec, served = bench.bench_spec(
                    self.store,
                    target,
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
                    cwd=cwd or self.cwd,
                )
            except ValueError as exc:
                raise runctl.OpError("bad_args", str(exc)) from None
            except BenchError as exc:
                raise runctl.OpError("bench_refused", str(exc)) from None
            spec.launch_id = launch_id
            launched = await asyncio.to_thread(runctl.launch, self.store, spec)
            return {**launched, "served_run": served}

        def served(run: RunDir) -> dict[str, Any]:
            argv = run.trusted_spec().argv
            path = argv[argv.index("--served-run") + 1] if "--served-run" in argv[:-1] else None
            return {"served_run": Path(path).name if path else None}

        return cast(protocol.BenchLaunchResult, await self._once(launch_id, start, served))

    async def op_relaunch_presets(self, run: str) -> RelaunchPresetsResult:
        """The relaunch presets spelled for the release that serves the run (its flags' verdict is usually cached)."""
        unchanged_before_import("backends.serving")
        from backends import serving

        spec = self.store.get(run).trusted_spec()
        if spec.kind in ("train", "extract"):  # a serving engine's flags mean nothing to our stages
            return {"version": None, "presets": []}
        engine, found = serving.serve_launch(spec.argv, spec.env, spec.sglang_python)
        return await asyncio.to_thread(engine.relaunch_presets, found, spec.env, spec.cwd)

    async def op_preflight(self, kind: str, argv: list[Any], cwd: str | None, env: dict[str, Any]) -> PreflightResult:
        unchanged_before_import("backends.runs.preflight")
        from backends.runs import preflight

        if not all(isinstance(a, str) for a in argv):
            raise runctl.OpError("bad_args", "argv must be a list of strings")
        if not all(isinstance(v, str) for v in env.values()):
            raise runctl.OpError("bad_args", "env values must be strings")
        return await asyncio.to_thread(preflight.check_launch, kind, argv, cwd or self.cwd, env)

    async def op_convert(self, src: str, dst: str, to: str, cwd: str | None) -> DoctorResult:
        unchanged_before_import("backends.doctor.convert")
        from backends.doctor.convert import ConvertError, convert

        try:
            return await asyncio.to_thread(convert, self._path(src, cwd), self._path(dst, cwd), to)
        except ConvertError as exc:
            raise runctl.OpError("convert_refused", f"convert refused: {exc}") from None

    async def op_stacks(self, run: str, now: bool) -> StacksResult:
        unchanged_before_import("backends.runs.watch")  # runctl.stacks's
        return await asyncio.to_thread(runctl.stacks, self.store.get(run), now)

    async def op_kill(self, run: str, signal: str, grace: float) -> KillResult:
        return await asyncio.to_thread(runctl.kill, self.store.get(run), signal, grace)

    async def op_relaunch(
        self,
        run: str,
        set: list[str],
        unset: list[str],
        grace: float,
        force: bool,
        dry_run: bool,
        launch_id: str | None,
    ) -> Any:
        async def start() -> dict[str, Any]:
            return await asyncio.to_thread(
                runctl.relaunch, self.store, run, set, unset, grace, force, dry_run, launch_id
            )

        def copied(child: RunDir) -> dict[str, Any]:
            spec = child.trusted_spec()
            return {"parent": spec.parent, "argv": mask_argv(spec.argv), "stopped_parent": None}

        return await (start() if dry_run else self._once(launch_id, start, copied))

    async def op_free_gpus(self, gpus: list[int] | None, dry_run: bool, timeout: float, grace: float) -> FreeGpusResult:
        unchanged_before_import("backends.host.freegpus", "backends.runs.holders")
        from backends.host.freegpus import free_gpus
        from backends.runs.holders import RunHolders

        self._owners = runctl.owner_lookup(self.store)

        def free() -> FreeGpusResult:
            holders = RunHolders(self.store)  # which run each process is part of, proven by its store's record
            return free_gpus(self.sampler, gpus, dry_run, timeout, grace, self._record_free, holders)

        return await asyncio.to_thread(free)

    def _record_free(self, plan: FreePlan) -> None:
        """A run whose processes free-gpus is about to stop shows as killed, not failed: in its own store, this
        one or another workdir's."""
        by_run: dict[Path, list[int]] = {}
        for planned in plan.processes:
            if planned.skip is None and planned.process["run_id"] and planned.holder in ("run", "other_store"):
                workdir = self.store.workdir if planned.workdir is None else Path(planned.workdir)
                folder = workdir / RUNS / planned.process["run_id"]
                by_run.setdefault(folder, []).append(planned.process["pid"])
        for folder, pids in by_run.items():
            try:
                RunDir(folder).append_event("signal", signal="TERM", pids=sorted(pids), by="free-gpus")
            except OSError:
                if folder.parent == self.store.runs:
                    raise
                # Another store that cannot be written (read-only, gone): the kill goes on, unrecorded there.

    async def op_logs(self, run: str, offset: int | None, tail: int | None, max_bytes: int) -> LogChunk:
        rundir = self.store.get(run)
        path = rundir.file(OUTPUT)
        try:
            size = os.stat(path).st_size
            if offset is None:
                offset = tail_offset(path, tail) if tail is not None else 0
        except FileNotFoundError:
            raise runctl.OpError("no_output", f"run {rundir.id} has no {OUTPUT} (removed?)") from None
        data = read_bytes(path, offset, min(max_bytes, FRAME_BYTES))
        state = rundir.state()
        self._noticed(rundir, state)
        return {
            "offset": offset,
            "next_offset": offset + len(data),
            "size": size,
            "data_b64": base64.b64encode(data).decode(),
            "state": state,
        }

    async def op_metrics(
        self, run: str, offset: int, points: int | None, coarse: bool, until: int | None
    ) -> MetricsResult:
        path = self.store.get(run).file(METRICS)
        if points is not None:
            if not MIN_VIEW_POINTS <= points <= MAX_VIEW_POINTS:
                raise runctl.OpError("bad_args", f"points must be {MIN_VIEW_POINTS} to {MAX_VIEW_POINTS}, not {points}")
            # a pass over the whole history: off the loop, so the streams of others go on meanwhile
            view = await asyncio.to_thread(metrics_view, path, offset, points, coarse=coarse, until=until)
            if view is not None:
                return view
        return {**rows_chunk(path, offset), "thinned": False}

    async def op_events(self, run: str, offset: int) -> EventsResult:
        return rows_chunk(self.store.get(run).file(EVENTS), offset)

    async def op_subscribe(
        self, run: str | None, offsets: dict[str, Any], gpu_interval: float | None
    ) -> SubscribeResult:
        rundir = self.store.get(run) if run is not None else None
        bad = [k for k, v in offsets.items() if k not in STREAMS or not isinstance(v, int) or v < 0]
        if bad:
            raise runctl.OpError("bad_args", f"offsets: unknown stream or bad offset for {', '.join(bad)}")
        if gpu_interval is not None and gpu_interval < MIN_INTERVAL_S:
            raise runctl.OpError("bad_args", f"gpu_interval must be at least {MIN_INTERVAL_S} s")
        sub = Subscription(
            id=self.next_sub,
            run=rundir,
            offsets={name: offsets.get(name, 0) for name in STREAMS} if rundir else {},
            gpu_interval=gpu_interval,
            paths={name: str(rundir.file(f)) for name, f in STREAM_FILES.items()} if rundir else {},
        )
        self.next_sub += 1
        self.subs[sub.id] = sub
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self.poll_loop())
        return {"sub": sub.id, "run": rundir.id if rundir else None}

    async def op_unsubscribe(self, sub: int) -> UnsubscribeResult:
        if self.subs.pop(sub, None) is None:
            raise runctl.OpError("not_found", f"no subscription {sub}")
        return {"sub": sub}

    # ----- streaming -----
    async def poll_loop(self) -> None:
        """One pass over every subscription per tick: again at once while data flows,
        backing off to POLL_MAX_S while all are quiet (one wake-up for all of them)."""
        pause = POLL_MIN_S
        while self.subs:
            now = time.monotonic()
            moved = False
            for sub in list(self.subs.values()):
                try:
                    moved |= await self.poll_sub(sub, now)
                except Exception as exc:  # what one subscription meets ends it, never the others' streams
                    whose = f"run {sub.run.id}: its" if sub.run else "the GPU"
                    await self.end(sub, sub.last_state, f"{whose} stream stopped: {type(exc).__name__}: {exc}")
                if sub.ended:
                    self.subs.pop(sub.id, None)
            pause = POLL_MIN_S if moved else min(POLL_MAX_S, pause * 2)
            await asyncio.sleep(0 if moved else pause)

    async def poll_sub(self, sub: Subscription, now: float) -> bool:
        moved = False
        if sub.gpu_interval is not None and now >= sub.next_gpu_at:
            sub.next_gpu_at = now + sub.gpu_interval
            gpus = await asyncio.to_thread(self.sample_gpus)
            await self.send(
                protocol.stream_message(
                    sub.id,
                    "gpus",
                    {"t": time.time(), "source": self.sampler.source, "error": self.gpu_error(), "gpus": gpus},
                )
            )
        if sub.run is None:
            return moved
        for stream, path in sub.paths.items():
            moved |= await self.pump(sub, stream, path)
        if not moved and now < sub.next_state_at:
            return False
        sub.next_state_at = now + STATE_CHECK_S
        if not sub.run.path.is_dir():
            await self.end(
                sub, sub.last_state, f"run {sub.run.id}: its folder {sub.run.path} is gone; nothing more will come"
            )
            return moved
        state = sub.run.state()
        self._noticed(sub.run, state)
        if state != sub.last_state:
            sub.last_state = state
            await self.send(protocol.stream_message(sub.id, "state", {"run": sub.run.id, "state": state}))
            if state == "corrupt":
                return moved  # look once more before the end: a folder being removed is corrupt for a moment
        if state in TERMINAL_STATES and not moved:
            # Everything written before the end has been delivered: say so once.
            info = sub.run.info() if state in ("corrupt", "failed") else None
            corrupt = info["corrupt"] if info is not None else None
            why = f"run {sub.run.id} is corrupt: {corrupt['file']}: {corrupt['reason']}" if corrupt else None
            await self.end(sub, state, why, info.get("failure") if info is not None else None)
        return moved

    async def end(
        self, sub: Subscription, state: str | None, error: str | None = None, failure: str | None = None
    ) -> None:
        """The subscription's last message: the run's state, `failure` (why a failed run failed), and `error` when
        the run did not simply end."""
        sub.ended = True
        body: dict[str, Any] = {"run": sub.run.id if sub.run else None, "state": state, "offsets": sub.offsets}
        if failure is not None:
            body["failure"] = failure
        if error is not None:
            body["error"] = error
        await self.send(protocol.stream_message(sub.id, "end", body))

    async def pump(self, sub: Subscription, stream: str, path: str) -> bool:
        offset = sub.offsets[stream]
        if file_size(path) <= offset:
            return False
        assert sub.run is not None
        if stream == "log":
            data = read_bytes(path, offset, FRAME_BYTES)
            sub.offsets[stream] = offset + len(data)
            body = {
                "run": sub.run.id,
                "offset": offset,
                "next_offset": offset + len(data),
                "data_b64": base64.b64encode(data).decode(),
            }
        else:
            rows, skipped, next_offset = read_jsonl(path, offset, FRAME_BYTES)
            if next_offset == offset:
                return False  # only a half-written line so far
            sub.offsets[stream] = next_offset
            body = {"run": sub.run.id, "offset": offset, "next_offset": next_offset, "rows": rows, "skipped": skipped}
        await self.send(protocol.stream_message(sub.id, stream, body))
        return True


async def run_agent(workdir: Path) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, proto = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout)
    writer = asyncio.StreamWriter(transport, proto, None, loop)
    store = RunStore(workdir)
    runindex.sweep_leftovers(store)
    agent = Agent(store, writer)
    try:
        await agent.serve(reader)
    finally:
        with contextlib.suppress(Exception):
            await writer.drain()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.agent", description=__doc__)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="run store folder (default %(default)s)")
    # Given by the console's launcher to an uploaded copy: what it verified, checked again before each supervisor.
    parser.add_argument("--manifest-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.manifest_fd is not None:
            from backends import shipped

            shipped.adopt(args.manifest_fd)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"agent: cannot read what the launcher verified: {exc}", file=sys.stderr)
        return 1
    try:
        RunStore(args.workdir).secure()
    except StoreError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 1
    try:
        asyncio.run(run_agent(args.workdir))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    procinfo.restart_without(CHILD_ONLY_ENV)  # an agent started from inside a run is not that run's
    sys.exit(main())
