"""The SSH transport: the agent runs on the GPU host over an SSH exec channel (asyncssh).

`~/.ssh/config` applies (HostName, User, Port, IdentityFile, ProxyJump, ...),
the agent (`$SSH_AUTH_SOCK`) is used, and the host key is checked strictly
against `~/.ssh/known_hosts`: a changed key refuses the connection, and an
unknown one is trusted only when `trust_new_key` (a person, asked, or
`--accept-new-host-key`) says so (`host_keys`); it is never accepted silently. The host needs only `python3`:
the pure-Python `backends` package is uploaded by SFTP, once per version, into
`WORKDIR/agent/<version>/` on the host (written under a temporary name, then
renamed), and the agent runs from there. Nothing listens on the host: the agent
speaks over the channel's stdin/stdout.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import re
import shlex
import uuid
from pathlib import Path
from typing import Any

import asyncssh

from console import host_keys
from console.transport import STDERR_KEEP_LINES, Transport, TransportError

BACKENDS = Path(__file__).resolve().parent.parent / "backends"
DEFAULT_PYTHON = "python3"  # the host's interpreter for the agent, unless --remote-python names another
DEFAULT_WORKDIR = ".eagle3-console"  # relative to the remote home, as the agent's own default
CONNECT_TIMEOUT_S = 15
KEEPALIVE_S = 15  # a dead link (laptop asleep, Wi-Fi gone) is noticed within about three of these
_HOST = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>[^@\s:]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d{1,5}))?$")


def parse_host(spec: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` as (user, host, port); ValueError for anything else."""
    match = _HOST.match(spec)
    if match is None:
        raise ValueError(f"{spec!r} is not a host: use [user@]host[:port] or a Host alias of ~/.ssh/config")
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"{spec!r}: port {port} is out of range")
    return match["user"], match["host"].strip("[]"), port


def backends_files() -> list[Path]:
    """The files the agent needs on the host: the backends package's Python sources."""
    return sorted(p for p in BACKENDS.rglob("*.py") if "__pycache__" not in p.parts)


