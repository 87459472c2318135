"""How many threads a CPU-bound stage should run now: as many as this process has idle CPUs.

torch starts one thread per core and its threads meet at the end of every parallel region; on a box where another
process keeps a core busy, the thread sharing that core arrives late every time and the others spin waiting for it
(the demo's training on a busy 2-core box ran 17x slower with torch's two threads than it should). So the count is
chosen from what is idle when the stage starts, not from how many cores there are.
"""

from __future__ import annotations

import math
import os
import time

SAMPLE_S = 0.3


def allowed_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's or taskset's limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) jiffies of all CPUs since boot, from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    return fields[3] + fields[4], sum(fields[:8])  # idle + iowait; user .. steal


def busy_share(sample_s: float = SAMPLE_S) -> float | None:
    """The share of the host's CPU time spent working over the next `sample_s` seconds; None when unknown."""
    before = _cpu_times()
    time.sleep(sample_s)
    after = _cpu_times()
    if before is None or after is None or after[1] <= before[1]:
        return None
    return min(1.0, max(0.0, 1 - (after[0] - before[0]) / (after[1] - before[1])))


def cpu_threads(requested: int | None, processes: int = 1) -> tuple[int, str]:
    """(threads per process, why) for a stage running `processes` processes on the CPU."""
    if requested is not None:
        return requested, "--threads"
    from_env = os.environ.get("OMP_NUM_THREADS", "")
    if from_env.isdigit() and int(from_env) > 0:
        return int(from_env), "OMP_NUM_THREADS"
    allowed = allowed_cpus()
    busy = busy_share()
    if busy is None:
        return max(1, allowed // processes), f"{allowed} CPUs"
    # Ours are taken to be as busy as the host's average: a container's few CPUs on a big box included.
    idle = max(1, math.floor(allowed * (1 - busy) + 0.5))
    return max(1, idle // processes), f"{idle} of {allowed} CPUs idle"
