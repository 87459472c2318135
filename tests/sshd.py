"""A real OpenSSH server on 127.0.0.1 for the SSH transport's tests, with its own keys and a client home.

`start_sshd(folder)` generates a host key and a user key, writes an sshd_config
that listens on a free loopback port and accepts only that key, starts
`/usr/sbin/sshd -D -e` and waits until it answers. The client side is a HOME
with `.ssh/config` (Host alias `gpu-test`), the user key and a known_hosts that
trusts the host key: what a user's laptop holds.
"""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port

SSHD = Path("/usr/sbin/sshd")
ALIAS = "gpu-test"


@dataclass
class Sshd:
    process: subprocess.Popen[bytes]
    port: int
    home: Path  # the client's HOME
    host_public_key: str

    def env(self, home: Path | None = None) -> dict[str, str]:
        """The client environment: this HOME and no ssh agent (the key file is the only identity)."""
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        env["HOME"] = str(home or self.home)
        return env

    def client_home(self, folder: Path, *, known_hosts: str | None = None, key: Path | None = None) -> Path:
        """Another client HOME: other known_hosts text, or another identity file."""
        ssh = folder / ".ssh"
        ssh.mkdir(parents=True)
        (ssh / "config").write_text(_config(self.port, key or self.home / ".ssh" / "id_ed25519"))
        (ssh / "known_hosts").write_text(self.known_hosts() if known_hosts is None else known_hosts)
        return folder

    def known_hosts(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_public_key}\n"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def _config(port: int, key: Path, alias: str = ALIAS) -> str:
    return (
        f"Host {alias}\n    HostName 127.0.0.1\n    Port {port}\n    User {getpass.getuser()}\n    IdentityFile {key}\n"
    )


def home_for(folder: Path, hosts: dict[str, Sshd]) -> Path:
    """A client HOME that reaches each sshd by its alias here (several hosts from one laptop)."""
    ssh = folder / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "config").write_text("".join(_config(d.port, d.home / ".ssh" / "id_ed25519", a) for a, d in hosts.items()))
    (ssh / "known_hosts").write_text("".join(d.known_hosts() for d in hosts.values()))
    return folder


def start_sshd(folder: Path) -> Sshd:
    server = folder / "server"
    server.mkdir(parents=True)
    host_public = keygen(server / "host_key")
    home = folder / "home"
    (home / ".ssh").mkdir(parents=True)
    user_public = keygen(home / ".ssh" / "id_ed25519")
    (server / "authorized_keys").write_text(user_public + "\n")
    port = free_port()
    (server / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {server / 'host_key'}\n"
        f"AuthorizedKeysFile {server / 'authorized_keys'}\nPidFile {server / 'sshd.pid'}\n"
        "StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\n"
        "LogLevel ERROR\n"
        # The host's caches (serve-flag verdicts, py-spy) stay with this server, not in the real HOME where other
        # suites (pytest-xdist's other workers) would share them.
        f"SetEnv XDG_CACHE_HOME={server / 'cache'}\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    process = subprocess.Popen(
        [str(SSHD), "-D", "-e", "-f", str(server / "sshd_config")], stderr=(server / "sshd.log").open("wb")
    )
    sshd = Sshd(process, port, home, host_public)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited: {(server / 'sshd.log').read_text()}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    (home / ".ssh" / "config").write_text(_config(port, home / ".ssh" / "id_ed25519"))
    (home / ".ssh" / "known_hosts").write_text(sshd.known_hosts())
    return sshd
