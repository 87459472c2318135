"""A run's output in lines of any length, over any link: one line of 100 MB, a progress bar of 10 MB redrawn with
\\r and never ended, read by `logs` (byte exact, piped) and `logs -f` locally, over SSH, and through the host's
shared connection (the multiplexer), and by the console's subscription.

Real: OpenSSH's sshd on 127.0.0.1 (`tests/sshd.py`), the CLI in its own process, the multiplexer it starts, the
agent on the "host" (this machine through sshd), the runs and their files. Every command runs under a timeout, so
a hang fails the test rather than holding the suite.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import console.link.transport
from backends import protocol
from backends.protocol import FRAME_BYTES, MAX_LINE_BYTES
from backends.runs.store import RunSpec, RunStore
from console.cli import quick
from console.link.client import LOGS_AHEAD, PAST_END, AgentClient, log_bytes
from console.link.local import LocalTransport
from console.link.multiplexer import Multiplexer, Session
from console.link.ssh import SSHTransport
from console.link.transport import HEAD_BYTES, AgentError, AgentOps, OversizedLine, Transport, stream_piece, whole_line
from tests.conftest import REPO, wait_for
from tests.sshd import ALIAS, Sshd
from tests.test_ssh_reuse import Place

MB = 1_000_000
# One line of `size` bytes, no newline anywhere: every byte but \n, so invalid UTF-8 and control bytes ride too.
ONE_LINE = (
    "import sys\npattern = bytes(b for b in range(256) if b != 10)\nsize = int(sys.argv[1])\n"
    "sys.stdout.buffer.write((pattern * (size // len(pattern) + 1))[:size])\nsys.stdout.buffer.flush()\n"
)
# A tqdm-style bar: each redraw starts with \r, and the bar never prints a newline.
BAR = (
    "import sys\nsize = int(sys.argv[1])\nframes, written, i = [], 0, 0\n"
    "while written < size:\n"
    "    frame = b'\\r%7d/ 99999 |%s%s| %d it/s' % (i, b'#' * (i % 60), b' ' * (60 - i % 60), i * 7 % 1000)\n"
    "    frames.append(frame)\n    written += len(frame)\n    i += 1\n"
    "sys.stdout.buffer.write(b''.join(frames))\nsys.stdout.buffer.flush()\n"
)


@pytest.fixture
def place(sshd: Sshd, tmp_path: Path) -> Iterator[Place]:
    """The test's own runtime folder (its multiplexers its own, stopped at the end) and run store."""
    runtime = Path(tempfile.mkdtemp(prefix="e3l", dir="/tmp"))  # short: a socket path fits in 108 bytes
    here = Place(sshd, runtime, tmp_path / "work")
    yield here
    for pid in here.multiplexers():
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not here.multiplexers(), what="the multiplexers to exit")
    subprocess.run(["rm", "-rf", str(runtime)], check=True)


