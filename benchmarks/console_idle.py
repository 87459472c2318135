"""The console's CPU in a terminal, idle and following a run, beside anchors in the same tmux windows of time.

    .venv/bin/python -m benchmarks.console_idle [--windows 5] [--window-s 60] [--size 160x48] [--case idle,following]

Every program runs in a tmux session of its own, `--size`, on one private tmux server, all at once; each window of
`--window-s` seconds reads every program's CPU (utime + stime from /proc/PID/stat) at its start and end, so each
figure is of the same stretch of time as its anchor's: the median over `--windows` windows is printed, with its
ratio to the anchor.

- idle: the console (`python -m console --workdir W local`) over 4 quiet runs (train runs that sleep and print
  nothing), its local agent apart, beside htop (Debian's, its default 1.5 s refresh) and top (3 s).
  Targets (issue 28): the console at or below htop.
- following: the console following a train run that writes 10 metric rows and 10 log lines a second
  (benchmarks.console_cpu's writer), beside a bare Textual app whose RichLog gets the same lines (it reads the
  run's output.log every 0.1 s, as `tail -f` does, and writes what came), htop, and `tail -f` of that log.
  Target: the console at most 3% of a core.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import cpu_seconds, print_table
from benchmarks.console_cpu import WRITER

REPO = Path(__file__).resolve().parent.parent
TMUX = shutil.which("tmux") or "/usr/bin/tmux"
IDLE_TARGET = "htop"
FOLLOWING_TARGET_PERCENT = 3.0
QUIET = "import time\nwhile True: time.sleep(3600)"
BARE_RICHLOG = """
import sys
from pathlib import Path
from textual.app import App
from textual.widgets import RichLog

class Tail(App):
    def compose(self):
        yield RichLog(max_lines=5000)

    def on_mount(self):
        self.file = Path(sys.argv[1]).open('rb')
        self.rest = b''
        self.set_interval(0.1, self.read)

    def read(self):
        data = self.rest + self.file.read()
        *lines, self.rest = data.split(b'\\n')
        log = self.query_one(RichLog)
        for line in lines:
            log.write(line.decode(errors='replace'))

Tail().run()
"""


class Server:
    """A private tmux server holding one session per program."""

    def __init__(self, folder: Path, size: tuple[int, int]) -> None:
        self.base = [TMUX, "-S", str(folder / "tmux.sock"), "-f", "/dev/null", "-u"]
        self.size = size
        self.env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
        self.env.setdefault("TERM", "xterm-256color")

    def tmux(self, *args: str) -> str:
        done = subprocess.run([*self.base, *args], env=self.env, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"tmux {args[0]}: {done.stderr.strip()}")
        return done.stdout

    def start(self, name: str, argv: list[str]) -> int:
        width, height = self.size
        self.tmux(
            "new-session", "-d", "-s", name, "-x", str(width), "-y", str(height), "-c", str(REPO), shlex.join(argv)
        )
        return int(self.tmux("display-message", "-p", "-t", name, "#{pane_pid}"))

    def screen(self, name: str) -> str:
        return self.tmux("capture-pane", "-p", "-t", name)

    def wait(self, name: str, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.screen(name):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} never showed {text!r}:\n{self.screen(name)}")
            time.sleep(0.5)

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=30, check=False)


def console_cli(workdir: Path, *args: str) -> str:
    argv = [sys.executable, "-m", "console", "--workdir", str(workdir), "local", *args]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"console {' '.join(args[:2])}: {done.stderr.strip()}")
    return done.stdout.strip()


def agent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            kids = [int(p) for p in fh.read().split()]
    except OSError:
        return None
    for kid in kids:
        with open(f"/proc/{kid}/cmdline", "rb") as fh:
            if b"backends.agent" in fh.read():
                return kid
    return None


def windows(pids: dict[str, int], count: int, seconds: float) -> dict[str, list[float]]:
    """Each program's CPU, % of a core, in each of `count` windows of `seconds`, all read in the same windows."""
    shares: dict[str, list[float]] = {name: [] for name in pids}
    for _ in range(count):
        start, wall0 = {name: cpu_seconds(pid) for name, pid in pids.items()}, time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - wall0
        for name, pid in pids.items():
            shares[name].append((cpu_seconds(pid) - start[name]) / wall * 100)
    return shares


