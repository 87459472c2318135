"""The real agent's handlers in this process, over a socket pair: a link a test can drop, or refuse to make, at will,
without the agent's start-up as a process (what a retry loop's tests need, fast).

Real: the agent (`backends.agent.Agent`: its framing, its handlers, its run store on disk) and the console's client.
Not: the pipe (a socket pair, in place of SSH's channel or a subprocess's stdio) and the refusals a test queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

from backends.agent import Agent
from backends.protocol import MAX_LINE_BYTES
from backends.runs.store import RunStore
from console.link.transport import Transport, TransportError, stream_piece, whole_line


class InProcessTransport(Transport):
    def __init__(self, workdir: Path, description: str = "inprocess") -> None:
        self.workdir = workdir
        self.description = description
        self.refusals: list[TransportError] = []  # the next opens fail with these, in turn
        self.opened = 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._agent_writer: asyncio.StreamWriter | None = None
        self._agent: Agent | None = None
        self._serving: asyncio.Task[None] | None = None

    async def open(self) -> None:
        if self.refusals:
            raise self.refusals.pop(0)
        ours, theirs = socket.socketpair()
        self._reader, self._writer = await asyncio.open_connection(sock=ours, limit=MAX_LINE_BYTES)
        agent_reader, self._agent_writer = await asyncio.open_connection(sock=theirs, limit=MAX_LINE_BYTES)
        self._agent = Agent(RunStore(self.workdir), self._agent_writer)
        self._serving = asyncio.create_task(self._agent.serve(agent_reader))
        self.opened += 1

    async def send(self, line: bytes) -> None:
        if self._writer is None or self._writer.is_closing():
            raise TransportError(f"{self.description}: the link is down")
        try:
            self._writer.write(line)
            await self._writer.drain()
        except ConnectionError:
            raise TransportError(f"{self.description}: the agent went away") from None

    async def receive(self) -> bytes:
        reader = self._reader
        assert reader is not None
        return await whole_line(lambda: stream_piece(reader))

    def drop(self) -> None:
        """The link breaks, from the agent's side (its host went to sleep, its network away)."""
        if self._agent is not None and self._agent._poller is not None:
            self._agent._poller.cancel()
        if self._serving is not None:
            self._serving.cancel()
        if self._agent_writer is not None:
            self._agent_writer.close()

    async def close(self) -> None:
        self.drop()
        if self._serving is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._serving
        if self._writer is not None:
            self._writer.close()
        self._serving = self._agent = self._writer = self._agent_writer = None

    def last_words(self) -> str:
        return ""
