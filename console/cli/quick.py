"""The short commands (`status`, `stacks`, `kill`: one request, one answer), and their quick way through the
host's running multiplexer, with no event loop: scripts call them in loops, and importing asyncio alone took
longer (23 ms) than the kill itself.

`answer(words)` answers such a command (`console.cli.output`'s `cmd_*`) when a multiplexer serves its host, else
says None and the CLI goes its usual way (which starts a multiplexer). It speaks only to a socket of this user's,
whose peer is this user, that greets as a multiplexer (the checks of `console.link.reuse`). Every command asks it
first, so what only a one-shot command through a multiplexer needs (the output's rendering, the multiplexer's
checks) is imported once the command line is known to be one.
"""

from __future__ import annotations

import _socket  # socket.py's own: socket.py first makes enums of its ~350 constants (2 ms of every quick command)
import io
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from backends.protocol import MAX_LINE_BYTES, PROTOCOL_VERSION, request_line, too_large_reply
from console.cli import config, grammar
from console.cli.config import UsageError
from console.link.transport import AgentError, AgentOps, NoAnswer, TransportError, no_answer, reply_result, seconds_for

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from _typeshed import WriteableBuffer

T = TypeVar("T")
OneShot = Callable[[AgentOps, "argparse.Namespace", list[str]], Coroutine[Any, Any, int]]

ONE_SHOT = ("status", "stacks", "kill")
# Asked without a hello first: the multiplexer's key holds this release and its protocol (`reuse.Target.key`), and
# its agent is this release's own upload; a status that finds the link gone changes nothing, so the CLI's way asks
# again. A kill goes only to an agent that answered, so that a link found gone is found before the kill is sent.
LOOKS = ("status",)


def one_shot(command: str) -> OneShot:
    """The handler of a one-shot command (of ONE_SHOT)."""
    from console.cli import output

    handlers: dict[str, OneShot] = {"status": output.cmd_status, "stacks": output.cmd_stacks, "kill": output.cmd_kill}
    return handlers[command]


class Received(io.RawIOBase):
    """What a connected socket receives, as a stream to read lines from (socket.makefile's, without socket.py)."""

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        return self._sock.recv_into(buffer)


class BlockingClient(AgentOps):
    """The agent behind a multiplexer's socket, one request at a time, each awaited by blocking on the socket."""

    def __init__(self, spec: str, timeout: float | None = None) -> None:
        self.spec = spec
        self.timeout = (
            timeout  # --timeout: every call's deadline; None: each call's own (`console.link.transport.seconds_for`)
        )
        self._ids = itertools.count(1)
        self._sock: _socket.socket | None = None
        self._lines: Any = None  # the socket's reading side, as a binary file
        self._closing: str | None = None  # why the multiplexer said it closes

    def connect(self, path: Path) -> None:
        """Connect and read the greeting; ReuseUnavailable when no multiplexer answers as one should."""
        from console.link import reuse

        reuse.check_socket(path, self.spec)
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
        except OSError as exc:
            sock.close()
            raise reuse.unreachable(path, exc) from None
        self._sock, self._lines = sock, io.BufferedReader(Received(sock))
        try:
            reuse.check_peer(sock, path)
            sock.settimeout(reuse.GREETING_TIMEOUT_S)
            reuse.greeting_pid(self._lines.readline(MAX_LINE_BYTES))
            sock.settimeout(None)
        except reuse.ReuseUnavailable:
            self.close()
            raise
        except (OSError, ValueError, TypeError, KeyError) as exc:
            self.close()
            raise reuse.ReuseUnavailable(f"the multiplexer at {path} did not greet ({type(exc).__name__})") from None

    async def request(self, op: str, **arguments: Any) -> Any:
        from console.link import reuse  # imported already by connect: the greeting's words

        assert self._sock is not None
        request_id = next(self._ids)
        lost = f"{self.spec}: the shared connection was lost"
        seconds = seconds_for(op, arguments, self.timeout)
        deadline = time.monotonic() + seconds
        try:
            self._sock.settimeout(seconds)
            self._sock.sendall(request_line(request_id, op, arguments))
        except TimeoutError:
            raise no_answer(self.spec, op, seconds) from None
        except OSError:
            raise TransportError(lost + self._why()) from None
        while True:
            try:
                self._sock.settimeout(max(deadline - time.monotonic(), 0.001))
                line = self._lines.readline(MAX_LINE_BYTES + 1)
                size = self._dropped(line) if len(line) > MAX_LINE_BYTES else len(line)
            except TimeoutError:
                raise no_answer(self.spec, op, seconds) from None
            except OSError:
                line = b""
            if not line:
                raise TransportError(lost + self._why())
            if len(line) > MAX_LINE_BYTES:  # the request fails, naming it; the link stays in step
                return reply_result(too_large_reply(request_id, op, size))
            if line.startswith(reuse.GREETING):
                self._closing = reuse.closing_reason(line) or self._closing
                continue
            try:
                msg = json.loads(line)
            except ValueError as exc:
                raise TransportError(f"the agent sent something that is not a message ({exc})") from None
            if isinstance(msg, dict) and msg.get("id") == request_id:
                return reply_result(msg)

    def _dropped(self, start: bytes) -> int:
        """Read and drop the rest of a line cut short at the reader's limit; the whole line's length."""
        size, piece = len(start), start
        while piece and not piece.endswith(b"\n"):
            piece = self._lines.readline(1 << 20)
            size += len(piece)
        return size

    def _why(self) -> str:
        return f": {self._closing}" if self._closing else ""

    def close(self) -> None:
        if self._lines is not None:
            self._lines.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._lines = None


