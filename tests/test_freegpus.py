"""Freeing GPUs as a user sees it: real processes, real signals, memory released on the NVML double."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends import procinfo
from backends.freegpus import carry_out, free_gpus, plan_free
from backends.gpus import GpuSampler
from backends.protocol import ProtocolError
from tests import fake_nvml
from tests.conftest import Spawn
from tests.fake_nvml import gpu, write_state

STUBBORN = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake NVML selected; the test rewrites its state file, which the fake reads on every call."""
    path = write_state(tmp_path / "nvml.json", [])
    monkeypatch.setenv("EAGLE3_NVML_MODULE", "tests.fake_nvml")
    monkeypatch.setenv(fake_nvml.STATE_ENV, str(path))
    return path


@pytest.fixture
def sampler(state: Path) -> Iterator[GpuSampler]:
    with GpuSampler() as gpus:
        yield gpus


def alive(child: subprocess.Popen[bytes]) -> bool:
    return procinfo.identify(child.pid) is not None


def test_dry_run_plans_the_kill_and_signals_nothing(state: Path, sampler: GpuSampler, spawn: Spawn) -> None:
    trainer = spawn()
    write_state(state, [gpu(base_used_mib=500, processes=[(trainer.pid, 4600)])])
    result = free_gpus(sampler, None, dry_run=True)
    time.sleep(0.2)
    assert alive(trainer)
    assert result["dry_run"] is True
    (report,) = result["gpus"]
    assert [(p["pid"], p["action"]) for p in report["processes"]] == [(trainer.pid, "kill")]
    assert (report["mem_used_before_mib"], report["mem_used_after_mib"], report["freed_mib"]) == (5100, None, None)
    assert report["still_held"] == []


def test_our_process_is_killed_its_memory_freed_and_it_is_reaped(
    state: Path, sampler: GpuSampler, spawn: Spawn
) -> None:
    trainer = spawn()
    write_state(state, [gpu(base_used_mib=500, processes=[(trainer.pid, 4600)])])
    started = time.monotonic()
    result = free_gpus(sampler, [0], dry_run=False, timeout=60, grace=30)
    assert time.monotonic() - started < 10  # SIGTERM sufficed: no waiting out the grace period
    (report,) = result["gpus"]
    assert [(p["pid"], p["action"]) for p in report["processes"]] == [(trainer.pid, "killed")]
    assert (report["mem_used_before_mib"], report["mem_used_after_mib"], report["freed_mib"]) == (5100, 500, 4600)
    assert report["still_held"] == []
    # Reaped by free_gpus itself, not left as a zombie for someone else to collect.
    assert not Path(f"/proc/{trainer.pid}").exists()
    with pytest.raises(ChildProcessError):
        os.waitpid(trainer.pid, os.WNOHANG)


