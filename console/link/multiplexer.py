"""The multiplexer: one SSH connection and its running agent, shared by the CLI's commands for one host.

Started detached by `console.link.reuse` (`python -m console.link.multiplexer --socket PATH ... -- HOST`), it
connects as a command does, with the host key checked strictly (it trusts nothing new: a key is new
only to a person, at the command that started it), starts the agent, and serves it on a Unix socket
(mode 600, in a folder of mode 700, each peer's user id checked) to any number of commands at once.

Commands are multiplexed, not queued: the agent already runs each request as its own task, so a
command's request ids are rewritten to ids unique on the shared channel and the replies routed back,
and each subscription's stream goes to the command that made it (the agent numbers subscriptions
across all of them). A `logs -f` therefore never holds up a `kill`. A command that goes away is
unsubscribed; its requests still run to their end, as they do when a direct connection closes.

It exits IDLE_S after its last command left, when the link or the agent dies (each command still
connected is told why), or on SIGTERM; its socket goes with it. One per key: a lock (`reuse.take_lock`),
taken by the command that starts it and held for its life.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import itertools
import json
import os
import signal
import sys
from pathlib import Path

from backends import protocol
from backends.protocol import MAX_LINE_BYTES, REPLY_HEAD, STREAM_HEAD
from console.link import reuse
from console.link.ssh import DEFAULT_PYTHON, SSHTransport
from console.link.transport import OversizedLine, TransportError

# A command this far behind (a paused `logs -f | less`, a slow terminal under a 100 MB line) has its streams stopped
# with protocol.BEHIND, to subscribe again from where it read; one behind on replies alone is let go.
SESSION_BUFFER_LIMIT = 64 * 1024 * 1024


class Session:
    """One connected command."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.subs: set[int] = set()
        self.closed = False

    def write(self, line: bytes) -> None:
        if self.closed or self.writer.is_closing():
            return
        self.writer.write(line)

    def waiting(self) -> int:
        """Bytes written to the command that it has not read yet."""
        return 0 if self.closed else self.writer.transport.get_write_buffer_size()

    def close(self) -> None:
        self.closed = True
        self.writer.close()