def command(place: Place, how: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """The CLI as a user runs it: `local`, over SSH on a connection of its own (`direct`), or through the host's
    multiplexer (`shared`); stdout kept as bytes. A command that hangs fails the test at its timeout."""
    host = {"local": ["local"], "direct": ["--no-reuse", ALIAS], "shared": [ALIAS]}[how]
    argv = [sys.executable, "-m", "console", "--workdir", str(place.workdir), *host, *args]
    return subprocess.run(argv, cwd=REPO, env=place.env(), capture_output=True, timeout=timeout, check=False)


def launch(place: Place, how: str, program: str, size: int) -> str:
    done = command(place, how, "launch", "command", "--", sys.executable, "-c", program, str(size))
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().strip()


def output_of(place: Place, run_id: str) -> Path:
    return place.workdir / "runs" / run_id / "output.log"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def assert_whole(done: subprocess.CompletedProcess[bytes], written: bytes, what: str) -> None:
    """The command succeeded, said nothing of a lost link, and gave the run's output byte for byte."""
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 0, f"{what}: {stderr}"
    assert "reconnecting" not in stderr and "lost" not in stderr, f"{what}: {stderr}"
    assert (len(done.stdout), digest(done.stdout)) == (len(written), digest(written)), what


def shared_ready(place: Place) -> None:
    """A multiplexer serves the host: the first command over SSH starts one, for the commands that follow."""
    assert command(place, "shared", "status").returncode == 0
    place.serving()


def test_a_line_of_100_mb_comes_whole_over_ssh_with_and_without_the_multiplexer(place: Place) -> None:
    """The issue's figure, once: `logs` on a connection of its own and `logs -f` through the shared one."""
    shared_ready(place)
    run_id = launch(place, "shared", ONE_LINE, 100 * MB)
    output = output_of(place, run_id)
    wait_for(lambda: output.stat().st_size == 100 * MB, timeout=60, what="the 100 MB line to be written")
    written = output.read_bytes()
    for how, args in (("direct", ()), ("shared", ("--follow",))):
        began = time.monotonic()
        done = command(place, how, "logs", run_id, *args, timeout=300)
        took = time.monotonic() - began
        assert_whole(done, written, f"logs {' '.join(args)} ({how})")
        print(f"\nlogs {' '.join(args)} of one 100 MB line over sshd ({how}): {took:.1f} s, {100 / took:.0f} MB/s")


@pytest.mark.timeout(400)
def test_a_follow_read_too_slowly_through_the_shared_connection_resumes_on_it_without_a_reconnect(
    place: Place,
) -> None:
    """`logs -f` of a 100 MB line into a pipe nobody reads for a while (a paused `| less`, a slow terminal): the
    multiplexer holds at most SESSION_BUFFER_LIMIT for the command, then stops its stream, and the command
    subscribes again from where it read, on the same connection. Before: the command was let go and said the
    connection was lost (cc18 saw it on a loaded machine with a reader that was merely slow)."""
    shared_ready(place)
    run_id = launch(place, "shared", ONE_LINE, 100 * MB)
    output = output_of(place, run_id)
    wait_for(lambda: output.stat().st_size == 100 * MB, timeout=60, what="the 100 MB line to be written")
    argv = [sys.executable, "-m", "console", "--workdir", str(place.workdir), ALIAS, "logs", run_id, "--follow"]
    follower = subprocess.Popen(argv, cwd=REPO, env=place.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert follower.stdout is not None and follower.stderr is not None
    read: list[bytes] = []
    go_on = threading.Event()

    def reader(pipe: Any) -> None:
        """Its first 2 MB (it has subscribed by then), then nothing until told, then the rest."""
        while (piece := pipe.read1(1 << 20)) and (sum(map(len, read)) < 2 * MB or go_on.wait(timeout=200)):
            read.append(piece)

    thread = threading.Thread(target=reader, args=(follower.stdout,), daemon=True)
    thread.start()
    try:
        log = place.folder / "reuse.log"
        stopped = "a command read its streams too slowly"
        wait_for(lambda: log.is_file() and stopped in log.read_text(), timeout=120, what="the stream stopped")
        go_on.set()
        thread.join(timeout=200)
        err = follower.stderr.read()
        follower.wait(timeout=30)
    finally:
        go_on.set()
        follower.kill()
        follower.wait()
    done = subprocess.CompletedProcess(argv, follower.returncode, b"".join(read), err)
    assert_whole(done, output.read_bytes(), "logs --follow (shared, read late)")
    assert len(place.multiplexers()) == 1  # the one it started with


@pytest.mark.parametrize("how", ["local", "direct", "shared"])
def test_a_progress_bar_of_10_mb_without_a_newline_is_followed_and_read_whole(place: Place, how: str) -> None:
    if how == "shared":
        shared_ready(place)
    run_id = launch(place, how, BAR, 10 * MB)
    followed = command(place, how, "logs", run_id, "--follow", timeout=120)  # from the run's start to its end
    written = output_of(place, run_id).read_bytes()
    assert len(written) >= 10 * MB and b"\n" not in written and written.count(b"\r") > 50_000
    assert_whole(followed, written, f"logs --follow ({how})")
    assert_whole(command(place, how, "logs", run_id), written, f"logs ({how})")
    tail = command(place, how, "logs", run_id, "--tail", "1")  # the last line is the whole bar
    assert_whole(tail, written, f"logs --tail 1 ({how})")


# --- what the console's log panel asks, over SSH --------------------------------------------------


def largest_line(transport: Transport) -> list[int]:
    """The length of the longest line the transport hands over, kept up to date in the list returned."""
    largest = [0]
    receive = transport.receive

    async def measured() -> bytes:
        line = await receive()
        largest[0] = max(largest[0], len(line))
        return line

    transport.receive = measured  # type: ignore[method-assign]
    return largest


async def test_the_consoles_log_panel_gets_a_10_mb_bar_over_ssh_in_bounded_frames_without_a_reconnect(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requests of the console's log panel (console.tui.app's follow): the last lines, then a subscription
    from there until the run ends, over a real SSH connection."""
    run_id = launch(place, "local", BAR, 10 * MB)
    monkeypatch.setenv("HOME", str(place.sshd.home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    client = AgentClient(SSHTransport(ALIAS, place.workdir))
    largest = largest_line(client.transport)
    received: list[bytes] = []
    ended: dict[str, Any] = {}

    async def follow() -> None:
        chunk = await client.logs(run_id, tail=200)
        received.append(base64.b64decode(chunk["data_b64"]))
        offsets = {"log": chunk["next_offset"], "metrics": PAST_END, "events": PAST_END}
        async for msg in await client.subscribe(run=run_id, offsets=offsets):
            if msg["stream"] == "log":
                received.append(base64.b64decode(msg["data_b64"]))
            elif msg["stream"] == "end":
                ended.update(msg)

    await client.start()
    try:
        await asyncio.wait_for(follow(), timeout=100)
    finally:
        await client.close()
    written = output_of(place, run_id).read_bytes()
    assert ended.get("state") == "exited" and "error" not in ended
    assert digest(b"".join(received)) == digest(written) and len(written) >= 10 * MB
    assert client.generation == 1 and client.closed_reason is None  # one link all along
    assert 0 < largest[0] <= FRAME_BYTES * 4 // 3 + 1024  # each message one frame, base64


def test_a_reply_larger_than_the_ssh_window_comes_whole(place: Place) -> None:
    """`status RUN` gives a run whole: a command line of 5 MB is one reply of 5 MB, more than asyncssh's window
    (2 MiB) holds, which asyncssh hands over in parts."""
    run = RunStore(place.workdir).create(RunSpec(kind="command", argv=["true"]))
    spec = json.loads((run.path / "spec.json").read_text())
    spec["argv"] = ["true", "a" * 5 * MB]
    (run.path / "spec.json").write_text(json.dumps(spec))
    done = command(place, "direct", "status", run.id, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["argv"] == spec["argv"]


class Frames(AgentOps):
    """An agent's `logs` over a run's output of `data`, each reply at most `frame` bytes (another release's frame
    size, say), answered in turn; it counts the requests in flight."""

    def __init__(self, data: bytes, frame: int) -> None:
        self.data, self.frame = data, frame
        self.in_flight = self.most_in_flight = 0

    async def request(self, op: str, **args: Any) -> Any:
        assert op == "logs"
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.001)
        self.in_flight -= 1
        offset = args["offset"]
        piece = self.data[offset : offset + min(self.frame, args["max_bytes"])]
        encoded = base64.b64encode(piece).decode()
        return {"offset": offset, "next_offset": offset + len(piece), "size": len(self.data), "data_b64": encoded}


@pytest.mark.parametrize("frame", [FRAME_BYTES, 1000, FRAME_BYTES // 2 + 1])
async def test_logs_asks_ahead_and_gives_the_output_in_order_whatever_the_frames(frame: int) -> None:
    data = bytes(range(256)) * (3 * FRAME_BYTES // 256 + 3)
    agent = Frames(data, frame)
    got = [piece async for piece in log_bytes(agent, "r", 7, len(data))]
    assert b"".join(got) == data[7:]
    if frame == FRAME_BYTES:  # frames as this console asks for: several in flight at once
        assert agent.most_in_flight == min(LOGS_AHEAD, len(got))


# --- a message too large to read: one error naming it, and the link serves on ----------------------


async def test_a_message_too_large_to_read_fails_its_request_or_ends_its_stream_and_the_link_serves_on(
    workdir: Path, nvml_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that reads lines of at most 64 KiB, against a real agent whose log frames are larger."""
    monkeypatch.setattr(console.link.transport, "MAX_LINE_BYTES", 64 * 1024)
    run = RunStore(workdir).create(RunSpec(kind="command", argv=["true"]))
    run.file("output.log").write_bytes(b"x" * (FRAME_BYTES + 1))
    async with AgentClient(LocalTransport(workdir)) as client:
        with pytest.raises(AgentError) as refused:
            await client.logs(run.id)
        assert refused.value.code == "too_large" and refused.value.message.startswith("logs: the agent's reply was ")
        small = await client.logs(run.id, max_bytes=1000)  # the same link, in step: the next reply is whole
        assert base64.b64decode(small["data_b64"]) == b"x" * 1000
        sub = await client.subscribe(run=run.id)
        messages = [msg async for msg in sub]
        assert messages[-1]["stream"] == "end" and "a log message of the agent's was" in messages[-1]["error"]
        with pytest.raises(AgentError, match=f"no subscription {sub.id}"):  # the agent was told to stop it
            await asyncio.sleep(0.5)
            await client.unsubscribe(sub.id)
        assert (await client.hello())["version"] == protocol.PROTOCOL_VERSION
        assert client.generation == 1 and client.closed_reason is None


@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    limit=st.sampled_from([64, 100, 257]),
    reader_limit=st.sampled_from([16, 64, 1 << 16]),
)
@settings(max_examples=200, deadline=None)
def test_lines_of_any_length_come_whole_or_as_one_oversized_line_in_step(
    sizes: list[int], limit: int, reader_limit: int
) -> None:
    """Whatever a reader's own limit cuts a line into, each line comes back whole, or, past the limit, as
    OversizedLine with its head and length, and the lines after it are read as they were sent."""
    lines = [bytes([65 + i % 26]) * size + b"\n" for i, size in enumerate(sizes)]

    async def read_all() -> list[bytes | tuple[bytes, int]]:
        reader = asyncio.StreamReader(limit=reader_limit)
        reader.feed_data(b"".join(lines))
        reader.feed_eof()
        got: list[bytes | tuple[bytes, int]] = []
        while True:
            try:
                line = await whole_line(lambda: stream_piece(reader))
            except OversizedLine as big:
                got.append((big.head, big.size))
                continue
            if not line:
                return got
            got.append(line)

    with mock.patch.object(console.link.transport, "MAX_LINE_BYTES", limit):
        got = asyncio.run(read_all())
    assert got == [line if len(line) <= limit else (line[:HEAD_BYTES], len(line)) for line in lines]


def test_a_line_the_agent_left_unfinished_is_no_message() -> None:
    async def read() -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(b'{"v":1,"id":3,"ok":tr')
        reader.feed_eof()
        return await whole_line(lambda: stream_piece(reader))

    assert asyncio.run(read()) == b""


def test_the_quick_client_fails_a_reply_too_large_naming_it_and_reads_the_next_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """console.cli.quick's client (status, stacks, kill through a multiplexer) against a socket that answers its first
    request with a line past its limit and its second as it should."""
    monkeypatch.setattr(quick, "MAX_LINE_BYTES", 64 * 1024)
    ours, theirs = socket.socketpair()
    huge = protocol.encode(protocol.ok_reply(1, {"text": "s" * 1_000_000}))

    def answer() -> None:
        with theirs, theirs.makefile("rb") as requests:
            requests.readline()
            theirs.sendall(huge)
            requests.readline()
            theirs.sendall(protocol.encode(protocol.ok_reply(2, {"text": "ok"})))

    answering = threading.Thread(target=answer)
    answering.start()
    client = quick.BlockingClient("gpu-host")
    client._sock, client._lines = ours, ours.makefile("rb")
    try:
        with pytest.raises(AgentError) as refused:
            quick.drive(client.stacks("r1"))
        assert refused.value.code == "too_large"
        assert refused.value.message.startswith(f"stacks: the agent's reply was {len(huge)} bytes")
        assert quick.drive(client.request("hello")) == {"text": "ok"}
    finally:
        client.close()
        answering.join(timeout=10)


class Written:
    """A command's side of the multiplexer: the lines it is sent."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.subs: set[int] = set()
        self.closed = False

    def write(self, line: bytes) -> None:
        self.lines.append(json.loads(line))

    def waiting(self) -> int:
        return 0  # it reads all it is sent


class Agent:
    """The multiplexer's link to the agent: the lines it sends."""

    spec = "gpu-host"

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, line: bytes) -> None:
        self.sent.append(json.loads(line))


