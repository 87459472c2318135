"""What benchmarks/mutation.sh found no test of in the console's kill and relaunch path (console/actions.py and the
job grouping it kills and relaunches a job by, console/fleet/jobs.py): what `status` says of a job over hosts
(one unreachable, one whose nodes are all starting), which run is a node of a job, and which processes
free-gpus reports surviving. Run records as the agents send them."""

from __future__ import annotations

import asyncio
import base64
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends.protocol import FreeGpusResult, RunInfo
from console import actions
from console.fleet import jobs
from console.fleet.hosts import Fleet
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.link.transport import AgentError
from tests.conftest import kill_runs_of
from tests.fake_nvml import gpu, write_state
from tests.test_serve_flags import PARSER_PATH, SERVER, needs_parser


def node(run_id: str, rank: int, state: str, host: str = "") -> RunInfo:
    run: dict[str, Any] = {
        "id": run_id,
        "state": state,
        "job": {"id": "sweep-7", "node_rank": rank, "nnodes": 2},
    }
    if host:
        run["host"] = host
    return run  # type: ignore[return-value]  # the fields a job reads


def test_status_of_a_job_says_each_state_and_why_one_is_unknown() -> None:
    gathered = jobs.gather([("a", [node("r-0", 0, "running")]), ("b", [node("r-1", 1, "starting")])])
    assert jobs.jobs_text(gathered).splitlines() == [
        "job sweep-7  running  2/2 nodes  node 1 (b) starting",
        "  node 0  a  r-0  running",
        "  node 1  b  r-1  starting",
    ]
    since = time.time()
    down = jobs.jobs_text(gathered, {"b": since}).splitlines()[0]
    assert down == f"job sweep-7  unknown (b unreachable since {jobs.hms(since)}; last seen: running)  2/2 nodes"


def test_a_job_whose_every_node_is_starting_is_starting() -> None:
    (job,) = jobs.gather([("a", [node("r-0", 0, "starting")]), ("b", [node("r-1", 1, "starting")])])
    assert job.state() == ("starting", "node 0 (a) starting; node 1 (b) starting")


def test_the_job_of_a_run_in_view_and_a_run_of_one_node() -> None:
    runs = [node("r-0", 0, "running", "a"), node("r-1", 1, "running", "b")]
    found = jobs.in_view(runs[1], runs)
    assert found is not None and (found.id, [n.host for n in found.nodes]) == ("sweep-7", ["a", "b"])
    single: RunInfo = {"id": "r-9", "state": "running"}  # type: ignore[typeddict-item]
    assert jobs.in_view(single, runs) is None


def test_free_gpus_reports_as_surviving_the_processes_that_survived_only() -> None:
    done: FreeGpusResult = {  # type: ignore[typeddict-item]
        "dry_run": False,
        "gpus": [
            {"processes": [{"pid": 1, "action": "killed"}, {"pid": 2, "action": "survived"}]},
            {"processes": [{"pid": 3, "action": "skip: not yours"}, {"pid": 4, "action": "survived"}]},
        ],
    }
    assert [p["pid"] for p in actions.survivors(done)] == [2, 4]
    plan: FreeGpusResult = {  # type: ignore[typeddict-item]
        "dry_run": True,
        "gpus": [{"processes": [{"pid": 1, "action": "kill"}, {"pid": 3, "action": "skip: not yours"}]}],
    }
    assert [p["pid"] for p in actions.to_kill(plan)] == [1]


async def test_kill_of_several_runs_answers_for_each_in_order(client: AgentClient) -> None:
    """What the console's `k` on several runs gets back: each run's outcome, an error where there was no run."""
    launched = await client.launch("command", [sys.executable, "-c", "import time; time.sleep(60)"])
    run_id = launched["run"]
    assert actions.live((await client.list_runs())["runs"][0])
    first, second = await actions.kill(client, [run_id, "20000101-000000-000-0000"], signal="KILL", grace=10)
    assert not isinstance(first, Exception) and first["run"] == run_id
    assert [(p["signals"], p["died"]) for p in first["processes"]] == [(["KILL"], True)]
    assert isinstance(second, AgentError)
    (run,) = (await client.list_runs())["runs"]
    assert run["state"] == "killed" and not actions.live(run)


SLEEP_ARGV = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
async def other_host(tmp_path: Path, nvml_state: Path) -> AsyncIterator[AgentClient]:
    """A second host: an agent of its own over its own run store (killed at teardown, as a workdir's)."""
    workdir = tmp_path / "other-host"
    agent = AgentClient(LocalTransport(workdir))
    await agent.start()
    try:
        yield agent
    finally:
        await agent.close()
        kill_runs_of(workdir)


