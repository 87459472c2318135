"""What benchmarks/mutation.sh found no test of in host/freegpus.py: what free-gpus reports of a GPU whose
processes change while it frees it. Real processes and signals; the NVML double (tests/fake_nvml.py) lists the
GPUs, and the test rewrites its state between the plan and its carrying out, as a GPU host changes meanwhile."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.host.freegpus import GONE, carry_out, free_gpus, plan_free
from backends.host.gpus import GpuSampler
from backends.protocol import ProtocolError
from tests import fake_nvml
from tests.conftest import Spawn
from tests.fake_nvml import gpu, write_state
from tests.test_freegpus import STUBBORN, alive, holding, nodes, sampler, state

__all__ = ["nodes", "sampler", "state"]  # the fixtures of test_freegpus.py, used here by name

# A process that takes a moment to exit on SIGTERM (its GPU's memory released on the way), as a trainer saving state.
SLOW_TO_EXIT = fake_nvml.MAP_NODES + (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_process_that_appears_while_freeing_is_told_apart_and_a_survivor_shows_its_memory_now(
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    stubborn = holding(spawn, nodes / "nvidia0", code=STUBBORN)
    write_state(state, [gpu(base_used_mib=100, processes=[(stubborn.pid, 8000)])], dev_dir=nodes)
    plan = plan_free(sampler, None)
    # Meanwhile another process takes memory on the GPU, and the stubborn one gives some back.
    newcomer = holding(spawn, nodes / "nvidia0")
    write_state(state, [gpu(base_used_mib=100, processes=[(stubborn.pid, 6000), (newcomer.pid, 300)])], dev_dir=nodes)
    # grace > timeout: no SIGKILL, the stubborn one outlives the wait.
    result = carry_out(plan, sampler, timeout=0.3, grace=10)
    (report,) = result["gpus"]
    assert alive(stubborn) and alive(newcomer)  # the newcomer was never planned, never signalled
    assert [(p["pid"], p["action"]) for p in report["processes"]] == [(stubborn.pid, "survived")]
    assert [(p["pid"], p["action"], p["mem_mib"]) for p in report["still_held"]] == [
        (stubborn.pid, "survived", 6000),
        (newcomer.pid, "skip: appeared while freeing", 300),
    ]
    assert (report["mem_used_before_mib"], report["mem_used_after_mib"], report["freed_mib"]) == (8100, 6400, 1700)


def test_a_gpu_gone_from_the_list_while_freeing_is_reported_without_an_after(
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    first = holding(spawn, nodes / "nvidia0")
    second = holding(spawn, nodes / "nvidia1", code=SLOW_TO_EXIT)
    write_state(state, [gpu(processes=[(first.pid, 1000)]), gpu(processes=[(second.pid, 2000)])], dev_dir=nodes)
    plan = plan_free(sampler, None)
    # GPU 1 falls off the bus: NVML lists GPU 0 alone from now on.
    write_state(state, [gpu(processes=[(first.pid, 1000)])], dev_dir=nodes)
    result = carry_out(plan, sampler, timeout=30, grace=10)
    reports = {report["index"]: report for report in result["gpus"]}
    assert [(p["pid"], p["action"]) for p in reports[0]["processes"]] == [(first.pid, "killed")]
    assert [(p["pid"], p["action"]) for p in reports[1]["processes"]] == [(second.pid, "killed")]
    gone = reports[1]
    assert (gone["mem_used_before_mib"], gone["mem_used_after_mib"], gone["freed_mib"]) == (2000, None, None)
    assert gone["still_held"] == []


def test_the_grace_asked_for_is_the_one_kept(state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path) -> None:
    """SIGKILL comes after the grace asked for, well inside the timeout; with the default grace (5 s, as long as
    this timeout) it would never come, and the stubborn process would be reported surviving."""
    stubborn = holding(spawn, nodes / "nvidia0", code=STUBBORN)
    write_state(state, [gpu(processes=[(stubborn.pid, 8000)])], dev_dir=nodes)
    result = free_gpus(sampler, None, dry_run=False, timeout=5.0, grace=0.2)
    (report,) = result["gpus"]
    assert [(p["pid"], p["action"]) for p in report["processes"]] == [(stubborn.pid, "killed")]


def test_a_process_this_host_cannot_see_is_planned_as_gone(state: Path, sampler: GpuSampler) -> None:
    """NVML lists the pid of a process of another pid namespace (a container's host): no process of ours has it."""
    unseen = next(pid for pid in range(4_000_000, 4_100_000) if not Path(f"/proc/{pid}").exists())
    write_state(state, [gpu(host_processes=[(unseen, 100)])])
    (report,) = free_gpus(sampler, None, dry_run=True)["gpus"]
    assert [(p["pid"], p["action"]) for p in report["processes"]] == [(unseen, f"skip: {GONE}")]


def test_gpus_asked_for_that_are_not_there_are_refused_naming_those_seen(state: Path, sampler: GpuSampler) -> None:
    write_state(state, [gpu(), gpu()])
    with pytest.raises(ProtocolError) as missing:
        free_gpus(sampler, [5, 7], dry_run=True)
    assert missing.value.message == "free_gpus: no GPU 5, 7 here (GPUs seen: 0, 1; source nvml)"
    write_state(state, [])
    with pytest.raises(ProtocolError) as none:
        free_gpus(sampler, [0], dry_run=True)
    assert none.value.message == "free_gpus: no GPU 0 here (GPUs seen: none; source nvml)"
    with pytest.raises(ProtocolError) as not_indices:
        free_gpus(sampler, ["0"], dry_run=True)  # type: ignore[list-item]
    assert (not_indices.value.code, not_indices.value.message) == (
        "bad_args",
        "free_gpus: 'gpus' must be a list of GPU indices",
    )


def test_a_report_says_whether_it_was_a_dry_run_its_gpu_source_and_whose_each_survivor_is(
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    stubborn = holding(spawn, nodes / "nvidia0", code=STUBBORN)
    write_state(state, [gpu(processes=[(stubborn.pid, 8000)])], dev_dir=nodes)
    planned = free_gpus(sampler, None, dry_run=True)
    assert (planned["dry_run"], planned["gpu_source"]) == (True, "nvml")
    result = carry_out(plan_free(sampler, None), sampler, timeout=0.3, grace=10)  # no SIGKILL: it survives
    assert (result["dry_run"], result["gpu_source"]) == (False, "nvml")
    (report,) = result["gpus"]
    (held,) = report["still_held"]
    assert (held["pid"], held["action"], held["holder"], held["mem_mib"]) == (stubborn.pid, "survived", "own", 8000)
