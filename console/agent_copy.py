"""The agent's code on an SSH host, kept identical to this console's own `backends` sources.

It lives in `WORKDIR/agent/<version>/backends/` on the host, and that folder is on the agent's
PYTHONPATH, so whatever sits there runs as the agent. Each connection starts one small launcher on
the host (its Python, isolated with -I) that makes `WORKDIR/agent` and the version folder private
(700) and lists the folder with a SHA-256 per file; the client compares that with the manifest of its
own files and puts right what differs over one SFTP session, opened only then: a changed, missing or
unreadable module is written under a name Python cannot import and renamed over the old one (so an
agent starting meanwhile imports a whole module, old or new, never half of one, and two consoles
repairing at once both end with the right bytes); anything else (a planted module, a sitecustomize.py,
a link) is removed, as are the compiled copies of the modules rewritten. A version the host lacks is
uploaded whole into a staging folder and renamed into place. Then the launcher becomes the agent on
the same channel, so a connection still costs one exec.

The version folder also holds the agent's pure-Python dependencies (`vendor/`, from this console's own
environment: `vendored`), under the same manifest and repair. The launcher says the host's architecture and
whether it has a py-spy of its own, and lists WORKDIR/agent/bin/py-spy when not, so that `host_py_spy` can
put the right one there.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import posixpath
import shlex
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from console import vendored

BACKENDS = Path(__file__).resolve().parent.parent / "backends"
PARTIAL = ".eagle3-partial-"  # a file being written: not importable, and left alone by a check running meanwhile
CACHE = "__pycache__"
SHOWN_NAMES = 3  # names said per kind of change; the rest are counted

# The first thing the host runs, with its Python (any 3.x, so that the agent's own version check can
# speak after it), isolated (-I) from PYTHONPATH and the current folder. argv is WORKDIR and the version.
# In the home folder, it makes WORKDIR/agent and WORKDIR/agent/<version> private, prints one JSON line
# {workdir, top, found, tree, machine, py_spy, tool}: `found` is what WORKDIR/agent/<version> is, and `tree`
# maps each path under it to its SHA-256, "dir", "link", "other" (a fifo, a socket), "unreadable" (a file) or
# "unlistable" (a folder); `machine` is `uname -m`, `py_spy` the host's own py-spy (on PATH or beside this
# Python, as the agent looks) or null, and `tool` what WORKDIR/agent/bin/py-spy is ("unused" when the host
# has its own). Then it waits for GO on stdin, read a byte at a time so that nothing meant
# for the agent is taken, and becomes the agent (exec, on the same channel) with the checked copy first
# on sys.path, where `-m` would put the home folder (a ~/backends or ~/json.py would shadow it), and its
# shipped dependencies right after. A failure is one line on stderr.
LAUNCHER = r"""
import hashlib, json, os, platform, shutil, stat, sys
tree = {}
def kind(path):
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode): return 'link'
    if stat.S_ISDIR(mode): return 'dir'
    if not stat.S_ISREG(mode): return 'other'
    try:
        with open(path, 'rb') as f: return hashlib.sha256(f.read()).hexdigest()
    except OSError: return 'unreadable'
def walk(folder, prefix):
    try: names = sorted(os.listdir(folder))
    except OSError: tree[prefix[:-1]] = 'unlistable'; return
    for name in names:
        try: tree[prefix + name] = kind(os.path.join(folder, name))
        except OSError: continue
        if tree[prefix + name] == 'dir': walk(os.path.join(folder, name), prefix + name + '/')
try:
    os.chdir(os.path.expanduser('~'))
    workdir = os.path.abspath(os.path.expanduser(sys.argv[1]))
    agent = os.path.join(workdir, 'agent')
    top = os.path.join(agent, sys.argv[2])
    for folder in (agent, top):
        if os.path.isdir(folder) and not os.path.islink(folder) and os.stat(folder).st_mode & 0o777 != 0o700:
            os.chmod(folder, 0o700)
    try: found = kind(top)
    except OSError: found = 'missing'
    if found == 'dir': walk(top, '')
    beside = os.path.join(os.path.dirname(sys.executable), 'py-spy')
    own = shutil.which('py-spy') or (beside if os.path.isfile(beside) else None)
    try: tool = 'unused' if own else kind(os.path.join(agent, 'bin', 'py-spy'))
    except OSError: tool = 'missing'
except OSError as exc:
    sys.exit('%s: %s' % (exc.filename, exc.strerror))
listing = {'workdir': workdir, 'top': top, 'found': found, 'tree': tree, 'machine': platform.machine(),
           'py_spy': own, 'tool': tool}
sys.stdout.write(json.dumps(listing) + '\n')
sys.stdout.flush()
said = b''
while not said.endswith(b'\n'):
    byte = os.read(0, 1)
    if not byte: sys.exit(0)
    said += byte
