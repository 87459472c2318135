"""The agent's code on an SSH host, kept identical to this console's own `backends` sources.

It lives in `WORKDIR/agent/<version>/backends/` on the host, and that folder is on the agent's
PYTHONPATH, so whatever sits there runs as the agent. Each connection starts one small launcher on
the host (its Python, isolated with -I) that refuses, in one line, a copy that anyone but its user (and root,
above WORKDIR) could change, makes `WORKDIR/agent` and the version folder private (700) and lists the folder
with a SHA-256 per file; the client compares that with the manifest of its own files and puts right what
differs over one SFTP session, opened only then: a changed, missing or unreadable module is written under a
name Python cannot import and renamed over the old one (so an agent starting meanwhile imports a whole module,
old or new, never half of one, and two consoles repairing at once both end with the right bytes); anything
else (a planted module, a sitecustomize.py, a link, any bytecode) is removed. Each folder's `__pycache__` is
an empty file the launcher makes, so bytecode is never read from, nor written into, the host's copy: a planted
.pyc cannot stand in for a checked module. A version the host lacks is uploaded whole into a staging folder
and renamed into place. The launcher checks the result against the version, then becomes the agent on the
same channel, so a connection still costs one exec.

The version folder also holds the agent's pure-Python dependencies (`vendor/`, from this console's own
environment), under the same manifest and repair. The launcher says the host's architecture and
whether it has a py-spy of its own, and lists WORKDIR/agent/bin/py-spy when not, so that `py_spy` can
put the right one there.

The dependencies shipped: `backends.shipped.DEPENDENCIES` and what they require (their requirements without an
extra, read from their metadata) are copied from the distributions installed here into
WORKDIR/agent/<version>/vendor/ on the host: each distribution's files as its RECORD lists them (the importable
packages and modules, their data, and its METADATA so that importlib.metadata still answers), never a compiled one,
since the host's Python and architecture need not be this console's. A requirement for another Python only (a marker
such as `python_version < "3.11"`) that is not installed here is left to the host's own site-packages.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib.metadata
import json
import posixpath
import re
import shlex
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import asyncssh

from backends.shipped import DEPENDENCIES, PARTIAL, VENDOR

BACKENDS = Path(__file__).resolve().parents[2] / "backends"
CACHE = "__pycache__"  # in every folder of the host's copy an empty file of ours, so no bytecode can be there
EMPTY = hashlib.sha256(b"").hexdigest()
SHOWN_NAMES = 3  # names said per kind of change; the rest are counted

# The first thing the host runs, with its Python (any 3.x, so that the agent's own version check can
# speak after it), isolated (-I) from PYTHONPATH and the current folder. argv is WORKDIR and the version.
# In the home folder, it refuses to go on (one JSON line {refused}) unless every folder above WORKDIR is, as
# sshd's StrictModes wants of the folders above authorized_keys, root's or ours and writable by no one else
# (a sticky folder such as /tmp excepted: no one else can rename or remove what we own in it), and WORKDIR,
# WORKDIR/agent, the version folder and everything in it, and WORKDIR/agent/bin with its py-spy, are ours:
# whoever could change any of them could make the agent run their code as us (as root, for root). What is
# ours but writable by others is closed (WORKDIR/agent and the version folder 700, the rest go-w). WORKDIR is
# taken with its links resolved, and that path is what the console writes to and the agent runs from.
# Then it prints one JSON line {workdir, top, found, tree, machine, py_spy, tool}: `found` is what
# WORKDIR/agent/<version> is, and `tree` maps each path under it to its SHA-256, "dir", "link", "other" (a fifo,
# a socket), "unreadable" (a file) or "unlistable" (a folder); `machine` is `uname -m`, `py_spy` the host's own
# py-spy (on PATH or beside this Python, as the agent looks) or null, and `tool` what WORKDIR/agent/bin/py-spy
# is ("unused" when the host has its own). Then it waits for GO on stdin, read a byte at a time so that nothing
# meant for the agent is taken, and checks the repaired copy again: the same owners and modes, every folder's
# __pycache__ an empty file of ours (made here when missing: no Python, with any flags, can then read or write
# bytecode in the copy), and the files' digest (`version_of`, written again below) equal to the version. It
# prints {ready} or {refused} and becomes the agent (exec, on the same channel) with the checked copy first on
# sys.path, where `-m` would put the home folder (a ~/backends or ~/json.py would shadow it), its shipped
# dependencies right after, and what it verified (each entry's SHA-256 and stat facts) on an inherited
# descriptor, for `backends.shipped.check_unchanged`. Any other failure is one line on stderr.
LAUNCHER = r"""
import hashlib, json, os, platform, shutil, stat, sys, tempfile
ME = os.geteuid()
PARTIAL, CACHE, EMPTY = @PARTIAL@, @CACHE@, hashlib.sha256(b'').hexdigest()
class Refused(Exception): pass
def who(uid):
    try:
        import pwd
        return 'user ' + pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError): return 'uid %d' % uid
