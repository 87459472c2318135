"""How long the console's command line takes to start, against a bare interpreter (issue 28's instant CLI).

    .venv/bin/python -m benchmarks.cli_start [--runs 20]

Wall time of whole processes (median and p90 of --runs each, after one unmeasured run): `python -c pass`, importing
`console.__main__`, `--version`, `--help`, and `local status` on an empty run store (the CLI and the agent it
starts); and, in-process, the install-integrity check that `status`, `doctor` and `--version` run. Targets: issue
28's (`--version` and `--help` within 40 ms) and the integrity check's (well under a millisecond, so that no
command pays for it); the ratio column is measured / target.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import percentile, print_table
from console.cli import integrity

HEADERS = ("what", "median ms", "p90 ms", "target ms", "ratio")


def timed(argv: list[str], runs: int) -> list[float]:
    subprocess.run(argv, capture_output=True, check=True)  # the page cache warm, as for a user's second command
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        took.append((time.perf_counter() - started) * 1000)
    return took


def integrity_check_ms(runs: int) -> list[float]:
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        integrity.foreign_package()
        took.append((time.perf_counter() - started) * 1000)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    python = sys.executable
    with tempfile.TemporaryDirectory() as work:
        store = str(Path(work) / "work")
        cases: list[tuple[str, list[float], float | None]] = [
            ("python -c pass", timed([python, "-c", "pass"], runs), None),
            ("import console.__main__", timed([python, "-c", "import console.__main__"], runs), None),
            ("--version", timed([python, "-m", "console", "--version"], runs), 40.0),
            ("--help", timed([python, "-m", "console", "--help"], runs), 40.0),
            (
                "local status (CLI + agent)",
                timed([python, "-m", "console", "--workdir", store, "local", "status"], runs),
                None,
            ),
            ("integrity check (in-process)", integrity_check_ms(runs), 1.0),
        ]
    rows = []
    for name, took, target in cases:
        median = statistics.median(took)
        ratio = f"{median / target:.2f}" if target else "-"
        rows.append((name, f"{median:.1f}", f"{percentile(took, 90):.1f}", f"{target:.0f}" if target else "-", ratio))
    print_table(rows, HEADERS)


if __name__ == "__main__":
    main()
