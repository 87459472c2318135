"""Files written so that readers never see half of them, and read so that garbage never stops a reader.

Everything here is private to its owner whatever the umask (700 folders, 600 files): run records hold the
environment a run needs (tokens). Records are replaced atomically (a temp file, fsync, rename); JSON-lines
files are appended with one write(2) each, so that two writers never interleave.
"""

from __future__ import annotations

import ctypes
import errno
import json
import math
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

# The run store is its owner's alone, whatever the umask: specs hold the env a run needs (tokens).
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_dir(path: Path) -> None:
    """Make `path` (and missing parents) a folder only its owner can enter.

    A new folder is 700 whatever the umask. An existing one loses what others may do and keeps what its owner
    chose: one the owner made read-only (500) stays so, and a write into it fails with the system's own error
    (Permission denied) rather than being quietly allowed again.
    """
    try:
        path.mkdir(mode=PRIVATE_DIR, parents=True)
    except FileExistsError:
        if not path.is_dir():
            raise
        mode = path.stat().st_mode & 0o777
        if mode & ~PRIVATE_DIR:
            os.chmod(path, mode & PRIVATE_DIR)
    else:
        os.chmod(path, PRIVATE_DIR)


def open_private(path: Path, flags: int) -> int:
    """os.open with mode 600 exactly: the umask may not widen it, and an older file is narrowed."""
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE)
    try:
        if os.fstat(fd).st_mode & 0o777 != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a private temp file beside `path`, fsync, then rename over it."""
    tmp = path.with_name(f"{_temp_prefix(path)}{os.getpid()}.{secrets.token_hex(3)}{_TEMP_SUFFIX}")
    try:
        with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_EXCL), "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_TEMP_SUFFIX = ".tmp"


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def sweep_atomic_leftovers(path: Path, older_than_s: float) -> int:
    """Remove the temp files of `atomic_write_bytes` that writers killed between the write and the rename left
    beside `path`, those over `older_than_s` old (a younger one may be a live writer's); how many."""
    removed, now, prefix = 0, time.time(), _temp_prefix(path)
    try:
        entries = list(os.scandir(path.parent))
    except FileNotFoundError:
        return 0
    for entry in entries:
        if not (entry.name.startswith(prefix) and entry.name.endswith(_TEMP_SUFFIX)):
            continue
        try:
            if entry.is_file(follow_symlinks=False) and now - entry.stat(follow_symlinks=False).st_mtime > older_than_s:
                os.unlink(entry.path)
                removed += 1
        except FileNotFoundError:  # another sweeper took it first
            continue
    return removed


def atomic_write_json(path: Path, obj: object) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1).encode() + b"\n")


# renameat2(2)'s: both paths relative to the working folder, and swapped rather than one replacing the other.
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# What a system or file system without the swap says (an old C library, an old kernel, NFS).
NO_EXCHANGE = frozenset({errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP})


def exchange(a: Path, b: Path) -> None:
    """Swap two existing paths in one step, so that a reader of either sees one of the two, never neither:
    how a whole folder replaces another (rename cannot put a folder over one that is not empty). OSError
    with an errno in NO_EXCHANGE where the system or its file system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "this C library has no renameat2", str(a))
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a), None, str(b))


class Reserved:
    """Room for one record, taken while the disk has it, so that the record fits when the disk is full.

    The slot is a private file written out in full beforehand; the record is later written over
    its blocks in place (no new block needed) and renamed onto its name, so readers see the old
    file or the new one, whole. Trailing spaces pad the JSON, which parsers allow.
    """

    SIZE = 4096

    def __init__(self, slot: Path) -> None:
        self.slot = slot

    def make(self) -> None:
        """Take the room now: the slot written out in full."""
        fd = open_private(self.slot, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, b" " * self.SIZE)
            os.fsync(fd)
        finally:
            os.close(fd)

    def commit(self, path: Path, obj: object) -> None:
        """Write `obj` as `path` through the slot; OSError when that cannot be done (no slot left)."""
        data = json.dumps(obj, indent=1).encode() + b"\n"
        if len(data) > self.SIZE or not self.slot.exists():
            atomic_write_bytes(path, data)
            return
        fd = os.open(self.slot, os.O_WRONLY)
        try:
            os.pwrite(fd, data.ljust(self.SIZE), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.slot, path)


# How far back a torn last line is measured: its size is told, not needed, so the read stays small.
TORN_TAIL_READ = 64 * 1024


def _jsonl_line(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def torn_tail(fd: int) -> int:
    """The size of a last line that lacks its newline (a power cut, a writer killed mid-line); 0 if none."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return 0
    tail = os.pread(fd, min(size, TORN_TAIL_READ), max(size - TORN_TAIL_READ, 0))
    return len(tail) - tail.rfind(b"\n") - 1