async def test_the_multiplexer_passes_on_a_line_too_large_to_read_as_its_commands_error() -> None:
    agent, command_side = Agent(), Written()
    mux = Multiplexer(cast(SSHTransport, agent), idle_s=60)
    session = cast(Session, command_side)
    mux.routes[5] = (session, 41, "logs")
    head = protocol.encode(protocol.ok_reply(5, {"data_b64": "A" * 1000}))[:HEAD_BYTES]
    stand_in = mux.stand_in(OversizedLine(head, MAX_LINE_BYTES + 9))
    assert stand_in is not None
    mux.route(stand_in)
    reply = command_side.lines[-1]
    assert (reply["id"], reply["error"]["code"]) == (41, "too_large")  # the command's own id
    assert reply["error"]["message"].startswith(f"logs: the agent's reply was {MAX_LINE_BYTES + 9} bytes")
    mux.owners[3] = session
    head = protocol.encode(protocol.stream_message(3, "log", {"data_b64": "A" * 1000}))[:HEAD_BYTES]
    stand_in = mux.stand_in(OversizedLine(head, MAX_LINE_BYTES + 9))
    assert stand_in is not None
    mux.route(stand_in)
    end = command_side.lines[-1]
    assert (end["sub"], end["stream"]) == (3, "end") and "a log message of the agent's was" in end["error"]
    await asyncio.sleep(0)  # the agent is told to stop that stream
    assert [(m["op"], m["args"]) for m in agent.sent] == [("unsubscribe", {"sub": 3})]
    assert 3 not in mux.owners
    assert mux.stand_in(OversizedLine(b"garbage", MAX_LINE_BYTES + 9)) is None
