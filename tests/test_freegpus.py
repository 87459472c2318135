"""Freeing GPUs as a user sees it: real processes, real signals, memory released on the NVML double.

Real: the processes, their signals, the files they hold open. The NVML double (tests/fake_nvml.py) lists the
GPUs' processes and names a folder of plain files standing in for the GPUs' device nodes (/dev/nvidiaN): a
GPU holder here maps its GPU's stand-in into its memory, as a CUDA context maps its node.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.host import procinfo
from backends.host.freegpus import carry_out, free_gpus, plan_free
from backends.host.gpus import GpuSampler
from backends.protocol import ProtocolError
from tests import fake_nvml
from tests.conftest import CLI, Spawn, wait_for, wait_state
from tests.fake_nvml import gpu, write_state
from tests.sshd import ALIAS, Sshd

NVML_DOUBLE_ENV = ("EAGLE3_NVML_MODULE", fake_nvml.STATE_ENV, "PYTHONPATH")  # what `nvml_state` sets

STUBBORN = fake_nvml.MAP_NODES + (
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


@pytest.fixture
def nodes(tmp_path: Path) -> Path:
    """The stand-in device nodes the double's state names (`dev_dir`)."""
    return fake_nvml.stand_in_nodes(tmp_path / "dev")


def holding(spawn: Spawn, *held: Path, code: str = fake_nvml.HOLDER, **popen: Any) -> subprocess.Popen[bytes]:
    """A child running `code` with the stand-in nodes `held` as arguments (HOLDER maps them for its whole life,
    as a CUDA context maps its GPU's node), once it said it is ready."""
    child = spawn([sys.executable, "-c", code, *map(str, held)], stdout=subprocess.PIPE, **popen)
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"
    return child


def alive(child: subprocess.Popen[bytes]) -> bool:
    return procinfo.identify(child.pid) is not None


