"""Nothing retried silently: each loop that asks again (a follow's reconnect, watch, the console's log follow and
status poll) says after its first failure what failed and that it tries again, and stops with the reason on a
failure that asking again cannot change.

Real: the agent's handlers and its run store on disk (`tests.inprocess_agent`, in this process over a socket pair),
the console's client, `watch` and the Textual app. Injected: a link that refuses to be made, and the agent failing
inside a handler (as a bug of its own or an I/O error of the host's would).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Static

from backends.agent import Agent
from backends.protocol import ProtocolError
from backends.runs.store import OUTPUT, RunDir, RunSpec, RunStore
from console.cli import fleet_commands
from console.fleet.hosts import Fleet, Member
from console.link import client as client_module
from console.link.client import PAST_END, AgentClient, follow
from console.link.transport import TransportError
from console.tui import app as app_module
from console.tui.app import ConsoleApp
from console.tui.log import TailLog
from console.tui.panels import RunsTable
from tests.conftest import Notes, until
from tests.inprocess_agent import InProcessTransport


def starting_run(workdir: Path, output: bytes = b"") -> RunDir:
    """A run just launched whose supervisor has not recorded itself yet: `starting` for half a minute, no process."""
    run = RunStore(workdir).create(RunSpec(kind="command", argv=["sleep", "30"], name="job"))
    run.file(OUTPUT).write_bytes(output)
    return run


def failing(
    monkeypatch: pytest.MonkeyPatch, op: str, error: Exception, times: int = 1, where: Path | None = None
) -> None:
    """The agent's handler of `op` fails with `error` the next `times` times (only the agent over `where`, if given)."""
    real = getattr(Agent, f"op_{op}")
    left = [times]

    async def handler(self: Agent, **args: Any) -> Any:
        if left[0] and (where is None or self.store.workdir == where):
            left[0] -= 1
            raise error
        return await real(self, **args)

    monkeypatch.setattr(Agent, f"op_{op}", handler)


async def task_until(task: asyncio.Task[Any], predicate: Callable[[], bool], what: str) -> None:
    """Wait for `predicate` while `task` runs (its failure, if it ends, is raised), then cancel it."""
    for _ in range(200):
        if predicate():
            break
        if task.done():
            task.result()
            raise AssertionError(f"{what}: the loop ended")
        await asyncio.sleep(0.025)
    else:
        raise AssertionError(f"timed out waiting for {what}")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# --- the command line: follow's reconnects, watch ----------------------------------------------------------------


async def test_a_follow_whose_reconnects_fail_says_why_once_and_resumes(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "RECONNECT_BACKOFF_S", (0.01, 0.02))
    run = starting_run(workdir, b"before\n")
    transport = InProcessTransport(workdir)
    client = AgentClient(transport)
    await client.start()
    said: list[str] = []
    got = b""
    try:
        async for msg in follow(client, run.id, {"log": 0, "metrics": PAST_END, "events": PAST_END}, said.append):
            if msg["stream"] != "log":
                continue
            got += base64.b64decode(msg["data_b64"])
            if got == b"before\n":
                refused = TransportError("inprocess: connect to the host: Connection refused")
                transport.refusals = [refused, refused]  # the host is still away for two tries
                transport.drop()
                with run.file(OUTPUT).open("ab") as log:
                    log.write(b"while away\n")
            elif got.endswith(b"while away\n"):
                break
    finally:
        await client.close()
    assert got == b"before\nwhile away\n"  # nothing lost, nothing twice
    assert transport.opened == 2
    assert said == [
        "connection lost (the agent closed the connection); reconnecting",
        "cannot reconnect yet (inprocess: connect to the host: Connection refused); trying again, at most 0.02 s apart",
        "reconnected after 0 s; resuming where the stream stopped",
    ]