def above(path):
    parts = path.strip('/').split('/')
    for folder in ['/' + '/'.join(parts[:i]) for i in range(len(parts))]:
        try: st = os.lstat(folder)
        except FileNotFoundError: return
        owner = who(st.st_uid)
        if stat.S_ISLNK(st.st_mode) or st.st_uid not in (0, ME) or (
                st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            what = 'is a link' if stat.S_ISLNK(st.st_mode) else 'belongs to ' + owner if st.st_uid not in (0, ME) \
                else 'is writable by others (%s, mode %o)' % (owner, stat.S_IMODE(st.st_mode))
            fix = ' (or chmod go-w %s)' % folder if st.st_uid == ME else ''
            raise Refused('%s %s: whoever can change a folder above the agent\'s files can swap them for code the '
                          'agent runs as %s; choose a --workdir in folders only %s can change%s'
                          % (folder, what, who(ME), 'root' if ME == 0 else 'root or ' + who(ME), fix))
def mine(path, st):
    if st.st_uid != ME:
        raise Refused('%s belongs to %s, not to %s who runs the agent: remove it, or choose a --workdir of your own'
                      % (path, who(st.st_uid), who(ME)))
    if st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode): os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)
def facts(st): return [st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
def kind(path, st):
    if stat.S_ISLNK(st.st_mode): return 'link', st
    if stat.S_ISDIR(st.st_mode): return 'dir', st
    if not stat.S_ISREG(st.st_mode): return 'other', st
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), 'rb') as f:
            st = os.fstat(f.fileno())
            return hashlib.sha256(f.read()).hexdigest(), st
    except OSError: return 'unreadable', st
def walk(folder, prefix, tree, record):
    if record is not None:
        try: os.close(os.open(os.path.join(folder, CACHE), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400))
        except FileExistsError: pass
    try: names = sorted(os.listdir(folder))
    except OSError: tree[prefix[:-1]] = 'unlistable'; return
    if record is not None: record[prefix[:-1] or '.'] = ['dir'] + facts(os.lstat(folder))
    for name in names:
        path, rel = os.path.join(folder, name), prefix + name
        try: st = os.lstat(path)
        except OSError: continue
        mine(path, st)
        tree[rel], st = kind(path, st)
        if tree[rel] == 'dir': walk(path, rel + '/', tree, record)
        elif record is not None and len(tree[rel]) == 64: record[rel] = [tree[rel]] + facts(st)
def ours(folder, private):
    try: st = os.lstat(folder)
    except FileNotFoundError: return None
    mine(folder, st)
    if stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) & ~private:
        os.chmod(folder, stat.S_IMODE(st.st_mode) & private)
    return st
def look(record):
    above(workdir)
    for folder in (workdir, agent):
        st = ours(folder, 0o700)
        if st is None: return 'missing', {}
        if not stat.S_ISDIR(st.st_mode): raise Refused('%s is not a folder: choose another --workdir' % folder)
    st = ours(top, 0o700)
    tree = {}
    if st is None: return 'missing', tree
    if stat.S_ISDIR(st.st_mode): walk(top, '', tree, record); return 'dir', tree
    return ('link' if stat.S_ISLNK(st.st_mode) else 'other'), tree
