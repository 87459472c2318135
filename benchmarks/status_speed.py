"""How long `eagle3-console HOST status` takes over SSH, warm (its host's multiplexer already running), by what the
run store holds, side by side with OpenSSH's ControlMaster doing the least a request can (issue 28, part 3).

    .venv/bin/python -m benchmarks.status_speed [--runs 20] [--tree PATH]

Real: OpenSSH's sshd on 127.0.0.1 (`tests/sshd.py`, with its own keys), ssh and sftp, the CLI in its own process
through the multiplexer its untimed first turn started (one per store: the store is part of its key), and the
agent behind it. The stores: empty; 2,000 and 20,000 ended runs (each with its spec, proc.json, events, exit record
and three metric rows, written here as a supervisor leaves them); 10 live runs (sleeping processes the CLI
launched). The anchors: a ControlMaster's `-O check` (the client and its master alone) and an sftp `pwd` through
it (a request to the host that starts no remote shell), and `cat` through it of every ended run's records
(spec, proc, exit, events): what reading the store costs at the least. Each row's ratio is to its anchor.

The ways are timed in turns (a shared machine's load falls on all alike), each p50 and p90 of --runs, and the p50
of the CPU time the command's own processes took (ssh's or sftp's: the client; the CLI's: it alone, the multiplexer
and the agent running on). Two commands for the same store stand at least PACING_S apart: the agent answers a
status no sooner than MIN_INTERVAL_S after its last one (a script polling in a loop waits there), which a user's
second command, typed, never meets. `--tree PATH` measures the CLI of another source tree (`git archive COMMIT |
tar -x -C PATH`), whose `status` may list every run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from backends.host import procinfo
from backends.protocol import MIN_INTERVAL_S
from backends.runs.store import RunSpec
from benchmarks._common import percentile, print_table
from console.link import reuse
from tests.sshd import ALIAS, Sshd, start_sshd

REPO = Path(__file__).resolve().parent.parent
SLEEPER = "import time\ntime.sleep(3600)"
LIVE = 10
PACING_S = MIN_INTERVAL_S + 0.05
HEADERS = ("way", "p50 ms", "p90 ms", "cpu ms", "runs", "anchor", "ratio (p50)", "goal")


@dataclass(frozen=True)
class Way:
    argv: list[str]
    store: str = ""  # the store whose agent answers it: its commands stand PACING_S apart
    anchor: str = ""  # the way its ratio is to
    goal: str = ""
    stdin: str | None = None


def ended_store(workdir: Path, count: int) -> None:
    """`count` training runs that ended between 30 days and a few hours ago, each folder as its supervisor leaves
    it; written plainly, without the fsync of each record that the store's own writes make (minutes for 20,000)."""
    runs = workdir / "runs"
    runs.mkdir(parents=True, mode=0o700)
    os.chmod(workdir, 0o700)
    boot = procinfo.boot_id()
    start = time.time() - 30 * 86400
    step = (30 * 86400 - 4 * 3600) / max(count, 1)
    for i in range(count):
        t = start + i * step
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(t))
        folder = runs / f"{stamp}-{int(t * 1000) % 1000:03d}-{i % 65536:04x}"
        folder.mkdir(mode=0o700)
        spec = RunSpec(kind="train", argv=["python3", "-m", "backends.train", "--lr", "1e-4"], name=f"r{i}")
        spec.created_at = t
        dead = {"pid": 4_000_000 + i, "start_ticks": 1, "boot_id": boot}  # no such process: gone
        ended = t + 3600.0
        files = {
            "spec.json": json.dumps(spec.to_json()),
            "proc.json": json.dumps({"supervisor": dead, "child": dead, "child_started_at": t + 1}),
            "events.jsonl": "".join(
                json.dumps(e) + "\n"
                for e in ({"t": t, "type": "launch"}, {"t": ended, "type": "exit", "code": 0, "signal": None})
            ),
            "metrics.jsonl": "".join(json.dumps({"step": s, "loss": 2.0 / s}) + "\n" for s in (1, 2, 3)),
            "output.log": "done\n",
            "exit.json": json.dumps({"code": 0, "signal": None, "error": None, "ended_at": ended}),
        }
        for name, text in files.items():
            (folder / name).write_text(text)
            os.utime(folder / name, (ended, ended))


