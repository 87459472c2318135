"""A host's SSH key seen for the first time: shown by its fingerprint, trusted only when a person says
so (asked on the terminal or in the console, or `--accept-new-host-key`), then recorded in known_hosts,
as OpenSSH's `StrictHostKeyChecking accept-new` does. A key that differs from the one known_hosts
already holds for the host is never accepted: that is how an interception looks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncssh

DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
USER_CONFIG = Path("~/.ssh/config")  # named, as asyncssh reads it for connect() but not for bare options
SSH_PORT = 22


@dataclass(frozen=True)
class OfferedKey:
    """The key a host offered that known_hosts does not trust."""

    spec: str  # the host as the user named it
    name: str  # its known_hosts name: host, [host]:port, or the config's HostKeyAlias
    algorithm: str  # ssh-ed25519, ...
    fingerprint: str  # SHA256:...
    line: str  # the known_hosts line that trusts it
    known_hosts: Path  # where that line goes
    changed: bool  # known_hosts trusts another key of this type (or a CA) under this name
    trusted_algorithms: tuple[str, ...]  # the types of the keys known_hosts trusts under this name
    address: str  # the host as the config resolves it (HostName), for ssh-keyscan, which reads no config
    port: int

    @property
    def other_type(self) -> bool:
        """known_hosts trusts keys for this name, but none of the offered key's type."""
        return bool(self.trusted_algorithms) and not self.changed

    def keyscan(self) -> str:
        """The command that lists every key the host offers."""
        return shlex.join(["ssh-keyscan", "-p", str(self.port), self.address])

    def describe(self) -> str:
        return f"{self.spec} ({self.name}) offers the {self.algorithm} key {self.fingerprint}"

    def trusted(self) -> str:
        """What is said when `--accept-new-host-key` trusts it, so a person can check it later."""
        return f"{self.describe()}; trusted and added to {self.known_hosts}"


TrustNewKey = Callable[[OfferedKey], Awaitable[bool]]


async def offered_key(spec: str, host: str, port: int | None) -> OfferedKey | None:
    """What the host offers, read as OpenSSH's config resolves `host` (HostName, Port, HostKeyAlias,
    ProxyJump, UserKnownHostsFile); None when the handshake shows no key (GSS key exchange).

    A key of a type known_hosts trusts is asked for first, as the connection that was refused asked
    (asyncssh offers only those types then); any key when the host has none of them."""
    config = [str(USER_CONFIG.expanduser())] if USER_CONFIG.expanduser().is_file() else []
    options = asyncssh.SSHClientConnectionOptions(host=host, port=port if port is not None else (), config=config)
    name = options.host_key_alias or options.host
    if options.port != SSH_PORT:
        name = f"[{name}]:{options.port}"
    configured = options.known_hosts  # the config's UserKnownHostsFile, as a list of paths
    named = [f for f in configured if isinstance(f, str)] if isinstance(configured, list) else []
    files = [Path(f).expanduser() for f in named] or [DEFAULT_KNOWN_HOSTS.expanduser()]
    present = [str(f) for f in files if f.is_file()]
    trusted = asyncssh.match_known_hosts(asyncssh.read_known_hosts(present), name, "", None) if present else None
    trusted_keys = list(trusted[0]) if trusted else []
    trusted_algorithms = tuple(dict.fromkeys(k.get_algorithm() for k in trusted_keys))
    key = None
    if trusted_keys:
        algs = [alg.decode() for k in trusted_keys for alg in k.sig_algorithms]
        with contextlib.suppress(asyncssh.Error, OSError):
            key = await asyncssh.get_server_host_key(
                host, port if port is not None else (), config=config, server_host_key_algs=algs
            )
    if key is None:
        key = await asyncssh.get_server_host_key(host, port if port is not None else (), config=config)
    if key is None:
        return None
    return OfferedKey(
        spec=spec,
        name=name,
        algorithm=key.get_algorithm(),
        fingerprint=key.get_fingerprint(),
        line=f"{name} {key.export_public_key().decode().strip()}\n",
        known_hosts=files[0],
        changed=bool(trusted and trusted[1]) or key.get_algorithm() in trusted_algorithms,
        trusted_algorithms=trusted_algorithms,
        address=options.host,
        port=options.port,
    )


# One question at a time, and one change of known_hosts at a time: a command over several hosts meets their
# new keys at once, and two prompts on one terminal (or two rewrites of one file) would garble each other.
_ASKING = threading.Lock()
_RECORDING = threading.Lock()


def record(offered: OfferedKey) -> None:
    """Add the key to known_hosts, atomically: the file is whole or untouched, whatever happens."""
    path = offered.known_hosts.resolve()  # a known_hosts linked from elsewhere stays a link
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _RECORDING:
        before = path.read_text() if path.is_file() else ""
        mode = path.stat().st_mode & 0o777 if path.is_file() else 0o600
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as out:
            out.write(before if not before or before.endswith("\n") else before + "\n")
            out.write(offered.line)
        tmp.replace(path)


def _ask(offered: OfferedKey) -> bool:
    with _ASKING:
        sys.stderr.write(
            f"The authenticity of host {offered.spec} ({offered.name}) can't be established.\n"
            f"{offered.algorithm} key fingerprint is {offered.fingerprint}.\n"
            f"Trust it and add it to {offered.known_hosts} (yes/no/[fingerprint])? "
        )
        sys.stderr.flush()
        answer = sys.stdin.readline()
    return answer.strip().lower() in ("yes", "y") or answer.strip() == offered.fingerprint


async def ask_on_terminal(offered: OfferedKey) -> bool:
    """ssh's question, on stderr; yes (or the fingerprint itself) trusts the key. Asked in a thread, so that the
    other hosts' connections go on meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(None, _ask, offered)


async def accept_and_say(offered: OfferedKey) -> bool:
    """`--accept-new-host-key`: trusted, and the fingerprint is said, so a person can check it later."""
    sys.stderr.write(f"eagle3-console: {offered.trusted()}\n")
    return True