def settled(tree):
    files, folders = {}, set()
    for rel, what in tree.items():
        name = rel.rsplit('/', 1)[-1]
        if name.startswith(PARTIAL) or (name == CACHE and what == EMPTY): continue
        if what == 'dir': folders.add(rel); continue
        if len(what) != 64 or name == CACHE:
            raise Refused('%s/%s is %s after the repair; connect again' % (top, rel, what))
        files[rel] = what
    digest = ''.join('%s\0%s\0' % (rel, files[rel]) for rel in sorted(files))
    if hashlib.sha256(digest.encode('utf-8', 'surrogateescape')).hexdigest()[:16] != version:
        raise Refused('the agent\'s files in %s changed while the console put them right; connect again' % top)
    needed = set(rel.rsplit('/', 1)[0] for rel in files if '/' in rel)
    for rel in list(needed): needed.update(rel[:i] for i in range(len(rel)) if rel[i] == '/')
    for rel in sorted(folders - needed): raise Refused('%s/%s was added during the repair; connect again' % (top, rel))
def say(**line):
    sys.stdout.write(json.dumps(line) + '\n')
    sys.stdout.flush()
try:
    os.chdir(os.path.expanduser('~'))
    workdir = os.path.realpath(os.path.expanduser(sys.argv[1]))
    version = sys.argv[2]
    agent = os.path.join(workdir, 'agent')
    top = os.path.join(agent, version)
    found, tree = look(None)
    beside = os.path.join(os.path.dirname(sys.executable), 'py-spy')
    own = shutil.which('py-spy') or (beside if os.path.isfile(beside) else None)
    tool = 'unused' if own else 'missing'
    st = ours(os.path.join(agent, 'bin'), 0o755) if os.path.isdir(agent) else None
    if st is not None and stat.S_ISDIR(st.st_mode):
        binary = os.path.join(agent, 'bin', 'py-spy')
        st = ours(binary, 0o755)
        if st is not None and not own: tool = kind(binary, st)[0]
except Refused as exc:
    say(refused=str(exc))
    sys.exit(1)
except OSError as exc:
    sys.exit('%s: %s' % (exc.filename, exc.strerror))
say(workdir=workdir, top=top, found=found, tree=tree, machine=platform.machine(), py_spy=own, tool=tool)
said = b''
while not said.endswith(b'\n'):
    byte = os.read(0, 1)
    if not byte: sys.exit(0)
    said += byte
if said != b'GO\n': sys.exit('the console said %r, not GO' % said)
record = {}
try:
    found, tree = look(record)
    if found != 'dir': raise Refused('%s is %s after the repair; connect again' % (top, found))
    settled(tree)
    try: fd = os.memfd_create('eagle3-agent-files', 0)
    except (AttributeError, OSError): fd = os.dup(tempfile.TemporaryFile().fileno())
    data = json.dumps({'top': top, 'entries': record}).encode('utf-8', 'surrogateescape')
    while data: data = data[os.write(fd, data):]
    os.set_inheritable(fd, True)
except Refused as exc:
    say(refused=str(exc))
    sys.exit(1)
except OSError as exc:
    say(refused='cannot check %s: %s' % (exc.filename, exc.strerror))
    sys.exit(1)
say(ready=len(record))
start = ('import sys; sys.path[0] = sys.argv.pop(1); import runpy; from backends import shipped; '
         'shipped.vendor_first(); runpy.run_module("backends.agent", run_name="__main__")')
os.execv(sys.executable, [sys.executable, '-c', start, top, '--workdir', workdir, '--manifest-fd', str(fd)])
"""
LAUNCHER = LAUNCHER.replace("@PARTIAL@", repr(PARTIAL)).replace("@CACHE@", repr(CACHE))
GO = b"GO\n"


def backends_files() -> list[Path]:
    """The backends package's Python sources."""
    return sorted(p for p in BACKENDS.rglob("*.py") if "__pycache__" not in p.parts)


def sources() -> dict[str, Path]:
    """Each file the host must hold, as its path under the version folder, and the file here: the backends
    package and the agent's shipped dependencies (VendorError when one cannot be shipped)."""
    own = {f"backends/{p.relative_to(BACKENDS).as_posix()}": p for p in backends_files()}
    return own | vendor_files()


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


class Refused(Exception):
    """The launcher would not run the agent from the host's copy; the message says why and what to do."""


