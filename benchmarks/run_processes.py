"""What proving a run's processes costs: `procinfo.run_processes` on a busy host.

    .venv/bin/python -m benchmarks.run_processes [--others 500] [--members 8] [--repeat 20]

The run's processes are proven by reading the environment of every process of ours born since
the run's child (the EAGLE3_RUN_ID marker), on top of one scan of /proc. The watch calls it every
2 s per watched run, `kill` every 50 ms while it waits, so its cost on a host with many processes
of ours matters. Target: one call under 50 ms with 500 other processes of ours (ratio <= 1 passes).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from backends.host import procinfo
from benchmarks._common import percentile, print_table

TARGET_MS = 50.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--others", type=int, default=500, help="processes of ours that are not the run's")
    parser.add_argument("--members", type=int, default=8, help="processes of the run (child included)")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    marker = "EAGLE3_RUN_ID=bench-run"
    run_env = {**os.environ, "EAGLE3_RUN_ID": "bench-run"}
    child = subprocess.Popen(
        ["sh", "-c", f"for i in $(seq {args.members - 1}); do sleep 600 & done; wait"],
        env=run_env,
        start_new_session=True,
    )
    others = [subprocess.Popen(["sleep", "600"]) for _ in range(args.others)]
    try:
        ident = procinfo.identify(child.pid)
        assert ident is not None
        deadline = time.monotonic() + 10
        while len(procinfo.run_processes(marker.encode(), ident)) < args.members and time.monotonic() < deadline:
            time.sleep(0.05)
        times: list[float] = []
        found = 0
        for _ in range(args.repeat):
            start = time.perf_counter()
            found = len(procinfo.run_processes(marker.encode(), ident))
            times.append((time.perf_counter() - start) * 1000)
        scans: list[float] = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            procinfo.live_stats()
            scans.append((time.perf_counter() - start) * 1000)
    finally:
        for proc in [child, *others]:
            proc.kill()
        os.killpg(child.pid, 9)
        for proc in [child, *others]:
            proc.wait()
    p50, p95 = percentile(times, 50), percentile(times, 95)
    print(f"{len(procinfo.all_pids())} processes on this host now; the run's found: {found} of {args.members}")
    print_table(
        [
            ("run_processes p50 (ms)", f"{p50:.1f}", f"{TARGET_MS:.0f}", f"{p50 / TARGET_MS:.2f}"),
            ("run_processes p95 (ms)", f"{p95:.1f}", f"{TARGET_MS:.0f}", f"{p95 / TARGET_MS:.2f}"),
            ("/proc scan alone p50 (ms)", f"{percentile(scans, 50):.1f}", "-", "-"),
        ]
    )
    sys.exit(0 if found == args.members else 1)


if __name__ == "__main__":
    main()
