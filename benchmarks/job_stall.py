"""How soon a multi-node job with one frozen rank is called stalled as a job, naming that rank: a 2-node job of
our trainer on CPU (torchrun, gloo, the tiny target), one node per real sshd on 127.0.0.1; once both nodes
train, node 1's rank is stopped (SIGSTOP) and `status --json` over both hosts is polled until the job's state
is `stalled` with that rank named first. The figure is compared with the stall window as a ratio.

    .venv/bin/python -m benchmarks.job_stall [--windows 5,10] [--repeats 2]

Real: sshd, the CLI, the agents, torchrun and our trainer, the watch's stall verdict. Both "hosts" are this
machine, so node 0's rank spins its gloo receive on the same 2 CPUs as everything else.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import percentile, print_table
from benchmarks.many_hosts import Cluster
from tests.train_fixtures import job_words, worker_of

POLL_S = 0.25


def job_state(cluster: Cluster, job: str) -> dict[str, Any]:
    _, text = cluster.cli("all", "status", "--json")
    return next(found for found in json.loads(text)["jobs"] if found["id"] == job)


def trial(cluster: Cluster, words: list[str], window: float) -> float:
    """Seconds from the freeze to the job's verdict."""
    _, out = cluster.cli("all", "train", "--nodes", "2", "--stall-after", str(window), *words)
    job = out.split()[0]
    try:
        deadline = time.monotonic() + 180
        while job_state(cluster, job)["nodes"][0]["state"] != "running" or not progressed(cluster, job):
            if time.monotonic() > deadline:
                raise SystemExit(f"job {job} never trained")
            time.sleep(0.5)
        frozen = worker_of(job_state(cluster, job)["nodes"][1]["run"], rank=1)
        os.kill(frozen, signal.SIGSTOP)
        start = time.monotonic()
        while (found := job_state(cluster, job))["state"] != "stalled":
            if time.monotonic() - start > 10 * window + 60:
                raise SystemExit(f"job {job} not called stalled: {found}")
            time.sleep(POLL_S)
        took = time.monotonic() - start
        if not found["detail"].startswith("node 1 (h1): rank 1 stopped"):
            raise SystemExit(f"the frozen rank was not named first: {found['detail']}")
        return took
    finally:
        cluster.cli("all", "kill", job, "--grace", "2")


def progressed(cluster: Cluster, job: str) -> bool:
    _, out = cluster.cli("h0", "metrics", job_state(cluster, job)["nodes"][0]["run"], "--json")
    return len(out.splitlines()) >= 3


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.job_stall", description=__doc__)
    parser.add_argument("--windows", default="5,10", help="stall windows to try, in seconds (default 5,10)")
    parser.add_argument("--repeats", type=int, default=2, help="trials per window (2)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="e3job", dir="/tmp"))
    cluster = Cluster(folder, 2)
    try:
        words = job_words(folder, "--steps", "1000000", "--log-every", "1", "--save-every", "0", "--eval-every", "0")
        rows = []
        for window in map(float, args.windows.split(",")):
            took = [trial(cluster, words, window) for _ in range(args.repeats)]
            rows.append(
                [
                    f"{window:.0f}",
                    f"{min(took):.1f}",
                    f"{percentile(took, 50):.1f}",
                    f"{max(took):.1f}",
                    f"{percentile(took, 50) / window:.2f}",
                ]
            )
    finally:
        cluster.stop()
        subprocess.run(["pkill", "-f", str(folder / "draft")], check=False)  # a node left by a failed trial
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{os.cpu_count()} CPUs, 2 nodes (sshd on loopback), {args.repeats} trials per window")
    print_table(rows, ("window s", "min s", "p50 s", "max s", "p50 / window"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