class Multiplexer:
    def __init__(self, transport: SSHTransport, idle_s: float) -> None:
        self.transport = transport
        self.idle_s = idle_s
        self.sessions: set[Session] = set()
        self.ids = itertools.count(1)
        self.routes: dict[int, tuple[Session | None, int | str, str]] = {}  # shared id: session, its id, op
        self.owners: dict[int, Session] = {}  # subscription: the command that made it
        self.early: dict[int, list[bytes]] = {}  # stream lines that beat their subscribe reply
        self.done = asyncio.Event()
        self.reason = "stopped"
        self._idle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        pump = asyncio.create_task(self.pump())
        self._arm_idle()
        await self.done.wait()
        pump.cancel()
        for session in list(self.sessions):
            session.write(protocol.encode({"multiplexer": {"closing": self.reason}}))
            session.close()

    def stop(self, reason: str) -> None:
        self.reason = reason
        self.done.set()

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = None
        if not self.sessions:
            self._idle = asyncio.get_running_loop().call_later(
                self.idle_s, self.stop, f"exited after {self.idle_s:g} s without commands"
            )

    # ----- the agent's side -----
    async def pump(self) -> None:
        """Every line of the agent to the command it is for, until the agent or the link is gone."""
        while True:
            try:
                line = await self.transport.receive()
            except OversizedLine as big:
                stand_in = self.stand_in(big)
                if stand_in is None:
                    reuse.log(f"{self.transport.spec}: dropped a line of the agent's: {big}, for no request or stream")
                    continue
                line = stand_in
            if not line:
                words = self.transport.last_words().strip()
                self.stop("closed: the agent or the link to the host is gone" + (f" ({words})" if words else ""))
                return
            try:
                self.route(line)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                reuse.log(f"{self.transport.spec}: dropped a line of the agent's: {exc}")

    def stand_in(self, big: OversizedLine) -> bytes | None:
        """What goes to a command in place of a line of the agent's too long to take: its request's failure, or
        its stream's end (and the agent told to stop that stream), saying why; None: it was for nobody."""
        head = protocol.message_head(big.head)
        if head is None or (head[0] == "id" and head[1] not in self.routes):
            return None
        kind, number, stream = head
        if kind == "id":
            return protocol.encode(protocol.too_large_reply(number, self.routes[number][2], big.size))
        self.unsubscribe(number)
        return protocol.encode(protocol.too_large_end(number, stream, big.size))

    def route(self, line: bytes) -> None:
        stream = STREAM_HEAD.match(line)
        if stream is not None:
            self.route_stream(int(stream[1]), stream[2] == b"end", line)
            return
        reply = REPLY_HEAD.match(line)
        shared_id = int(reply[1]) if reply is not None else json.loads(line).get("id")
        session, own_id, op = self.routes.pop(shared_id)
        if op in ("subscribe", "unsubscribe") or reply is None:
            msg = json.loads(line)
            if op == "subscribe" and msg.get("ok") and session is not None:
                self.subscribed(session, int(msg["result"]["sub"]))
            if op == "subscribe" and not self._subscribing():
                self.early.clear()  # what is left there belongs to no subscription of anyone's
            msg["id"] = own_id
            line = protocol.encode(msg)
        else:  # only the id changes: the rest of a reply (a log chunk of megabytes) is passed on as it came
            line = line[: reply.start(1)] + json.dumps(own_id).encode() + line[reply.end(1) :]
        if session is not None:
            session.write(line)
            if session.waiting() > SESSION_BUFFER_LIMIT:
                reuse.log(f"a command read its replies too slowly ({session.waiting()} bytes waiting); let it go")
                session.close()

    def route_stream(self, sub: int, end: bool, line: bytes) -> None:
        owner = self.owners.get(sub)
        if owner is None:
            if self._subscribing():
                self.early.setdefault(sub, []).append(line)
            return  # the stream of a command that left: it was unsubscribed, this was already on its way
        owner.write(line)
        if end:
            self.owners.pop(sub, None)
            owner.subs.discard(sub)
        elif owner.waiting() > SESSION_BUFFER_LIMIT:
            self.stop_streams(owner)

    def stop_streams(self, session: Session) -> None:
        """Stop the streams of a command that reads too slowly: what it has not been sent it reads again from the
        run's files, where it subscribes again, instead of this process holding it."""
        waiting = session.waiting()
        reuse.log(f"a command read its streams too slowly ({waiting} bytes waiting); stopped them for it to resume")
        for sub in session.subs:
            self.owners.pop(sub, None)
            self.unsubscribe(sub)
            session.write(protocol.encode(protocol.behind_message(sub, waiting)))
        session.subs.clear()

    def subscribed(self, session: Session, sub: int) -> None:
        if session.closed:
            self.unsubscribe(sub)
            return
        self.owners[sub] = session
        session.subs.add(sub)
        for line in self.early.pop(sub, []):
            session.write(line)

    def _subscribing(self) -> bool:
        """Whether a subscribe request awaits its reply (whose stream may come first)."""
        return any(op == "subscribe" for _, _, op in self.routes.values())

    def unsubscribe(self, sub: int) -> None:
        shared_id = next(self.ids)
        self.routes[shared_id] = (None, shared_id, "unsubscribe")
        self.forward(protocol.request_line(shared_id, "unsubscribe", {"sub": sub}))

    def forward(self, line: bytes) -> None:
        """Send without waiting: from the agent's side, which must never wait on the agent's input."""
        task = asyncio.create_task(self.send(line))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def send(self, line: bytes) -> None:
        try:
            await self.transport.send(line)
        except TransportError as exc:
            self.stop(f"closed: {exc}")

    # ----- the commands' side -----
    async def session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("socket")
        if reuse.peer_uid(peer) not in (None, os.getuid()):  # the folder's mode already keeps others out
            writer.close()
            return
        session = Session(reader, writer)
        self.sessions.add(session)
        self._arm_idle()
        session.write(protocol.encode({"multiplexer": {"pid": os.getpid()}}))
        try:
            await self.serve(session)
        finally:
            self.sessions.discard(session)
            session.close()
            for sub in session.subs:
                self.owners.pop(sub, None)
                self.unsubscribe(sub)  # its requests in flight still run, as over a direct connection
            if not self.done.is_set():
                self._arm_idle()

    async def serve(self, session: Session) -> None:
        while True:
            try:
                line = await session.reader.readuntil(b"\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
                return  # gone, or sent what no agent would read: let it go
            try:
                msg = json.loads(line)
                own_id = msg["id"]
                if not isinstance(own_id, (int, str)) or isinstance(own_id, bool):
                    raise TypeError("no integer or string 'id'")
            except (ValueError, KeyError, TypeError) as exc:
                session.write(protocol.encode(protocol.error_reply(None, "bad_request", f"not a request: {exc}")))
                continue
            shared_id = next(self.ids)
            op = msg.get("op")
            self.routes[shared_id] = (session, own_id, op if isinstance(op, str) else "")
            if op == "unsubscribe" and isinstance(msg.get("args"), dict):
                sub = msg["args"].get("sub")
                if sub in session.subs:
                    session.subs.discard(sub)
                    self.owners.pop(sub, None)
            msg["id"] = shared_id
            await self.send(protocol.encode(msg))


async def serve(target: reuse.Target, path: Path, idle_s: float, lock: int) -> int:
    """Hold the connection and serve it at `path` until idle or gone; 0 also when another one serves. `lock`:
    the key's lock, taken by the command that started it and held (inherited) for its life."""
    os.set_inheritable(lock, False)  # what it starts (a ProxyCommand) must not hold the key after it
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already, unless given a wrong descriptor
    except BlockingIOError:
        return 0  # another multiplexer holds this key: it serves, or is about to
    os.ftruncate(lock, 0)
    os.write(lock, f"{os.getpid()}\n".encode())
    workdir = Path(target.workdir) if target.workdir is not None else None
    transport = SSHTransport(target.spec, workdir, target.python or DEFAULT_PYTHON)
    transport.say = lambda text: reuse.log(f"{target.spec}: {text}")  # the command that started it said so too
    try:
        await transport.open()  # trust_new_key is None: a key not already trusted is refused
    except TransportError as exc:
        reuse.log(f"{target.spec}: the multiplexer could not connect: {exc}")
        return 1
    mux = Multiplexer(transport, idle_s)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, mux.stop, "stopped (SIGTERM)")
    temporary = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    old_umask = os.umask(0o177)  # the socket is born 600: never open to others, not even for a moment
    try:
        server = await asyncio.start_unix_server(mux.session, path=str(temporary), limit=MAX_LINE_BYTES)
    finally:
        os.umask(old_umask)
    os.replace(temporary, path)  # over a stale socket, whose multiplexer (it held this lock) is gone
    reuse.log(f"{target.spec}: multiplexer pid {os.getpid()} serves {path.name}")
    try:
        await mux.run()
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # ours: a successor must take the lock first, and we hold it
        server.close()
        await transport.close()
        reuse.log(f"{target.spec}: multiplexer pid {os.getpid()} {mux.reason}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m console.link.multiplexer", description=__doc__)
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--lock-fd", type=int, required=True)
    parser.add_argument("--workdir")
    parser.add_argument("--remote-python")
    parser.add_argument("host")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its own session has no terminal; be sure all the same
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.chdir("/")  # hold no folder of the command that started it
    idle_s = float(os.environ.get(reuse.IDLE_ENV, reuse.IDLE_S))
    target = reuse.Target(args.host, args.workdir, args.remote_python)
    return asyncio.run(serve(target, args.socket, idle_s, args.lock_fd))


if __name__ == "__main__":
    sys.exit(main())
