"""A run's watch, kept by its supervisor whether or not a console is connected.

Every second it reads the new output (phases, failures, and for a server its
decode figures as metric rows: accept length, throughput; the serving engine's reader, `backends.serving`), polls
the health URL of a serve run, and while that server is healthy scrapes its own metrics endpoint every
METRICS_EVERY_S when its command turns it on (SGLang's --enable-metrics): once the endpoint answers, its rows
replace the decode lines' figures, which stay the fallback for a server without one. It also samples what the
run's processes do (CPU
time from /proc, GPU utilisation of the GPUs they hold). A run whose output has
been silent for `stall_after` seconds while every one of its processes and GPUs
sits idle, or while its GPUs are held by a kernel that does no work (a rank
spinning in an NCCL collective that waits for a peer), is `stalled`: the stall
is recorded with the phase it stopped in and how it sits still, and
every process's stack is dumped into `stacks/` at once (py-spy when it is
installed, else what /proc tells). A healthy server (health 200, or SGLang's
ready line when there is no URL) is `ready` and idle by right, so it is never
called stalled. Output or activity after a stall is recorded as a resume.

The watch's verdict is `watch.json` in the run folder (state, phase, health,
stall), written atomically on every change; its events go to events.jsonl.
When the run ends, a run killed by a signal we did not send, with no failure
recognised, is diagnosed (its reader's `crash_diagnosis`) before exit.json is written;
the supervisor asks the same reader why the run failed (`failure_reason`); and
watch.json's state becomes the run's final one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from backends import serving, shipped
from backends.fileio import append_jsonl, atomic_write_bytes, atomic_write_json, private_dir
from backends.host import diskspace, procinfo
from backends.host.gpus import GpuSampler
from backends.masking import mask_text, mask_values
from backends.protocol import Diagnosis, Metric, StalledProcess
from backends.runs import stalled
from backends.runs.store import METRICS, OUTPUT, STACKS, WATCH, CorruptFile, RunDir, RunSpec, SpecError, signalled_by_us

if TYPE_CHECKING:
    import httpx

TICK_S = 1.0
READ_MAX = 16 * 1024 * 1024  # output read per tick; a flood is caught up over the next ticks
ACTIVITY_EVERY_S = 2.0
HEALTH_EVERY_S = 2.0
HEALTH_TIMEOUT_S = 5.0
METRICS_EVERY_S = 5.0
DEFAULT_STALL_AFTER_S = 30.0
WATCHED_KINDS = ("serve", "extract", "train")  # stall-watched by default; `command` runs when asked
IDLE_CPU_PERCENT = 5.0  # per process, over the silent window
IDLE_GPU_PERCENT = 5
# A kernel that never ends and does no work: on the H200 (benchmarks/spin_signature.py) a spin
# reads 100% utilisation with 0% memory utilisation, where real work moves memory (bf16 matmuls
# 23%, a copy 100%). Back-to-back tiny kernels read the same, so it also takes silent output.
SPIN_GPU_PERCENT = 90
SPIN_MEM_PERCENT = 1
HEALTH_LOST_AFTER = 3  # failed polls in a row before a ready server is no longer ready
STACK_TIMEOUT_S = 20.0
CLOCK_TICKS = 100  # os.sysconf("SC_CLK_TCK") on Linux


def stall_window(spec: RunSpec) -> float | None:
    """Seconds of silent idleness that make the run stalled; None: not watched for stalls."""
    if spec.stall_after is not None:
        return spec.stall_after
    if spec.kind == "serve" and spec.job is not None and spec.job["node_rank"] > 0 and health_url(spec) is None:
        return None  # a follower node serves no HTTP and is silent by design while it serves: node 0 speaks for it
    return DEFAULT_STALL_AFTER_S if spec.kind in WATCHED_KINDS else None


def silent_by_design(spec: RunSpec) -> bool:
    """A training or extraction node of rank >= 1 of a job: its torchrun ranks print nothing (global rank 0 speaks,
    on node 0) and sit idle whenever they wait for node 0, so neither its silence nor its idleness tells a hang.
    Only a hang of its own makes it stalled: a process stopped, or GPUs held by kernels that do no work; while
    node 0 runs, the job runs (node 0's watch speaks for it)."""
    return spec.kind in ("train", "extract") and spec.job is not None and spec.job["node_rank"] > 0


def own_hang(kind: str | None, pids: list[int]) -> str | None:
    """Of a node silent by design: the way it sits still when that is a hang of its own (spinning, or idle with a
    process stopped), else None."""
    if kind == "idle" and not any((stat := procinfo.read_stat(pid)) and stat.state == "T" for pid in pids):
        return None
    return kind


def health_url(spec: RunSpec) -> str | None:
    """The URL to poll: the one given (any command), else the serving engine's health URL for a serve command,
    as the host reaches it."""
    if spec.health_url is not None:
        return spec.health_url
    return serving.health_url(spec.argv, spec.env) if spec.kind == "serve" else None


def server_metrics(spec: RunSpec, url: str | None) -> tuple[str, serving.ServerMetrics] | None:
    """The server's metrics endpoint and its reader: the one given (any command), else the serving engine's
    beside the health URL when the command turns it on."""
    if spec.metrics_url is not None:
        engine = serving.engine_for(spec.argv) or serving.DEFAULT
        return spec.metrics_url, engine.server_metrics()
    return serving.server_metrics(spec.argv, url, spec.env) if spec.kind == "serve" and url else None


def unwatched(spec: RunSpec, url: str | None) -> str | None:
    """What the watch cannot do for a serve run, said once at its start with the option that makes it work:
    no health URL (a wrapper, a container port not published: no /metrics beside it either)."""
    if spec.kind != "serve" or (spec.job is not None and spec.job["node_rank"] > 0):
        return None
    where = (found := serving.serve_launch(spec.argv, spec.env, spec.sglang_python)[1]).describe()
    if url is None:
        why = "its flags are not on the command line"
        if found.container is not None and found.flags is not None:
            why = f"the server's port is not published by {found.container.runtime} run (-p HOST:CONTAINER)"
        return (
            f"no health poll for {where}: {why}; the server's ready line is read instead "
            "(give --health-url URL, and --metrics-url URL for its metrics)"
        )
    return None


@functools.cache
def httpx_missing() -> str | None:
    """Why httpx cannot be imported (an agent host without its dependencies: health polls and server metrics are
    off, said once), or None. Asked only for a run with a URL to poll: importing httpx is 60-130 ms of every
    supervisor's and agent's start, and most runs poll nothing."""
    try:
        import httpx  # noqa: F401
    except ImportError as exc:
        return f"httpx is not installed ({exc})"
    return None


def poll_health(client: httpx.Client, url: str) -> str:
    """`ok` (200), `http NNN`, `refused` (not listening yet) or `error: ...`."""
    import httpx

    if not url.startswith(("http://", "https://")):
        return f"error: {url} is not an http(s) URL"
    try:
        reply = client.get(url)
    except httpx.HTTPError as exc:
        return "refused" if refused(exc) else f"error: {exc}"
    return "ok" if reply.status_code == 200 else f"http {reply.status_code}"


def refused(exc: BaseException) -> bool:
    """Whether the connection was refused (httpx wraps the OSError twice: httpx's error, then httpcore's)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass(frozen=True)
class GpuLoad:
    """What NVML says one GPU did over its last sampling period."""

    util: int | None  # % of time a kernel ran
    mem_util: int | None  # % of time memory was read or written
    pids: frozenset[int] = frozenset()  # the run's processes on it

    @property
    def idle(self) -> bool:
        return self.util is None or self.util < IDLE_GPU_PERCENT

    @property
    def spinning(self) -> bool:
        """A kernel resident all the time that moves no memory: waiting, not working."""
        return (self.util or 0) >= SPIN_GPU_PERCENT and self.mem_util is not None and self.mem_util <= SPIN_MEM_PERCENT


@dataclass
class Activity:
    """One sample of what the run's processes do."""

    at: float
    cpu_ticks: dict[int, int]  # pid -> user+system ticks so far
    gpus: dict[int, GpuLoad]  # GPU index -> its load, for GPUs holding a run process


def busiest_cpu_percent(old: Activity, new: Activity, leaving_out: frozenset[int] = frozenset()) -> float:
    """The highest CPU use of one process between two samples, in percent of one core."""
    seconds = max(new.at - old.at, 1e-6)
    deltas = [new.cpu_ticks[pid] - old.cpu_ticks.get(pid, 0) for pid in new.cpu_ticks if pid not in leaving_out]
    return 100.0 * max(deltas, default=0) / CLOCK_TICKS / seconds


def sitting_still(samples: list[Activity]) -> str | None:
    """How the run sat still across the samples: "idle" (no process used the CPU, no GPU of the
    run was busy), "spinning" (its GPUs held by kernels that do no work, and every process not
    waiting on such a kernel idle: the waiting ones spin on the CPU too), or None when it worked.
    A rank busy on the CPU while the others wait (a slow data loader) is work, not a hang."""
    first, last = samples[0], samples[-1]
    loads = [load for sample in samples for load in sample.gpus.values()]
    if all(load.idle for load in loads) and busiest_cpu_percent(first, last) < IDLE_CPU_PERCENT:
        return "idle"
    spun = all(any(load.spinning for load in sample.gpus.values()) for sample in samples)
    if not spun or not all(load.idle or load.spinning for load in loads):
        return None
    waiting = frozenset(pid for load in loads if load.spinning for pid in load.pids)
    return "spinning" if busiest_cpu_percent(first, last, leaving_out=waiting) < IDLE_CPU_PERCENT else None


@dataclass
class Watch:
    """The watch's verdict on the run (what `watch.json` holds)."""

    state: str = "running"  # running | ready | stalled; once the run ended, its final state (exited | failed | killed)
    phase: str | None = None
    health: str | None = None
    stalled_since: float | None = None
    stall_kind: str | None = None  # idle | spinning
    stalled_processes: list[StalledProcess] = field(default_factory=list)  # while stalled: who sits where
    stack_dumps: list[str] = field(default_factory=list)
    diagnoses: list[Diagnosis] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "state": self.state,
            "phase": self.phase,
            "health": self.health,
            "stalled_since": self.stalled_since,
            "stall_kind": self.stall_kind,
            "stalled_processes": self.stalled_processes,
            "stack_dumps": self.stack_dumps,
            "diagnoses": self.diagnoses,
        }


