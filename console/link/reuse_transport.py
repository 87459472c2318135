"""The CLI's transport over SSH through the host's shared connection (`console.link.reuse`), on asyncio: a running
multiplexer's socket when there is one, else a direct connection that then starts one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
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
        self._path: Path | None = None  # the socket looked at first

    @property
    def multiplexer_pid(self) -> int | None:
        return self._inner.pid if isinstance(self._inner, MultiplexedTransport) else None

    async def open(self) -> None:
        self._inner = None  # a reconnect opens afresh
        lock: int | None = None
        try:
            lock = await self._shared_or_lock()
        except reuse.ReuseUnavailable as exc:
            reuse.log(f"{self.target.spec}: connecting directly: {exc}")
        if self._inner is not None:
            return
        try:
            direct = self._direct()
            await direct.open()  # its host key checks passed: only now may a multiplexer be started
            self._inner = direct
            if lock is not None:
                path = reuse.socket_path(self.target)
                if path != self._path:  # a host key just trusted changed known_hosts, and with it the key
                    os.close(lock)
                    lock = reuse.take_lock(path)
                if lock is not None:
                    reuse.start_multiplexer(self.target, path, lock)
        finally:
            if lock is not None:
                os.close(lock)  # the multiplexer holds it now, or nobody: the next command starts one

    async def _shared_or_lock(self) -> int | None:
        """Through the multiplexer (`_inner`, then None); else the key's lock, held, for this command to start
        one. While another command or its multiplexer holds the lock, wait (WINNER_WAIT_S at most) for that
        multiplexer to serve; ReuseUnavailable when none serves and this command is not to start one."""
        self._path = reuse.socket_path(self.target)
        deadline = time.monotonic() + reuse.WINNER_WAIT_S
        found = reuse.passed_over.get(self._path)
        while True:
            if found is None:
                shared = MultiplexedTransport(self.target.spec, self._path)
                try:
                    await shared.open()
                except reuse.ReuseUnavailable as exc:
                    found = exc
                else:
                    self._inner = shared
                    return None
            if not found.start_one:
                raise found  # hung, or not ours: passed over, and another started in its place would be too
            lock = reuse.take_lock(self._path)
            if lock is not None:
                reuse.log(f"{self.target.spec}: connecting directly: {found}")
                return lock
            if time.monotonic() > deadline:
                raise reuse.ReuseUnavailable(
                    f"{found}, and the one starting did not serve in {reuse.WINNER_WAIT_S:g} s"
                )
            await asyncio.sleep(0.05)
            found = None

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