if said != b'GO\n': sys.exit('the console said %r, not GO' % said)
start = ('import runpy, sys; sys.path[0] = sys.argv.pop(1); from backends import shipped; shipped.vendor_first(); '
         'runpy.run_module("backends.agent", run_name="__main__")')
os.execv(sys.executable, [sys.executable, '-c', start, top, '--workdir', workdir])
"""
GO = b"GO\n"


def backends_files() -> list[Path]:
    """The backends package's Python sources."""
    return sorted(p for p in BACKENDS.rglob("*.py") if "__pycache__" not in p.parts)


def sources() -> dict[str, Path]:
    """Each file the host must hold, as its path under the version folder, and the file here: the backends
    package and the agent's shipped dependencies (VendorError when one cannot be shipped)."""
    own = {f"backends/{p.relative_to(BACKENDS).as_posix()}": p for p in backends_files()}
    return own | vendored.vendor_files()


def manifest() -> dict[str, str]:
    """Each file the host must hold, as its path under the version folder and its SHA-256."""
    return {path: hashlib.sha256(source.read_bytes()).hexdigest() for path, source in sources().items()}


def version_of(files: dict[str, str]) -> str:
    """A digest of the manifest: a host runs exactly the agent this console was built with."""
    return hashlib.sha256(
        "".join(f"{path}\0{digest}\0" for path, digest in sorted(files.items())).encode()
    ).hexdigest()[:16]


def backends_version() -> str:
    """The version this console's files make: the name of their folder on the host."""
    return version_of(manifest())


def launch_command(python: str, workdir: str, version: str) -> str:
    """The shell command that starts the launcher on the host; every word quoted."""
    return shlex.join([python, "-I", "-c", LAUNCHER, workdir, version])


@dataclass(frozen=True)
class HostCopy:
    """What the launcher saw on the host."""

    workdir: str  # absolute
    top: str  # WORKDIR/agent/<version>, absolute
    found: str  # what `top` is: "dir", "missing", or something that is not a folder
    tree: dict[str, str]  # path under `top` -> SHA-256, "dir", "link", "other", "unreadable" or "unlistable"
    machine: str  # uname -m
    py_spy: str | None  # the host's own py-spy
    tool: str  # what WORKDIR/agent/bin/py-spy is, as `tree` says it; "missing", or "unused" with py_spy


def parse_listing(line: bytes) -> HostCopy:
    """The launcher's JSON line; ValueError when it is not what the launcher prints."""
    data: Any = json.loads(line)
    if not (isinstance(data, dict) and isinstance(data.get("tree"), dict)):
        raise ValueError("the launcher printed something else")
    return HostCopy(
        str(data["workdir"]),
        str(data["top"]),
        str(data["found"]),
        {str(k): str(v) for k, v in data["tree"].items()},
        str(data.get("machine", "")),
        None if data.get("py_spy") is None else str(data["py_spy"]),
        str(data.get("tool", "missing")),
    )


@dataclass(frozen=True)
class Repair:
    """What to do to make the host's copy equal the manifest."""

    changed: tuple[str, ...] = ()  # there, but not the right bytes (or not a plain file, or not a folder)
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()  # not in the manifest: removed (a folder with what it holds)
    remove: tuple[tuple[str, bool], ...] = ()  # (path, is a folder): extras and wrong kinds, removed first
    folders: tuple[str, ...] = ()  # folders to make, parents first
    write: tuple[str, ...] = ()  # modules to (re)write
    stale: tuple[str, ...] = ()  # compiled copies of the modules rewritten

    @property
    def needed(self) -> bool:
        return bool(self.remove or self.folders or self.write or self.stale)

    def summary(self) -> str:
        """The differences in a few words, e.g. 'changed: backends/agent.py; removed: backends/evil.py'."""
        parts = [
            (what, names)
            for what, names in (("changed", self.changed), ("missing", self.missing), ("removed", self.extra))
            if names
        ]
        return "; ".join(f"{what}: {_names(names)}" for what, names in parts)