class RunWatcher:
    """The supervisor's watch over its child (a thread; `stop` ends it)."""

    def __init__(self, run: RunDir, spec: RunSpec, sampler: GpuSampler | None) -> None:
        self.run = run
        self.sampler = sampler
        self.window = stall_window(spec)
        self.by_design = silent_by_design(spec)
        self.url = health_url(spec)
        self.serving = spec.kind == "serve"
        self.client: httpx.Client | None = None  # made in the watch's thread at its first poll
        # The server's own metrics endpoint and its reader, when the command turns it on.
        self.metrics = server_metrics(spec, self.url)
        self.unwatched = unwatched(spec, self.url)
        self.scraped = False  # the endpoint answered: the output's figures of the same names are not written
        self.last_scrape = 0.0
        self.metrics_problem: str | None = None  # the last one recorded, so that each is said once
        self.reader = (serving.engine_for(spec.argv) or serving.DEFAULT).output_reader()
        self.watch = Watch()
        self.offset = 0
        self.last_output = time.monotonic()
        self.last_health = 0.0
        self.last_activity = 0.0
        self.failed_polls = 0
        self.samples: deque[Activity] = deque()
        self.disk_full: str | None = None  # what the first full-disk error said, for the run's exit record
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="run-watch", daemon=True)

    def start(self) -> None:
        if self.url is not None and (missing := httpx_missing()) is not None:
            off = f"health polls and server metrics are off: {missing}; the server's ready line is read instead"
            self.url = None
        elif self.metrics is not None and (missing := self.metrics[1].unavailable()) is not None:
            off = f"server metrics are off: {missing}; the output's decode figures are read instead"
        else:
            off = None
        if off is not None:
            self.metrics = None
            with contextlib.suppress(OSError):  # a full disk is noticed at the first tick
                self._metrics_problem(f"{off} (install it beside the agent)")
        if self.unwatched is not None:
            with contextlib.suppress(OSError):
                self.run.append_event("unwatched", message=self.unwatched)
        self._thread.start()
        try:
            self._save()
        except OSError as exc:
            self._failed(exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.client is not None:
            self.client.close()
        self._read_output()  # the last lines before the exit still count (a failure printed as it died)

    def explain_exit(self, returncode: int) -> None:
        """Before exit.json is written (whoever sees the end finds it explained): a run of any kind killed by a
        signal, with no failure recognised that names its cause, gets a `crashed` diagnosis; not one we signalled."""
        try:
            if signalled_by_us(self.run):
                return
        except CorruptFile:  # the run is `corrupt`, with that file's reason: nothing more to say here
            return
        found = self.reader.crash_diagnosis(returncode)
        if found is not None:
            self._diagnosed(found)
            self._save()

    def settle(self, state: str) -> None:
        """After exit.json: the watch's verdict is the run's final state, not the last one it watched."""
        self.watch.state = state
        self._save()

    def _loop(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.tick(time.monotonic())
            except Exception as exc:  # a full disk or an odd /proc must not end the watch: say so, keep watching
                self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        if diskspace.is_full(exc) and self.disk_full is None:
            self.disk_full = diskspace.no_space_message(self.run.path)
        with contextlib.suppress(OSError):  # the log may sit on the full disk too
            traceback.print_exception(exc, file=sys.stderr)

    def tick(self, now: float) -> None:
        if self.disk_full is None:
            self.disk_full = diskspace.full_now(self.run.path)
            if self.disk_full is not None:
                self.run.append_event("disk_full", message=self.disk_full)
        if self._read_output():
            self.last_output = now
            if self.watch.state == "stalled":
                self._resume("output")
        if self.url is not None and now - self.last_health >= HEALTH_EVERY_S:
            self.last_health = now
            self._health(now)
        serving_now = self.watch.health == "ok" or (self.url is None and self.watch.state == "ready")
        if self.metrics is not None and serving_now and now - self.last_scrape >= METRICS_EVERY_S:
            self.last_scrape = now
            self._scrape(*self.metrics)
        if self.window is not None and self.watch.state != "ready" and now - self.last_activity >= ACTIVITY_EVERY_S:
            self.last_activity = now
            self._activity(now)

    def _read_output(self) -> bool:
        try:
            with open(self.run.file(OUTPUT), "rb") as log:
                if os.fstat(log.fileno()).st_size < self.offset:
                    self.offset = 0  # the log was truncated by hand: read it again from the start
                log.seek(self.offset)
                data = log.read(READ_MAX)
        except OSError:
            return False
        if not data:
            return False
        self.offset += len(data)
        events = self.reader.feed(data)
        for event in events:
            if event.kind == "decode":
                values = self._decode_figures(event.values)
                if self.serving and values:  # a server's decode figures are its metric rows (accept length, ...)
                    append_jsonl(self.run.file(METRICS), {Metric.TIME: round(time.time(), 3), **values})
            elif event.kind == "phase":
                self.run.append_event("phase", phase=event.name, line=event.line)
            else:
                self._diagnosed(self.reader.diagnosis(event.name, event.line))
        if events or self.reader.where() != self.watch.phase:
            self.watch.phase = self.reader.where()
            self._save()
        if self.url is None and self.reader.phase == "ready" and self.watch.state != "ready":
            self._set_state("ready")
        return True

    def _decode_figures(self, values: dict[str, float]) -> dict[str, float]:
        """The output's figures, less those the server's own metrics endpoint gives once it answers."""
        if self.scraped and self.metrics is not None:
            return {name: value for name, value in values.items() if name not in self.metrics[1].names}
        return values

    def _diagnosed(self, found: Diagnosis) -> None:
        self.run.append_event("diagnosis", **found)
        self.watch.diagnoses.append(found)

    def _http(self) -> httpx.Client:
        import httpx

        if self.client is None:
            # Redirects followed, as urllib did: a health URL behind one still answers.
            self.client = httpx.Client(timeout=HEALTH_TIMEOUT_S, follow_redirects=True)
        return self.client

    def _scrape(self, url: str, reader: serving.ServerMetrics) -> None:
        """One scrape of the server's metrics endpoint: its row, or, said once, why there is none."""
        import httpx

        try:
            reply = self._http().get(url)
        except httpx.HTTPError as exc:
            self.scraped = False
            self._metrics_problem(f"cannot read {url}: {exc}; the output's decode figures are read instead")
            return
        if reply.status_code != 200:
            self.scraped = False
            self._metrics_problem(
                f"{url} answered {reply.status_code} (a server without metrics?); the output's decode figures "
                "are read instead"
            )
            return
        self.scraped = True
        row = reader.row(reply.text)
        if row:  # none before the server's first batch
            append_jsonl(self.run.file(METRICS), {Metric.TIME: round(time.time(), 3), **row})

    def _metrics_problem(self, message: str) -> None:
        if message != self.metrics_problem:
            self.metrics_problem = message
            self.run.append_event("metrics_error", source="server", error=message)

    def _health(self, now: float) -> None:
        status = poll_health(self._http(), self.url or "")
        if status != self.watch.health:
            self.run.append_event("health", status=status)
            self.watch.health = status
            self._save()
        if status == "ok":
            self.failed_polls = 0
            if self.watch.state != "ready":
                self._set_state("ready")
        elif self.watch.state == "ready":
            self.failed_polls += 1
            if self.failed_polls >= HEALTH_LOST_AFTER:
                self.last_output = now  # the stall clock starts when the server stopped being healthy
                self.samples.clear()
                self._set_state("running")

    def _activity(self, now: float) -> None:
        stats = procinfo.live_stats()
        members = self.run.processes(stats)
        sample = Activity(now, {s.pid: s.cpu_ticks for s in stats if s.pid in members}, self._gpu_loads(members))
        self.samples.append(sample)
        assert self.window is not None
        while len(self.samples) > 2 and self.samples[1].at <= now - self.window:
            self.samples.popleft()
        if self.watch.state == "stalled":
            if len(self.samples) >= 2 and sitting_still([self.samples[-2], sample]) is None:
                self._resume("activity")
            return
        silent = now - self.last_output
        window = list(self.samples)
        if silent >= self.window and now - window[0].at >= self.window * 0.8:
            kind = sitting_still(window)
            if self.by_design:
                kind = own_hang(kind, sorted(members))
            if kind is not None:
                self._stalled(kind, silent, busiest_cpu_percent(window[0], sample), sample, members)

    def _gpu_loads(self, members: dict[int, procinfo.ProcIdentity]) -> dict[int, GpuLoad]:
        if self.sampler is None:
            return {}
        return {
            gpu["index"]: GpuLoad(gpu["util"], gpu["mem_util"], frozenset(mine))
            for gpu in self.sampler.sample()
            if (mine := [p["pid"] for p in gpu["processes"] if p["pid"] in members])
        }

    def _stalled(
        self, kind: str, silent: float, cpu: float, sample: Activity, members: dict[int, procinfo.ProcIdentity]
    ) -> None:
        # The stacks come first, so that whoever sees `stalled` finds them already there.
        found = stalled.before_dump(sorted(members))
        dump = dump_stacks(self.run, sorted(members))
        self.watch.stalled_processes = stalled.with_places(found, dump.read_text(errors="replace"))
        self.watch.stalled_since = time.time() - silent
        self.watch.stall_kind = kind
        self.watch.stack_dumps.append(dump.name)
        self.run.append_event(
            "stalled",
            kind=kind,
            phase=self.watch.phase,
            silent_s=round(silent, 1),
            cpu_percent=round(cpu, 1),
            gpu_util={str(k): v.util for k, v in sample.gpus.items()},
            gpu_mem_util={str(k): v.mem_util for k, v in sample.gpus.items()},
        )
        self.run.append_event("stacks", file=f"{STACKS}/{dump.name}", pids=sorted(members))
        self._set_state("stalled")

    def _resume(self, why: str) -> None:
        since = self.watch.stalled_since
        self.run.append_event("resumed", by=why, stalled_s=round(time.time() - since, 1) if since else None)
        self.watch.stalled_since = None
        self.watch.stall_kind = None
        self.watch.stalled_processes = []
        self.samples.clear()
        self._set_state("ready" if self.watch.health == "ok" else "running")

    def _set_state(self, state: str) -> None:
        self.watch.state = state
        self.run.append_event("state", state=state)
        self._save()

    def _save(self) -> None:
        atomic_write_json(self.run.file(WATCH), self.watch.to_json())


def py_spy() -> str | None:
    """py-spy's program: on PATH, next to this interpreter (a venv's bin), or the one the console uploaded."""
    beside = Path(sys.executable).parent / "py-spy"
    found = shutil.which("py-spy") or (beside if beside.is_file() else shipped.uploaded_py_spy())
    return None if found is None else str(found)


def dump_stacks(run: RunDir, pids: list[int]) -> Path:
    """Every process's stack in one file under stacks/, secrets masked, written atomically; its path."""
    folder = run.file(STACKS)
    private_dir(folder)
    path = folder / time.strftime("%Y%m%d-%H%M%S.txt", time.gmtime())
    tool = py_spy()
    sections = [_stack_of(pid, tool) for pid in pids]
    if tool is None:
        sections.insert(0, "py-spy is not installed on this host: kernel-side facts only (pip install py-spy)\n")
    atomic_write_bytes(path, mask_stacks(run, "\n".join(sections)).encode())
    return path


def mask_stacks(run: RunDir, text: str) -> str:
    """A stack dump with the run's secrets masked: its argv's secret values and its secret env values."""
    try:
        spec = run.spec()
    except SpecError:
        return text
    return mask_values(mask_text(text, spec.argv), spec.env)


def _stack_of(pid: int, tool: str | None) -> str:
    """One process's stack; its own command line's secrets masked (a worker's argv is not the run's)."""
    argv = [arg for arg in _read(f"/proc/{pid}/cmdline").split("\0") if arg]
    return mask_text(_unmasked_stack_of(pid, tool, argv), argv)


def _unmasked_stack_of(pid: int, tool: str | None, argv: list[str]) -> str:
    header = f"=== pid {pid}: {' '.join(argv)}\n"
    if tool is not None:
        try:
            done = subprocess.run(
                [tool, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=STACK_TIMEOUT_S, check=False
            )
            if done.returncode == 0:
                return header + done.stdout
            header += f"py-spy failed ({done.stderr.strip()[-300:]}); kernel-side facts:\n"
        except subprocess.TimeoutExpired:
            header += f"py-spy took over {STACK_TIMEOUT_S:.0f} s; kernel-side facts:\n"
    state = next((line for line in _read(f"/proc/{pid}/status").splitlines() if line.startswith("State:")), "State: ?")
    facts = [state.replace("\t", " "), f"wchan: {_read(f'/proc/{pid}/wchan') or '?'}"]
    kernel = _read(f"/proc/{pid}/stack")
    if kernel:
        facts.append("kernel stack:\n" + kernel)
    return header + "\n".join(facts) + "\n"


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""
