"""Multi-node jobs, piece by piece: a node's record and its torchrun options (backends.runs.job), who sits where in
a stalled run (backends.runs.stalled), and a job's state from its nodes (console.fleet.jobs). The whole job over two
real sshd hosts is in test_many_hosts."""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.protocol import OPS, RunInfo, StalledProcess
from backends.runs import job, stalled
from backends.runs.control import OpError, checked_spec
from backends.runs.store import RunSpec, SpecError
from console.actions import job_id
from console.fleet import jobs
from tests.conftest import CLI


@given(st.text(max_size=70), st.integers(-3, 10), st.integers(-3, 10))
def test_a_node_is_a_job_id_and_a_rank_below_the_node_count(job_id: str, rank: int, count: int) -> None:
    problem = job.node_problem({"id": job_id, "node_rank": rank, "nnodes": count})
    fine = bool(job.JOB_ID.fullmatch(job_id)) and count >= 1 and 0 <= rank < count
    assert (problem is None) == fine
    if not fine:
        with pytest.raises(SpecError):
            RunSpec("train", ["python3"], job={"id": job_id, "node_rank": rank, "nnodes": count}).validate()


def test_a_node_record_takes_no_other_shape() -> None:
    bad: object
    for bad in (None, [], {"id": "j", "node_rank": 0}, {"id": "j", "node_rank": True, "nnodes": 2}):
        assert job.node_problem(bad) is not None


def launch_args(**given: Any) -> dict[str, Any]:
    """A launch request's arguments as the agent receives them, less `force` (the gate's): the protocol's
    defaults, then `given`."""
    base = {name: copy.deepcopy(default) for name, (_, _, default) in OPS["launch"].items() if name != "force"}
    return {**base, "kind": "train", "argv": ["--steps", "1"], **given}


def test_a_node_of_our_training_runs_torchrun_at_the_rendezvous_in_its_host_order() -> None:
    spec = checked_spec(
        None, **launch_args(module="backends.train", job="j1", node_rank=1, nnodes=2, rendezvous="10.0.0.1:29400")
    )
    assert spec.job == {"id": "j1", "node_rank": 1, "nnodes": 2}
    launcher = spec.argv[spec.argv.index("torch.distributed.run") + 1 : spec.argv.index("backends.train") - 1]
    assert launcher == [
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=static",
        "--rdzv-endpoint=10.0.0.1:29400",
        "--rdzv-id=j1",
        f"--rdzv-conf=timeout={job.JOIN_TIMEOUT_S}",
        "--nproc-per-node=1",
    ]
    assert spec.argv[-2:] == ["--steps", "1"]


def test_a_command_of_the_users_is_recorded_as_a_node_without_touching_its_argv() -> None:
    spec = checked_spec(None, **launch_args(kind="command", argv=["./run.sh"], job="j", node_rank=0, nnodes=3))
    assert (spec.argv, spec.job) == (["./run.sh"], {"id": "j", "node_rank": 0, "nnodes": 3})


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"module": "backends.train", "job": "j", "node_rank": 0, "nnodes": 2}, "meets the others at a rendezvous"),
        ({"module": "backends.train", "rendezvous": "h:1"}, "rendezvous goes with a job"),
        ({"job": "j", "node_rank": 0}, "job, node_rank and nnodes together"),
        ({"job": "j", "node_rank": 2, "nnodes": 2}, "node_rank is 0 to 1"),
        ({"job": "../x", "node_rank": 0, "nnodes": 1}, "a job id is"),
        ({"kind": "command", "argv": ["x"], "job": "j", "node_rank": 0, "nnodes": 1, "rendezvous": "h:1"}, "go with"),
        ({"module": "backends.train", "job": "j", "node_rank": 0, "nnodes": 2, "rendezvous": "h"}, "not HOST:PORT"),
    ],
)
def test_a_node_named_badly_is_refused_before_anything_starts(given: dict[str, Any], said: str) -> None:
    with pytest.raises(OpError, match=said):
        checked_spec(None, **launch_args(**given))


def test_the_rendezvous_address_is_the_one_the_console_reached_and_the_port_is_free() -> None:
    assert job.reachable_address("192.168.1.5 52000 10.1.2.3 22") == "10.1.2.3"
    assert job.reachable_address(None) == job.reachable_address("garbage") == "127.0.0.1"
    assert job.reachable_address("fe80::2 52000 2001:db8::1 22") == "[2001:db8::1]"
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", job.free_port()))  # free: binding it works


def test_launch_records_a_users_node_and_status_shows_it(cli: CLI) -> None:
    done = cli("launch", "command", "--job", "sweep-1", "--node-rank", "1", "--nnodes", "2", "--", "true")
    assert done.returncode == 0, done.stderr
    run = done.stdout.decode().strip()
    info = json.loads(cli("status", run, "--json").stdout)
    assert info["job"] == {"id": "sweep-1", "node_rank": 1, "nnodes": 2}
    for words, said in (
        (["--job", "j"], "takes --job NAME, --node-rank R and --nnodes N together"),
        (["--job", "j", "--node-rank", "2", "--nnodes", "2"], "--node-rank is 0 to 1"),
    ):
        refused = cli("launch", "command", *words, "--", "true")
        assert refused.returncode == 2 and said in refused.stderr.decode(), refused.stderr