def test_dry_run_plans_the_kill_and_signals_nothing(
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    trainer = holding(spawn, nodes / "nvidia0")
    write_state(state, [gpu(base_used_mib=500, processes=[(trainer.pid, 4600)])], dev_dir=nodes)
    result = free_gpus(sampler, None, dry_run=True)
    time.sleep(0.2)
    assert alive(trainer)
    assert result["dry_run"] is True
    (report,) = result["gpus"]
    assert [(p["pid"], p["action"]) for p in report["processes"]] == [(trainer.pid, "kill")]
    assert (report["mem_used_before_mib"], report["mem_used_after_mib"], report["freed_mib"]) == (5100, None, None)
    assert report["still_held"] == []


def test_our_process_is_killed_its_memory_freed_and_it_is_reaped(
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    trainer = holding(spawn, nodes / "nvidia0")
    write_state(state, [gpu(base_used_mib=500, processes=[(trainer.pid, 4600)])], dev_dir=nodes)
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


def test_a_process_ignoring_sigterm_is_sigkilled_after_grace(
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    stubborn = holding(spawn, nodes / "nvidia0", code=STUBBORN)
    write_state(state, [gpu(processes=[(stubborn.pid, 8000)])], dev_dir=nodes)
    started = time.monotonic()
    result = free_gpus(sampler, None, dry_run=False, timeout=60, grace=0.5)
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 10  # ended by SIGKILL, not by the timeout
    (report,) = result["gpus"]
    assert [p["action"] for p in report["processes"]] == ["killed"]
    assert report["freed_mib"] == 8000
    assert not Path(f"/proc/{stubborn.pid}").exists()  # dead and reaped


def test_a_process_surviving_the_timeout_is_reported_still_holding(
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    stubborn = holding(spawn, nodes / "nvidia0", code=STUBBORN)
    write_state(state, [gpu(base_used_mib=10, processes=[(stubborn.pid, 8000)])], dev_dir=nodes)
    # grace == timeout: no time is left for SIGKILL to be sent and waited on.
    result = free_gpus(sampler, None, dry_run=False, timeout=0.3, grace=10)
    (report,) = result["gpus"]
    assert alive(stubborn)
    assert [p["action"] for p in report["processes"]] == ["survived"]
    assert [(p["pid"], p["action"]) for p in report["still_held"]] == [(stubborn.pid, "survived")]
    assert report["freed_mib"] == 0


def test_a_recycled_pid_is_never_signalled(state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path) -> None:
    newcomer = holding(spawn, nodes / "nvidia0")
    write_state(state, [gpu(processes=[(newcomer.pid, 4600)])], dev_dir=nodes)
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
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    pid, user = someone_elses_process(spawn)
    ours = holding(spawn, nodes / "nvidia0")
    write_state(state, [gpu(base_used_mib=0, processes=[(pid, 30000), (ours.pid, 1000)])], dev_dir=nodes)
    result = free_gpus(sampler, None, dry_run=False, timeout=5, grace=1)
    assert procinfo.identify(pid) is not None
    (report,) = result["gpus"]
    actions = {p["pid"]: p["action"] for p in report["processes"]}
    assert actions[ours.pid] == "killed"
    assert actions[pid].startswith("skip: ")
    if user is not None:
        assert actions[pid] == f"skip: belongs to user {user}"
        assert {p["pid"]: p["holder"] for p in report["processes"]} == {pid: "not_yours", ours.pid: "own"}
    (held,) = report["still_held"]
    assert (held["pid"], held["mem_mib"], held["action"]) == (pid, 30000, actions[pid])
    assert held["user"] == procinfo.user_name(procinfo.proc_uid(pid))
    assert report["freed_mib"] == 1000


def test_only_the_chosen_gpus_are_touched(state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path) -> None:
    on_0, on_1 = holding(spawn, nodes / "nvidia0"), holding(spawn, nodes / "nvidia1")
    write_state(state, [gpu(processes=[(on_0.pid, 100)]), gpu(processes=[(on_1.pid, 200)])], dev_dir=nodes)
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


def test_the_dry_run_lists_what_would_stay(state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path) -> None:
    ours = holding(spawn, nodes / "nvidia0")
    write_state(state, [gpu(processes=[(ours.pid, 100), (1, 50)])], dev_dir=nodes)
    (report,) = free_gpus(sampler, None, dry_run=True)["gpus"]
    assert [(p["pid"], p["action"]) for p in report["still_held"]] == [
        (1, "skip: protected (pid 1, the agent or the console)")
    ]
    assert alive(ours)


def test_a_process_on_two_gpus_is_killed_once_and_both_are_freed(
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    tensor_parallel = holding(spawn, nodes / "nvidia0", nodes / "nvidia1")
    write_state(
        state,
        [gpu(processes=[(tensor_parallel.pid, 70000)]), gpu(processes=[(tensor_parallel.pid, 70000)])],
        dev_dir=nodes,
    )
    result = free_gpus(sampler, None, dry_run=False, timeout=5, grace=1)
    assert [(r["freed_mib"], [p["action"] for p in r["processes"]]) for r in result["gpus"]] == [
        (70000, ["killed"]),
        (70000, ["killed"]),
    ]


NO_NODE = "does not hold an NVIDIA device here (no CUDA context mapping {node}): "
IN_A_CONTAINER = "NVML's pid is likely from another pid namespace (a container?)"


def test_a_listed_process_that_holds_no_gpu_node_is_never_signalled_and_the_report_says_why(
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    # NVML lists both; only `holder` holds GPU 0's node. `bystander` is any process of ours whose pid NVML
    # happens to list (inside a container: a host pid with its number).
    bystander, holder = spawn(), holding(spawn, nodes / "nvidia0")
    write_state(state, [gpu(base_used_mib=100, processes=[(bystander.pid, 4000), (holder.pid, 1000)])], dev_dir=nodes)
    planned = free_gpus(sampler, None, dry_run=True)["gpus"][0]["processes"]
    why = f"skip: {NO_NODE.format(node=nodes / 'nvidia0')}{IN_A_CONTAINER}"
    assert [(p["pid"], p["action"]) for p in planned] == [(bystander.pid, why), (holder.pid, "kill")]
    (report,) = free_gpus(sampler, None, dry_run=False, timeout=5, grace=1)["gpus"]
    assert alive(bystander)  # a SIGTERM or SIGKILL would have ended it
    assert {p["pid"]: p["action"] for p in report["processes"]} == {bystander.pid: why, holder.pid: "killed"}
    # Held by someone unknown: the user of the pid here is not the GPU holder's.
    (held,) = report["still_held"]
    assert (held["pid"], held["user"], held["run_id"], held["mem_mib"]) == (bystander.pid, None, None, 4000)
    assert report["freed_mib"] == 1000


# As an NVML monitor or nvidia-smi: GPU 0's node and the driver's open, only the driver's control node mapped.
MONITOR = (
    "import mmap, sys, time\n"
    "files = [open(path, 'rb') for path in sys.argv[1:]]\n"
    "control = mmap.mmap(files[1].fileno(), 0, access=mmap.ACCESS_READ)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_only_a_cuda_context_on_the_gpus_own_node_counts_and_any_gpus_node_without_a_minor_number(
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    on_1 = holding(spawn, nodes / "nvidia1", nodes / "nvidiactl", nodes / "nvidia-uvm")
    monitor = holding(spawn, nodes / "nvidia0", nodes / "nvidiactl", nodes / "nvidia-uvm", code=MONITOR)
    write_state(state, [gpu(processes=[(on_1.pid, 100), (monitor.pid, 10)])], dev_dir=nodes)
    actions = [p["action"] for p in free_gpus(sampler, None, dry_run=True)["gpus"][0]["processes"]]
    assert actions == [f"skip: {NO_NODE.format(node=nodes / 'nvidia0')}{IN_A_CONTAINER}"] * 2
    # Without GPU 0's minor number, some GPU's node mapped is the proof; the driver's control node never is.
    write_state(state, [gpu(processes=[(on_1.pid, 100), (monitor.pid, 10)], fail=["minor"])], dev_dir=nodes)
    (report,) = free_gpus(sampler, None, dry_run=False, timeout=5, grace=1)["gpus"]
    assert [p["action"] for p in report["processes"]] == [
        "killed",
        f"skip: {NO_NODE.format(node=nodes / 'nvidiaN')}{IN_A_CONTAINER}",
    ]
    assert not alive(on_1) and alive(monitor)


def test_nodes_are_looked_for_in_dev_unless_the_nvml_module_names_another_folder(
    state: Path, sampler: GpuSampler, nodes: Path
) -> None:
    write_state(state, [gpu(), gpu()])
    assert str(sampler.gpu_node(1)) == "/dev/nvidia1"
    write_state(state, [gpu(), gpu(fail=["minor"])], dev_dir=nodes)
    assert (str(sampler.gpu_node(0)), str(sampler.gpu_node(1))) == (f"{nodes}/nvidia0", f"{nodes}/nvidiaN")


# Maps GPU 0's node, and unmaps it (living on) on SIGTERM or when told to on stdin.
LETS_GO = fake_nvml.MAP_NODES + (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: nodes[0].close())\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "nodes[0].close()\n"
    "print('let go', flush=True)\n"
    "time.sleep(60)\n"
)


def mapped(child: subprocess.Popen[bytes], node: Path) -> bool:
    return str(node) in (procinfo.mapped_files(child.pid) or set())


def test_a_process_that_let_go_of_its_node_after_the_plan_is_not_signalled(
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    child = holding(spawn, nodes / "nvidia0", code=LETS_GO, stdin=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    write_state(state, [gpu(processes=[(child.pid, 4600)])], dev_dir=nodes)
    plan = plan_free(sampler, None)
    assert [p.skip for p in plan.processes] == [None]
    child.stdin.write(b"now\n")
    child.stdin.flush()
    assert child.stdout.readline() == b"let go\n"
    (report,) = carry_out(plan, sampler, timeout=1, grace=0.2)["gpus"]
    assert alive(child)
    assert [p["action"] for p in report["processes"]] == [
        f"skip: {NO_NODE.format(node=nodes / 'nvidia0')}{IN_A_CONTAINER}"
    ]


def test_sigkill_is_not_sent_to_a_process_that_let_go_of_its_node_on_sigterm(
    state: Path, sampler: GpuSampler, spawn: Spawn, nodes: Path
) -> None:
    # SIGTERM finds it holding GPU 0's node; it unmaps the node and lives on, so at the grace's end it is no
    # longer proven to be the GPU's holder and SIGKILL is not sent.
    child = holding(spawn, nodes / "nvidia0", code=LETS_GO, stdin=subprocess.PIPE)
    assert mapped(child, nodes / "nvidia0")
    write_state(state, [gpu(processes=[(child.pid, 4600)])], dev_dir=nodes)
    (report,) = free_gpus(sampler, None, dry_run=False, timeout=2, grace=0.5)["gpus"]
    assert alive(child) and not mapped(child, nodes / "nvidia0")
    assert [p["action"] for p in report["processes"]] == ["survived"]


# --- whose each process is: runs of this store, of another workdir, the user's own ---------------------------


def other_store(workdir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """The console on another workdir of the same user on this host."""
    argv = [sys.executable, "-m", "console", "--workdir", str(workdir), "local", *args]
    return subprocess.run(argv, capture_output=True, timeout=60, check=False)


def launched_holder(run: Callable[..., subprocess.CompletedProcess[bytes]], node: Path) -> tuple[str, int]:
    """A run whose child holds `node` (as a CUDA context maps its GPU's node): its id and its child's pid."""
    done = run("launch", "command", "--", sys.executable, "-c", fake_nvml.HOLDER, str(node))
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.decode().strip()

    def child() -> int | None:
        (info,) = [r for r in json.loads(run("status", "--json").stdout)["runs"] if r["id"] == run_id]
        return info["pid"] if b"ready" in run("logs", run_id).stdout else None

    return run_id, wait_for(child, what=f"run {run_id} holding {node.name}")


def over_ssh(sshd: Sshd, workdir: Path, folder: Path) -> CLI:
    """The console on the same store through the test sshd: the host's Python (a wrapper, as --remote-python
    names one) hands the agent the NVML double this test set up, as a host's own environment would."""
    python = folder / "host-python"
    exports = " ".join(f"{name}={shlex.quote(os.environ[name])}" for name in NVML_DOUBLE_ENV)
    python.write_text(f'#!/bin/sh\nexport {exports}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
        argv = [sys.executable, "-m", "console", "--no-reuse", "--workdir", str(workdir), "--remote-python",
                str(python), ALIAS, *args]  # fmt: skip
        return subprocess.run(argv, env=sshd.env(), capture_output=True, timeout=timeout, check=False)

    return run


@pytest.mark.parametrize("host", ["local", ALIAS])
def test_the_plan_says_whose_each_process_is_and_a_run_of_another_workdir_ends_killed_there(
    host: str, cli: CLI, nvml_state: Path, spawn: Spawn, sshd: Sshd, workdir: Path, tmp_path: Path
) -> None:
    """Real: both stores, their agents, supervisors and runs, the user's own process, the signals, and for
    gpu-test OpenSSH's sshd between the console and its agent; the NVML double lists the three on one GPU."""
    if host == ALIAS:
        cli = over_ssh(sshd, workdir, tmp_path)
    nodes = fake_nvml.stand_in_nodes(tmp_path / "dev")
    elsewhere = tmp_path / "elsewhere"
    here, here_pid = launched_holder(cli, nodes / "nvidia0")
    there, there_pid = launched_holder(functools.partial(other_store, elsewhere), nodes / "nvidia0")
    own = holding(spawn, nodes / "nvidia0")
    listed = [(here_pid, 1000), (there_pid, 2000), (own.pid, 3000)]
    write_state(nvml_state, [gpu(processes=listed)], dev_dir=nodes)

    planned = cli("free-gpus", "--dry-run", "--json")
    assert planned.returncode == 0, planned.stderr
    (report,) = json.loads(planned.stdout)["gpus"]
    assert {p["pid"]: (p["holder"], p["run_id"], p["workdir"], p["action"]) for p in report["processes"]} == {
        here_pid: ("run", here, None, "kill"),
        there_pid: ("other_store", there, str(elsewhere), "kill"),
        own.pid: ("own", None, None, "kill"),
    }
    shown = cli("free-gpus", "--yes")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.decode().splitlines()
    user = procinfo.user_name(os.geteuid())
    assert f"  pid {here_pid} ({user}, run {here} of this store, 1000 MiB): killed" in lines
    assert f"  pid {there_pid} ({user}, run {there} of workdir {elsewhere}, 2000 MiB): killed" in lines
    assert f"  pid {own.pid} ({user}, your process, not a run, 3000 MiB): killed" in lines
    assert wait_state(cli, here, {"killed", "failed"})["state"] == "killed"

    def state_there() -> str | None:
        (info,) = json.loads(other_store(elsewhere, "status", "--json").stdout)["runs"]
        return info["state"] if info["state"] not in ("running", "starting") else None

    assert wait_for(state_there, what="the other store's run to end") == "killed"  # not failed