def table(shares: dict[str, list[float]], anchor: str) -> list[list[str]]:
    base = statistics.median(shares[anchor])
    rows = []
    for name, values in shares.items():
        median = statistics.median(values)
        spread = f"{min(values):.2f}-{max(values):.2f}"
        rows.append([name, f"{median:.2f}", spread, f"{median / base:.2f}" if base else "-"])
    return rows


def idle(folder: Path, workdir: Path, count: int, seconds: float, size: tuple[int, int]) -> None:
    quiet = [
        console_cli(workdir, "launch", "train", "--name", "quiet", "--", sys.executable, "-c", QUIET).split()[0]
        for _ in range(4)
    ]
    server = Server(folder, size)
    try:
        console = server.start("console", [sys.executable, "-m", "console", "--workdir", str(workdir), "local"])
        htop = server.start("htop", ["htop"])
        top = server.start("top", ["top", "-d", "3"])
        server.wait("console", "4 running")
        time.sleep(10)  # the console's start settles
        agent = agent_of(console)
        pids = {"console": console, **({"its agent": agent} if agent else {}), "htop": htop, "top": top}
        shares = windows(pids, count, seconds)
    finally:
        server.close()
        for run in quiet:  # runs outlive their console: they go with the benchmark
            console_cli(workdir, "kill", run, "--grace", "1")
    print(f"idle: 4 quiet runs, {size[0]}x{size[1]}, {count} windows of {seconds:g} s, on {os.cpu_count()} cores")
    print_table(table(shares, IDLE_TARGET), ("program", "CPU % (median)", "min-max", f"ratio to {IDLE_TARGET}"))


def following(folder: Path, workdir: Path, count: int, seconds: float, size: tuple[int, int]) -> None:
    run = console_cli(
        workdir, "launch", "train", "--name", "writer", "--", sys.executable, "-c", WRITER, "0", "10", "logs"
    )
    log = next(workdir.glob(f"runs/{run.split()[0]}*/output.log"), None) if run else None
    server = Server(folder, size)
    try:
        console = server.start("console", [sys.executable, "-m", "console", "--workdir", str(workdir), "local"])
        server.wait("console", "step ")
        bare = server.start("bare", [sys.executable, "-c", BARE_RICHLOG, str(log)])
        htop = server.start("htop", ["htop"])
        tail = server.start("tail", ["tail", "-f", str(log)])
        time.sleep(10)
        agent = agent_of(console)
        pids = {"console": console, **({"its agent": agent} if agent else {}), "bare Textual RichLog": bare}
        shares = windows({**pids, "htop": htop, "tail -f": tail}, count, seconds)
    finally:
        server.close()
        console_cli(workdir, "kill", "writer", "--grace", "1")
    print(
        f"following: a train run at 10 rows + 10 log lines a second, {size[0]}x{size[1]}, {count} windows of "
        f"{seconds:g} s, on {os.cpu_count()} cores (target: the console at most {FOLLOWING_TARGET_PERCENT:g}%)"
    )
    print_table(
        table(shares, "bare Textual RichLog"),
        ("program", "CPU % (median)", "min-max", "ratio to bare Textual RichLog"),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--size", default="160x48")
    parser.add_argument("--case", default="idle,following")
    args = parser.parse_args()
    if shutil.which("htop") is None:
        print("htop is not installed (Debian: apt-get install htop)", file=sys.stderr)
        return 1
    width, height = (int(v) for v in args.size.split("x"))
    for case in args.case.split(","):
        with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as workdir:
            {"idle": idle, "following": following}[case](
                Path(folder), Path(workdir), args.windows, args.window_s, (width, height)
            )
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
