"""Connection reuse for the CLI over SSH, in the spirit of OpenSSH's ControlPersist.

A command over SSH pays for a handshake, a remote shell and an agent's start each time; a connected
client signals in milliseconds. So the first command for a host, once its own direct connection (with
the host key checked as always) is up, starts a detached multiplexer (`console.multiplexer`) that makes
its own connection, checked just as strictly, holds it and its running agent, and listens on a Unix
socket in a folder only this user may enter. Later commands speak the agent protocol through that
socket; the multiplexer exits after IDLE_S without commands, or when its link dies.

This module is the client's side, and the facts both sides share (where the socket is, what it is keyed
by); it imports no asyncssh, so a command that reuses a connection starts no faster than it must. Any
failure here is logged (`LOG_NAME` in the socket folder) and the command connects directly instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import socket
import stat
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import backends
from backends.protocol import MAX_LINE_BYTES, PROTOCOL_VERSION
from console.transport import Transport, TransportError

IDLE_S = 300.0  # a multiplexer without commands for this long exits
IDLE_ENV = "EAGLE3_CONSOLE_REUSE_IDLE_S"  # overrides IDLE_S (tests wait seconds, not minutes)
GREETING_TIMEOUT_S = 3.0  # a multiplexer that does not greet within this is hung: connect directly
GREETING = b'{"multiplexer":'  # the first key of each line the multiplexer itself says
LOG_NAME = "reuse.log"
LOG_LIMIT_BYTES = 1 << 20  # then the log starts again (the previous one kept as reuse.log.1)
SOCKET_PATH_MAX = 100  # sun_path holds 104 bytes on macOS, 108 on Linux, with its NUL
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class ReuseUnavailable(Exception):
    """No multiplexer can serve this command; `start_one` says whether starting one may help."""

    def __init__(self, message: str, start_one: bool = False) -> None:
        super().__init__(message)
        self.start_one = start_one


@dataclass(frozen=True)
class Target:
    """What a multiplexer is keyed by: the host as given, and every option that changes the connection."""

    spec: str
    workdir: str | None
    python: str | None  # --remote-python; None: the transport's default

    def key(self) -> str:
        """Also the release (the agent it runs) and the files that decide whom ssh reaches and trusts: after
        an edit of ~/.ssh/config or known_hosts, commands connect afresh and check the host key again."""
        home = Path.home()
        trust = [_stamp(home / ".ssh" / "config"), _stamp(home / ".ssh" / "known_hosts")]
        parts = [backends.__version__, PROTOCOL_VERSION, self.spec, self.workdir, self.python, str(home), trust]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]

    def argv(self, socket_path: Path) -> list[str]:
        """The multiplexer's command line (an argv list, never through a shell)."""
        argv = [sys.executable, "-m", "console.multiplexer", "--socket", str(socket_path)]
        argv += ["--remote-python", self.python] if self.python is not None else []
        argv += ["--workdir", self.workdir] if self.workdir is not None else []
        return [*argv, "--", self.spec]


def _stamp(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def private_dir() -> Path:
    """The folder of the sockets, made if missing: a directory of this user's that nobody else may enter.

    $XDG_RUNTIME_DIR first (per user, gone at logout), then /tmp, then ~/.cache; a candidate someone else
    owns (a squatter's /tmp/eagle3-console-UID) is passed over."""
    uid = os.getuid()
    candidates = [Path(os.environ["XDG_RUNTIME_DIR"]) / "eagle3-console"] if os.environ.get("XDG_RUNTIME_DIR") else []
    candidates += [Path("/tmp") / f"eagle3-console-{uid}", Path.home() / ".cache" / "eagle3-console"]
    problems = []
    for folder in candidates:
        try:
            return _ensure_private(folder, uid)
        except OSError as exc:
            problems.append(f"{folder}: {exc.strerror or exc}")
    raise ReuseUnavailable(f"no private folder for the socket ({'; '.join(problems)})")


def _ensure_private(folder: Path, uid: int) -> Path:
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700, parents=folder.parent.name == ".cache")
    st = os.lstat(folder)  # lstat: a link planted in the folder's place is refused, not followed
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise OSError(errno.EPERM, "not a folder of this user's")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(folder, 0o700)
    if len(os.fsencode(folder)) + 32 > SOCKET_PATH_MAX:
        raise OSError(errno.ENAMETOOLONG, "too long a path for a socket")
    return folder