def _said(line: bytes) -> dict[str, Any]:
    data: Any = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("the launcher printed something else")
    if isinstance(data.get("refused"), str):
        raise Refused(data["refused"])
    return data


def parse_listing(line: bytes) -> HostCopy:
    """The launcher's JSON line; Refused when it refused, ValueError when it is not what the launcher prints."""
    data = _said(line)
    if not isinstance(data.get("tree"), dict):
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


def parse_ready(line: bytes) -> None:
    """The launcher's line after GO: the repaired copy checked (it becomes the agent), else Refused; ValueError
    when it is not what the launcher prints."""
    if not isinstance(_said(line).get("ready"), int):
        raise ValueError("the launcher printed something else")


@dataclass(frozen=True)
class Repair:
    """What to do to make the host's copy equal the manifest."""

    changed: tuple[str, ...] = ()  # there, but not the right bytes (or not a plain file, or not a folder)
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()  # not in the manifest: removed (a folder with what it holds)
    remove: tuple[tuple[str, bool], ...] = ()  # (path, is a folder): extras and wrong kinds, removed first
    folders: tuple[str, ...] = ()  # folders to make, parents first
    write: tuple[str, ...] = ()  # modules to (re)write

    @property
    def needed(self) -> bool:
        return bool(self.remove or self.folders or self.write)

    def summary(self) -> str:
        """The differences in a few words, e.g. 'changed: backends/agent.py; removed: backends/evil.py'."""
        parts = [
            (what, names)
            for what, names in (("changed", self.changed), ("missing", self.missing), ("removed", self.extra))
            if names
        ]
        return "; ".join(f"{what}: {_names(names)}" for what, names in parts)


