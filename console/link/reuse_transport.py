"""The CLI's transport over SSH through the host's shared connection (`console.link.reuse`), on asyncio: a running
multiplexer's socket when there is one, else a direct connection that then starts one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from backends.protocol import MAX_LINE_BYTES
from console.link import reuse
from console.link.transport import Transport, TransportError, stream_piece, whole_line


class MultiplexedTransport(Transport):
    """The agent of a running multiplexer, through its socket: the same JSON lines as over SSH."""

    def __init__(self, spec: str, path: Path) -> None:
        self.description = spec
        self.path = path
        self.pid: int | None = None  # the multiplexer's, from its greeting
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._closing: str | None = None  # why the multiplexer said it closes

    async def open(self) -> None:
        """Connect and read the greeting; ReuseUnavailable when no multiplexer answers as one should."""
        reuse.check_socket(self.path, self.description)
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(str(self.path), limit=MAX_LINE_BYTES)
        except OSError as exc:
            raise reuse.unreachable(self.path, exc) from None
        try:
            reuse.check_peer(self._writer.get_extra_info("socket"), self.path)
            greeting = await asyncio.wait_for(self._reader.readline(), reuse.GREETING_TIMEOUT_S)
            self.pid = reuse.greeting_pid(greeting)
        except reuse.ReuseUnavailable:
            await self.close()
            raise
        except (asyncio.TimeoutError, OSError, ValueError, TypeError, KeyError) as exc:
            await self.close()
            raise reuse.ReuseUnavailable(
                f"the multiplexer at {self.path} did not greet ({type(exc).__name__})"
            ) from None

    async def send(self, line: bytes) -> None:
        if self._writer is None:
            raise TransportError(f"{self.description}: the shared connection is not open")
        try:
            self._writer.write(line)
            await self._writer.drain()
        except OSError:
            raise TransportError(f"{self.description}: the shared connection was lost{self._why()}") from None

    async def receive(self) -> bytes:
        reader = self._reader
        assert reader is not None
        while True:
            try:
                line = await whole_line(lambda: stream_piece(reader))
            except OSError:
                return b""
            if not line.startswith(reuse.GREETING):
                return line
            self._closing = reuse.closing_reason(line) or self._closing

    def last_words(self) -> str:
        return f"the shared connection (multiplexer pid {self.pid}) {self._closing or 'went away'}"

    def _why(self) -> str:
        return f": {self._closing}" if self._closing else ""

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None


class ReusingTransport(Transport):
    """Through the host's multiplexer when one runs; else directly (the `direct` transport), and then a
    multiplexer is started for the commands that follow."""

    def __init__(self, target: reuse.Target, direct: Callable[[], Transport]) -> None:
        self.target = target
        self.description = target.spec
        self._direct = direct
        self._inner: Transport | None = None

    @property
    def multiplexer_pid(self) -> int | None:
        return self._inner.pid if isinstance(self._inner, MultiplexedTransport) else None

    async def open(self) -> None:
        path: Path | None = None
        try:
            path = reuse.socket_path(self.target)
            if path in reuse.passed_over:
                raise reuse.passed_over[path]
            shared = MultiplexedTransport(self.target.spec, path)
            await shared.open()
            self._inner = shared
            return
        except reuse.ReuseUnavailable as exc:
            reuse.log(f"{self.target.spec}: connecting directly: {exc}")
            if not exc.start_one:
                path = None
        direct = self._direct()
        await direct.open()  # its host key checks passed: only now may a multiplexer be started
        self._inner = direct
        if path is not None:
            # Keyed again: a host key just trusted changed known_hosts, and the next command looks there.
            reuse.start_multiplexer(self.target, reuse.socket_path(self.target))

    async def send(self, line: bytes) -> None:
        if self._inner is None:
            raise TransportError(f"{self.description}: not connected")
        await self._inner.send(line)

    async def receive(self) -> bytes:
        assert self._inner is not None
        return await self._inner.receive()

    def last_words(self) -> str:
        return self._inner.last_words() if self._inner is not None else ""

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()