def log(text: str) -> None:
    """One line in the reuse log, for whoever wonders why a command connected directly."""
    with contextlib.suppress(OSError, ReuseUnavailable):
        path = private_dir() / LOG_NAME
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_size > LOG_LIMIT_BYTES:
                os.replace(path, path.with_name(LOG_NAME + ".1"))
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with open(fd, "a", encoding="utf-8") as file:
            file.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid {os.getpid()}: {text}\n")


def peer_uid(sock: socket.socket) -> int | None:
    """The user id of the process at the other end of a Unix socket, where the system tells it."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return int(uid)


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
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            raise ReuseUnavailable(f"no multiplexer for {self.description} yet", start_one=True) from None
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
            raise ReuseUnavailable(f"{self.path} is not a socket of this user's; not used")
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(str(self.path), limit=MAX_LINE_BYTES)
        except (ConnectionRefusedError, FileNotFoundError):
            # Nobody listens: its multiplexer is gone. A new one removes the socket and takes its place.
            raise ReuseUnavailable(f"{self.path} is stale (its multiplexer is gone)", start_one=True) from None
        except OSError as exc:
            raise ReuseUnavailable(f"cannot connect to {self.path}: {exc}") from None
        sock = self._writer.get_extra_info("socket")
        if peer_uid(sock) not in (None, os.getuid()):
            await self.close()
            raise ReuseUnavailable(f"{self.path} is served by another user; not used")
        try:
            greeting = json.loads(await asyncio.wait_for(self._reader.readline(), GREETING_TIMEOUT_S))
            self.pid = int(greeting["multiplexer"]["pid"])
        except (asyncio.TimeoutError, OSError, ValueError, TypeError, KeyError) as exc:
            await self.close()
            raise ReuseUnavailable(f"the multiplexer at {self.path} did not greet ({type(exc).__name__})") from None

    async def send(self, line: bytes) -> None:
        if self._writer is None:
            raise TransportError(f"{self.description}: the shared connection is not open")
        try:
            self._writer.write(line)
            await self._writer.drain()
        except OSError:
            raise TransportError(f"{self.description}: the shared connection was lost{self._why()}") from None

    async def receive(self) -> bytes:
        assert self._reader is not None
        while True:
            try:
                line = await self._reader.readline()
            except ValueError:
                raise TransportError("the agent sent a line over the size limit") from None
            except OSError:
                return b""
            if not line.startswith(GREETING):
                return line
            with contextlib.suppress(ValueError, TypeError, KeyError):
                self._closing = str(json.loads(line)["multiplexer"]["closing"])

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

    def __init__(self, target: Target, direct: Callable[[], Transport]) -> None:
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
            path = private_dir() / f"{self.target.key()}.sock"
            shared = MultiplexedTransport(self.target.spec, path)
            await shared.open()
            self._inner = shared
            return
        except ReuseUnavailable as exc:
            log(f"{self.target.spec}: connecting directly: {exc}")
            if not exc.start_one:
                path = None
        direct = self._direct()
        await direct.open()  # its host key checks passed: only now may a multiplexer be started
        self._inner = direct
        if path is not None:
            # Keyed again: a host key just trusted changed known_hosts, and the next command looks there.
            start_multiplexer(self.target, path.with_name(f"{self.target.key()}.sock"))

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


def start_multiplexer(target: Target, path: Path) -> None:
    """Start a multiplexer for `target` in its own session (a Ctrl-C at the terminal never reaches it), with
    no terminal and no pipe of ours (a caller reading our output to its end is not kept waiting)."""
    env = dict(os.environ)
    # Wherever this console is imported from (a wheel, a source tree), the multiplexer imports the same.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    logfile = str(path.with_name(LOG_NAME))
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600),
    ]
    try:
        pid = os.posix_spawn(sys.executable, target.argv(path), env, file_actions=actions, setsid=True)
    except (OSError, NotImplementedError) as exc:  # NotImplementedError: a libc without POSIX_SPAWN_SETSID
        log(f"{target.spec}: cannot start a multiplexer: {exc}")
        return
    log(f"{target.spec}: started multiplexer pid {pid} for {path.name}")