class Bench:
    def __init__(self, sshd: Sshd, folder: Path, tree: Path) -> None:
        self.folder = folder
        self.tree = tree
        self.env = {**sshd.env(), "XDG_RUNTIME_DIR": str(folder / "run"), reuse.IDLE_ENV: "900"}
        self.env["PYTHONPATH"] = str(tree)
        # An installed wheel has its bytecode compiled at install: the untimed first turn writes it here.
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        (folder / "run").mkdir(mode=0o700)
        ssh_dir = sshd.home / ".ssh"
        # ssh reads the config of the passwd entry's home, not $HOME: name this client's files outright.
        client = ["-F", str(ssh_dir / "config"), "-o", f"UserKnownHostsFile={ssh_dir / 'known_hosts'}"]
        client += ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
        client += ["-o", "ControlMaster=auto", "-o", f"ControlPath={folder / 'cm-%C'}", "-o", "ControlPersist=600"]
        self.ssh = ["ssh", *client]
        self.sftp = ["sftp", "-q", "-b", "-", *client]

    def cli(self, workdir: Path, *args: str) -> list[str]:
        return [sys.executable, "-m", "console", "--workdir", str(workdir), ALIAS, *args]

    def run(self, argv: list[str], stdin: str | None = None) -> str:
        done = subprocess.run(
            argv, cwd=self.tree, env=self.env, input=stdin, capture_output=True, text=True, timeout=600, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"{shlex.join(argv)} failed: {done.stderr.strip()}")
        return done.stdout

    def timed(self, ways: dict[str, Way], runs: int) -> dict[str, tuple[list[float], list[float]]]:
        """Milliseconds per command of each way, wall and CPU (the command's process and its children's: on a loaded
        machine it moves less than the wall time), in turns; each way once first, untimed (its multiplexer starts)."""
        times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in ways}
        last: dict[str, float] = {}
        for turn in range(runs + 1):
            for name, way in ways.items():
                if way.store:
                    time.sleep(max(0.0, last.get(way.store, 0.0) + PACING_S - time.monotonic()))
                cpu, start = _children_cpu(), time.perf_counter()
                self.run(way.argv, way.stdin)
                took, cpu = time.perf_counter() - start, _children_cpu() - cpu
                if way.store:
                    last[way.store] = time.monotonic()
                if turn:
                    times[name][0].append(took * 1000)
                    times[name][1].append(cpu * 1000)
        return times


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.status_speed", description=__doc__)
    parser.add_argument("--runs", type=int, default=20, help="timed commands per way (default 20)")
    parser.add_argument("--tree", type=Path, default=REPO, help="the source tree whose CLI is measured")
    args = parser.parse_args()
    tree = args.tree.resolve()
    folder = Path(tempfile.mkdtemp(prefix="e3status", dir="/tmp"))
    sshd = start_sshd(folder / "sshd")
    bench = Bench(sshd, folder, tree)
    stores = {name: folder / name for name in ("empty", "2k", "20k", "live")}
    ended_store(stores["2k"], 2_000)
    ended_store(stores["20k"], 20_000)
    live: list[str] = []
    try:
        bench.run([*bench.ssh, ALIAS, "true"])  # the ControlMaster, left running (ControlPersist) for the anchors
        for _ in range(LIVE):
            launched = bench.run(bench.cli(stores["live"], "launch", "command", "--", "python3", "-c", SLEEPER))
            live.append(launched.strip())

        def status(store: str, *more: str, goal: str = "", anchor: str = "") -> Way:
            return Way(bench.cli(stores[store], "status", *more), store=store, anchor=anchor, goal=goal)

        def cat(store: str) -> Way:
            find = "find . -name spec.json -o -name proc.json -o -name exit.json -o -name events.jsonl"
            remote = f"cd {shlex.quote(str(stores[store] / 'runs'))} && {find} | xargs cat"
            return Way([*bench.ssh, ALIAS, remote])

        pwd = "sftp pwd through ControlMaster"
        cat2k, cat20k = "cat 2,000 runs' records, ControlMaster", "cat 20,000 runs' records, ControlMaster"
        ways = {
            "ssh -O check (ControlMaster)": Way([*bench.ssh, "-O", "check", ALIAS]),
            pwd: Way([*bench.sftp, ALIAS], stdin="pwd\n"),
            cat2k: cat("2k"),
            cat20k: cat("20k"),
            "status, warm, empty store": status("empty", goal="<= 50", anchor=pwd),
            "status, warm, 10 live runs": status("live", anchor=pwd),
            "status, warm, 2,000 ended": status("2k", goal="<= 100", anchor=cat2k),
            "status, warm, 20,000 ended": status("20k", goal="<= 100", anchor=cat20k),
            "CLI --version (no connection)": Way([sys.executable, "-m", "console", "--version"]),
            "python -c pass": Way([sys.executable, "-c", "pass"]),
        }
        if (tree / "backends" / "runs" / "index.py").exists():  # a tree with the index pages its status
            ways["status --all, warm, 2,000 ended"] = status("2k", "--all", anchor=cat2k)
        results = bench.timed(ways, args.runs)
    finally:
        for run_id in live:
            with contextlib.suppress(SystemExit):
                bench.run(bench.cli(stores["live"], "kill", run_id))
        subprocess.run([*bench.ssh, "-O", "exit", ALIAS], capture_output=True, check=False)
        for lock in (folder / "run" / "eagle3-console").glob("*.lock"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(lock.read_text().split()[0]), signal.SIGTERM)
        sshd.stop()
        shutil.rmtree(folder, ignore_errors=True)
    rows = []
    for name, way in ways.items():
        took, cpu = results[name]
        p50, p90, cpu50 = percentile(took, 50), percentile(took, 90), percentile(cpu, 50)
        ratio = f"{p50 / percentile(results[way.anchor][0], 50):.2f}" if way.anchor else "-"
        row = [name, f"{p50:.0f}", f"{p90:.0f}", f"{cpu50:.0f}", str(len(took)), way.anchor or "-", ratio]
        rows.append([*row, way.goal or "-"])
    print(f"{tree}: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end")
    print_table(rows, HEADERS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
