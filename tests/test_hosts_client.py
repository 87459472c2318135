"""The console's client over several hosts (console.fleet.hosts) against real agents, one per run store: runs
named HOST/RUN, every request sent to the run's host with the host's own id, and a host that cannot be reached
said in `links` while the other answers. (The console over two real sshd hosts is in test_many_hosts.)"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import cast

import pytest

from backends.runs.store import RunStore
from console.fleet.hosts import Fleet, HostsStatus
from console.fleet.names import split
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.link.transport import AgentError, TransportError
from tests.test_status_index import ended_run

SLEEPER = "import time; time.sleep(60)"


async def test_two_hosts_answer_as_one_each_run_named_by_its_host_and_a_host_down_said(tmp_path: Path) -> None:
    down = tmp_path / "not-a-folder"
    down.write_text("a file where the run store should be: this host's agent cannot start")
    hosts = Fleet.of({"a": AgentClient(LocalTransport(tmp_path / "a")), "b": AgentClient(LocalTransport(down))})
    try:
        said: list[str] = []
        await hosts.reconnect_until_back(lambda exc: said.append(str(exc)))
        started = await hosts.clients["a"].launch("command", [sys.executable, "-c", SLEEPER], name="s")
        status = await hosts.status(gpus=False)
        run = f"a/{started['run']}"
        assert [(r["id"], r["host"]) for r in status["runs"]] == [(run, "a")]
        links = cast(HostsStatus, status)["links"]
        assert status["host"] == "a, b" and links["a"] is None
        assert links["b"]  # why b cannot be reached, for the banner
        assert (await hosts.run_info(run))["id"] == run
        killed = await hosts.kill(run, grace=1)
        assert killed["run"] == run and killed["state"] == "killed"
        with pytest.raises(AgentError, match="HOST/RUN"):
            await hosts.kill(started["run"])  # no host named: never guessed
        with pytest.raises(TransportError, match=r"^b: "):
            await hosts.run_info("b/20261201-000000-000-0000")
        with pytest.raises(AgentError, match="no host c"):
            await hosts.run_info("c/x")
    finally:
        await hosts.close()


async def test_a_relaunch_comes_back_named_by_its_host(tmp_path: Path) -> None:
    hosts = Fleet.of({name: AgentClient(LocalTransport(tmp_path / name)) for name in ("a", "b")})
    try:
        await hosts.reconnect_until_back(lambda exc: None)
        started = await hosts.clients["b"].launch("command", [sys.executable, "-c", SLEEPER], name="s")
        again = await hosts.relaunch(f"b/{started['run']}", grace=1)
        assert split(again["run"])[0] == "b" and again["parent"] == f"b/{started['run']}"
        assert again["stopped_parent"] is not None and again["stopped_parent"]["run"] == f"b/{started['run']}"
        assert split(again["run"])[1] in {r["id"] for r in (await hosts.clients["b"].status())["runs"]}
        await hosts.kill(again["run"], grace=1)
    finally:
        await hosts.close()


def test_a_run_key_splits_at_its_last_slash() -> None:
    assert split("me@gpu1:2222/20261201-000000-000-0000") == ("me@gpu1:2222", "20261201-000000-000-0000")


async def test_the_ended_runs_not_listed_are_counted_over_every_host(tmp_path: Path) -> None:
    """The console over two hosts asks each for its newest ended runs: what each left out adds up, once."""
    made = {"a": 7, "b": 4}
    for name, count in made.items():
        store = RunStore(tmp_path / name)
        for index in range(count):
            ended_run(store, time.time() - 3600 - index * 60)
    hosts = Fleet.of({name: AgentClient(LocalTransport(tmp_path / name)) for name in made})
    try:
        await hosts.reconnect_until_back(lambda exc: None)
        status = await hosts.status(gpus=False, ended=3)
        assert sorted(r["host"] for r in status["runs"]) == ["a"] * 3 + ["b"] * 3
        assert (status["ended_total"], status["hidden"]) == (11, (7 - 3) + (4 - 3))
    finally:
        await hosts.close()
