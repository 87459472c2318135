"""Giving the C heap's free pages back to the system while the console stays open.

A tracemalloc soak (the soak benchmark's relaunches, reconnects and run switches ten times as often, for 26
minutes) found the console's Python objects flat (34.9, 40.7, 38.8 MiB traced at 4, 15 and 26 minutes) while
its RSS rose by a few MiB an hour: what grows is the C heap under them, the pages that its larger short-lived
buffers (256 KiB stream frames, the metric arrays a thinning makes anew) leave free between live objects, which
glibc keeps. `malloc_trim(0)` hands such free pages back (inside the heap too, not only at its top). Elsewhere
than glibc (musl, macOS) there is nothing to call and nothing is done."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache

TRIM_EVERY_S = 60.0  # a few milliseconds once a minute: nothing next to a redraw


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else ctypes.CDLL(None)
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)  # glibc only
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


def release_free_heap() -> bool:
    """Hand the heap's free pages back to the system; whether there was a glibc to ask."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
