"""How long the console's command line takes to start, against a bare interpreter (issue 28's instant CLI).

    .venv/bin/python -m benchmarks.cli_start [--runs 20] [--python VENV/bin/python]

Wall time of whole processes (median and p90 of --runs each, after one unmeasured run): `python -c pass`, importing
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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import percentile, print_table
from console.cli import integrity

HEADERS = ("what", "median ms", "p90 ms", "target ms", "ratio")


def timed(argv: list[str], runs: int, cwd: str | None = None, env: dict[str, str] | None = None) -> list[float]:
    subprocess.run(argv, capture_output=True, check=True, cwd=cwd, env=env)  # the page cache warm, as for a user's
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True, cwd=cwd, env=env)
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

        def run(*argv: str) -> list[float]:
            return timed(list(argv), runs, cwd, env)

        cases: list[tuple[str, list[float], float | None]] = [
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
    for name, took, target in cases:
        median = statistics.median(took)
        ratio = f"{median / target:.2f}" if target else "-"
        rows.append((name, f"{median:.1f}", f"{percentile(took, 90):.1f}", f"{target:.0f}" if target else "-", ratio))
    print_table(rows, HEADERS)


if __name__ == "__main__":
    main()