async def test_a_follow_whose_link_goes_again_as_it_subscribes_reconnects_again_and_loses_nothing(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As through a multiplexer that greets for an agent killed a moment before: the reconnect is answered, then
    the subscribe finds the link gone. Before, that subscribe's error ended the follow with exit 1."""
    monkeypatch.setattr(client_module, "RECONNECT_BACKOFF_S", (0.01, 0.02))
    run = starting_run(workdir, b"before\n")
    transport = InProcessTransport(workdir)
    client = AgentClient(transport)
    subscribes = [0]
    real_subscribe = AgentClient.subscribe

    async def subscribe(self: AgentClient, **kwargs: Any) -> Any:
        subscribes[0] += 1
        if subscribes[0] == 2:  # the first subscribe after the first loss
            transport.drop()
        return await real_subscribe(self, **kwargs)

    monkeypatch.setattr(AgentClient, "subscribe", subscribe)
    await client.start()
    said: list[str] = []
    got = b""
    try:
        async for msg in follow(client, run.id, {"log": 0, "metrics": PAST_END, "events": PAST_END}, said.append):
            if msg["stream"] != "log":
                continue
            got += base64.b64decode(msg["data_b64"])
            if got == b"before\n":
                transport.drop()
                with run.file(OUTPUT).open("ab") as log:
                    log.write(b"while away\n")
            elif got.endswith(b"while away\n"):
                break
    finally:
        await client.close()
    assert got == b"before\nwhile away\n"  # nothing lost, nothing twice
    assert (transport.opened, subscribes[0]) == (3, 3)
    assert said[0] == "connection lost (the agent closed the connection); reconnecting"
    assert said[-1] == "reconnected after 0 s; resuming where the stream stopped"
    assert [line for line in said if line.startswith("connection lost")] == [said[0], said[2]], said


async def test_a_quiet_follow_whose_hello_cannot_be_sent_reconnects_rather_than_wait_for_ever(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link that takes no more writes while its reader sees no end: the hello a quiet follow asks cannot be sent.
    Before, that hello's failure ended the follow's watch on the link and the follow waited on its stream for ever
    (one such `logs --follow` was found idle an hour after its test)."""
    monkeypatch.setattr(client_module, "RECONNECT_BACKOFF_S", (0.01, 0.02))
    run = starting_run(workdir, b"before\n")
    transport = InProcessTransport(workdir)
    client = AgentClient(transport, timeout=1.0)  # a quiet second asks for a hello
    real_send = InProcessTransport.send
    unwritable = [False]

    async def send(self: InProcessTransport, line: bytes) -> None:
        if unwritable[0]:
            unwritable[0] = False
            raise TransportError("inprocess: the link takes no more writes")
        await real_send(self, line)

    async def write_once_back() -> None:
        while transport.opened < 2:
            await asyncio.sleep(0.01)
        with run.file(OUTPUT).open("ab") as log:
            log.write(b"while away\n")

    async def followed() -> bytes:
        got = b""
        async for msg in follow(client, run.id, {"log": 0, "metrics": PAST_END, "events": PAST_END}, said.append):
            if msg["stream"] != "log":
                continue
            got += base64.b64decode(msg["data_b64"])
            if got == b"before\n":
                unwritable[0] = True  # the next request, the quiet follow's hello, cannot be sent
            elif got.endswith(b"while away\n"):
                break
        return got

    monkeypatch.setattr(InProcessTransport, "send", send)
    await client.start()
    said: list[str] = []
    writer = asyncio.create_task(write_once_back())
    try:
        got = await asyncio.wait_for(followed(), timeout=20)
    finally:
        writer.cancel()
        await client.close()
    assert got == b"before\nwhile away\n"  # nothing lost, nothing twice
    assert said == [
        "connection lost (inprocess: the link takes no more writes); reconnecting",
        "reconnected after 0 s; resuming where the stream stopped",
    ]


async def test_watch_says_a_status_the_agent_failed_to_give_and_asks_again(
    workdir: Path, nvml_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    starting_run(workdir)
    failing(monkeypatch, "status", OSError(5, "Input/output error"), times=2)
    client = AgentClient(InProcessTransport(workdir))
    await client.start()
    said: list[str] = []
    try:
        watching = asyncio.create_task(fleet_commands.watch_runs(client, 0.01, False, said.append))
        await task_until(watching, lambda: any(line.startswith("watching") for line in said), "the first look")
    finally:
        await client.close()
    assert said == [
        "status failed (OSError: [Errno 5] Input/output error); asking again every 0.01 s",  # once, for both
        "watching 1 runs (1 live); Ctrl-C to stop",
    ]


async def test_watch_over_several_hosts_stops_a_host_that_refuses_for_good_and_goes_on(
    tmp_path: Path, nvml_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, refusing = tmp_path / "good", tmp_path / "refusing"
    starting_run(good)
    failing(monkeypatch, "status", ProtocolError("bad_args", "status takes no argument 'gpus'"), 99, refusing)
    said: list[str] = []
    members = [
        Member(name, AgentClient(InProcessTransport(workdir, name)), tell=said.append)
        for name, workdir in (("good", good), ("refusing", refusing))
    ]
    fleet = Fleet(members)
    ns = argparse.Namespace(interval=0.01, json=False)
    try:
        watching = asyncio.create_task(fleet_commands.cmd_watch(fleet, ns, []))
        await task_until(
            watching,
            lambda: "good: watching 1 runs (1 live); Ctrl-C to stop" in said and len(said) == 2,
            "both hosts' first words",
        )
    finally:
        await fleet.close()
    assert "refusing: status takes no argument 'gpus'; no longer watched (the other hosts go on)" in said
    assert members[1].error == "status takes no argument 'gpus'"


# --- the console: the selected run's follow, the status poll ---------------------------------------------------


def log_text(app: ConsoleApp) -> str:
    return "\n".join(line.text for line in app.query_one(TailLog).lines)


async def test_the_console_says_once_that_it_cannot_follow_a_run_and_follows_it_when_it_can(
    workdir: Path, nvml_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "POLL_S", 0.05)
    run = starting_run(workdir, b"hello from the run\n")
    failing(monkeypatch, "subscribe", OSError(5, "Input/output error"), times=3)
    notes = Notes()
    app = ConsoleApp(Fleet.one(InProcessTransport(workdir)))
    async with app.run_test(size=(160, 50), message_hook=notes) as pilot:
        await until(pilot, lambda: app.query_one(RunsTable).selected_run() == run.id, what="the run")
        await until(pilot, lambda: "hello from the run" in log_text(app), what="the log")
        run.file(OUTPUT).open("ab").write(b"streamed\n")
        await until(pilot, lambda: "streamed" in log_text(app), what="the log followed")
        await pilot.press("q")
    assert [note.message for note in notes] == [
        f"run {run.id}: cannot follow its log and curves (OSError: [Errno 5] Input/output error); trying again "
        "every 0.05 s"
    ]


async def test_the_console_stops_following_a_run_removed_while_its_link_was_down(
    workdir: Path, nvml_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "POLL_S", 0.05)
    run = starting_run(workdir, b"hello from the run\n")
    transport = InProcessTransport(workdir)
    app = ConsoleApp(Fleet.one(transport))
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: "hello from the run" in log_text(app), what="the log")
        shutil.rmtree(run.path)  # removed by hand while the link is down
        transport.drop()
        await until(pilot, lambda: "no longer followed" in log_text(app), timeout=10, what="the end of the follow")
        shown = log_text(app)
        await pilot.press("q")
    assert transport.opened == 2
    assert shown.splitlines()[-1] == (
        f"— no run {run.id!r} in {workdir / 'runs'}; 'status' lists the runs; no longer followed —"
    )


async def test_the_console_says_a_status_it_asks_again_for_and_leaves_on_one_refused_for_good(
    workdir: Path, nvml_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "POLL_S", 0.05)
    # Failing until the banner is read: were it to pass again, a loaded machine could draw the banner and take it
    # down between two looks.
    failing(monkeypatch, "status", OSError(5, "Input/output error"), times=10**6)
    app = ConsoleApp(Fleet.one(InProcessTransport(workdir)))
    async with app.run_test(size=(160, 50)) as pilot:
        banner = app.query_one("#link", Static)
        await until(pilot, lambda: banner.display, what="the banner")
        said = str(banner.content)
        failing(monkeypatch, "status", ProtocolError("unknown_op", "unknown op 'status'"), times=99)
        await until(pilot, lambda: app.return_code is not None, timeout=10, what="the console to leave")
        last_words = list(app._exit_renderables)  # printed as it closes (Textual is pinned for the tests)
    assert said == "status failed: OSError: [Errno 5] Input/output error; asking again every 0.05 s"
    assert (app.return_code, last_words) == (1, ["eagle3-console: status: unknown op 'status'"])
