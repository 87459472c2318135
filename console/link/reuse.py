"""Connection reuse for the CLI over SSH, in the spirit of OpenSSH's ControlPersist.

A command over SSH pays for a handshake, a remote shell and an agent's start each time; a connected
client signals in milliseconds. So the first command for a host, once its own direct connection (with
the host key checked as always) is up, starts a detached multiplexer (`console.link.multiplexer`) that makes
its own connection, checked just as strictly, holds it and its running agent, and listens on a Unix
socket in a folder only this user may enter. Later commands speak the agent protocol through that
socket; the multiplexer exits after IDLE_S without commands, or when its link dies.

This module is the client's side, and the facts both sides share (where the socket is, what it is keyed
by); it imports no asyncssh, so a command that reuses a connection starts no faster than it must. Any
failure here is logged (`LOG_NAME` in the socket folder) and the command connects directly instead.
"""

from __future__ import annotations

import _socket  # socket.py's own: what a quick command needs of it, without socket.py's 2 ms of enums
import contextlib
import errno
import fcntl
import importlib
import json
import os
import stat
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import backends
from backends.protocol import PROTOCOL_VERSION

IDLE_S = 300.0  # a multiplexer without commands for this long exits
IDLE_ENV = "EAGLE3_CONSOLE_REUSE_IDLE_S"  # overrides IDLE_S (tests wait seconds, not minutes)
GREETING_TIMEOUT_S = 3.0  # a multiplexer that does not greet within this is hung: connect directly
# A command that finds another one starting the host's multiplexer waits this long for it to serve (a direct
# connection and the multiplexer's own take about 1 s each), then connects directly, starting none.
WINNER_WAIT_S = 5.0
GREETING = b'{"multiplexer":'  # the first key of each line the multiplexer itself says
LOG_NAME = "reuse.log"
LOG_LIMIT_BYTES = 1 << 20  # then the log starts again (the previous one kept as reuse.log.1)
SOCKET_PATH_MAX = 100  # sun_path holds 104 bytes on macOS, 108 on Linux, with its NUL
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
# Sockets this process found no multiplexer to use at, and why: the quick way's finding holds for the CLI's
# way after it (a hung multiplexer is waited for once, not twice).
passed_over: dict[Path, ReuseUnavailable] = {}


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
        return sha256_hex(json.dumps(parts).encode())[:20]

    def argv(self, socket_path: Path, lock: int) -> list[str]:
        """The multiplexer's command line (an argv list, never through a shell); `lock`: the key's lock, held."""
        argv = [sys.executable, "-m", "console.link.multiplexer", "--socket", str(socket_path), "--lock-fd", str(lock)]
        argv += ["--remote-python", self.python] if self.python is not None else []
        argv += ["--workdir", self.workdir] if self.workdir is not None else []
        return [*argv, "--", self.spec]


def sha256_hex(data: bytes) -> str:
    """SHA-256 by CPython's own module (`_sha2`, `_sha256` before 3.12) where it has one: hashlib loads OpenSSL's
    library first, 2 ms of every quick `status`."""
    for name in ("_sha2", "_sha256"):
        with contextlib.suppress(ImportError):
            return str(importlib.import_module(name).sha256(data).hexdigest())
    import hashlib

    return hashlib.sha256(data).hexdigest()


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


def peer_uid(sock: _socket.socket) -> int | None:
    """The user id of the process at the other end of a Unix socket, where the system tells it."""
    if not hasattr(_socket, "SO_PEERCRED"):
        return None
    _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _PEERCRED.size))
    return int(uid)


def socket_path(target: Target) -> Path:
    """Where the multiplexer of `target` listens (or would)."""
    return private_dir() / f"{target.key()}.sock"


def take_lock(path: Path) -> int | None:
    """The lock of the multiplexer at `path`, held (its file descriptor); None when another process holds it:
    a command connecting directly that will start one, or the multiplexer itself, for its whole life. The
    kernel lets go of a flock when its holder dies, so a dead one's lock never blocks."""
    try:
        fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ReuseUnavailable(f"cannot open the lock beside {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def check_socket(path: Path, spec: str) -> None:
    """ReuseUnavailable unless `path` is a socket of this user's (start_one when there is none yet)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ReuseUnavailable(f"no multiplexer for {spec} yet", start_one=True) from None
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        raise ReuseUnavailable(f"{path} is not a socket of this user's; not used")


def unreachable(path: Path, exc: OSError) -> ReuseUnavailable:
    """Why connecting to the socket at `path` failed."""
    if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)):
        # Nobody listens: its multiplexer is gone. A new one removes the socket and takes its place.
        return ReuseUnavailable(f"{path} is stale (its multiplexer is gone)", start_one=True)
    return ReuseUnavailable(f"cannot connect to {path}: {exc}")


def check_peer(sock: _socket.socket, path: Path) -> None:
    if peer_uid(sock) not in (None, os.getuid()):
        raise ReuseUnavailable(f"{path} is served by another user; not used")


def greeting_pid(line: bytes) -> int:
    """The multiplexer's pid from its greeting; ValueError (or KeyError, TypeError) when it is none."""
    return int(json.loads(line)["multiplexer"]["pid"])


def closing_reason(line: bytes) -> str | None:
    """Why the multiplexer closes, from a line of its own (one that starts with GREETING); None: it does not say."""
    with contextlib.suppress(ValueError, TypeError, KeyError):
        return str(json.loads(line)["multiplexer"]["closing"])
    return None


def start_multiplexer(target: Target, path: Path, lock: int) -> None:
    """Start a multiplexer for `target` in its own session (a Ctrl-C at the terminal never reaches it), with
    no terminal and no pipe of ours (a caller reading our output to its end is not kept waiting). It inherits
    `lock` (held, from `take_lock`): the key is never free between this command and it."""
    env = dict(os.environ)
    # Wherever this console is imported from (a wheel, a source tree), the multiplexer imports the same.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    logfile = str(path.with_name(LOG_NAME))
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600),
    ]
    try:
        os.set_inheritable(lock, True)
        pid = os.posix_spawn(sys.executable, target.argv(path, lock), env, file_actions=actions, setsid=True)
    except (OSError, NotImplementedError) as exc:  # NotImplementedError: a libc without POSIX_SPAWN_SETSID
        log(f"{target.spec}: cannot start a multiplexer: {exc}")
        return
    log(f"{target.spec}: started multiplexer pid {pid} for {path.name}")
