"""How far one command over many hosts goes: `status` over 1 to N hosts at once, each a real OpenSSH sshd on
127.0.0.1 with its own run store holding a few sleeping runs; cold (a direct SSH connection per host) and
warm (through each host's multiplexer), with what each host costs: reply bytes, SSH connections, and the
memory of the processes the console leaves (a multiplexer here, an agent on the host).

    .venv/bin/python -m benchmarks.many_hosts [--hosts 1,2,4,8,16] [--runs-per-host 5] [--repeats 5]

Real: sshd, ssh keys and known_hosts, the CLI in its own process as a user runs it (from its compiled
bytecode, as an installed wheel), the multiplexers it starts, the agents on the "hosts". All hosts are this
machine, so its 2 CPUs serve every sshd and agent at once: a cluster's hosts each bring their own.
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

from backends.protocol import MIN_INTERVAL_S
from benchmarks._common import percentile, print_table, rss_mib
from tests.sshd import Sshd, home_for, start_sshd

REPO = Path(__file__).resolve().parent.parent
SLEEPER = "import time\ntime.sleep(3600)"


class Cluster:
    def __init__(self, folder: Path, count: int) -> None:
        self.folder = folder
        self.servers: list[Sshd] = [start_sshd(folder / f"sshd-{i}") for i in range(count)]
        self.names = [f"h{i}" for i in range(count)]
        self.home = home_for(
            folder / "laptop", {f"alias-{n}": s for n, s in zip(self.names, self.servers, strict=True)}
        )
        settings = self.home / ".config" / "eagle3-console" / "config.toml"
        settings.parent.mkdir(parents=True)
        hosts = "".join(f'[hosts.{n}]\naddress = "alias-{n}"\nworkdir = "{folder / n}"\n' for n in self.names)
        settings.write_text(hosts + f"[groups]\nall = {json.dumps(self.names)}\n")
        self.runtime = Path(tempfile.mkdtemp(prefix="e3b", dir="/tmp"))  # socket paths must stay short

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "PYTHONDONTWRITEBYTECODE")}
        return {**env, "HOME": str(self.home), "XDG_RUNTIME_DIR": str(self.runtime), "XDG_CONFIG_HOME": ""}

    def cli(self, *args: str) -> tuple[float, str]:
        """Seconds the command took, and its output; a failure stops the benchmark."""
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "console", *args], cwd=REPO, env=self.env(), capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip
        took = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(args)} failed: {done.stderr.strip()}")
        return took, done.stdout

    def wait_serving(self, count: int) -> None:
        """Until every host's multiplexer has connected (each says so in the reuse log)."""
        log = self.runtime / "eagle3-console" / "reuse.log"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if log.is_file() and log.read_text().count(" serves ") >= count:
                return
            time.sleep(0.1)
        raise SystemExit(f"the multiplexers of {count} hosts did not all connect within 60 s")

    def pids(self, pattern: str) -> list[int]:
        found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
        return [int(pid) for pid in found.stdout.split()]

    def stop(self) -> None:
        for pid in self.pids(f"console.link.multiplexer --socket {self.runtime}"):
            os.kill(pid, signal.SIGTERM)
        for pid in self.pids(f"python3 -c {SLEEPER.splitlines()[0]}"):
            if str(self.folder).encode() in Path(f"/proc/{pid}/environ").read_bytes():
                os.kill(pid, signal.SIGTERM)
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.runtime, ignore_errors=True)


def measure(folder: Path, count: int, runs_per_host: int, repeats: int) -> list[str]:
    cluster = Cluster(folder / f"n{count}", count)
    try:
        for name in cluster.names:
            for _ in range(runs_per_host):
                cluster.cli("--no-reuse", name, "launch", "command", "--", "python3", "-c", SLEEPER)
        cold, _ = cluster.cli("--no-reuse", "all", "status", "--json")
        cluster.cli("all", "status")  # starts a multiplexer per host
        cluster.wait_serving(count)
        warm = []
        for _ in range(repeats):
            time.sleep(MIN_INTERVAL_S)  # an agent paces looks at its runs this far apart
            took, text = cluster.cli("all", "status", "--json")
            warm.append(took)
        hosts = json.loads(text)["hosts"]
        reply = sum(len(json.dumps(h["result"])) for h in hosts) / count
        muxes = cluster.pids(f"console.link.multiplexer --socket {cluster.runtime}")
        agents = [p for p in cluster.pids("backends.agent") if str(cluster.folder).encode() in _cmdline(p)]
        return [
            str(count),
            f"{cold * 1000:.0f}",
            f"{percentile(warm, 50) * 1000:.0f}",
            f"{reply / 1024:.1f}",
            str(len(muxes)),
            f"{sum(rss_mib(p) for p in muxes) / max(len(muxes), 1):.0f}",
            f"{sum(rss_mib(p) for p in agents) / max(len(agents), 1):.0f}",
        ]
    finally:
        cluster.stop()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.many_hosts", description=__doc__)
    parser.add_argument("--hosts", default="1,2,4,8,16", help="host counts to try (default 1,2,4,8,16)")
    parser.add_argument("--runs-per-host", type=int, default=5, help="sleeping runs in each host's store (5)")
    parser.add_argument("--repeats", type=int, default=5, help="warm status commands per count (5)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="e3many", dir="/tmp"))
    try:
        rows = [measure(folder, int(n), args.runs_per_host, args.repeats) for n in args.hosts.split(",")]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{os.cpu_count()} CPUs, {args.runs_per_host} runs per host, load average {os.getloadavg()[0]:.2f}")
    head = ("hosts", "cold ms", "warm p50 ms", "reply KiB/host", "multiplexers", "MiB each", "agent MiB each")
    print_table(rows, head)
    return 0


if __name__ == "__main__":
    sys.exit(main())