def plan(files: dict[str, str], tree: dict[str, str]) -> Repair:
    """Compare the host's `tree` with the manifest `files`."""
    folders = {posixpath.dirname(path) for path in files}
    folders |= {parent for folder in folders for parent in _parents(folder)}
    caches = {f"{folder}/{CACHE}" for folder in folders}
    changed: list[str] = []
    extra: list[str] = []
    remove: list[tuple[str, bool]] = []
    compiled: list[str] = []
    for path, kind in sorted(tree.items()):
        is_folder = kind in ("dir", "unlistable")
        if any(path.startswith(f"{gone}/") for gone, folder in remove if folder):
            continue  # goes with its folder
        if posixpath.basename(path).startswith(PARTIAL) or kind == files.get(path, "dir" if path in folders else ""):
            continue
        if path in files or path in folders:
            changed.append(path)  # a module with other bytes is renamed over; anything else in the way goes first
            if is_folder or path in folders:
                remove.append((path, is_folder))
        elif path in caches and kind == "dir":
            continue
        elif posixpath.dirname(path) in caches and not is_folder and kind not in ("link", "other"):
            compiled.append(path)
        else:
            extra.append(path)
            remove.append((path, is_folder))
    gone = {path for path, _ in remove}
    present = {p for p in tree if p not in gone and not any(p.startswith(f"{g}/") for g in gone)}
    write = [path for path in sorted(files) if path in changed or path not in present]
    rewritten = {(posixpath.dirname(path), posixpath.basename(path).removesuffix(".py")) for path in write}
    stale = [
        path
        for path in compiled
        if (posixpath.dirname(posixpath.dirname(path)), posixpath.basename(path).split(".")[0]) in rewritten
    ]
    return Repair(
        changed=tuple(changed),
        missing=tuple(path for path in sorted(files) if path not in tree),
        extra=tuple(extra),
        remove=tuple(remove),
        folders=tuple(sorted((f for f in folders if f not in present), key=lambda f: f.count("/"))),
        write=tuple(write),
        stale=tuple(stale),
    )


async def repair(sftp: asyncssh.SFTPClient, top: str, what: Repair) -> None:
    """Make the host's copy under `top` equal the manifest, as `what` says."""
    local = sources()
    for path, is_folder in what.remove:
        await _remove(sftp, f"{top}/{path}", is_folder)
    for folder in what.folders:
        with contextlib.suppress(asyncssh.SFTPFailure):  # made meanwhile by another console
            await sftp.mkdir(_remote(f"{top}/{folder}"))
    await asyncio.gather(*(_replace(sftp, local[path], f"{top}/{path}") for path in what.write))
    await asyncio.gather(*(_remove(sftp, f"{top}/{path}", False) for path in what.stale))


async def upload(sftp: asyncssh.SFTPClient, top: str) -> None:
    """The whole version into a private staging folder, renamed to `top` when complete."""
    agent = posixpath.dirname(top)
    await sftp.makedirs(agent, exist_ok=True)
    await sftp.chmod(agent, 0o700)
    staging = f"{agent}/.upload-{uuid.uuid4().hex[:8]}"
    await sftp.mkdir(staging, asyncssh.SFTPAttrs(permissions=0o700))
    files = sources()
    for folder in sorted({posixpath.dirname(path) for path in files}):
        await sftp.makedirs(f"{staging}/{folder}", exist_ok=True)
    await asyncio.gather(*(sftp.put(str(source), f"{staging}/{path}") for path, source in files.items()))
    try:
        await sftp.rename(staging, top)
    except asyncssh.SFTPError:
        await sftp.rmtree(staging)  # another console uploaded the same version meanwhile


async def _replace(sftp: asyncssh.SFTPClient, source: Path, target: str) -> None:
    partial = f"{posixpath.dirname(target)}/{PARTIAL}{posixpath.basename(target)}.{uuid.uuid4().hex[:8]}"
    await sftp.put(str(source), _remote(partial))
    try:
        await sftp.posix_rename(_remote(partial), _remote(target))
    except asyncssh.SFTPOpUnsupported:  # a server without OpenSSH's extension: a moment without the file
        await _remove(sftp, target, False)
        await sftp.rename(_remote(partial), _remote(target))


async def _remove(sftp: asyncssh.SFTPClient, path: str, is_folder: bool) -> None:
    """Remove a file, link or folder; one already gone (another console removed it) is fine."""

    def gone_meanwhile(_func: Callable[..., object], _path: bytes, info: Any) -> None:
        if not isinstance(info[1], asyncssh.SFTPNoSuchFile):
            raise info[1]

    with contextlib.suppress(asyncssh.SFTPNoSuchFile):
        if is_folder:
            await sftp.rmtree(_remote(path), onerror=gone_meanwhile)
        else:
            await sftp.remove(_remote(path))


def _remote(path: str) -> bytes:
    """A host path as SFTP takes it: bytes, so a name that is not UTF-8 reaches the host as it was read."""
    return path.encode("utf-8", "surrogateescape")


def _parents(folder: str) -> Iterable[str]:
    while "/" in folder:
        folder = posixpath.dirname(folder)
        yield folder


def _names(names: tuple[str, ...]) -> str:
    shown = ", ".join(name if name.isprintable() else ascii(name) for name in names[:SHOWN_NAMES])
    more = len(names) - SHOWN_NAMES
    return shown + (f" and {more} more" if more > 0 else "")
