"""GPUs in containers: NVML lists the host's pids there, so no listed process matches a run's; the console then
places a live run on the GPUs its CUDA_VISIBLE_DEVICES names, and says so. Never a reason to signal anything.

Real: the agent, the CLI, the runs and their processes, signals. The NVML double (tests/fake_nvml.py) lists
`host_processes` under pids that do not exist in this pid namespace, as NVML does inside a container.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.host.gpus import GpuSampler, infer_by_visible_devices, visible_indices
from backends.protocol import GpuInfo, RunInfo
from console import render
from console.tui.gpu_panel import MARK, GpuHistory, Selection, gpu_text
from tests.conftest import CLI, launch, run_info, status, wait_for, wait_state
from tests.fake_nvml import gpu, gpu_uuid, stand_in_nodes, write_state

SLEEP = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(300)"]
BY_CVD = "(by CUDA_VISIBLE_DEVICES)"


def host_pid() -> int:
    """A pid no process of this namespace has: what NVML reports for our process inside a container."""
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid


def started(cli: CLI, *args: str) -> str:
    run_id = launch(cli, "command", *args, "--", *SLEEP)
    wait_for(lambda: b"up" in cli("logs", run_id).stdout, what=f"run {run_id} up")
    return run_id


# ----- reading CUDA_VISIBLE_DEVICES ------------------------------------------------------------


def uuid_of(index: int) -> str:
    return gpu_uuid(index)


@st.composite
def visible_values(draw: st.DrawFn) -> tuple[int, str, list[int]]:
    """(GPUs on the host, a CUDA_VISIBLE_DEVICES value naming some of them in every way CUDA accepts, and the
    indices it names in order, each once)."""
    count = draw(st.integers(1, 8))
    chosen = draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=6))
    spellings = [draw(st.sampled_from([str(i), uuid_of(i), f"MIG-{uuid_of(i)}/1/0", f" {i} "])) for i in chosen]
    return count, ",".join(spellings), list(dict.fromkeys(chosen))


@given(visible_values(), st.sampled_from(["", "-1", "7x", "GPU-nothere", "MIG-nothere"]), st.integers(0, 7))
def test_visible_devices_name_gpus_by_index_uuid_or_mig_and_end_at_the_first_unknown_entry(
    drawn: tuple[int, str, list[int]], bad: str, after: int
) -> None:
    count, value, expected = drawn
    uuids = {uuid_of(i): i for i in range(count)}
    assert visible_indices(value, range(count), lambda: uuids) == expected
    # As CUDA does: an entry naming no GPU here hides it and every entry after it.
    assert visible_indices(f"{value},{bad},{after}", range(count), lambda: uuids) == expected
    assert visible_indices(f"{bad},{value}", range(count), lambda: uuids) == []


def test_a_uuid_prefix_counts_only_when_it_names_one_gpu_and_a_mig_device_counts_as_its_gpu() -> None:
    uuids = {"GPU-aaaa-1": 0, "GPU-aaab-2": 1, "MIG-5e1f-77": 1}
    assert visible_indices("GPU-aaab", range(2), lambda: uuids) == [1]
    assert visible_indices("GPU-aaa", range(2), lambda: uuids) == []  # two GPUs start so: CUDA refuses it
    assert visible_indices("MIG-5e1f-77", range(2), lambda: uuids) == [1]
    assert visible_indices("5", range(2), lambda: uuids) == []  # no GPU 5 here


def test_uuids_are_read_from_nvml_only_when_a_value_names_one() -> None:
    asked: list[bool] = []

    def uuids() -> dict[str, int]:
        asked.append(True)
        return {}

    assert visible_indices("0,1", range(2), uuids) == [0, 1]
    assert asked == []


def test_the_sampler_reads_gpu_and_mig_uuids_from_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = write_state(tmp_path / "nvml.json", [gpu(), gpu(mig=["MIG-0b7c0000-1111-2222-3333-444444444444"])])
    monkeypatch.setenv("EAGLE3_NVML_MODULE", "tests.fake_nvml")
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    with GpuSampler() as sampler:
        assert sampler.uuids() == {gpu_uuid(0): 0, gpu_uuid(1): 1, "MIG-0b7c0000-1111-2222-3333-444444444444": 1}


def gpu_info(index: int, util: int, pids: list[tuple[int, str | None]]) -> GpuInfo:
    return {
        "index": index,
        "name": "NVIDIA H200",
        "util": util,
        "mem_util": 0,
        "mem_used_mib": 4600,
        "mem_total_mib": 143771,
        "temp_c": 50,
        "power_w": 300.0,
        "processes": [{"pid": pid, "user": None, "mem_mib": 4600, "run_id": run} for pid, run in pids],
    }


def test_only_runs_no_listed_process_matched_are_placed_by_their_visible_devices() -> None:
    gpus = [gpu_info(0, 97, [(4000001, None)]), gpu_info(1, 40, [(123, "matched")]), gpu_info(2, 0, [])]
    looked_up: list[list[str]] = []

    def visible_of(runs: list[str]) -> dict[str, str]:
        looked_up.append(runs)
        return {"boxed": "0,2", "matched": "1"}

    infer_by_visible_devices(gpus, ["boxed", "matched", "boxed"], visible_of, dict)
    assert looked_up == [["boxed"]]  # a matched run's launch is not even read
    placed = [gpu.get("inferred") for gpu in gpus]
    holder = {"run_id": "boxed", "inferred_from": "CUDA_VISIBLE_DEVICES"}
    assert placed == [[holder], None, [holder]]
    assert render.run_gpus(gpus) == {"boxed": f"0:97% 2:0% {BY_CVD}", "matched": "1:40%"}


# ----- what a person sees, from a real agent and real runs ----------------------------------------


def test_a_run_in_a_container_shows_on_the_gpus_its_launch_named_and_says_so(cli: CLI, nvml_state: Path) -> None:
    by_index = started(cli, "--gpus", "1")
    by_uuid = started(cli, "--env", f"CUDA_VISIBLE_DEVICES={gpu_uuid(2)}")
    everywhere = started(cli)  # CUDA_VISIBLE_DEVICES unset: it could be on any GPU, so it is placed on none
    write_state(
        nvml_state,
        [
            gpu(),
            gpu(util=97, host_processes=[(host_pid(), 4600)]),
            gpu(util=55, host_processes=[(host_pid() + 1, 2000)]),
        ],
    )
    gpus = status(cli)["gpus"]
    assert [g.get("inferred") for g in gpus] == [
        None,
        [{"run_id": by_index, "inferred_from": "CUDA_VISIBLE_DEVICES"}],
        [{"run_id": by_uuid, "inferred_from": "CUDA_VISIBLE_DEVICES"}],
    ]
    assert all(p["run_id"] is None for g in gpus for p in g["processes"])  # no pid was taken for the run's
    text = cli("status").stdout.decode()
    row = {line.split()[0]: line for line in text.splitlines() if line.split()[:1] in ([by_index], [by_uuid])}
    assert f"1:97% {BY_CVD}" in row[by_index] and f"2:55% {BY_CVD}" in row[by_uuid]
    assert f"run {by_index} {BY_CVD}" in text
    everywhere_row = next(line for line in text.splitlines() if line.startswith(everywhere))
    assert BY_CVD not in everywhere_row


def test_a_run_whose_process_nvml_lists_is_placed_by_that_process_not_its_launch(cli: CLI, nvml_state: Path) -> None:
    run_id = started(cli, "--gpus", "0")
    child = run_info(cli, run_id)["pid"]
    write_state(nvml_state, [gpu(util=10), gpu(util=90, processes=[(child, 1000)])])
    gpus = status(cli)["gpus"]
    assert [p["run_id"] for p in gpus[1]["processes"]] == [run_id]
    assert all("inferred" not in g for g in gpus)  # --gpus 0 is not where it is: the listed process says GPU 1
    assert BY_CVD not in cli("status").stdout.decode()


def test_free_gpus_never_stops_a_run_placed_only_by_its_visible_devices(cli: CLI, nvml_state: Path) -> None:
    run_id = started(cli, "--gpus", "0")
    write_state(nvml_state, [gpu(base_used_mib=100, host_processes=[(host_pid(), 4600)])])
    assert status(cli)["gpus"][0]["inferred"][0]["run_id"] == run_id
    done = cli("free-gpus", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)["gpus"]
    assert [p["action"].split(":")[0] for p in report["processes"]] == ["skip"]
    assert all(p["run_id"] is None for p in report["processes"])
    assert wait_state(cli, run_id, {"running"})["state"] == "running"
    assert b"up" in cli("logs", run_id).stdout


def test_free_gpus_leaves_alone_a_process_of_ours_whose_pid_nvml_lists_for_a_host_process(
    cli: CLI, nvml_state: Path, tmp_path: Path
) -> None:
    # Inside a container NVML's host pid may equal the pid of one of our processes here: the run's child, which
    # maps no GPU node (the double's stand-ins, tests/fake_nvml.py). Real: the agent, the run, its signals.
    run_id = started(cli, "--gpus", "0")
    child = run_info(cli, run_id)["pid"]
    write_state(nvml_state, [gpu(host_processes=[(child, 4600)])], dev_dir=stand_in_nodes(tmp_path / "dev"))
    done = cli("free-gpus", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)["gpus"]
    ((pid, user, run, action),) = [(p["pid"], p["user"], p["run_id"], p["action"]) for p in report["processes"]]
    assert (pid, user, run) == (child, None, None)  # held by someone unknown, not by the run
    assert action.startswith("skip: does not hold an NVIDIA device here (no CUDA context mapping ")
    assert action.endswith("NVML's pid is likely from another pid namespace (a container?)")
    assert wait_state(cli, run_id, {"running"})["state"] == "running"
    assert run_info(cli, run_id)["pid"] == child
    said = cli("free-gpus", "--yes").stdout.decode()
    assert f"pid {child} (n/a, holder unknown, 4600 MiB): skip: does not hold an NVIDIA device here" in said


# ----- the console's GPU panel ----------------------------------------------------------------------


def panel_run(run_id: str, gpus: list[int]) -> RunInfo:
    return {"id": run_id, "gpus": gpus}  # type: ignore[typeddict-item]  # Selection reads these two only


def test_the_gpu_panel_names_a_placed_run_under_its_gpu_and_marks_it_when_selected() -> None:
    placed = gpu_info(1, 97, [(4000001, None)])
    placed["inferred"] = [{"run_id": "r7", "inferred_from": "CUDA_VISIBLE_DEVICES"}]
    gpus = [gpu_info(0, 0, []), placed]
    history = GpuHistory()
    history.add(gpus, 100.0)
    plain = gpu_text(gpus, history, 100.0, width=100).plain
    assert f"run r7 {BY_CVD}" in plain and MARK not in plain
    # Selected with an --env CUDA_VISIBLE_DEVICES (no --gpus): GPU 1 is marked all the same.
    selected = gpu_text(gpus, history, 100.0, width=100, selection=Selection.of(panel_run("r7", []))).plain
    marked = [line for line in selected.splitlines() if line.lstrip().startswith(MARK)]
    assert [line.split()[1] for line in marked] == ["GPU1", "run"]


def test_in_a_narrow_panel_the_run_id_gives_up_its_head_and_the_note_stays() -> None:
    placed = gpu_info(0, 97, [])
    placed["inferred"] = [{"run_id": "20261201-042114-986-dcaa", "inferred_from": "CUDA_VISIBLE_DEVICES"}]
    history = GpuHistory()
    history.add([placed], 100.0)
    for width in (40, 55, 80):
        (line,) = [ln for ln in gpu_text([placed], history, 100.0, width=width).plain.splitlines() if "run" in ln]
        assert line.rstrip().endswith(f"-dcaa {BY_CVD}") and len(line) <= width