PY_SPY = """Process 4242: python -m backends.train
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    wrapper (torch/distributed/c10d_logger.py:81)
Thread 4250 (idle): "Thread-1"
    wait (threading.py:331)
"""


def test_a_stalled_process_is_placed_at_its_innermost_frame_or_its_kernel_wait() -> None:
    dump = f"=== pid 4242: python -m backends.train\n{PY_SPY}\n=== pid 4243: python\nState: S\nwchan: futex_wait\n"
    found: list[StalledProcess] = [
        {"pid": 4242, "rank": 0, "state": "S", "where": None},
        {"pid": 4243, "rank": 1, "state": "S", "where": None},
        {"pid": 4244, "rank": 2, "state": "T", "where": None},
        {"pid": 4245, "rank": None, "state": "S", "where": None},
    ]
    placed = [p["where"] for p in stalled.with_places(found, dump)]
    assert placed == [
        "in all_reduce (distributed_c10d.py:3252), idle",
        "in the kernel's futex_wait",
        stalled.STOPPED,
        None,
    ]


def test_a_stopped_process_is_seen_as_stopped_with_its_rank() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={"RANK": "3"})
    try:
        child.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while (seen := stalled.before_dump([child.pid])[0])["state"] != "T":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert (seen["rank"], seen["pid"]) == (3, child.pid)
    finally:
        child.kill()
        child.wait()


def run(rank: int, state: str, **more: Any) -> RunInfo:
    info: dict[str, Any] = {"id": f"r{rank}-{more.pop('n', 0)}", "state": state, "exit_code": None, "error": None}
    info["kind"] = more.pop("kind", "train")
    info.update(signal=None, stall_kind=None, job={"id": "j", "node_rank": rank, "nnodes": 2}, **more)
    return info  # type: ignore[return-value]  # the fields the job's state reads


def job_of(*nodes: tuple[str, RunInfo]) -> jobs.Job:
    [found] = jobs.gather((host, [info]) for host, info in nodes)
    return found


def held(rank: int, where: str, state: str = "S") -> StalledProcess:
    return {"pid": 100 + rank, "rank": rank, "state": state, "where": where}


def test_a_job_fails_when_any_node_fails_and_says_which() -> None:
    found = job_of(("a", run(0, "running")), ("b", run(1, "failed", exit_code=1)))
    assert found.state() == ("failed", "node 1 (b) failed (exit 1)")


def test_a_job_is_stalled_only_when_every_node_is_and_the_odd_rank_comes_first() -> None:
    spinning = [held(r, "in all_reduce (c10d.py:1), idle") for r in range(3)]
    frozen = [held(3, stalled.STOPPED, "T"), held(4, "in all_reduce (c10d.py:1), idle")]
    nodes = ("a", run(0, "stalled", stalled_processes=spinning)), ("b", run(1, "stalled", stalled_processes=frozen))
    state, story = job_of(*nodes).state()
    assert state == "stalled"
    assert story == (
        f"node 1 (b): rank 3 {stalled.STOPPED}; node 1 (b): rank 4 in all_reduce (c10d.py:1), idle; "
        "node 0 (a): ranks 0, 1, 2 in all_reduce (c10d.py:1), idle"
    )
    assert job_of(("a", run(0, "running")), ("b", run(1, "stalled"))).state() == ("running", "node 1 (b) stalled")


def test_a_job_is_ready_when_node_0_is_and_a_missing_node_is_said() -> None:
    assert job_of(("a", run(0, "ready")), ("b", run(1, "running"))).state() == ("ready", "")
    assert job_of(("a", run(0, "running"))).state() == ("running", "node 1 not seen")
    assert job_of(("a", run(0, "exited")), ("b", run(1, "exited"))).state() == ("exited", "")
    assert job_of(("a", run(0, "killed")), ("b", run(1, "exited"))).state() == ("killed", "")


def test_of_a_node_relaunched_the_job_shows_the_newest_run() -> None:
    [found] = jobs.gather([("a", [run(0, "failed", n=1), run(0, "running", n=2)]), ("b", [run(1, "running")])])
    assert [node.run["id"] for node in found.nodes] == ["r0-2", "r1-0"]
    assert found.state() == ("running", "")


def test_runs_of_one_node_are_no_job() -> None:
    alone = run(0, "running")
    del alone["job"]
    assert jobs.gather([("a", [alone])]) == []


@given(st.text(max_size=80))
def test_any_name_makes_a_job_id_the_agents_take(name: str) -> None:
    made = job_id(name or None, "train")
    assert job.JOB_ID.fullmatch(made), made
