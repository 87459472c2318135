"""py-spy for an SSH host that has none, so a stalled run's stack dump shows its Python frames.

The binary comes from py-spy's wheel for the host's architecture (the launcher says `uname -m`), pinned to
one release: the one installed beside this console when it is that release and that architecture, else a
copy cached in ~/.cache/eagle3-console/ (from `pip download` of the wheel, when first needed). Every wheel
and every binary is checked against the SHA-256 pinned here (the wheels' are those PyPI publishes), so
nothing else is ever run on the host as py-spy. It goes to WORKDIR/agent/bin/py-spy (0700, written under
another name and renamed), where the agent looks after PATH and its interpreter's folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata
import os
import posixpath
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from backends.shipped import BIN, PARTIAL, PY_SPY

VERSION = "0.4.3"
PIP_TIMEOUT_S = 120


@dataclass(frozen=True)
class Wheel:
    platform: str  # pip's --platform
    filename: str
    sha256: str  # of the wheel, as PyPI publishes it
    binary_sha256: str  # of py-spy inside it


WHEELS = {
    "x86_64": Wheel(
        "manylinux2014_x86_64",
        f"py_spy-{VERSION}-py2.py3-none-manylinux1_x86_64.manylinux_2_5_x86_64.whl",
        "8a4277225f470d394a85cca0cdd944bef87f0097b6f20150a6dd3ac2e92806b8",
        "a41205d4925beafd108e1ace85e66c0a1a7adbfcbebcd4441f07848b608886c0",
    ),
    "aarch64": Wheel(
        "manylinux2014_aarch64",
        f"py_spy-{VERSION}-py2.py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
        "bbcec46930d464b3bfc142d6d02ade4dd8ad5627823263b3eff0280e80c7c132",
        "ad6e22882e8dcaced4f0a76fef10d372645cc7b94c48a289ebe1bedb754774ed",
    ),
}
ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


class NoPySpy(Exception):
    """No py-spy can be had for the host; the message says why, in a few words."""


def wheel_for(machine: str) -> Wheel | None:
    """The pinned wheel for a host of this `uname -m`, if py-spy publishes one."""
    return WHEELS.get(ALIASES.get(machine, machine))


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle3-console"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# What each architecture got in this process: a checked binary, or why there is none (pip is asked once).
_found: dict[str, Path | NoPySpy] = {}


def where(top: str) -> str:
    """Where the uploaded py-spy lives on the host, given the version folder WORKDIR/agent/<version>."""
    return f"{posixpath.dirname(top)}/{BIN}/{PY_SPY}"


async def binary(machine: str) -> tuple[Path, str]:
    """A checked py-spy for a host of `machine`, and its SHA-256; NoPySpy when there is none."""
    wheel = wheel_for(machine)
    if wheel is None:
        raise NoPySpy(f"py-spy publishes no build for {machine!r} hosts")
    if wheel.platform not in _found:
        try:
            _found[wheel.platform] = await asyncio.to_thread(_checked, wheel)
        except NoPySpy as exc:
            _found[wheel.platform] = exc
    found = _found[wheel.platform]
    if isinstance(found, NoPySpy):
        raise found
    return found, wheel.binary_sha256


def _checked(wheel: Wheel) -> Path:
    """The installed or cached binary when it is the pinned one, else one fetched now."""
    for candidate in (_installed(), cache_dir() / f"py-spy-{VERSION}-{wheel.platform}"):
        if candidate is not None and candidate.is_file() and sha256_of(candidate) == wheel.binary_sha256:
            return candidate
    return _fetch(wheel)


def _installed() -> Path | None:
    """py-spy as installed beside this console (the agent extra), when it is there."""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(PY_SPY)
        for path in dist.files or []:
            if path.name == PY_SPY:
                return Path(str(dist.locate_file(path))).resolve()
    return None


def _fetch(wheel: Wheel) -> Path:
    """The wheel from pip (into a private scratch folder), checked, and its binary cached, checked."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"py-spy-{VERSION}-{wheel.platform}"
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        _pip_download(wheel, Path(scratch))
        path = Path(scratch) / wheel.filename
        if not path.is_file():
            raise NoPySpy(f"pip gave no {wheel.filename}")
        if sha256_of(path) != wheel.sha256:
            raise NoPySpy(f"{wheel.filename} from pip is not the one pinned (SHA-256 differs)")
        partial = Path(scratch) / PY_SPY
        with zipfile.ZipFile(path) as archive:
            partial.write_bytes(archive.read(f"py_spy-{VERSION}.data/scripts/{PY_SPY}"))
        if sha256_of(partial) != wheel.binary_sha256:
            raise NoPySpy(f"py-spy inside {wheel.filename} is not the one pinned (SHA-256 differs)")
        partial.chmod(0o700)
        partial.replace(target)
    return target


def _pip_download(wheel: Wheel, folder: Path) -> None:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    argv += ["--platform", wheel.platform, "--dest", str(folder), f"py-spy=={VERSION}"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoPySpy(f"pip download of py-spy failed: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise NoPySpy(f"pip download of py-spy failed: {said}")


async def upload(sftp: asyncssh.SFTPClient, agent: str, source: Path, found: str) -> None:
    """`source` to AGENT/bin/py-spy, mode 0700, under another name first and renamed over what `found` was."""
    folder = f"{agent}/{BIN}"
    with contextlib.suppress(asyncssh.SFTPFailure):  # there already
        await sftp.mkdir(folder, asyncssh.SFTPAttrs(permissions=0o700))
    target = f"{folder}/{PY_SPY}"
    if found in ("dir", "unlistable"):
        await sftp.rmtree(target)
    partial = f"{folder}/{PARTIAL}{PY_SPY}.{os.urandom(4).hex()}"
    await sftp.put(str(source), partial)
    await sftp.chmod(partial, 0o700)
    try:
        await sftp.posix_rename(partial, target)
    except asyncssh.SFTPOpUnsupported:  # a server without OpenSSH's extension
        with contextlib.suppress(asyncssh.SFTPNoSuchFile):
            await sftp.remove(target)
        await sftp.rename(partial, target)
