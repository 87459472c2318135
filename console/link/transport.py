"""The transport to a host's agent: one interface (a byte pipe of lines) and the line framing every kind shares.

The client speaks JSON lines over whatever a transport gives it: `console.link.local` runs the agent as a
subprocess of this machine, `console.link.ssh` on a host over an SSH channel, `console.link.reuse_transport`
through a running multiplexer's connection.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable

from backends.protocol import MAX_LINE_BYTES

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
