"""What the console ships beside this package on an SSH host, and how the host side finds it.

- `WORKDIR/agent/<version>/vendor/`: the agent's pure-Python dependencies (httpx and what it needs,
  prometheus_client), copied from the console's own environment, since a host's python3 typically lacks
  them. The agent (its launcher) and the run supervisors (importing `backends.runs`, which only they do: a
  run's stages sit below it) put this folder FIRST on sys.path (`vendor_first`), before the
  host's PYTHONPATH and site-packages: they then import the very versions the console was tested with,
  whatever older or newer ones the host holds (httpx 1.x or an old anyio would break us, and mixing our
  httpx with the host's httpcore is worse). A run's own processes never get the folder (it is on no
  PYTHONPATH), so a server or a training keeps the host's versions.
- `WORKDIR/agent/bin/py-spy`: py-spy for the host's architecture, uploaded when the host has none, so a
  stalled run's stack dump shows Python frames (`uploaded_py_spy`). It outlives the version folders.

The launcher (`console.link.agent_upload`) verifies the version folder before anything is imported and hands the agent
what it verified (`adopt`): each file's SHA-256 and each entry's stat facts. A run's supervisor imports that
code anew, long after the connection's check, so `check_unchanged` is asked before one starts: a stat of each
entry, and the SHA-256 only of what moved.

`python -m backends.shipped` says where the agent imports each shipped dependency from.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pwd
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from backends import PACKAGE_ROOT

AGENT = "agent"  # WORKDIR/agent holds the version folders and BIN
VENDOR = "vendor"  # under the version folder
BIN = "bin"  # under WORKDIR/agent
PY_SPY = "py-spy"
# What the agent imports that a host's Python may lack; the console ships these and what they need.
DEPENDENCIES = ("httpx", "prometheus_client")
PARTIAL = ".eagle3-partial-"  # a file being written by a console's repair: not importable, and left alone


class Altered(Exception):
    """The agent's files changed since the launcher verified them; the message names what, in one line."""


@dataclass
class _Entry:
    digest: str  # a file's SHA-256, or "dir"
    facts: list[int]  # (dev, inode, mode, uid, size, mtime_ns, ctime_ns) when last verified


@dataclass
class _Verified:
    top: Path
    entries: dict[str, _Entry]  # path under `top` ("." for it) -> what was verified


_verified: _Verified | None = None  # set once by the agent of an uploaded copy; a local agent has none


def adopt(fd: int) -> None:
    """Take the launcher's record of the verified copy from the inherited descriptor `fd` (read from its start,
    so an agent that re-executes itself reads it whole again), and close it: supervisors need not hold it.
    ValueError or OSError when it is not one."""
    global _verified
    try:
        size = os.fstat(fd).st_size
        data = json.loads(os.pread(fd, size, 0))
    finally:
        os.close(fd)
    entries = {str(path): _Entry(str(value[0]), [int(n) for n in value[1:]]) for path, value in data["entries"].items()}
    _verified = _Verified(Path(data["top"]), entries)


def _facts(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def check_unchanged() -> None:
    """Before a supervisor imports the agent's code again: every verified entry still has its stat facts, or,
    where one moved, still its bytes (a file) or its names (a folder), still ours and writable by no one else;
    Altered naming the first difference. Nothing to check for an agent that was not uploaded."""
    if _verified is None:
        return
    moved = {}
    for path, entry in _verified.entries.items():
        try:
            st = os.lstat(_verified.top / path)
        except OSError:
            raise Altered(f"{path} is missing") from None
        if _facts(st) != entry.facts:
            moved[path] = st
    for path, st in moved.items():
        _recheck(_verified, path, st)
        _verified.entries[path].facts = _facts(st)


def _recheck(verified: _Verified, path: str, st: os.stat_result) -> None:
    entry = verified.entries[path]
    if st.st_uid != os.geteuid():
        raise Altered(f"{path} now belongs to {_user(st.st_uid)}")
    if st.st_mode & 0o022:
        raise Altered(f"{path} is now writable by others (mode {stat.S_IMODE(st.st_mode):o})")
    if entry.digest == "dir":
        if not stat.S_ISDIR(st.st_mode):
            raise Altered(f"{path} is no longer a folder")
        prefix = "" if path == "." else f"{path}/"
        for name in sorted(os.listdir(verified.top / path)):
            if f"{prefix}{name}" not in verified.entries and not name.startswith(PARTIAL):
                raise Altered(f"{prefix}{name} was added")
        return
    if not stat.S_ISREG(st.st_mode):
        raise Altered(f"{path} is no longer a plain file")
    try:
        fd = os.open(verified.top / path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        raise Altered(f"{path} cannot be read") from None
    with os.fdopen(fd, "rb") as file:
        if hashlib.sha256(file.read()).hexdigest() != entry.digest:
            raise Altered(f"{path} changed")


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"uid {uid}"


def vendor_first() -> None:
    """Put the shipped dependencies right after our own package on sys.path (see the module's docstring)."""
    folder = str(PACKAGE_ROOT / VENDOR)
    if Path(folder).is_dir() and folder not in sys.path:
        sys.path.insert(1, folder)


def uploaded_py_spy() -> Path | None:
    """py-spy as the console uploaded it for this copy of the agent, when this is an uploaded copy and it is there."""
    path = PACKAGE_ROOT.parent / BIN / PY_SPY
    return path if PACKAGE_ROOT.parent.name == AGENT and path.is_file() else None


def origins() -> dict[str, str]:
    """Each dependency the agent needs, and the file it is imported from (or why it cannot be)."""
    found: dict[str, str] = {}
    for name in DEPENDENCIES:
        try:
            found[name] = str(importlib.import_module(name).__file__)
        except ImportError as exc:
            found[name] = f"not importable: {exc}"
    return found


if __name__ == "__main__":
    vendor_first()
    for name, origin in origins().items():
        print(f"{name}: {origin}")
