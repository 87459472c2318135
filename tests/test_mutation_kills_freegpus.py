"""What benchmarks/mutation.sh found no test of in host/freegpus.py: what free-gpus reports of a GPU whose
processes change while it frees it. Real processes and signals; the NVML double (tests/fake_nvml.py) lists the
GPUs, and the test rewrites its state between the plan and its carrying out, as a GPU host changes meanwhile."""

from __future__ import annotations

from pathlib import Path

from backends.host.freegpus import carry_out, plan_free
from backends.host.gpus import GpuSampler
from tests.conftest import Spawn
from tests.fake_nvml import gpu, write_state
from tests.test_freegpus import STUBBORN, alive, holding, nodes, sampler, state

__all__ = ["nodes", "sampler", "state"]  # the fixtures of test_freegpus.py, used here by name


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
    second = holding(spawn, nodes / "nvidia1")
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
