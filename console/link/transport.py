"""Transports to the host agent: one interface, one implementation per kind of host.

The client speaks JSON lines over whatever a transport gives it; `local` runs
the agent as a subprocess; `ssh_transport` runs it on a host over an SSH channel.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from backends.protocol import MAX_LINE_BYTES
from backends.runs.store import CHILD_ONLY_ENV
from console.link.ops import TransportError

STDERR_KEEP_LINES = 20
HEAD_BYTES = 256  # what is kept of a line too long to take: enough to tell whom it was for


class OversizedLine(Exception):
    """A line of the agent's longer than a reader takes (MAX_LINE_BYTES), read to its end and dropped, so the link
    stays in step: its first bytes (whom it was for: `protocol.message_head`) and its length."""

    def __init__(self, head: bytes, size: int) -> None:
        super().__init__(f"a line of {size} bytes, over {MAX_LINE_BYTES}")
        self.head = head
        self.size = size


async def whole_line(read_piece: Callable[[], Awaitable[bytes]]) -> bytes:
    """One line of the agent's, from pieces (a reader hands over a long line in parts: asyncssh as much as its
    window holds); b"" once the agent has gone, a line it left unfinished included. A line past MAX_LINE_BYTES
    raises OversizedLine once it is read to its end, without holding more than its head."""
    pieces: list[bytes] = []
    size = 0
    head: bytes | None = None  # set once the line is past the limit
    while True:
        piece = await read_piece()
        if not piece:
            return b""
        size += len(piece)
        if head is None and size > MAX_LINE_BYTES:
            head, pieces = b"".join(pieces)[:HEAD_BYTES], []
        if head is None:
            pieces.append(piece)
        elif len(head) < HEAD_BYTES:
            head += piece[: HEAD_BYTES - len(head)]
        if piece.endswith(b"\n"):
            break
    if head is not None:
        raise OversizedLine(head, size)
    return b"".join(pieces)


async def stream_piece(reader: asyncio.StreamReader) -> bytes:
    """A line from `reader`, or as much of it as the reader's limit holds; b"" at its end."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial
    except asyncio.LimitOverrunError as exc:
        return await reader.readexactly(exc.consumed)


class Transport(abc.ABC):
    """A byte pipe to one agent: lines out, lines in."""

    description: str

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def send(self, line: bytes) -> None: ...

    @abc.abstractmethod
    async def receive(self) -> bytes:
        """One line from the agent; b"" once the agent has gone; OversizedLine for one too long to take."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    def last_words(self) -> str:
        """What the agent said on stderr before it went, for error messages."""


class LocalTransport(Transport):
    """The agent as a subprocess of this machine (HOST `local`)."""

    def __init__(self, workdir: Path | None) -> None:
        self.workdir = workdir
        self.description = "local"
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_KEEP_LINES)
        self._stderr_task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        argv = [sys.executable, "-m", "backends.agent"]
        if self.workdir is not None:
            argv += ["--workdir", str(self.workdir)]
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=MAX_LINE_BYTES,
                # A console started from inside a run starts an agent of no run: what it launches is its own.
                env={key: value for key, value in os.environ.items() if key not in CHILD_ONLY_ENV},
            )
        except OSError as exc:
            raise TransportError(f"cannot start the local agent: {exc}") from None
        self._stderr_task = asyncio.create_task(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        async for line in self._proc.stderr:
            self._stderr.append(line.decode(errors="replace").rstrip())

    async def send(self, line: bytes) -> None:
        if self._proc is None or self._proc.stdin is None:
            raise TransportError("the local agent is not running")
        try:
            self._proc.stdin.write(line)
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise TransportError(f"the local agent went away{self._why()}") from None

    async def receive(self) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        stdout = self._proc.stdout
        return await whole_line(lambda: stream_piece(stdout))

    def last_words(self) -> str:
        return "\n".join(self._stderr)

    def _why(self) -> str:
        return f": {self._stderr[-1]}" if self._stderr else ""

    async def close(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), timeout=5)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
        if self._stderr_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._stderr_task, timeout=1)
        self._proc = None
