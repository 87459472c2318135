"""SGLang's real startup output read right, and a real SGLang server run through our engine.

Real: tests/sglang_output/*.log, printed by SGLang 0.5.23 of the real-SGLang tier on this machine (see the README
there), and the server the last test starts (EAGLE3_SGLANG_PYTHON, `--device cpu`, a small KV cache). The
GPU-only lines (CUDA graph capture, `accept len`) cannot be printed here: tests/sglang_standin.py marks the lines
it writes from SGLang's source as RECONSTRUCTED and the ones taken from these logs as REAL.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.protocol import ENV_RUN_ID, Metric
from backends.runs.store import RunDir
from backends.sglang import log as sglang_log
from tests.conftest import CLI, free_port, launch, run_info, wait_for, wait_state

OUTPUT = Path(__file__).parent / "sglang_output"
# Real: the tiny demo target served on CPU until ready, one /generate, then SIGTERM.
SERVE_CPU = (OUTPUT / "serve_cpu_0.5.23.log").read_bytes()
# Real: the same with an EAGLE-3 draft; both load, then the target's KV pool needs Triton, which has no CPU driver.
EAGLE3_CPU = (OUTPUT / "serve_eagle3_cpu_0.5.23.log").read_bytes()
# Real: the same server launched and then stopped by our `kill` (SIGTERM to each of its processes).
KILLED = (OUTPUT / "killed_by_console_0.5.23.log").read_bytes()
PHASES_CPU = ["init", "load-weights", "memory-pool", "http", "ready"]
# 0.5.23 loads the draft's weights before the target's KV cache: the pool after them is the target's.
PHASES_EAGLE3_CPU = ["init", "load-weights", "memory-pool", "draft-load-weights", "memory-pool"]
# Real lines that look like failures and are none (imports SGLang does not need here, a CPU with no CUDA).
ALARMING_BUT_HARMLESS = (
    "Failed to import from vllm._C",
    "Ignore import error when loading sglang.srt.models.",
    "Cannot detect CUDA architecture.",
    "Fail to set RLIMIT_NOFILE",
    "Only CUDA, HIP and XPU support AWQ currently.",
    '"GET /health HTTP/1.1" 503 Service Unavailable',
)


def events(data: bytes) -> tuple[sglang_log.OutputReader, list[sglang_log.Event]]:
    reader = sglang_log.OutputReader()
    return reader, reader.feed(data)


def test_real_cpu_startup_is_read_phase_by_phase_with_nothing_taken_for_a_failure() -> None:
    reader, found = events(SERVE_CPU)
    assert [e.name for e in found if e.kind == "phase"] == PHASES_CPU
    assert [e for e in found if e.kind == "failure"] == []
    assert list(reader.crash_lines) == []
    text = SERVE_CPU.decode()
    for alarming in ALARMING_BUT_HARMLESS:
        line = next(line for line in text.splitlines() if alarming in line)
        assert [e for e in sglang_log.OutputReader().feed(line.encode() + b"\n") if e.kind == "failure"] == []
    # Its one decode line (no speculative decoding: no accept len) becomes a metric row.
    [decode] = [e for e in found if e.kind == "decode"]
    assert decode.values == {"gen_throughput": 16.55, "running_req": 1, "queue_req": 0, "token_usage": 0.01}


def test_a_real_server_stopped_by_our_kill_is_not_taken_for_a_dead_scheduler() -> None:
    reader, found = events(KILLED)
    assert b"Subprocess scheduler_0 (pid=" in KILLED and b"crashed with exit code -15" in KILLED
    assert [e.name for e in found if e.kind == "phase"] == PHASES_CPU
    assert [e for e in found if e.kind == "failure"] == [] and list(reader.crash_lines) == []
    # A scheduler that died of anything else still is one.
    died = KILLED.replace(b"crashed with exit code -15", b"crashed with exit code -9")
    assert [e.name for e in events(died)[1] if e.kind == "failure"] == ["scheduler-died"]


def test_a_real_load_shows_its_bar_while_the_bar_is_still_moving() -> None:
    # SGLang's bar leads each state with a carriage return: the newest state is not ended until the next comes.
    second_state = SERVE_CPU.index(b"\rMulti-thread loading shards: 100%")
    reader, _ = events(SERVE_CPU[:second_state])
    assert reader.where() == "load-weights (0/1)"
    reader.feed(SERVE_CPU[second_state : SERVE_CPU.index(b"\n", second_state)])
    assert reader.where() == "load-weights (1/1)"


@given(cuts=st.lists(st.integers(0, len(SERVE_CPU) + len(EAGLE3_CPU)), max_size=30))
def test_real_output_read_in_any_pieces_gives_the_same_events(cuts: list[int]) -> None:
    for data in (SERVE_CPU, EAGLE3_CPU):
        reader = sglang_log.OutputReader()
        bounds = [0, *sorted(min(c, len(data)) for c in cuts), len(data)]
        pieces = [e for a, b in itertools.pairwise(bounds) for e in reader.feed(data[a:b])]
        assert [(e.kind, e.name, e.values) for e in pieces] == [(e.kind, e.name, e.values) for e in events(data)[1]]


def test_eagle3_on_cpu_fails_in_the_targets_memory_pool_and_is_explained() -> None:
    reader, found = events(EAGLE3_CPU)
    assert [e.name for e in found if e.kind == "phase"] == PHASES_EAGLE3_CPU
    # SGLang's own traceback says where: init_target_memory_pool, after both models' weights.
    assert b"in init_target_memory_pool" in EAGLE3_CPU and reader.phase == "memory-pool"
    assert [e.name for e in found if e.kind == "failure"] == ["scheduler-exception", "triton-no-driver"]
    triton = sglang_log.failure("triton-no-driver")
    assert "speculative decoding" in triton.hint and "CUDA driver" in triton.hint
    # SGLang kills its own process group with SIGKILL: still explained by the cause, not as the OOM killer.
    assert sglang_log.crash(reader, -9) is None


def test_the_standins_startup_agrees_with_the_real_one_where_the_real_one_runs() -> None:
    standin = subprocess.Popen(
        [sys.executable, "-m", "tests.sglang_standin", "--port", str(free_port())],
        stdout=subprocess.PIPE,
        start_new_session=True,  # its group holds its scheduler too: both are killed
    )
    try:
        assert standin.stdout is not None
        lines = list(itertools.takewhile(lambda line: b"ready to roll" not in line, standin.stdout))
    finally:
        os.killpg(standin.pid, signal.SIGKILL)
        standin.wait()
    _, found = events(b"".join(lines) + b"[2026-11-30 21:41:43] The server is fired up and ready to roll!\n")
    gpu_only = {"cuda-graph", "draft-cuda-graph"}
    assert [e.name for e in found if e.kind == "phase" and e.name not in gpu_only] == [
        *PHASES_EAGLE3_CPU,
        *PHASES_CPU[PHASES_CPU.index("http") :],
    ]
    assert [e for e in found if e.kind == "failure"] == []


# ----- one real server (the suite's only real start that gets to serve): ~25-45 s on 2 cores -----


def processes_of(run_id: str) -> dict[int, int]:
    """pid -> resident KiB of every process carrying the run's marker in its environment."""
    marker = f"{ENV_RUN_ID}={run_id}".encode()
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                status = (entry / "status").read_text()
                found[int(entry.name)] = next(
                    (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0
                )
        except OSError:
            continue
    return found


@pytest.mark.timeout(300)  # a real start, its metrics and two benches: past the suite's 120 s on a busy machine
def test_a_real_sglang_server_on_cpu_is_ready_by_its_health_gives_metrics_rows_is_benched_and_our_kill_ends_it(
    cli: CLI, workdir: Path, target: Path, sglang_python: Path, tmp_path: Path
) -> None:
    """One real server (starting one is most of a minute of CPU) for our engine's view of it, its /metrics
    (`--enable-metrics`) read into rows, and the bench's request and stream formats against the real 0.5.23 (no
    speculative decoding on CPU: no acceptance). Its decode lines as rows are read from the real log above."""
    port = free_port()
    server = [
        str(sglang_python), "-m", "sglang.launch_server", "--model-path", str(target), "--device", "cpu",
        "--host", "127.0.0.1", "--port", str(port), "--max-total-tokens", "4096", "--enable-metrics",
    ]  # fmt: skip
    started = time.monotonic()
    run_id = launch(cli, "serve", "--stall-after", "120", "--", *server)
    try:
        info = wait_state(cli, run_id, {"ready", "failed", "exited", "stalled"}, timeout=240)
        ready_s = time.monotonic() - started
        log = (workdir / "runs" / run_id / "output.log").read_text(errors="replace")
        assert info["state"] == "ready", log[-3000:]
        print(f"real SGLang on CPU: ready by /health {ready_s:.1f} s after launch")
        run = RunDir(workdir / "runs" / run_id)
        # /health may answer before the supervisor has read SGLang's own ready line.
        phases = wait_for(
            lambda: (p := [e["phase"] for e in run.events() if e["type"] == "phase"])[-1:] == ["ready"] and p
        )
        assert phases == PHASES_CPU
        health = [e["status"] for e in run.events() if e["type"] == "health"]
        assert health[0] == "refused" and health[-1] == "ok"
        # The status says the phase once the watch has saved it, a moment after it wrote the phase's event.
        info = wait_for(lambda: (now := run_info(cli, run_id))["phase"] == "ready" and now)
        assert info["diagnoses"] == [] and info["phase"] == "ready"
        # The launcher, its scheduler and detokenizer (and multiprocessing's tracker); a small KV cache keeps
        # them far from the 15 GB SGLang takes by default.
        processes = processes_of(run_id)
        assert len(processes) >= 3 and sum(processes.values()) < 8 * 1024 * 1024, processes
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/generate",
            json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 48, "temperature": 0}}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert json.loads(answer.read())["meta_info"]["completion_tokens"] == 48
        # The warmup and this request finished: SGLang's TTFT histogram has them, and a scrape of /metrics reads it.
        rows = wait_for(
            lambda: [
                r for r in map(json.loads, cli("metrics", run_id, "--json").stdout.splitlines()) if Metric.TTFT_P50 in r
            ],
            timeout=30,
            what="a /metrics row",
        )
        assert rows[0][Metric.TTFT_P50] > 0 and Metric.CACHE_HIT_RATE in rows[0]
        assert not [e for e in run.events() if e["type"] == "metrics_error"]
        url = f"http://127.0.0.1:{port}"
        for api in ("chat", "completions"):
            out = tmp_path / f"{api}.jsonl"
            argv = ["--url", url, "--api", api, "--requests", "3", "--concurrency", "2", "--max-tokens", "6"]
            bench = subprocess.run(
                [sys.executable, "-m", "backends.bench", *argv, "--out", str(out)], capture_output=True, timeout=180
            )
            assert bench.returncode == 0, bench.stdout.decode()[-2000:]
            [result] = [json.loads(line) for line in out.read_text().splitlines()]
            f = result["figures"]
            assert (f["ok"], f["errors"], f["cut"], f["output_tokens"]) == (3, 0, 0, 18)
            assert f["accept_len"] is None and f["ttft_ms"] is not None and f["itl_ms"] is not None
            assert re.search(rb"^Accept length: +n/a$", bench.stdout, re.MULTILINE)  # no verify steps on CPU
            # The real server's own counts: prompt tokens in its usage, and a running count in every chunk
            # (continuous_usage_stats), so per-token ITL needs no tokenizer; no speculative decoding: a token each.
            assert f["input_tokens"] > 0 and f["itl_ms"]["max"] >= f["itl_ms"]["p99"]
    finally:
        killed = cli("kill", run_id, "--grace", "10", timeout=60)
    assert killed.returncode == 0, killed.stderr
    final = wait_state(cli, run_id, {"killed"}, timeout=30)
    assert final["diagnoses"] == []
    assert wait_for(lambda: processes_of(run_id) == {}, timeout=15, what="no process of the run left") is True
    assert run_info(cli, run_id)["state"] == "killed"
    assert not os.path.exists(f"/proc/{info['pid']}")
