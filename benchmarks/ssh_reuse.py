"""How long one `kill` over SSH takes, from typing it to the prompt: the CLI through its shared connection
(`console.link.reuse`), the CLI connecting afresh (--no-reuse), plain `ssh host kill PID`, and `ssh` through an
OpenSSH ControlMaster connection, each warmed up first.

    .venv/bin/python -m benchmarks.ssh_reuse [--runs 20]

Real: OpenSSH's sshd on 127.0.0.1 (`tests/sshd.py`, with its own keys), ssh, the CLI in its own process,
and sleeping runs on the "host" (this machine), one killed per timed command. The CLI's kill also waits
until the run's processes are seen gone; `ssh kill` only sends the signal. The last row is the floor under
any CLI command: Python and the CLI's imports, connecting nowhere. The CLI runs from its compiled bytecode,
as an installed wheel does. Target: reuse at or below ControlMaster (ratio <= 1).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks._common import percentile, print_table
from console.link import reuse
from tests.sshd import ALIAS, Sshd, start_sshd

SLEEPER = "import time\ntime.sleep(3600)"
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Way:
    argv: Callable[[str, int], list[str]]  # the command, given the run's id and its process's pid
    kills: bool = True  # False: a command that needs no run


class Bench:
    def __init__(self, sshd: Sshd, folder: Path) -> None:
        self.sshd = sshd
        self.workdir = folder / "work"
        self.env = {**sshd.env(), "XDG_RUNTIME_DIR": str(folder / "run"), reuse.IDLE_ENV: "600"}
        # An installed wheel has its bytecode compiled at install: the CLI may write it here (the untimed first
        # turn does), where the environment may forbid it and every start would compile the project again.
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        (folder / "run").mkdir(mode=0o700)
        ssh_dir = sshd.home / ".ssh"
        # ssh reads the config of the passwd entry's home, not $HOME: name this client's files outright.
        self.ssh = ["ssh", "-F", str(ssh_dir / "config"), "-o", f"UserKnownHostsFile={ssh_dir / 'known_hosts'}"]
        self.ssh += ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
        self.control = [*self.ssh, "-o", "ControlMaster=auto", "-o", f"ControlPath={folder / 'cm-%C'}"]
        self.control += ["-o", "ControlPersist=60"]
        self.sleepers: list[int] = []  # pids of the sleeping runs started

    def stop_sleepers(self) -> None:
        """End the sleeping runs a failed command left behind: each proven ours by its run folder."""
        for pid in self.sleepers:
            with contextlib.suppress(OSError):
                if str(self.workdir).encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    os.kill(pid, signal.SIGTERM)

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "console", "--workdir", str(self.workdir), *args]

    def run(self, argv: list[str]) -> str:
        done = subprocess.run(argv, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{shlex.join(argv)} failed: {done.stderr.strip()}")
        return done.stdout

    def sleeper(self) -> tuple[str, int]:
        """A sleeping run on the host: its id and its process's pid."""
        run_id = self.run(self.cli(ALIAS, "launch", "command", "--", "python3", "-c", SLEEPER)).strip()
        for _ in range(200):
            pid = json.loads(self.run(self.cli(ALIAS, "status", run_id, "--json"))).get("pid")
            if pid:
                self.sleepers.append(int(pid))
                return run_id, int(pid)
            time.sleep(0.05)
        raise SystemExit(f"run {run_id} never got a pid")

    def timed(self, ways: dict[str, Way], runs: int) -> dict[str, list[float]]:
        """Seconds per command of each way, taken in turns (the load of a shared machine falls on all alike);
        before each kill, a new sleeping run for it. Each way once first, untimed: a connection to reuse."""
        times: dict[str, list[float]] = {name: [] for name in ways}
        for turn in range(runs + 1):
            for name, way in ways.items():
                command = way.argv(*self.sleeper()) if way.kills else way.argv("", 0)
                start = time.perf_counter()
                self.run(command)
                if turn:
                    times[name].append(time.perf_counter() - start)
        return times


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ssh_reuse", description=__doc__)
    parser.add_argument("--runs", type=int, default=20, help="timed kills per way (default 20)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="e3bench", dir="/tmp"))
    sshd = start_sshd(folder / "sshd")
    bench = Bench(sshd, folder)
    try:
        ways = {
            "CLI kill, reused connection": Way(lambda run, _pid: bench.cli(ALIAS, "kill", run)),
            "CLI kill, --no-reuse": Way(lambda run, _pid: bench.cli("--no-reuse", ALIAS, "kill", run)),
            "ssh host kill PID": Way(lambda _run, pid: [*bench.ssh, ALIAS, "kill", str(pid)]),
            "ssh ControlMaster kill PID": Way(lambda _run, pid: [*bench.control, ALIAS, "kill", str(pid)]),
            # The floor under any CLI command: the interpreter and the CLI's imports, connecting nowhere.
            "CLI start-up alone (--version)": Way(lambda _run, _pid: bench.cli("--version"), kills=False),
        }
        results = bench.timed(ways, args.runs)
    finally:
        subprocess.run([*bench.control, "-O", "exit", ALIAS], capture_output=True, check=False)
        for lock in (folder / "run" / "eagle3-console").glob("*.lock"):
            subprocess.run(["pkill", "-TERM", "-F", str(lock)], check=False)
        bench.stop_sleepers()
        sshd.stop()
        shutil.rmtree(folder, ignore_errors=True)
    rows = [
        [name, f"{percentile(times, 50) * 1000:.0f}", f"{percentile(times, 90) * 1000:.0f}", str(len(times))]
        for name, times in results.items()
    ]
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print_table(rows, ("way", "p50 ms", "p90 ms", "runs"))
    reused, master = (percentile(results[k], 50) for k in ("CLI kill, reused connection", "ssh ControlMaster kill PID"))
    print(f"ratio reuse/ControlMaster (p50): {reused / master:.2f} (target <= 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