async def test_a_job_over_two_hosts_is_gathered_killed_whole_and_refused_when_a_node_is_missing(
    client: AgentClient, other_host: AgentClient
) -> None:
    for rank, host in enumerate((client, other_host)):
        await host.launch("command", SLEEP_ARGV, job="sweep-7", node_rank=rank, nnodes=2)
    fleet = Fleet.of({"a": client, "b": other_host})
    nodes = await actions.job_nodes(fleet, "sweep-7")
    assert [(member.name, run["job"]["node_rank"]) for member, run in nodes] == [("a", 0), ("b", 1)]
    with pytest.raises(actions.Refused, match=r"^no job nope on a, b: `status` lists the jobs$"):
        await actions.job_nodes(fleet, "nope")
    killed = await actions.kill_job(fleet, "sweep-7", signal="KILL", grace=10)
    assert [[(k["run"], [p["died"] for p in k["processes"]]) for k in each or []] for each in killed] == [
        [(nodes[0][1]["id"], [True])],
        [(nodes[1][1]["id"], [True])],
    ]
    assert not [run for run in await actions.job_runs(client, "sweep-7") if actions.live(run)]
    # Only node 0 is on the hosts given: a relaunch of part of a job is refused.
    with pytest.raises(actions.Refused, match=r"^job sweep-7 has no run of node 1 on these hosts"):
        await actions.job_nodes(Fleet.of({"a": client}, named=True), "sweep-7")


async def test_the_free_gpus_plan_is_of_the_gpus_chosen(client: AgentClient, nvml_state: Path) -> None:
    """The console's free-GPUs dialog plans for the GPUs the user chose, not every GPU of the host."""
    write_state(nvml_state, [gpu(), gpu(), gpu()])
    plan = await actions.free_gpus_plan(client, [1])
    assert plan["dry_run"] is True and [report["index"] for report in plan["gpus"]] == [1]
    assert [report["index"] for report in (await actions.free_gpus_plan(client))["gpus"]] == [0, 1, 2]


# A run that ignores SIGTERM: only the KILL after the grace ends it, so how long a kill takes tells the grace the host
# was given (the protocol's default is KILL_GRACE_S, 10 s; these pass 0.5 s).
STUBBORN_ARGV = [
    sys.executable,
    "-c",
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)",
]
SHORT_GRACE = 0.5


async def stubborn(host: AgentClient, extra: tuple[str, ...] = (), **job: Any) -> str:
    """A run that ignores TERM, once it has said so (before, a TERM would end it at once)."""
    run = (await host.launch("command", [*STUBBORN_ARGV, *extra], **job))["run"]
    for _ in range(200):
        if b"ready" in base64.b64decode((await host.logs(run))["data_b64"]):
            return run
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run} never got ready")


async def test_kill_sends_term_by_default_and_kill_after_the_grace_given(client: AgentClient) -> None:
    run = await stubborn(client)
    start = time.monotonic()
    (done,) = await actions.kill(client, [run], grace=SHORT_GRACE)
    assert time.monotonic() - start < actions.KILL_GRACE_S / 2  # the grace asked for, not the default
    assert not isinstance(done, Exception)
    assert [(p["signals"], p["died"]) for p in done["processes"]] == [(["TERM", "KILL"], True)]


async def test_a_job_is_killed_with_term_by_default_and_the_grace_given(
    client: AgentClient, other_host: AgentClient
) -> None:
    for rank, host in enumerate((client, other_host)):
        await stubborn(host, job="sweep-8", node_rank=rank, nnodes=2)
    start = time.monotonic()
    killed = await actions.kill_job(Fleet.of({"a": client, "b": other_host}), "sweep-8", grace=SHORT_GRACE)
    assert time.monotonic() - start < actions.KILL_GRACE_S / 2
    assert [[p["signals"] for k in each or [] for p in k["processes"]] for each in killed] == [
        [["TERM", "KILL"]],
        [["TERM", "KILL"]],
    ]


async def test_a_relaunch_and_its_preview_carry_every_part_of_the_edit(client: AgentClient) -> None:
    parent = await stubborn(client, ("--keep", "--drop"))
    edit = actions.Edit(sets=["--added=1"], unsets=["--drop"], grace=SHORT_GRACE)
    shown = await actions.preview(client, parent, edit)
    assert shown["argv"][len(STUBBORN_ARGV) :] == ["--keep", "--added", "1"] and shown["would_stop"]
    start = time.monotonic()
    child = await actions.relaunch(client, parent, edit)
    assert time.monotonic() - start < actions.KILL_GRACE_S / 2  # the parent stopped within the grace given
    info = await client.run_info(child["run"])
    assert info["argv"][len(STUBBORN_ARGV) :] == ["--keep", "--added", "1"] and info["parent"] == parent
    await client.kill(child["run"], signal="KILL", grace=0.0)


