"""A full disk, said the way every message of ours says it: which device, how much is left."""

from __future__ import annotations

import errno
import os
from pathlib import Path

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# Less than this left counts as full: writes of whole blocks fail long before the last byte is gone.
FULL_BELOW_BYTES = 1024 * 1024


def is_full(exc: BaseException) -> bool:
    """True for the errors a full disk (or an exhausted quota) raises."""
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


def _existing(path: Path) -> Path:
    """`path`, or its nearest folder that exists: the one whose file system is meant."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def device_of(path: Path) -> str:
    """The device (and mount point) holding `path`, from /proc/self/mountinfo: `/dev/vda1 at /work`."""
    where = _existing(path)
    try:
        dev = os.stat(where).st_dev
        wanted = f"{os.major(dev)}:{os.minor(dev)}"
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4 and fields[2] == wanted and " - " in line:
                    source = line.split(" - ", 1)[1].split()
                    return f"{source[1] if len(source) > 1 else source[0]} at {fields[4]}"
    except OSError:
        pass
    return str(where)


def bytes_free(path: Path) -> int | None:
    try:
        st = os.statvfs(_existing(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def no_space_message(path: Path) -> str:
    """`no space left on DEVICE (N bytes free)`, for a write under `path` that failed."""
    free = bytes_free(path)
    return f"no space left on {device_of(path)} ({'?' if free is None else f'{free:,}'} bytes free)"


def full_now(path: Path) -> str | None:
    """`no_space_message` when the file system under `path` is (all but) full now, else None."""
    free = bytes_free(path)
    return no_space_message(path) if free is not None and free < FULL_BELOW_BYTES else None
