"""`lost`, the one state no process of the run is left to record: reading a run's state writes nothing and reads
its events once a look; the agent that finds a run lost records it, once.

Real: the run store's files, the processes whose identities a run records (started and ended here), the agent's
handlers in this process (its replies go to a socket pair).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.agent import Agent
from backends.fileio import append_jsonl, atomic_write_json
from backends.host import procinfo
from backends.runs.store import EVENTS, EXIT, PROC, RunDir, RunSpec, RunStore, derive_state

AN_HOUR_AGO = time.time() - 3600


def dead_ident() -> dict[str, object]:
    """The identity of a process that has ended, as a run records its supervisor and child."""
    proc = subprocess.Popen(["sleep", "30"])
    ident = procinfo.identify(proc.pid)
    proc.kill()
    proc.wait(timeout=5)
    assert ident is not None
    return ident.to_json()


def ended_run(workdir: Path, events: list[dict[str, Any]]) -> RunDir:
    """A run whose supervisor and child have both gone, without exit.json."""
    run = RunStore(workdir).create(RunSpec(kind="command", argv=["sleep", "30"], created_at=AN_HOUR_AGO))
    atomic_write_json(run.file(PROC), {"supervisor": dead_ident(), "child": dead_ident(), "child_started_at": 1.0})
    for row in [{"t": 2.0, "type": "launched"}, *events]:
        append_jsonl(run.file(EVENTS), row)
    return run


def the_store(workdir: Path) -> dict[str, tuple[int, bytes]]:
    """Every file and folder of the store: its mode and its bytes."""
    return {
        str(path.relative_to(workdir)): (path.stat().st_mode, path.read_bytes() if path.is_file() else b"")
        for path in sorted(workdir.rglob("*"))
    }


@contextlib.contextmanager
def read_only(workdir: Path) -> Iterator[None]:
    """The store made read-only (root writes into it all the same: `the_store` is what tells a write)."""
    paths = [workdir, *workdir.rglob("*")]
    modes = {path: path.stat().st_mode for path in paths}
    for path in reversed(paths):
        path.chmod(0o500 if path.is_dir() else 0o400)
    try:
        yield
    finally:
        for path in paths:
            path.chmod(modes[path])


@pytest.fixture
def event_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each opening of an events.jsonl, as it happens."""
    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, Path)) and Path(file).name == EVENTS:
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    return opened


@pytest.mark.parametrize("store", ["writable", "read-only"])
def test_a_lost_runs_state_is_read_without_a_write_and_with_one_read_of_its_events(
    tmp_path: Path, event_reads: list[str], store: str
) -> None:
    workdir = tmp_path / "work"
    run = ended_run(workdir, [])
    before = the_store(workdir)
    with read_only(workdir) if store == "read-only" else contextlib.nullcontext():
        looks: list[Callable[[], str]] = [lambda: derive_state(run), run.state, lambda: run.info()["state"]]
        for look in looks:
            event_reads.clear()
            assert look() == "lost"
            assert len(event_reads) == 1
    assert the_store(workdir) == before


def test_an_exit_written_during_the_look_is_told_from_the_events_read_once(
    tmp_path: Path, event_reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = ended_run(tmp_path / "work", [])
    real_is_alive = procinfo.is_alive

    def is_alive_as_the_supervisor_finishes(ident: procinfo.ProcIdentity) -> bool:
        if not run.file(EXIT).exists():  # the supervisor writes exit.json and leaves exactly as we look
            atomic_write_json(run.file(EXIT), {"code": 3, "ended_at": time.time()})
        return real_is_alive(ident)

    monkeypatch.setattr(procinfo, "is_alive", is_alive_as_the_supervisor_finishes)
    assert derive_state(run) == "failed"
    assert len(event_reads) == 1


@contextlib.asynccontextmanager
async def agent_on(workdir: Path) -> AsyncIterator[Agent]:
    """An agent over the store, as one connection starts it."""
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=ours)
    try:
        yield Agent(RunStore(workdir), writer)
    finally:
        writer.close()
        theirs.close()


def lost_records(run: RunDir) -> list[dict[str, Any]]:
    return [e for e in run.events() if e.get("type") == "state" and e.get("state") == "lost"]


async def test_the_agent_that_finds_a_run_lost_records_it_once(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    run = ended_run(workdir, [])
    assert run.info()["state"] == "lost" and lost_records(run) == []  # a look records nothing
    looks: list[Callable[[Agent], Any]] = [
        lambda agent: agent.op_status(gpus=False, ended=None, page=1),
        lambda agent: agent.op_run_info(run.id),
        lambda agent: agent.op_logs(run.id, offset=None, tail=None, max_bytes=1024),
    ]
    for _ in range(2):  # two connections: two agents, each looking every way
        async with agent_on(workdir) as agent:
            for look in looks:
                await look(agent)
                assert len(lost_records(run)) == 1
    [record] = lost_records(run)
    assert run.events()[-1] == record  # after what the run recorded itself