async def test_a_jobs_nodes_are_relaunched_together_each_old_one_stopped_first(
    client: AgentClient, other_host: AgentClient
) -> None:
    for rank, host in enumerate((client, other_host)):
        await stubborn(host, job="sweep-9", node_rank=rank, nnodes=2)
    fleet = Fleet.of({"a": client, "b": other_host})
    nodes = await actions.job_nodes(fleet, "sweep-9")
    start = time.monotonic()
    started = await actions.relaunch_nodes(
        [(member.client, run) for member, run in nodes], actions.Edit(sets=["--n=2"], grace=SHORT_GRACE)
    )
    assert time.monotonic() - start < actions.KILL_GRACE_S / 2
    for (member, old), new in zip(nodes, started, strict=True):
        assert not isinstance(new, Exception)
        assert (await member.client.run_info(old["id"]))["state"] == "killed"
        info = await member.client.run_info(new["run"])
        assert info["argv"][-2:] == ["--n", "2"] and info["parent"] == old["id"]
        assert info["job"]["node_rank"] == old["job"]["node_rank"]
        await member.client.kill(new["run"], signal="KILL", grace=0.0)


async def test_free_gpus_frees_only_the_gpus_chosen(client: AgentClient, nvml_state: Path) -> None:
    write_state(nvml_state, [gpu(), gpu(), gpu()])
    done = await actions.free_gpus(client, [1])
    assert done["dry_run"] is False and [report["index"] for report in done["gpus"]] == [1]


def test_a_job_is_gathered_by_its_newest_runs_widest_node_count_past_runs_of_no_job() -> None:
    single: RunInfo = {"id": "r-1", "state": "exited"}  # type: ignore[typeddict-item]
    newer, older = node("r-3", 0, "running"), node("r-2", 0, "killed")
    wide = node("r-4", 1, "running")
    wide["job"] = {"id": "sweep-7", "node_rank": 1, "nnodes": 3}
    (job,) = jobs.gather([("a", [single, newer, older, wide]), ("b", [node("r-0", 2, "running")])])
    assert [n.run["id"] for n in job.nodes] == ["r-3", "r-4", "r-0"]  # of node 0 its relaunch, not the older run
    assert job.nnodes == 3  # the widest any node said, whichever came last


@needs_parser
async def test_a_forced_preview_and_relaunch_go_past_a_flag_sglang_refuses(client: AgentClient) -> None:
    """SGLang's own parser (the parser tier) refuses the flag; only `force` lets the preview show it and the relaunch
    start. The parent dies at once here (no GPU runtime): nothing to stop."""
    env = {"PYTHONPATH": str(PARSER_PATH)}
    parent = (await client.launch("serve", [*SERVER, "--model-path", "/nowhere"], env=env))["run"]
    refused = actions.Edit(sets=["--cuda-graph-max-bs=8"])
    with pytest.raises(AgentError, match="ambiguous option: --cuda-graph-max-bs could match"):
        await actions.preview(client, parent, refused)
    forced = actions.Edit(sets=["--cuda-graph-max-bs=8"], force=True)
    shown = await actions.preview(client, parent, forced)
    assert shown["flags"] is not None and "ambiguous option" in shown["flags"]["message"]
    child = await actions.relaunch(client, parent, forced)
    assert child["argv"][-2:] == ["--cuda-graph-max-bs", "8"]
    await client.kill(child["run"], signal="KILL", grace=0.0)


async def test_a_job_missing_several_nodes_names_each(client: AgentClient) -> None:
    await client.launch("command", SLEEP_ARGV, job="sweep-3", node_rank=0, nnodes=3)
    with pytest.raises(actions.Refused, match=r"^job sweep-3 has no run of node 1, node 2 on these hosts"):
        await actions.job_nodes(Fleet.of({"a": client}, named=True), "sweep-3")


async def test_a_job_is_not_relaunched_while_one_of_its_hosts_cannot_answer(
    client: AgentClient, tmp_path: Path
) -> None:
    (tmp_path / "not-a-store").write_text("a file where the host's run store should be")
    broken = AgentClient(LocalTransport(tmp_path / "not-a-store"))  # its agent exits, saying why
    try:
        fleet = Fleet.of({"a": client, "b": broken})
        with pytest.raises(actions.Refused, match=r"^nothing relaunched: job sweep-1 relaunches only when every host"):
            await actions.job_nodes(fleet, "sweep-1")
        assert [member.name for member in fleet.unreached] == ["b"]
    finally:
        await broken.close()
