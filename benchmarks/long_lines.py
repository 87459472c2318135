"""How fast one line of 100 MB (a progress bar that never prints a newline) comes through `logs`: locally, over
SSH on a connection of its own, through the host's shared connection (the multiplexer), with and without
`--follow`, beside plain `ssh host cat output.log` on the same sshd.

    .venv/bin/python -m benchmarks.long_lines [--mb 100]

Real: OpenSSH's sshd on 127.0.0.1 (`tests/sshd.py`, with its own keys), ssh, the CLI in its own process, the
multiplexer and the agent on the "host" (this machine). Each way's output is checked byte for byte (sha256)
against the run's file. The ratio is each way's time over plain ssh's: what framing and the agent cost.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import print_table
from console.link import reuse
from tests.sshd import ALIAS, start_sshd

REPO = Path(__file__).resolve().parent.parent
ONE_LINE = (
    "import sys\npattern = bytes(b for b in range(256) if b != 10)\nsize = int(sys.argv[1])\n"
    "sys.stdout.buffer.write((pattern * (size // len(pattern) + 1))[:size])\n"
)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.long_lines", description=__doc__)
    parser.add_argument("--mb", type=int, default=100, help="the line's size in MB (default 100)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="e3long", dir="/tmp"))
    sshd = start_sshd(folder / "sshd")
    workdir = folder / "work"
    env = {**sshd.env(), "XDG_RUNTIME_DIR": str(folder / "run"), reuse.IDLE_ENV: "600"}
    (folder / "run").mkdir(mode=0o700)
    ssh_dir = sshd.home / ".ssh"
    ssh = ["ssh", "-F", str(ssh_dir / "config"), "-o", f"UserKnownHostsFile={ssh_dir / 'known_hosts'}"]

    def cli(*words: str) -> list[str]:
        return [sys.executable, "-m", "console", "--workdir", str(workdir), *words]

    def run(argv: list[str]) -> tuple[bytes, float]:
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, timeout=600, check=False)
        took = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:6])}... failed: {done.stderr.decode(errors='replace').strip()}")
        return done.stdout, took

    rows = []
    try:
        launched, _ = run(cli("local", "launch", "command", "--", sys.executable, "-c", ONE_LINE, str(args.mb * 10**6)))
        run_id = launched.decode().strip()
        output = workdir / "runs" / run_id / "output.log"
        while not output.exists() or output.stat().st_size < args.mb * 10**6:
            time.sleep(0.1)
        written = hashlib.sha256(output.read_bytes()).hexdigest()
        run(cli(ALIAS, "status"))  # starts the shared connection for the commands that follow
        time.sleep(3)
        ways = {
            "ssh host cat output.log": [*ssh, ALIAS, "cat", str(output)],
            "logs, local": cli("local", "logs", run_id),
            "logs, own SSH connection": cli("--no-reuse", ALIAS, "logs", run_id),
            "logs, shared connection": cli(ALIAS, "logs", run_id),
            "logs -f, own SSH connection": cli("--no-reuse", ALIAS, "logs", "-f", run_id),
            "logs -f, shared connection": cli(ALIAS, "logs", "-f", run_id),
        }
        floor = 0.0
        for name, argv in ways.items():
            got, took = run(argv)
            if hashlib.sha256(got).hexdigest() != written:
                raise SystemExit(f"{name}: the output differs from the run's file")
            floor = floor or took
            rows.append([name, f"{took:.1f}", f"{args.mb / took:.0f}", f"{took / floor:.1f}"])
    finally:
        for lock in (folder / "run" / "eagle3-console").glob("*.lock"):
            subprocess.run(["pkill", "-TERM", "-F", str(lock)], check=False)
        sshd.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"one line of {args.mb} MB; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print_table(rows, ("way", "seconds", "MB/s", "ratio to ssh cat"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