def backends_version() -> str:
    """A digest of the backends sources: a host runs exactly the agent this console was built with."""
    digest = hashlib.sha256()
    for path in backends_files():
        digest.update(path.relative_to(BACKENDS).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


class SSHTransport(Transport):
    """The agent on `[user@]host[:port]`, over SSH."""

    def __init__(self, host: str, workdir: Path | None, python: str = DEFAULT_PYTHON) -> None:
        self.user, self.host, self.port = parse_host(host)
        self.python = python
        self.spec = host
        self.workdir = workdir
        self.description = host
        self.trust_new_key: host_keys.TrustNewKey | None = None  # None: an unknown host key is refused
        self._conn: asyncssh.SSHClientConnection | None = None
        self._proc: asyncssh.SSHClientProcess[bytes] | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_KEEP_LINES)
        self._stderr_task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self._conn = await self._connect()
        try:
            home, agent_dir = await self._upload()
            workdir = str(self.workdir) if self.workdir is not None else f"{home}/{DEFAULT_WORKDIR}"
            agent = ["env", f"PYTHONPATH={agent_dir}", self.python, "-m", "backends.agent", "--workdir", workdir]
            command = f"cd {shlex.quote(home)} && exec {shlex.join(agent)}"
            self._proc = await self._conn.create_process(command, encoding=None)
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self.spec}: cannot start the agent: {_reason(exc)}") from None
        self._stderr_task = asyncio.create_task(self._drain_stderr())

    async def _connect(self) -> asyncssh.SSHClientConnection:
        options: dict[str, Any] = {
            "connect_timeout": CONNECT_TIMEOUT_S,
            "keepalive_interval": KEEPALIVE_S,
            "keepalive_count_max": 3,
        }
        if self.user is not None:
            options["username"] = self.user
        if self.port is not None:
            options["port"] = self.port
        try:
            try:
                return await asyncssh.connect(self.host, **options)
            except asyncssh.HostKeyNotVerifiable:
                await self._trust_new_key()
                return await asyncssh.connect(self.host, **options)
        except asyncssh.HostKeyNotVerifiable:
            raise TransportError(
                f"{self.spec}: the host key is not trusted by known_hosts; check it with `ssh {self.spec}`",
                transient=False,
            ) from None
        except asyncssh.PermissionDenied:
            raise TransportError(
                f"{self.spec}: permission denied (no key was accepted); make `ssh {self.spec}` work without a "
                "password first (ssh-copy-id, or IdentityFile in ~/.ssh/config)",
                transient=False,
            ) from None
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"cannot reach {self.spec}: {_reason(exc)}") from None

    async def _trust_new_key(self) -> None:
        """The host's key is not trusted: record it if it is new and a person trusts it, else refuse."""
        offered = await host_keys.offered_key(self.spec, self.host, self.port)
        if offered is None:
            raise asyncssh.HostKeyNotVerifiable("the host showed no key")
        if offered.changed:
            raise TransportError(
                f"{offered.describe()}, but {offered.known_hosts} trusts another key for {offered.name}: the "
                f"host key CHANGED. Someone may be intercepting the link; if the host was reinstalled, remove "
                f"the old key (ssh-keygen -R '{offered.name}') and connect again",
                transient=False,
            )
        if self.trust_new_key is None:
            raise TransportError(
                f"{offered.describe()}, not in {offered.known_hosts}; if that is the host's key, run again "
                "with --accept-new-host-key (or accept it with `ssh " + self.spec + "`)",
                transient=False,
            )
        if not await self.trust_new_key(offered):
            raise TransportError(f"{self.spec}: the host key was not trusted; nothing was changed", transient=False)
        host_keys.record(offered)

    async def _upload(self) -> tuple[str, str]:
        """(remote home, folder holding this version of backends), uploading it if the host lacks it."""
        assert self._conn is not None
        version = backends_version()
        async with self._conn.start_sftp_client() as sftp:
            home = await sftp.realpath(".")
            root = str(self.workdir) if self.workdir is not None else f"{home}/{DEFAULT_WORKDIR}"
            agent_dir = f"{root}/agent/{version}"
            if not await sftp.exists(f"{agent_dir}/backends/__init__.py"):
                staging = f"{root}/agent/.upload-{uuid.uuid4().hex[:8]}"
                files = backends_files()
                # One round trip per folder, not per file.
                for folder in sorted({path.parent.relative_to(BACKENDS).as_posix() for path in files}):
                    await sftp.makedirs(f"{staging}/backends/{folder}".removesuffix("/."), exist_ok=True)
                for path in files:
                    await sftp.put(str(path), f"{staging}/backends/{path.relative_to(BACKENDS).as_posix()}")
                try:
                    await sftp.rename(staging, agent_dir)
                except asyncssh.SFTPError:
                    await sftp.rmtree(staging)  # another console uploaded the same version meanwhile
        return home, agent_dir

    async def _drain_stderr(self) -> None:
        assert self._proc is not None
        with contextlib.suppress(asyncssh.Error, OSError):
            async for line in self._proc.stderr:
                self._stderr.append(line.decode(errors="replace").rstrip())

    async def send(self, line: bytes) -> None:
        if self._proc is None:
            raise TransportError(f"{self.spec}: the agent is not running")
        try:
            self._proc.stdin.write(line)
            await self._proc.stdin.drain()
        except (asyncssh.Error, OSError, BrokenPipeError):
            raise TransportError(f"{self.spec}: the connection to the agent was lost{self._why()}") from None

    async def receive(self) -> bytes:
        assert self._proc is not None
        try:
            return await self._proc.stdout.readline()
        except (asyncssh.Error, OSError):
            return b""

    def last_words(self) -> str:
        words = "\n".join(self._stderr)
        if self.python in words and any(said in words for said in ("No such file", "not found", "Permission denied")):
            words += f"\nno Python at {self.python} on {self.spec}: name its Python 3.10+ with --remote-python PATH"
        return words

    def _why(self) -> str:
        return f": {self._stderr[-1]}" if self._stderr else ""

    async def close(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(Exception):
                self._proc.stdin.write_eof()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._proc.wait_closed(), timeout=5)
        if self._stderr_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._stderr_task, timeout=1)
        if self._conn is not None:
            self._conn.close()
            with contextlib.suppress(Exception):
                await self._conn.wait_closed()
        self._proc = self._conn = None


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc or type(exc).__name__)
