"""The run's watch as a user meets it: phases, failures explained, ready by health, stalled with every stack dumped.

Real supervisors and real child processes; SGLang is the stand-in in
tests/sglang_standin.py and the GPUs are the NVML double.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from backends.runs import watch
from backends.runs.store import RunDir, RunSpec
from backends.sglang import log as sglang_log
from tests.conftest import CLI, ctrl_c_reaches_it, free_port, launch, run_info, wait_for, wait_state
from tests.fake_nvml import gpu, write_state

STARTUP_0_5_23 = """\
[2026-11-29 07:00:00] Init parallel begin.
[2026-11-29 07:00:01] Init parallel ends. elapsed=1.21 s
[2026-11-29 07:00:01] Load weight begin. avail mem=139.52 GB
Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.5it/s]\r\
Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00, 1.5it/s]
[2026-11-29 07:00:03] Load weight end. elapsed=2.1 s, type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=124.3 GB
[2026-11-29 07:00:03] Load weight begin. avail mem=124.3 GB
[2026-11-29 07:00:04] Load weight end. elapsed=0.4 s, type=LlamaForCausalLMEagle3, dtype=torch.bfloat16, avail=1
[2026-11-29 07:00:04] KV Cache is allocated. #tokens: 500000, K size: 30.52 GB, V size: 30.52 GB
[2026-11-29 07:00:04] Memory pool end. avail mem=20.05 GB
[2026-11-29 07:00:05] Capture target verify CUDA graph begin. This can take up to several minutes. avail mem=20.05 GB
[2026-11-29 07:00:06] Capture target verify CUDA graph end. Time elapsed: 0.21 s. mem usage=0.25 GB.
[2026-11-29 07:00:06] Capture draft decode CUDA graph begin. This can take up to several minutes. avail mem=19.80 GB
[2026-11-29 07:00:07] Capture draft extend CUDA graph begin. This can take up to several minutes. avail mem=19.75 GB
[2026-11-29 07:00:08] max_total_num_tokens=500000, chunked_prefill_size=8192
[2026-11-29 07:00:08] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2026-11-29 07:00:09] The server is fired up and ready to roll!
"""
# 0.5.23 allocates the target's KV cache after loading the draft (tests/sglang_output).
PHASES_0_5_23 = [
    "init", "load-weights", "memory-pool", "draft-load-weights", "memory-pool", "cuda-graph",
    "draft-cuda-graph", "http", "ready",
]  # fmt: skip

STARTUP_0_5_5_TP2 = """\
[2026-11-29 07:00:00 TP0] Init torch distributed begin.
[2026-11-29 07:00:00 TP1] Init torch distributed begin.
[2026-11-29 07:00:01 TP0] Load weight begin. avail mem=139.52 GB
[2026-11-29 07:00:01 TP1] Load weight begin. avail mem=139.52 GB
[2026-11-29 07:00:09 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=124.31 GB
[2026-11-29 07:00:09 TP1] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=124.31 GB
[2026-11-29 07:00:10 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=20.05 GB
[2026-11-29 07:00:20 TP0] Init torch distributed begin.
[2026-11-29 07:00:21 TP0] Load weight begin. avail mem=19.5 GB
[2026-11-29 07:00:22 TP0] Capture draft cuda graph begin. This can take up to several minutes. avail mem=19 GB
"""
PHASES_0_5_5_TP2 = [
    "init", "load-weights", "memory-pool", "cuda-graph", "draft-init", "draft-load-weights", "draft-cuda-graph",
]  # fmt: skip

FAILURE_LINES = {
    "cuda-graph-capture": "Capture cuda graph failed: CUDA out of memory. Possible solutions: 1. set --mem-fraction",
    "nccl-timeout": "[rank3]:[E1129 07:10:00.1 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600123 "
    "milliseconds before timing out.",
    "scheduler-died": "Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a "
    "common cause is the OS OOM killer",
    "port-in-use": "OSError: [Errno 98] Address already in use",
    "context-length": "ValueError: Target model's context_length (131072) is greater than the derived context_length "
    "(2048). This may lead to incorrect model outputs or CUDA errors.",
}


def phases(text: str) -> list[str]:
    reader = sglang_log.OutputReader()
    return [e.name for e in reader.feed(text.encode()) if e.kind == "phase"]


def test_startup_phases_of_both_releases_are_named_in_order_and_the_draft_is_told_apart() -> None:
    assert phases(STARTUP_0_5_23) == PHASES_0_5_23
    assert phases(STARTUP_0_5_5_TP2) == PHASES_0_5_5_TP2


def test_a_progress_bar_tells_how_far_the_phase_got() -> None:
    reader = sglang_log.OutputReader()
    reader.feed(b"[2026-11-29 07:00:01] Load weight begin. avail mem=139.52 GB\n")
    reader.feed(b"Loading safetensors checkpoint shards:  45% Completed | 29/64 [00:10<00:12, 2.9it/s]\r")
    assert reader.where() == "load-weights (29/64)"


@given(cuts=st.lists(st.integers(min_value=0, max_value=len(STARTUP_0_5_23)), max_size=20))
def test_output_read_in_any_pieces_gives_the_same_events(cuts: list[int]) -> None:
    data = (STARTUP_0_5_23 + "\n".join(FAILURE_LINES.values()) + "\n").encode()
    reader = sglang_log.OutputReader()
    bounds = [0, *sorted(cuts), len(data)]
    events = [e for a, b in itertools.pairwise(bounds) for e in reader.feed(data[a:b])]
    whole = sglang_log.OutputReader().feed(data)
    assert [(e.kind, e.name) for e in events] == [(e.kind, e.name) for e in whole]


def test_each_failure_is_recognised_once_with_what_it_means_and_what_to_try() -> None:
    reader = sglang_log.OutputReader()
    text = "\n".join([*FAILURE_LINES.values(), *FAILURE_LINES.values(), "Decode batch, #running-req: 1"]) + "\n"
    found = [e.name for e in reader.feed(text.encode()) if e.kind == "failure"]
    assert found == list(FAILURE_LINES)
    assert "--disable-cuda-graph" in sglang_log.failure("cuda-graph-capture").hint
    assert "OOM killer" in sglang_log.failure("scheduler-died").hint


def test_a_serve_command_is_health_polled_on_the_port_it_names() -> None:
    def spec(*argv: str, kind: str = "serve", url: str | None = None) -> RunSpec:
        return RunSpec(kind=kind, name="s", argv=list(argv), health_url=url)

    server = ("python", "-m", "sglang.launch_server", "--model-path", "m")
    assert watch.health_url(spec(*server)) == "http://127.0.0.1:30000/health"
    assert watch.health_url(spec(*server, "--host", "0.0.0.0", "--port=8001")) == "http://127.0.0.1:8001/health"
    assert watch.health_url(spec("python", "serve.py", url="http://10.0.0.2:9/h")) == "http://10.0.0.2:9/h"
    assert watch.health_url(spec(*server, kind="command")) is None
    assert watch.stall_window(spec(*server)) == watch.DEFAULT_STALL_AFTER_S
    assert watch.stall_window(spec("sleep", "9", kind="command")) is None


def serve(cli: CLI, *standin: str, stall_after: str = "2") -> tuple[str, int]:
    port = free_port()
    run_id = launch(
        cli, "serve", "--stall-after", stall_after, "--health-url", f"http://127.0.0.1:{port}/health", "--",
        sys.executable, "-m", "tests.sglang_standin", "--port", str(port), *standin,
    )  # fmt: skip
    return run_id, port


def events(workdir: Path, run_id: str) -> list[dict[str, Any]]:
    return RunDir(workdir / "runs" / run_id).events()


def test_a_launch_that_hangs_while_loading_is_stalled_in_that_phase_with_every_stack_dumped(
    cli: CLI, workdir: Path
) -> None:
    run_id, _ = serve(cli, "--hang-in", "load-weights")
    info = wait_state(cli, run_id, {"stalled"}, timeout=30)
    assert info["phase"] == "load-weights (4/8)"
    assert info["stalled_since"] is not None and info["health"] == "refused"
    stalled = next(e for e in events(workdir, run_id) if e["type"] == "stalled")
    assert stalled["phase"] == "load-weights (4/8)" and stalled["silent_s"] >= 2 and stalled["cpu_percent"] < 5
    [dump] = info["stack_dumps"]
    stacks = (workdir / "runs" / run_id / dump).read_text()
    # Every process of the run; the server and its scheduler each with the Python frames where it sleeps.
    dumped = next(e for e in events(workdir, run_id) if e["type"] == "stacks")
    assert stacks.count("=== pid ") == len(dumped["pids"]) >= 2 and stacks.count("hang_forever") == 2
    assert "load_weights" in stacks and "scheduler" in stacks
    text = cli("status").stdout.decode()
    assert "stalled" in text and "load-weights (4/8)" in text and dump in text
    cli("kill", run_id, "--grace", "1")


def test_a_server_that_comes_up_is_ready_by_its_health_and_is_not_stalled_while_idle(cli: CLI, workdir: Path) -> None:
    run_id, _ = serve(cli)
    info = wait_state(cli, run_id, {"ready"}, timeout=30)
    assert info["health"] == "ok" and info["phase"] == "ready"
    names = [e["phase"] for e in events(workdir, run_id) if e["type"] == "phase"]
    assert names == PHASES_0_5_23
    health = [e["status"] for e in events(workdir, run_id) if e["type"] == "health"]
    assert health[0] == "refused" and health[-1] == "ok"
    time.sleep(5)  # more than twice the stall window, silent and idle: a ready server is idle by right
    assert run_info(cli, run_id)["state"] == "ready"
    cli("kill", run_id, "--grace", "1")


def test_a_failed_cuda_graph_capture_is_explained_with_what_to_try(cli: CLI) -> None:
    run_id, _ = serve(cli, "--fail-in", "cuda-graph")
    info = wait_state(cli, run_id, {"failed"})
    codes = [d["code"] for d in info["diagnoses"]]
    assert codes == ["scheduler-exception", "cuda-graph-capture"]  # 0.5.23: the capture's exception, in its traceback
    assert info["phase"] == "cuda-graph"
    text = cli("status").stdout.decode()
    assert "cuda-graph-capture" in text and "--disable-cuda-graph" in text


def test_silence_alone_is_not_a_stall_while_the_run_computes_or_shows_progress(cli: CLI) -> None:
    busy = launch(cli, "train", "--stall-after", "2", "--", sys.executable, "-c", "while True: pass")
    bar = "import sys, time\nfor i in range(60):\n    print(f'step {i}%|', end='\\r', flush=True); time.sleep(0.5)"
    progress = launch(cli, "train", "--stall-after", "2", "--", sys.executable, "-c", bar)
    time.sleep(7)
    assert run_info(cli, busy)["state"] == "running"
    assert run_info(cli, progress)["state"] == "running"
    cli("kill", busy, "--grace", "1")
    cli("kill", progress, "--grace", "1")


def test_a_silent_process_on_a_busy_gpu_is_not_stalled_until_the_gpu_goes_idle(
    cli: CLI, workdir: Path, nvml_state: Path
) -> None:
    run_id = launch(cli, "train", "--stall-after", "2", "--", sys.executable, "-c", "import time; time.sleep(60)")
    pid = wait_for(lambda: run_info(cli, run_id)["pid"], what="the child's pid")
    write_state(nvml_state, [gpu(util=100, mem_util=23, processes=[(pid, 4096)])])  # bf16 matmuls on an H200
    time.sleep(6)
    assert run_info(cli, run_id)["state"] == "running"
    write_state(nvml_state, [gpu(util=0, processes=[(pid, 4096)])])
    info = wait_state(cli, run_id, {"stalled"}, timeout=20)
    assert info["stall_kind"] == "idle"
    stalled = next(e for e in events(workdir, run_id) if e["type"] == "stalled")
    assert stalled["gpu_util"] == {"0": 0} and stalled["kind"] == "idle"
    cli("kill", run_id, "--grace", "1")


def test_a_silent_run_whose_gpus_spin_without_moving_memory_is_stalled_until_they_work_again(
    cli: CLI, workdir: Path, nvml_state: Path
) -> None:
    # Ranks in an NCCL collective whose peer never came: rank 0's GPU pinned at 100% by a kernel
    # that moves no memory (what the H200 showed for a spinning kernel), rank 1 asleep with an idle
    # GPU; the hosts spin as well, so the CPU does not count.
    rank1 = "import time; time.sleep(60)"
    ranks = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {rank1!r}])\nwhile True: pass"
    run_id = launch(cli, "train", "--stall-after", "2", "--", sys.executable, "-c", ranks)
    pid = wait_for(lambda: run_info(cli, run_id)["pid"], what="the child's pid")
    rank1 = wait_for(lambda: first_child(pid), what="the second rank")
    write_state(
        nvml_state,
        [gpu(util=100, mem_util=0, processes=[(pid, 4096)]), gpu(util=0, processes=[(rank1, 4096)])],
    )
    info = wait_state(cli, run_id, {"stalled"}, timeout=20)
    assert info["stall_kind"] == "spinning" and info["stack_dumps"]
    stalled = next(e for e in events(workdir, run_id) if e["type"] == "stalled")
    assert stalled["kind"] == "spinning" and stalled["gpu_util"] == {"0": 100, "1": 0}
    assert stalled["cpu_percent"] > 4 * watch.IDLE_CPU_PERCENT  # a busy CPU, whatever else this machine runs
    assert "NCCL collective" in cli("status").stdout.decode()
    write_state(nvml_state, [gpu(util=100, mem_util=23, processes=[(pid, 4096)]), gpu(processes=[(rank1, 4096)])])
    assert wait_state(cli, run_id, {"running"}, timeout=20)["stall_kind"] is None
    resumed = next(e for e in events(workdir, run_id) if e["type"] == "resumed")
    assert resumed["by"] == "activity"
    cli("kill", run_id, "--grace", "1")


def first_child(pid: int) -> int | None:
    """The first child of `pid`, once it has one."""
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(found[0]) if found else None


RANK0, RANK1 = 101, 102  # the run's two processes, on GPU 0 and GPU 1 when they hold one


def load(util: int | None, mem_util: int | None = 0, *pids: int) -> watch.GpuLoad:
    return watch.GpuLoad(util, mem_util, frozenset(pids))


def sample(at: float, ticks: tuple[int, int], *gpus: watch.GpuLoad) -> watch.Activity:
    return watch.Activity(at, {RANK0: ticks[0], RANK1: ticks[1]}, dict(enumerate(gpus)))


def test_a_run_sits_still_when_idle_or_when_its_gpus_only_spin() -> None:
    # CPU ticks of (rank 0, rank 1) over 20 s: 0.1% or 100% of a core.
    idle, rank0_busy, rank1_busy = (2, 2), (2000, 2), (2, 2000)
    matmul, spin = load(97, 23, RANK0), load(100, 0, RANK0)
    cases: list[tuple[list[watch.GpuLoad], tuple[int, int], str | None]] = [
        ([load(0, 0, RANK0)], idle, "idle"),
        ([], idle, "idle"),
        ([load(None, None, RANK0)], idle, "idle"),
        ([], rank0_busy, None),
        ([load(0, 0, RANK0)], rank1_busy, None),
        ([spin], rank0_busy, "spinning"),  # the host waiting on its GPU spins too
        ([spin, load(0, 0, RANK1)], idle, "spinning"),  # rank 1 asleep: it will never join
        ([spin, load(0, 0, RANK1)], rank1_busy, None),  # rank 1 still working (a slow loader): not a hang
        ([spin], rank1_busy, None),
        ([spin, matmul], idle, None),
        ([matmul], idle, None),
        ([load(100, None, RANK0)], idle, None),  # no memory figure: never a spin
        ([load(89, 0, RANK0)], idle, None),
    ]
    for gpus, ticks, expected in cases:
        middle = (ticks[0] // 2, ticks[1] // 2)
        samples = [sample(0, (0, 0), *gpus), sample(10, middle, *gpus), sample(20, ticks, *gpus)]
        assert watch.sitting_still(samples) == expected, (gpus, ticks)


def test_one_sample_of_real_work_in_the_window_is_not_a_spin() -> None:
    spin = load(100, 0, RANK0)
    samples = [sample(0, (0, 0), spin), sample(10, (1000, 0), load(98, 40, RANK0)), sample(20, (2000, 0), spin)]
    assert watch.sitting_still(samples) is None


class Watcher:
    """`eagle3-console local watch` as a user runs it, once it has looked (what it found then is not news)."""

    def __init__(self, workdir: Path, *options: str) -> None:
        command = [sys.executable, "-m", "console", "--workdir", str(workdir), "local", "watch", "--interval", "0.5"]
        command += options
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=ctrl_c_reaches_it,
        )
        assert self.process.stderr is not None
        self.first = self.process.stderr.readline()
        self.printed = b""  # its stdout so far, read by `until` as it comes

    def _read(self, deadline: float, what: str) -> bool:
        """One read of its stdout, waiting until `deadline` at most; False at its end."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], f"the watch never printed {what}: {self.printed!r}"
        chunk = os.read(fd, 65536)
        self.printed += chunk
        return bool(chunk)

    def until(self, predicate: Callable[[str], bool], what: str, timeout: float = 30) -> None:
        """Reads its stdout as it comes until `predicate` holds of all of it so far."""
        deadline = time.monotonic() + timeout
        while not predicate(self.printed.decode(errors="replace")):
            assert self._read(deadline, what), f"the watch ended before it printed {what}: {self.printed!r}"

    def stop(self) -> tuple[str, str]:
        """Ctrl-C; what it printed (stdout, the rest of stderr)."""
        assert self.process.stderr is not None
        self.process.send_signal(signal.SIGINT)
        try:
            deadline = time.monotonic() + 30
            while self._read(deadline, "its end"):
                pass
            err = self.process.stderr.read()
            self.process.wait(timeout=30)
        finally:
            self.process.kill()  # nothing left behind, whatever happened
        assert self.process.returncode == 0, err
        return self.printed.decode(), err


def test_watch_prints_each_change_of_state_with_what_to_look_at(cli: CLI, workdir: Path) -> None:
    ended = launch(cli, "command", "--name", "earlier", "--", sys.executable, "-c", "pass")
    wait_state(cli, ended, {"exited"})
    watcher = Watcher(workdir)
    try:
        script = "import time\nprint('Load weight begin.', flush=True)\ntime.sleep(60)"
        run_id = launch(cli, "serve", "--name", "hangs", "--stall-after", "2", "--", sys.executable, "-c", script)
        wait_state(cli, run_id, {"stalled"}, timeout=30)
        watcher.until(lambda out: "running → stalled" in out, "the stall")
        cli("kill", run_id, "--grace", "1")
        wait_state(cli, run_id, {"killed"})
        watcher.until(lambda out: "stalled → killed" in out, "the kill")
    finally:
        out, err = watcher.stop()
    assert "watching 1 runs (0 live)" in watcher.first and err == ""
    lines = out.splitlines()
    moves = [line.split(": ", 1)[1] for line in lines if f"hangs ({run_id})" in line]
    assert moves[0].startswith("new serve run") and moves[-1] == "stalled → killed"
    assert "running → stalled in load-weights" in moves
    stall = lines[lines.index(next(line for line in lines if "→ stalled" in line)) + 1]
    assert stall.startswith(f"    run {run_id} stalled in load-weights") and "stacks: runs/" in stall
    assert "earlier" not in out  # an ended run that did not change is not news


def test_watch_json_gives_a_script_the_picture_then_each_change(cli: CLI, workdir: Path) -> None:
    earlier = launch(cli, "command", "--name", "earlier", "--", sys.executable, "-c", "pass")
    wait_state(cli, earlier, {"exited"})
    watcher = Watcher(workdir, "--json")
    try:
        doomed = launch(cli, "command", "--name", "doomed", "--", sys.executable, "-c", "raise SystemExit(3)")
        wait_state(cli, doomed, {"failed"})

        def failed(out: str) -> bool:
            changes = [json.loads(line) for line in out.splitlines(keepends=True) if line.endswith("\n")]
            return any(c["run"]["id"] == doomed and c["to"] == "failed" for c in changes)

        watcher.until(failed, "the failure")
    finally:
        out, _ = watcher.stop()
    changes = [json.loads(line) for line in out.splitlines()]
    assert changes[0]["first"] and changes[0]["run"]["id"] == earlier and changes[0]["to"] == "exited"
    mine = [c for c in changes if c["run"]["id"] == doomed]
    assert mine[0]["from"] is None and "first" not in mine[0]
    assert mine[-1]["to"] == "failed" and mine[-1]["run"]["exit_code"] == 3
    assert all(c["from"] != c["to"] for c in mine)


def test_watch_goes_on_across_a_lost_agent(cli: CLI, workdir: Path) -> None:
    watcher = Watcher(workdir)
    try:
        agent = f"backends.agent --workdir {workdir}"
        subprocess.run(["pkill", "-KILL", "-f", agent], check=True)  # the link is gone
        time.sleep(1)
        run_id = launch(cli, "command", "--name", "meanwhile", "--", sys.executable, "-c", "pass")
        wait_state(cli, run_id, {"exited"})
        watcher.until(lambda out: f"meanwhile ({run_id}): new command run" in out, "the run made meanwhile")
    finally:
        out, err = watcher.stop()
    assert "connection lost" in err and "reconnected after" in err
    assert f"meanwhile ({run_id}): new command run" in out


def test_output_after_a_stall_resumes_the_run(cli: CLI, workdir: Path) -> None:
    script = "import time\nprint('loading', flush=True)\ntime.sleep(6)\nprint('loaded', flush=True)\ntime.sleep(60)"
    run_id = launch(cli, "extract", "--stall-after", "2", "--", sys.executable, "-c", script)
    wait_state(cli, run_id, {"stalled"}, timeout=20)
    wait_state(cli, run_id, {"running"}, timeout=20)
    resumed = next(e for e in events(workdir, run_id) if e["type"] == "resumed")
    assert resumed["by"] == "output" and resumed["stalled_s"] > 0
    cli("kill", run_id, "--grace", "1")


def test_an_nccl_timeout_in_a_training_run_is_explained(cli: CLI) -> None:
    line = FAILURE_LINES["nccl-timeout"]
    run_id = launch(cli, "train", "--", sys.executable, "-c", f"print({line!r}); raise SystemExit(1)")
    info = wait_state(cli, run_id, {"failed"})
    [diagnosis] = info["diagnoses"]
    assert diagnosis["code"] == "nccl-timeout" and "NCCL_DEBUG=INFO" in diagnosis["hint"]


def test_stacks_on_demand_dump_every_live_process_and_then_show_the_latest(cli: CLI, workdir: Path) -> None:
    run_id = launch(cli, "command", "--", sys.executable, "-m", "tests.sglang_standin", "--hang-in", "init")
    wait_for(lambda: (workdir / "runs" / run_id / "output.log").read_bytes(), what="the first line")
    now = cli("stacks", run_id, "--now")
    assert now.returncode == 0, now.stderr
    assert now.stderr.decode().startswith("eagle3-console: stacks/")
    assert b"hang_forever" in now.stdout and now.stdout.count(b"=== pid ") >= 2
    dumped = [e for e in events(workdir, run_id) if e["type"] == "stacks"]
    assert dumped[-1]["by"] == "request"
    cli("kill", run_id, "--grace", "1")
    latest = cli("stacks", run_id)  # the run is gone: its last dump is still there to read
    assert latest.returncode == 0 and latest.stdout == now.stdout
    fresh = launch(cli, "command", "--", sys.executable, "-c", "pass")
    wait_state(cli, fresh, {"exited"})
    nothing = cli("stacks", fresh)
    assert nothing.returncode == 1
    assert nothing.stderr.decode() == f"eagle3-console: run {fresh} has no live process and no stack dump\n"


def test_a_decode_line_becomes_the_servers_figures() -> None:
    reader = sglang_log.OutputReader()
    line = (
        "[2026-11-29 07:10:00] Decode batch, #running-req: 3, #token: 1234, token usage: 0.02, accept len: 3.21, "
        "cuda graph: True, gen throughput (token/s): 812.33, #queue-req: 1, \n"
        "[2026-11-29 07:10:01] Decode batch, #running-req: 1, #token: 99, token usage: 0.00, "
        "gen throughput (token/s): 55.00, #queue-req: 0, \n"
    )
    first, second = [e.values for e in reader.feed(line.encode()) if e.kind == "decode"]
    assert first == {
        "accept_len": 3.21, "gen_throughput": 812.33, "running_req": 3, "queue_req": 1, "token_usage": 0.02,
    }  # fmt: skip
    assert "accept_len" not in second and second["gen_throughput"] == 55.0


def test_a_servers_accept_length_and_throughput_are_its_metric_rows(cli: CLI) -> None:
    run_id, _ = serve(cli, "--decode-lines", "5")
    wait_state(cli, run_id, {"ready"}, timeout=30)

    def rows() -> list[dict[str, Any]] | None:
        found = [json.loads(line) for line in cli("metrics", run_id, "--json").stdout.splitlines()]
        return found if len(found) == 5 else None

    found = wait_for(rows, what="five decode rows")
    assert [r["accept_len"] for r in found] == [2.5, 2.6, 2.7, 2.8, 2.9]
    assert found[-1]["gen_throughput"] == 440.0 and all("t" in r for r in found)
    cli("kill", run_id, "--grace", "1")


def test_serve_launches_sglang_with_the_draft_and_follows_it_until_ready(cli: CLI, tmp_path: Path) -> None:
    from tests.conftest import REPO
    from tests.draft_fixtures import good_draft, write_target

    target, draft = write_target(tmp_path / "target"), good_draft(tmp_path / "draft")
    port = free_port()
    env = f"PYTHONPATH={REPO / 'tests' / 'fake_sglang'}:{REPO}"
    done = cli(
        "serve", str(target), str(draft), "--port", str(port), "--python", sys.executable, "--env", env,
        "--name", "srv", "--follow", "--", "--mem-fraction-static", "0.8",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    run_id = lines[0]
    phases = [line.split("phase ")[1] for line in lines if "  phase " in line]
    assert phases == PHASES_0_5_23 and any(line.endswith("health ok") for line in lines)
    assert lines[-1].endswith("state ready")
    argv = run_info(cli, run_id)["argv"]
    assert argv[1:5] == ["-m", "sglang.launch_server", "--model-path", str(target)]
    assert argv[5:9] == ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft)]
    assert argv[-2:] == ["--mem-fraction-static", "0.8"]
    cli("kill", run_id, "--grace", "1")


def test_serve_follow_reports_a_stalled_launch_and_where_to_look(cli: CLI, tmp_path: Path) -> None:
    from tests.conftest import REPO
    from tests.draft_fixtures import good_draft, write_target

    target, draft = write_target(tmp_path / "target"), good_draft(tmp_path / "draft")
    env = f"PYTHONPATH={REPO / 'tests' / 'fake_sglang'}:{REPO}"
    done = cli(
        "serve", str(target), str(draft), "--port", str(free_port()), "--python", sys.executable, "--env", env,
        "--stall-after", "2", "--follow", "--", "--hang-in", "draft-load-weights",
    )  # fmt: skip
    assert done.returncode == 1
    assert "STALLED in draft-load-weights (1/2)" in done.stdout.decode()
    run_id = done.stdout.decode().splitlines()[0]
    assert f"`stacks {run_id}` shows where each process waits" in done.stderr.decode()
    assert run_info(cli, run_id)["state"] == "stalled"  # still running: the user decides
    cli("kill", run_id, "--grace", "1")
