"""How long the console's command line takes to start, against a bare interpreter (issue 28's instant CLI).

    .venv/bin/python -m benchmarks.cli_start [--runs 20] [--python VENV/bin/python]

Wall time of whole processes (median and p90 of --runs each, after one unmeasured run), and the median of their CPU
time (user and system, the process's and its children's: on a loaded machine it moves less than the wall time):
`python -c pass`, importing
`console.__main__`, `--version`, `--help` (as `python -m console` and as the `eagle3-console` script a user runs),
importing `backends.agent` (what every agent a command starts imports before it answers), and `local status` on an
empty run store (the CLI and the agent it starts); and, in-process, the install-integrity check that `status`,
`doctor` and `--version` run. Targets: issue 28's (`--version` and `--help` within 40 ms) and the integrity check's
(well under a millisecond, so that no command pays for it); the ratio column is measured / target.

`--python` measures another interpreter's console: an installed wheel's venv (as tests/test_installed_wheel.py
builds one), which has no editable install's import finder (~10-18 ms of every start in `site`); it runs from a
temporary folder with no PYTHONPATH, so that it imports the installed packages, not this tree's.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import percentile, print_table
from console.cli import integrity

HEADERS = ("what", "median ms", "p90 ms", "cpu ms", "target ms", "ratio")


def timed(
    argv: list[str], runs: int, cwd: str | None = None, env: dict[str, str] | None = None
) -> tuple[list[float], list[float] | None]:
    """Each run's wall time and CPU time, in ms."""
    # The page cache warm, as for a user's second command.
    subprocess.run(argv, capture_output=True, check=True, cwd=cwd, env=env)
    took, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True, cwd=cwd, env=env)
        took.append((time.perf_counter() - started) * 1000)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append((after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000)
    return took, cpu


def integrity_check_ms(runs: int) -> tuple[list[float], list[float] | None]:
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        integrity.foreign_package()
        took.append((time.perf_counter() - started) * 1000)
    return took, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose console is measured")
    args = parser.parse_args()
    runs, python = args.runs, os.path.abspath(args.python)
    script = str(Path(python).parent / "eagle3-console")
    own = python == sys.executable
    # Another venv's console runs away from this tree (the cwd is on sys.path under -m) and without PYTHONPATH.
    env = None if own else {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    with tempfile.TemporaryDirectory() as work:
        store = str(Path(work) / "work")
        cwd = None if own else work

        def run(*argv: str) -> tuple[list[float], list[float] | None]:
            return timed(list(argv), runs, cwd, env)

        cases: list[tuple[str, tuple[list[float], list[float] | None], float | None]] = [
            ("python -c pass", run(python, "-c", "pass"), None),
            ("import console.__main__", run(python, "-c", "import console.__main__"), None),
            ("-m console --version", run(python, "-m", "console", "--version"), 40.0),
            ("-m console --help", run(python, "-m", "console", "--help"), 40.0),
            ("eagle3-console --version", run(script, "--version"), 40.0),
            ("eagle3-console --help", run(script, "--help"), 40.0),
            ("import backends.agent", run(python, "-c", "import backends.agent"), None),
            ("local status (CLI + agent)", run(python, "-m", "console", "--workdir", store, "local", "status"), None),
            ("integrity check (in-process)", integrity_check_ms(runs), 1.0),
        ]
    rows = []
    for name, (took, cpu), target in cases:
        median = statistics.median(took)
        ratio = f"{median / target:.2f}" if target else "-"
        cpu_ms = f"{statistics.median(cpu):.1f}" if cpu else "-"
        target_ms = f"{target:.0f}" if target else "-"
        rows.append((name, f"{median:.1f}", f"{percentile(took, 90):.1f}", cpu_ms, target_ms, ratio))
    print_table(rows, HEADERS)


if __name__ == "__main__":
    main()