def append_jsonl(path: Path, obj: object, torn: Callable[[int], object] | None = None) -> None:
    """One write(2) with O_APPEND, so lines from agent and supervisor never interleave.

    A last line left without its newline is ended first, in the same write, so that the new line is a
    line of its own rather than glued onto garbage; `torn(size)` gives a row said right after it (the
    torn line's size), by which readers tell a repaired line from a corrupt one. Ending it (never
    truncating) loses nothing when another writer's line was only caught half-way in the page cache:
    that leaves an empty line, which readers skip.
    """
    line = _jsonl_line(obj)
    fd = open_private(path, os.O_RDWR | os.O_APPEND)
    try:
        torn_size = torn_tail(fd)
        if torn_size:
            line = b"\n" + (_jsonl_line(torn(torn_size)) if torn is not None else b"") + line
        written = os.write(fd, line)
        if written < len(line):
            # The disk filled mid-line: take the part back, or the next line would be glued onto it.
            os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_CUR) - written)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    finally:
        os.close(fd)


def read_json(path: Path) -> Any:
    """Parsed JSON, or None when the file is missing or not (yet) valid."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def _not_a_record_number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a number a record of a run holds")
    return value


def parse_record(data: bytes, finite: bool = False) -> Any:
    """One record's JSON, or ValueError saying why not (too deeply nested included); `finite`: no
    NaN or Infinity either, for records that hold only pids, times and codes."""
    try:
        if finite:
            return json.loads(data, parse_constant=_not_a_record_number, parse_float=_not_a_record_number)
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply to be a record") from None


# Deeper rows are garbage: no metric row or event is nested like that, and the encoder that sends
# rows on would run out of stack (RecursionError) on one nested near Python's recursion limit.
MAX_ROW_DEPTH = 32


def shallow(value: Any, depth: int = MAX_ROW_DEPTH) -> bool:
    """True when `value` nests lists and objects at most `depth` deep."""
    level = [value]
    for _ in range(depth):
        level = [
            item for v in level for item in (v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())
        ]
        if not level:
            return True
    return False


def last_lines_start(fh: IO[bytes], end: int, lines: int, floor: int = 0) -> int:
    """Where the last `lines` lines of `fh` before `end` begin, `floor` at the earliest: `end` is just past a
    line's newline or the end of a last line without one, which counts as a line too."""
    pos, found, block = end, 0, 64 * 1024
    fh.seek(max(floor, end - 1))
    if end > floor and fh.read(1) == b"\n":
        pos -= 1
    while pos > floor:
        start = max(floor, pos - block)
        fh.seek(start)
        data = fh.read(pos - start)
        idx = len(data)
        while (idx := data.rfind(b"\n", 0, idx)) >= 0:
            found += 1
            if found == lines:
                return start + idx + 1
        pos = start
    return floor


def read_jsonl(path: str | Path, offset: int = 0, max_bytes: int = 64 * 1024 * 1024) -> tuple[list[Any], int, int]:
    """Complete lines from `offset`: (rows, skipped garbage lines, next offset).

    A trailing line without its newline is still being written: it is left for
    the next read rather than counted as garbage.
    """
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(max_bytes)
    except FileNotFoundError:
        return [], 0, offset
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) == max_bytes:
        # One line longer than a whole read: skip past it rather than stall here.
        return [], 1, offset + len(data)
    rows: list[Any] = []
    skipped = 0
    # Split on \n only: a stray \r inside a line must not make two lines of it.
    for line in data[:end].split(b"\n"):
        if not line.strip():
            continue
        try:
            row = parse_record(line)
        except ValueError:
            skipped += 1
            continue
        if shallow(row):
            rows.append(row)
        else:
            skipped += 1
    return rows, skipped, offset + end