def leave(code: int) -> NoReturn:
    """Exit with `code` once what was said is out: a quick command holds nothing open, and the interpreter's own
    exit (every module torn down) was a tenth of its CPU (~5 ms)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # stdout closed early (e.g. `| head`): not an error of ours
        code = 0
    except OSError:  # what was said did not get out
        code = code or 1
    try:  # noqa: SIM105 (contextlib: an import more)
        sys.stderr.flush()
    except (OSError, ValueError):  # ValueError: closed after a broken pipe (`answer`)
        pass
    os._exit(code)


def drive(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run to its end a coroutine that never waits on an event loop: every await of it is a blocking call of
    BlockingClient's, so one step finishes it. This is what lets one_shot's commands serve both clients."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a one-shot command waited on an event loop")


def answer(words: list[str]) -> int | None:
    """The exit code of a one-shot command answered through a running multiplexer; None: not such a command, or
    no multiplexer serves its host (nothing was sent then, so the CLI may do it all its usual way)."""
    named = grammar.command_of(words)
    if "_ARGCOMPLETE" in os.environ or named not in ONE_SHOT:
        return None  # the words' COMMAND, read before they are parsed: any other command parses them only once
    if words[grammar.first_word(words) :][:1] == ["local"]:
        return None  # HOST named `local`, which no multiplexer serves: parsed only once, by the CLI's way
    try:
        settings = config.load(grammar.config_flag(words))
        options, tail = grammar.split(grammar.with_host(words, settings.default_host, settings.path), grammar.GRAMMARS)
        if options[grammar.first_word(options) :][:1] == [grammar.listing.name]:
            return None  # `hosts` is no command of a host: its own parser, `hosts -h` its own help
        # That command's grammar alone (the whole, 16 commands, took longer than the request): words it refuses, the
        # CLI's way reads again with every command's, and says what is wrong as it always does.
        ns = grammar.build_parser([g for g in grammar.GRAMMARS if g.name == named]).parse_args(options)
        if settings.expand(ns.host) != [ns.host]:
            return None  # several hosts: each on a connection of its own (`console.fleet.hosts`)
        config.apply_settings(ns, settings)
    except (UsageError, config.ConfigError):
        return None  # the CLI says what is wrong
    if ns.command not in ONE_SHOT or tail or ns.host == "local" or ns.no_reuse:
        return None
    from console.cli.output import EXIT_FAILED, EXIT_OK, failed, note
    from console.link import reuse

    command = one_shot(ns.command)
    target = config.target_of(ns)
    try:
        path = reuse.socket_path(target)
    except reuse.ReuseUnavailable:
        return None  # the CLI's way finds the same, and says so in its log
    client = BlockingClient(target.spec, ns.timeout_s)
    try:
        client.connect(path)
        if ns.command not in LOOKS and drive(client.hello()).get("version") != PROTOCOL_VERSION:
            client.close()
            return None
    except reuse.ReuseUnavailable as exc:
        reuse.passed_over[path] = exc  # the CLI's way takes it from here, without trying the socket again
        return None
    except NoAnswer as exc:  # as a hung ControlMaster's: said, not waited on twice
        client.close()
        note(f"{exc} (through the shared connection: --no-reuse connects afresh)")
        return EXIT_FAILED
    except (AgentError, TransportError):
        client.close()
        return None
    try:
        return drive(command(client, ns, []))
    except NoAnswer as exc:
        return failed(exc)
    except TransportError as exc:
        if ns.command not in LOOKS:
            return failed(exc)
        reuse.log(f"{target.spec}: {exc}; asked again the CLI's way")
        return None
    except AgentError as exc:
        return failed(exc)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        sys.stderr.close()  # stdout closed early (e.g. `| head`): not an error of ours
        return EXIT_OK
    finally:
        client.close()