def test_a_process_ignoring_sigterm_is_sigkilled_after_grace(state: Path, sampler: GpuSampler, spawn: Spawn) -> None:
    stubborn = spawn([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
    assert stubborn.stdout is not None
    assert stubborn.stdout.readline() == b"ready\n"
    write_state(state, [gpu(processes=[(stubborn.pid, 8000)])])
    started = time.monotonic()
    result = free_gpus(sampler, None, dry_run=False, timeout=60, grace=0.5)
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 10  # ended by SIGKILL, not by the timeout
    (report,) = result["gpus"]
    assert [p["action"] for p in report["processes"]] == ["killed"]
    assert report["freed_mib"] == 8000
    assert not Path(f"/proc/{stubborn.pid}").exists()  # dead and reaped


def test_a_process_surviving_the_timeout_is_reported_still_holding(
    state: Path, sampler: GpuSampler, spawn: Spawn
) -> None:
    stubborn = spawn([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
    assert stubborn.stdout is not None
    assert stubborn.stdout.readline() == b"ready\n"
    write_state(state, [gpu(base_used_mib=10, processes=[(stubborn.pid, 8000)])])
    # grace == timeout: no time is left for SIGKILL to be sent and waited on.
    result = free_gpus(sampler, None, dry_run=False, timeout=0.3, grace=10)
    (report,) = result["gpus"]
    assert alive(stubborn)
    assert [p["action"] for p in report["processes"]] == ["survived"]
    assert [(p["pid"], p["action"]) for p in report["still_held"]] == [(stubborn.pid, "survived")]
    assert report["freed_mib"] == 0


def test_a_recycled_pid_is_never_signalled(state: Path, sampler: GpuSampler, spawn: Spawn) -> None:
    newcomer = spawn()
    write_state(state, [gpu(processes=[(newcomer.pid, 4600)])])
    plan = plan_free(sampler, None)
    (planned,) = plan.processes
    assert planned.ident is not None and planned.skip is None
    # As if the planned process had exited and `newcomer` had since been given its pid.
    recycled = dataclasses.replace(planned, ident=dataclasses.replace(planned.ident, start_ticks=0))
    result = carry_out(dataclasses.replace(plan, processes=[recycled]), sampler, timeout=1, grace=0.2)
    time.sleep(0.2)
    assert alive(newcomer)
    (report,) = result["gpus"]
    (action,) = [p["action"] for p in report["processes"]]
    assert action.startswith("skip: gone or pid reused")
    assert [p["pid"] for p in report["still_held"]] == [newcomer.pid]


def test_pid_1_and_this_process_are_protected(state: Path, sampler: GpuSampler) -> None:
    write_state(state, [gpu(processes=[(1, 100), (os.getpid(), 200)])])
    result = free_gpus(sampler, None, dry_run=False, timeout=1, grace=0.5)
    (report,) = result["gpus"]
    assert {p["pid"]: p["action"] for p in report["processes"]} == {
        1: "skip: protected (pid 1, the agent or the console)",
        os.getpid(): "skip: protected (pid 1, the agent or the console)",
    }
    assert sorted(p["pid"] for p in report["still_held"]) == sorted([1, os.getpid()])
    assert report["freed_mib"] == 0


def someone_elses_process(spawn: Spawn) -> tuple[int, str | None]:
    """A live process of another user: spawned as nobody when root (as in CI), else pid 1."""
    if os.geteuid() == 0:
        return spawn(["sleep", "60"], user="nobody").pid, "nobody"
    return 1, None


def test_another_users_process_is_skipped_and_listed_as_still_held(
    state: Path, sampler: GpuSampler, spawn: Spawn
) -> None:
    pid, user = someone_elses_process(spawn)
    ours = spawn()
    write_state(state, [gpu(base_used_mib=0, processes=[(pid, 30000), (ours.pid, 1000)])])
    result = free_gpus(sampler, None, dry_run=False, timeout=5, grace=1)
    assert procinfo.identify(pid) is not None
    (report,) = result["gpus"]
    actions = {p["pid"]: p["action"] for p in report["processes"]}
    assert actions[ours.pid] == "killed"
    assert actions[pid].startswith("skip: ")
    if user is not None:
        assert actions[pid] == f"skip: belongs to user {user}"
    (held,) = report["still_held"]
    assert (held["pid"], held["mem_mib"], held["action"]) == (pid, 30000, actions[pid])
    assert held["user"] == procinfo.user_name(procinfo.proc_uid(pid))
    assert report["freed_mib"] == 1000


def test_only_the_chosen_gpus_are_touched(state: Path, sampler: GpuSampler, spawn: Spawn) -> None:
    on_0, on_1 = spawn(), spawn()
    write_state(state, [gpu(processes=[(on_0.pid, 100)]), gpu(processes=[(on_1.pid, 200)])])
    result = free_gpus(sampler, [1], dry_run=False, timeout=5, grace=1)
    assert [r["index"] for r in result["gpus"]] == [1]
    assert alive(on_0) and not alive(on_1)


def test_an_unknown_gpu_index_is_refused(state: Path, sampler: GpuSampler, spawn: Spawn) -> None:
    child = spawn()
    write_state(state, [gpu(processes=[(child.pid, 100)]), gpu()])
    with pytest.raises(ProtocolError) as refused:
        free_gpus(sampler, [0, 5], dry_run=False)
    assert refused.value.code == "bad_args"
    assert "no GPU 5" in refused.value.message
    assert alive(child)


def test_the_dry_run_lists_what_would_stay(state: Path, sampler: GpuSampler, spawn: Spawn) -> None:
    ours = spawn()
    write_state(state, [gpu(processes=[(ours.pid, 100), (1, 50)])])
    (report,) = free_gpus(sampler, None, dry_run=True)["gpus"]
    assert [(p["pid"], p["action"]) for p in report["still_held"]] == [
        (1, "skip: protected (pid 1, the agent or the console)")
    ]
    assert alive(ours)


def test_a_process_on_two_gpus_is_killed_once_and_both_are_freed(
    state: Path, sampler: GpuSampler, spawn: Spawn
) -> None:
    tensor_parallel = spawn()
    write_state(state, [gpu(processes=[(tensor_parallel.pid, 70000)]), gpu(processes=[(tensor_parallel.pid, 70000)])])
    result = free_gpus(sampler, None, dry_run=False, timeout=5, grace=1)
    assert [(r["freed_mib"], [p["action"] for p in r["processes"]]) for r in result["gpus"]] == [
        (70000, ["killed"]),
        (70000, ["killed"]),
    ]
