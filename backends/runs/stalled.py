"""Who is where in a stalled run: each process's rank (a distributed group's RANK), kernel state and the place
it sits, so that a multi-node job can name the odd rank out (one stopped, or asleep in a receive while the
others spin in all_reduce) without anyone reading every stack.
"""

from __future__ import annotations

import re

from backends.host import procinfo
from backends.protocol import StalledProcess

STOPPED = "stopped (SIGSTOP, or a debugger holds it)"
_SECTION = re.compile(r"^=== pid (\d+):", re.MULTILINE)
# py-spy's thread line: `Thread 769 (idle): "MainThread"`; its status is idle, active, gil or active+gil (a thread
# busy holding the GIL); a thread whose name py-spy cannot read has none.
_THREAD = re.compile(r'^Thread \S+ \(([\w+]+)\)(?:: "(.*)")?$', re.MULTILINE)
_KERNEL_FRAME = re.compile(r"^kernel stack:\n\[<\w+>\] (\w+)", re.MULTILINE)
_FRAME = re.compile(r"^[ \t]+(\S+) \((?:.*/)?([^/\n]+:\d+)\)")


def before_dump(pids: list[int]) -> list[StalledProcess]:
    """Each process's rank and state, read before its stack is dumped (a stack dump stops it for a moment)."""
    found: list[StalledProcess] = []
    for pid in pids:
        stat = procinfo.read_stat(pid)
        rank = procinfo.environ_value(pid, "RANK")
        found.append(
            {
                "pid": pid,
                "rank": int(rank) if rank is not None and rank.isdigit() else None,
                "state": stat.state if stat else "?",
                "where": None,
            }
        )
    return found


def with_places(found: list[StalledProcess], dump: str) -> list[StalledProcess]:
    """`found` with each process's place, read from its section of the stack dump."""
    sections = dict(zip(map(int, _SECTION.findall(dump)), _SECTION.split(dump)[2::2], strict=True))
    for process in found:
        process["where"] = STOPPED if process["state"] == "T" else place(sections.get(process["pid"], ""))
    return found


def place(section: str) -> str | None:
    """Where a process's dump section puts it: its main thread's innermost frame (py-spy's; else the first thread
    with a frame), else the kernel's wait channel or the top of its kernel stack; None when the section says none."""
    threads = sorted(_THREAD.finditer(section), key=lambda thread: thread.group(2) != "MainThread")
    for thread in threads:
        frame = _FRAME.match(section[thread.end() :].lstrip("\n"))
        if frame is not None:
            named = "" if thread.group(2) in (None, "MainThread") else f" (thread {thread.group(2)})"
            return f"in {frame.group(1)} ({frame.group(2)}){named}, {thread.group(1)}"
    wchan = re.search(r"^wchan: (\S+)", section, re.MULTILINE)
    if wchan is not None and wchan.group(1) not in ("0", "?"):
        return f"in the kernel's {wchan.group(1)}"
    kernel = _KERNEL_FRAME.search(section)
    return f"in the kernel's {kernel.group(1)}" if kernel is not None else None