def plan(files: dict[str, str], tree: dict[str, str]) -> Repair:
    """Compare the host's `tree` with the manifest `files`. A folder's `__pycache__` is right as the launcher
    makes it (an empty file) or missing (it makes it after the repair); as anything else it goes."""
    folders = {posixpath.dirname(path) for path in files}
    folders |= {parent for folder in folders for parent in _parents(folder)}
    caches = {CACHE} | {f"{folder}/{CACHE}" for folder in folders}
    changed: list[str] = []
    extra: list[str] = []
    remove: list[tuple[str, bool]] = []
    for path, kind in sorted(tree.items()):
        is_folder = kind in ("dir", "unlistable")
        if any(path.startswith(f"{gone}/") for gone, folder in remove if folder):
            continue  # goes with its folder
        wanted = files.get(path, "dir" if path in folders else EMPTY if path in caches else "")
        if posixpath.basename(path).startswith(PARTIAL) or kind == wanted:
            continue
        if path in files or path in folders:
            changed.append(path)  # a module with other bytes is renamed over; anything else in the way goes first
            if is_folder or path in folders:
                remove.append((path, is_folder))
        else:
            extra.append(path)
            remove.append((path, is_folder))
    gone = {path for path, _ in remove}
    present = {p for p in tree if p not in gone and not any(p.startswith(f"{g}/") for g in gone)}
    return Repair(
        changed=tuple(changed),
        missing=tuple(path for path in sorted(files) if path not in tree),
        extra=tuple(extra),
        remove=tuple(remove),
        folders=tuple(sorted((f for f in folders if f not in present), key=lambda f: f.count("/"))),
        write=tuple(path for path in sorted(files) if path in changed or path not in present),
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


async def upload(sftp: asyncssh.SFTPClient, top: str) -> None:
    """The whole version into a private staging folder, renamed to `top` when complete."""
    agent = posixpath.dirname(top)
    await sftp.makedirs(agent, asyncssh.SFTPAttrs(permissions=0o700), exist_ok=True)  # WORKDIR too, private
    await sftp.chmod(agent, 0o700)
    staging = f"{agent}/.upload-{uuid.uuid4().hex[:8]}"
    await sftp.mkdir(staging, asyncssh.SFTPAttrs(permissions=0o700))
    files = sources()
    try:
        for folder in sorted({posixpath.dirname(path) for path in files}):
            await sftp.makedirs(f"{staging}/{folder}", exist_ok=True)
        puts = [sftp.put(str(source), f"{staging}/{path}") for path, source in files.items()]
        failed = [done for done in await asyncio.gather(*puts, return_exceptions=True) if isinstance(done, Exception)]
        if failed:  # raised once every put has ended, so that nothing writes into the folder being removed
            raise failed[0]
    except asyncssh.SFTPError:
        with contextlib.suppress(asyncssh.SFTPError):
            await sftp.rmtree(staging)  # half a copy is of no use, and on a full disk it holds what space is left
        raise
    try:
        await sftp.rename(staging, top)
    except asyncssh.SFTPError:
        await sftp.rmtree(staging)  # another console uploaded the same version meanwhile


def bytes_to_write(what: Repair | None) -> int:
    """What an upload (None) or a repair writes on the host, in bytes."""
    local = sources()
    return sum(local[path].stat().st_size for path in (local if what is None else what.write))


async def no_space(sftp: asyncssh.SFTPClient, workdir: str, needed: int) -> str | None:
    """Why writing `needed` bytes under `workdir` failed when it is for want of space on its disk (as the host's
    statvfs says, asked of the deepest folder there is), else None: an SFTP server says only "Failure"."""
    folder = workdir
    while True:
        try:
            disk = await sftp.statvfs(_remote(folder))
            break
        except asyncssh.SFTPNoSuchFile:
            if folder in ("/", ""):
                return None
            folder = posixpath.dirname(folder)
        except asyncssh.SFTPError:  # a server without OpenSSH's statvfs: nothing to tell
            return None
    free = disk.bavail * disk.frsize
    if disk.files and not disk.favail:
        return f"no space left on the host's disk holding {workdir} (no free inodes)"
    if free >= needed:
        return None
    return (
        f"no space left on the host's disk holding {workdir}: the agent's files need {needed / 1e6:.1f} MB, "
        f"{free / 1e6:.1f} MB are free"
    )


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


# ---- the vendored dependencies ----
COMPILED = (".so", ".pyd", ".dylib", ".dll")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class VendorError(Exception):
    """A dependency cannot be shipped: missing here, or compiled; the message says what to do."""


@functools.cache
def vendor_files() -> dict[str, Path]:
    """Each file to ship, as its path under the version folder (`vendor/...`), and the file here."""
    files: dict[str, Path] = {}
    for dist in _distributions():
        files.update(_files_of(dist))
    return files


def _distributions() -> list[importlib.metadata.Distribution]:
    """The dependencies and what they require, each once, as installed here."""
    found: dict[str, importlib.metadata.Distribution] = {}
    wanted = [(name, "") for name in DEPENDENCIES]
    while wanted:
        name, marker = wanted.pop()
        key = _normal(name)
        if key in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            if marker:  # needed by another Python only: the host's own copy serves there
                continue
            raise VendorError(
                f"{name} is not installed beside this console, so the agent cannot take it to the host: "
                f"reinstall eagle3-console (or pip install {name})"
            ) from None
        found[key] = dist
        for requirement in dist.requires or []:
            spec, _, condition = requirement.partition(";")
            match = _NAME.match(spec)
            if match and "extra" not in condition:
                wanted.append((match.group(1), condition.strip()))
    return [found[key] for key in sorted(found)]


def _files_of(dist: importlib.metadata.Distribution) -> dict[str, Path]:
    name = dist.metadata["Name"]
    wheel = dist.read_text("WHEEL") or ""
    listed = dist.files or []
    if "Root-Is-Purelib: false" in wheel or any(str(path).endswith(COMPILED) for path in listed):
        raise VendorError(
            f"{name} is installed here as a compiled build, which the agent cannot take to a host of another Python "
            f"or architecture: reinstall it from its pure-Python (py3-none-any) wheel"
        )
    files: dict[str, Path] = {}
    for path in listed:
        parts = PurePosixPath(path.as_posix()).parts
        if not parts or parts[0] == ".." or "__pycache__" in parts or path.suffix == ".pyc":
            continue  # a script outside site-packages, or a compiled copy the host makes itself
        if parts[0].endswith(".dist-info") and parts[1:] != ("METADATA",):
            continue
        files[f"{VENDOR}/{path.as_posix()}"] = Path(str(dist.locate_file(path)))
    return files


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
