"""The two ways a request to the agent fails, for every client and transport (and imported by no more than
they need: neither asyncio nor asyncssh)."""

from __future__ import annotations

from typing import Any


class TransportError(Exception):
    """The agent could not be reached or went away; the message says what to do.

    `transient` is False where retrying cannot help (a refused host key, a key the host does not accept).
    """

    def __init__(self, message: str, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class AgentError(Exception):
    """The agent refused a request; `code` is machine-readable, the message is for people."""

    def __init__(self, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details
