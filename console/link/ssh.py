"""The SSH transport: the agent runs on the GPU host over an SSH exec channel (asyncssh).

`~/.ssh/config` applies (HostName, User, Port, IdentityFile, ProxyJump, ...),
the agent (`$SSH_AUTH_SOCK`) is used, and the host key is checked strictly
against `~/.ssh/known_hosts`: a changed key refuses the connection, and an
unknown one is trusted only when `trust_new_key` (a person, asked, or
`--accept-new-host-key`) says so (`host_keys`); it is never accepted silently. The host needs only `python3`:
the pure-Python `backends` package is uploaded by SFTP, once per version, into
`WORKDIR/agent/<version>/` on the host, checked against this console's own files
on every connection and put right where it differs (`agent_upload`), and the agent
runs from there, with its pure-Python dependencies shipped beside it and, on a host without py-spy, the
py-spy for its architecture (`py_spy`). Nothing listens on the host: the agent speaks over the
channel's stdin/stdout.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import posixpath
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncssh

from console.link import agent_upload, host_keys, py_spy
from console.link.transport import STDERR_KEEP_LINES, Transport, TransportError, whole_line
from console.visible import printable

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


def say_on_stderr(text: str) -> None:
    """A line for the person at the terminal, as the CLI says its notes."""
    print(f"eagle3-console: {printable(text)}", file=sys.stderr, flush=True)  # it may quote the host: shown only


class SSHTransport(Transport):
    """The agent on `[user@]host[:port]`, over SSH."""

    def __init__(self, host: str, workdir: Path | None, python: str = DEFAULT_PYTHON) -> None:
        self.user, self.host, self.port = parse_host(host)
        self.python = python
        self.spec = host
        self.workdir = workdir
        self.description = host
        self.trust_new_key: host_keys.TrustNewKey | None = None  # None: an unknown host key is refused
        self.say: Callable[[str], None] = say_on_stderr  # told when the host's copy of the agent was repaired
        self._conn: asyncssh.SSHClientConnection | None = None
        self._proc: asyncssh.SSHClientProcess[bytes] | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_KEEP_LINES)
        self._stderr_task: asyncio.Task[None] | None = None
        self._said_no_py_spy = False  # why the host gets no py-spy is said once, not at every reconnection

    async def open(self) -> None:
        self._conn = await self._connect()
        try:
            await self._start_agent()
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self.spec}: cannot start the agent: {_reason(exc)}") from None

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
                f"{self.spec}: the host key is not trusted by known_hosts; check it with `{self.ssh_command()}`",
                transient=False,
            ) from None
        except asyncssh.PermissionDenied:
            raise TransportError(
                f"{self.spec}: permission denied (no key was accepted); make `{self.ssh_command()}` work without a "
                "password first (ssh-copy-id, or IdentityFile in ~/.ssh/config)",
                transient=False,
            ) from None
        except (asyncssh.ConnectionLost, asyncssh.KeyExchangeFailed, ConnectionResetError) as exc:
            # The host hung up in the handshake: also how it looks when known_hosts trusts only key types
            # the host does not have (asyncssh offers only those), which no retry can mend.
            raise await self._other_key_type() or TransportError(f"cannot reach {self.spec}: {_reason(exc)}") from None
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"cannot reach {self.spec}: {_reason(exc)}") from None

    def ssh_command(self) -> str:
        """The `ssh` command that reaches this host, for hints: ssh takes the port as -p, not as host:port."""
        destination = f"{self.user}@{self.host}" if self.user is not None else self.host
        return shlex.join(["ssh", *(["-p", str(self.port)] if self.port is not None else []), destination])

    async def _other_key_type(self) -> TransportError | None:
        """The refusal to give when known_hosts trusts keys of this host, but none of a type it offers."""
        try:
            offered = await asyncio.wait_for(host_keys.offered_key(self.spec, self.host, self.port), CONNECT_TIMEOUT_S)
        except (asyncssh.Error, OSError, asyncio.TimeoutError):
            return None  # the host cannot be asked either: a plain network failure
        return self._other_type_refusal(offered) if offered is not None and offered.other_type else None

    def _other_type_refusal(self, offered: host_keys.OfferedKey) -> TransportError:
        return TransportError(
            f"{self.spec}: {offered.known_hosts} trusts only {' and '.join(offered.trusted_algorithms)} key(s) for "
            f"{offered.name}, but the host offers the {offered.algorithm} key {offered.fingerprint}; compare it "
            f"with the host's keys (`{offered.keyscan()}`), trust it with `{self.ssh_command()}` (ssh asks), "
            "and connect again",
            transient=False,
        )

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
        if offered.other_type:
            raise self._other_type_refusal(offered)
        if self.trust_new_key is None:
            raise TransportError(
                f"{offered.describe()}, not in {offered.known_hosts}; if that is the host's key, run again "
                f"with --accept-new-host-key (or accept it with `{self.ssh_command()}`)",
                transient=False,
            )
        if not await self.trust_new_key(offered):
            raise TransportError(f"{self.spec}: the host key was not trusted; nothing was changed", transient=False)
        host_keys.record(offered)

    async def _start_agent(self) -> None:
        """One channel: the launcher lists the host's copy of the agent, that copy is made equal to this
        console's files (over SFTP, only when it differs), and the launcher becomes the agent."""
        assert self._conn is not None
        try:
            files = agent_upload.manifest()
        except agent_upload.VendorError as exc:
            raise TransportError(f"{self.spec}: {exc}", transient=False) from None
        workdir = str(self.workdir) if self.workdir is not None else DEFAULT_WORKDIR
        command = agent_upload.launch_command(self.python, workdir, agent_upload.version_of(files))
        self._proc = await self._conn.create_process(command, encoding=None)
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        try:
            listing = await asyncio.wait_for(self._proc.stdout.readline(), CONNECT_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise TransportError(
                f"{self.spec}: {self.python} on the host did not start within {CONNECT_TIMEOUT_S} s"
            ) from None
        host = await self._listed(listing)
        repair = agent_upload.plan(files, host.tree) if host.found == "dir" else None
        spy = await self._py_spy_to_upload(host)
        if repair is None or repair.needed or spy is not None:
            async with self._conn.start_sftp_client() as sftp:
                try:
                    if repair is None:
                        if host.found != "missing":  # a file or a link where the folder belongs
                            await sftp.remove(host.top.encode("utf-8", "surrogateescape"))
                        await agent_upload.upload(sftp, host.top)
                    elif repair.needed:
                        await agent_upload.repair(sftp, host.top, repair)
                except asyncssh.SFTPFailure:
                    full = await agent_upload.no_space(sftp, host.workdir, agent_upload.bytes_to_write(repair))
                    if full is None:
                        raise
                    raise TransportError(
                        f"{self.spec}: {full}; free some space there, or choose another --workdir", transient=False
                    ) from None
                if spy is not None:
                    spy = await self._upload_py_spy(sftp, host, spy)
        if repair is not None and repair.needed:
            self.say(f"{self.spec}: the agent's files on the host had been altered ({repair.summary()}); restored them")
        elif host.found not in ("dir", "missing"):
            self.say(f"{self.spec}: {host.top} on the host was not a folder; the agent was uploaded again")
        if spy is not None and host.tool != "missing":
            self.say(f"{self.spec}: {py_spy.where(host.top)} on the host was not the pinned py-spy; replaced it")
        self._proc.stdin.write(agent_upload.GO)
        await self._ready()

    async def _ready(self) -> None:
        """The launcher's word on the repaired copy, before it becomes the agent."""
        assert self._proc is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), CONNECT_TIMEOUT_S)
            agent_upload.parse_ready(line)
        except asyncio.TimeoutError:
            raise TransportError(f"{self.spec}: the agent's files went unchecked for {CONNECT_TIMEOUT_S} s") from None
        except agent_upload.Refused as exc:
            raise self._refused(exc) from None
        except ValueError:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._proc.wait_closed(), timeout=5)
                await asyncio.wait_for(self._stderr_task or asyncio.sleep(0), timeout=1)
            raise TransportError(f"{self.spec}: the launcher did not start the agent{self._why()}") from None

    def _refused(self, exc: agent_upload.Refused) -> TransportError:
        return TransportError(f"{self.spec}: refused to start the agent: {exc}", transient=False)

    async def _py_spy_to_upload(self, host: agent_upload.HostCopy) -> Path | None:
        """The py-spy to put on a host that has none of its own and not the right one uploaded; when there is
        none for it, why is said once and stack dumps there stay kernel-side."""
        if host.py_spy is not None:
            return None
        try:
            source, digest = await py_spy.binary(host.machine)
        except py_spy.NoPySpy as exc:
            self._say_no_py_spy(f"the host has no py-spy and {exc}")
            return None
        return None if host.tool == digest else source

    async def _upload_py_spy(self, sftp: asyncssh.SFTPClient, host: agent_upload.HostCopy, source: Path) -> Path | None:
        """py-spy put on the host; when it cannot be (say, bin/ is a file), that is said once and the agent
        starts regardless, its stack dumps kernel-side. What was uploaded, or None."""
        try:
            await py_spy.upload(sftp, posixpath.dirname(host.top), source, host.tool)
        except asyncssh.SFTPError as exc:
            where = py_spy.where(host.top)
            self._say_no_py_spy(f"py-spy could not be put in {where}: {_reason(exc)}; {py_spy.ON_THE_HOST}")
            return None
        return source

    def _say_no_py_spy(self, why: str) -> None:
        if not self._said_no_py_spy:
            self._said_no_py_spy = True
            self.say(f"{self.spec}: {why}; stack dumps there show kernel-side facts only")

    async def _listed(self, line: bytes) -> agent_upload.HostCopy:
        """The launcher's listing, or why the launcher could not give one, said for a person."""
        assert self._proc is not None and self._stderr_task is not None
        with contextlib.suppress(ValueError):
            if line:
                try:
                    return agent_upload.parse_listing(line)
                except agent_upload.Refused as exc:
                    raise self._refused(exc) from None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._proc.wait_closed(), timeout=5)
            await asyncio.wait_for(self._stderr_task, timeout=1)
        if self._proc.exit_status in (126, 127):  # the shell found no such program, or could not run it
            raise TransportError(
                f"no Python at {self.python} on {self.spec}: name its Python 3.10+ with --remote-python PATH",
                transient=False,
            )
        said = next((line for line in reversed(self._stderr) if line.strip()), f"exit status {self._proc.exit_status}")
        raise TransportError(
            f"{self.spec}: cannot check the agent's files on the host with {self.python}: {said} (if that is not "
            "Python 3, name one with --remote-python PATH)",
            transient=False,
        )

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
        stdout = self._proc.stdout

        async def piece() -> bytes:
            # asyncssh hands a line longer than its window (2 MiB) over in parts, each looking like a line
            try:
                return await stdout.readline()
            except (asyncssh.Error, OSError):
                return b""

        return await whole_line(piece)

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
