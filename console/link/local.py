"""HOST `local`: the agent as a subprocess of this machine, its stdin and stdout the pipe."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import sys
from pathlib import Path

from backends.protocol import CHILD_ONLY_ENV, MAX_LINE_BYTES
from console.link.transport import STDERR_KEEP_LINES, Transport, TransportError, stream_piece, whole_line


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
