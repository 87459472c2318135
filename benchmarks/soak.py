"""Soak: the console left open for hours, as people leave it while a training runs for days. Its RSS and CPU (and
its local agent's, apart) are sampled every minute; the table, a text plot of both against time and the RSS slope
after the warm-up, extrapolated to 24 h, are printed from the samples file, so a partial run reads the same.

    .venv/bin/python -m benchmarks.soak [--hours 2] [--out /tmp/eagle3-soak] [--size 160x48]
    .venv/bin/python -m benchmarks.soak --report /tmp/eagle3-soak/samples.jsonl [--warmup-min 20]

The real console (`python -m console --workdir W local`) in a tmux terminal of its own, its real local agent,
and two real `train` runs that write metric rows like the trainer's (those of benchmarks.console_cpu) with a log
line for each: one at 10 rows/s over 10,000 rows of history, one at 100 rows/s. Every RELAUNCH_MIN minutes
both runs are relaunched (`relaunch`, through the CLI: the old run killed, a new one started); every
RECONNECT_MIN minutes the console's agent is killed, as a host lost, and the console reconnects; every
SWITCH_MIN minutes the cursor moves to the other live run, so the console follows each rate in turn. Targets
(issue 28): an RSS slope of 0 after the warm-up, at most 150 MiB at 24 h by extrapolation.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import cpu_seconds, print_table, rss_mib
from benchmarks.console_cpu import WRITER

REPO = Path(__file__).resolve().parent.parent
TMUX = shutil.which("tmux") or "/usr/bin/tmux"
SAMPLE_S = 60.0
RELAUNCH_MIN = 15
RECONNECT_MIN = 10
SWITCH_MIN = 5
RSS_TARGET_24H_MIB = 150.0
RATES = ((10.0, 10_000), (100.0, 0))  # rows (and log lines) a second, rows of history


def console_cli(workdir: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "console", "--workdir", str(workdir), "local", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"console {' '.join(args[:2])}: {done.stderr.strip()}")
    return done.stdout.strip()


def launch(workdir: Path, rate: float, history: int) -> str:
    argv = [sys.executable, "-c", WRITER, str(history), str(rate), "logs"]
    return console_cli(workdir, "launch", "train", "--name", f"soak-{rate:g}", "--json", "--", *argv)


def run_id(launched: str) -> str:
    reply = json.loads(launched)
    return str(reply.get("run") or reply.get("id"))


class Terminal:
    """The console in a detached tmux session on a server of its own."""

    def __init__(self, argv: list[str], size: tuple[int, int], folder: Path) -> None:
        self.server = [TMUX, "-S", str(folder / "tmux.sock"), "-f", "/dev/null", "-u"]
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
        session = ["new-session", "-d", "-x", str(size[0]), "-y", str(size[1]), "-c", str(REPO), shlex.join(argv)]
        subprocess.run([*self.server, *session], env=env, check=True, timeout=30)
        self.pid = int(self.tmux("display-message", "-p", "-t", "0", "#{pane_pid}"))

    def tmux(self, *args: str) -> str:
        return subprocess.run([*self.server, *args], capture_output=True, text=True, timeout=30, check=True).stdout

    def send(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "0", *keys)

    def close(self) -> None:
        subprocess.run([*self.server, "kill-server"], capture_output=True, timeout=30, check=False)


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


def agent_of(console: int) -> int | None:
    """The console's local agent: its child running backends.agent."""
    for child in children(console):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as fh:
                if b"backends.agent" in fh.read():
                    return child
        except OSError:
            continue
    return None


def commit() -> str:
    """HEAD, and the files of the console and the agent that differ from it (what the soak ran is the tree's)."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    status = ["git", "-C", str(REPO), "status", "--porcelain", "--", "console", "backends", "themes"]
    changed = [line[3:] for line in subprocess.run(status, capture_output=True, text=True).stdout.splitlines()]
    return head.stdout.strip() + (f" + uncommitted {' '.join(changed)}" if changed else "")


def soak(hours: float, out: Path, size: tuple[int, int], minute_s: float = SAMPLE_S) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    samples = out / "samples.jsonl"
    workdir = Path(tempfile.mkdtemp(prefix="eagle3-soak-store-"))
    live = [run_id(launch(workdir, rate, history)) for rate, history in RATES]
    argv = [sys.executable, "-m", "console", "--workdir", str(workdir), "local"]
    term = Terminal(argv, size, out)
    start = time.monotonic()
    header = {
        "commit": commit(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "size": f"{size[0]}x{size[1]}",
        "rates": [rate for rate, _ in RATES],
        "console_pid": term.pid,
        "minute_s": minute_s,
        "workdir": str(workdir),
    }
    with samples.open("w") as fh:
        fh.write(json.dumps({"header": header}) + "\n")
    events: list[str] = []
    last_cpu: dict[str, tuple[float, float]] = {}
    minute = 0
    try:
        while time.monotonic() - start < hours * 3600:
            minute += 1
            time.sleep(max(0.0, start + minute * minute_s - time.monotonic()))
            agent = agent_of(term.pid)
            now = time.monotonic()
            row: dict[str, object] = {"min": round((now - start) / minute_s, 2), "events": events}
            for name, pid in (("console", term.pid), ("agent", agent)):
                if pid is None:
                    continue
                try:
                    cpu, rss = cpu_seconds(pid), rss_mib(pid)
                except OSError:
                    continue
                key = f"{name}:{pid}"
                before = last_cpu.get(key)
                row[f"{name}_rss"] = round(rss, 1)
                row[f"{name}_cpu"] = round((cpu - before[0]) / (now - before[1]) * 100, 2) if before else None
                last_cpu[key] = (cpu, now)
            with samples.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            events = []
            if minute % RELAUNCH_MIN == 0:
                live = [
                    run_id(
                        console_cli(
                            workdir, "relaunch", r, "--set", f"--soak={minute}", "--grace", "1", "--force", "--json"
                        )
                    )
                    for r in live
                ]
                events.append("relaunch")
            if minute % RECONNECT_MIN == 0 and agent is not None:
                os.kill(agent, signal.SIGKILL)
                events.append("reconnect")
            if minute % SWITCH_MIN == 0 or "relaunch" in events:
                # the two live runs are the newest: the table's last two rows (none is a failure, which would lead)
                time.sleep(min(5.0, minute_s / 4))  # the console's next poll shows a relaunch's runs
                term.send("C-End", *(["Up"] if (minute // SWITCH_MIN) % 2 else []))
                events.append("switch")
    finally:
        term.close()
        for r in live:
            subprocess.run(
                [sys.executable, "-m", "console", "--workdir", str(workdir), "local", "kill", r, "--grace", "1"],
                cwd=REPO,
                capture_output=True,
                timeout=60,
                check=False,
            )
        shutil.rmtree(workdir, ignore_errors=True)
    return samples


def slope(points: list[tuple[float, float]]) -> float:
    """Least squares slope of y over x."""
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0


def text_plot(points: list[tuple[float, float]], label: str, height: int = 10, width: int = 72) -> list[str]:
    """`points` (minutes, value) as a column chart of text."""
    if not points:
        return []
    lo, hi = min(p[1] for p in points), max(p[1] for p in points)
    span = hi - lo or 1.0
    last = points[-1][0] or 1.0
    cols: list[list[float]] = [[] for _ in range(width)]
    for x, y in points:
        cols[min(width - 1, int(x / last * (width - 1)))].append(y)
    tops: list[float | None] = []
    for c in cols:  # a column between two samples holds the one before it, as the value stood then
        tops.append(max(c) if c else tops[-1] if tops else None)
    lines = [f"{label}: {lo:.1f} .. {hi:.1f}, against minutes 0 .. {last:.0f}"]
    for row in range(height, 0, -1):
        level = lo + span * (row - 0.5) / height
        axis = f"{lo + span * row / height:8.1f} |"
        lines.append(axis + "".join("#" if t is not None and t >= level else " " for t in tops))
    lines.append(" " * 9 + "+" + "-" * width)
    return lines


def report(samples: Path, warmup_min: float) -> int:
    rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    header = rows[0].get("header", {}) if rows else {}
    data = [r for r in rows if "min" in r]
    noted = samples.parent / "COMMIT"  # a soak run from an exported tree (no git there) has its commit noted beside
    ran = header.get("commit") or (noted.read_text().strip() if noted.exists() else "unknown")
    print(
        f"soak: {samples} — commit {ran}, started {header.get('started')}, "
        f"{header.get('size')}, runs at {header.get('rates')} rows+lines/s, {len(data)} samples"
    )
    table = [
        [
            f"{r['min']:.0f}",
            f"{r.get('console_rss', '-')}",
            str(r.get("console_cpu") or "-"),
            f"{r.get('agent_rss', '-')}",
            str(r.get("agent_cpu") or "-"),
            ",".join(r.get("events") or []),
        ]
        for r in data
    ]
    print_table(table, ("min", "console RSS MiB", "console CPU %", "agent RSS MiB", "agent CPU %", "then"))
    rss = [(float(r["min"]), float(r["console_rss"])) for r in data if "console_rss" in r]
    cpu = [(float(r["min"]), float(r["console_cpu"])) for r in data if r.get("console_cpu") is not None]
    print()
    for line in [*text_plot(rss, "console RSS, MiB"), "", *text_plot(cpu, "console CPU, % of a core")]:
        print(line)
    after = [p for p in rss if p[0] >= warmup_min]
    print()
    if len(after) < 3:
        print(f"slope: fewer than 3 samples after the {warmup_min:g}-minute warm-up")
        return 0
    per_h = slope(after) * 60
    at_24h = after[-1][1] + per_h * (24 - after[-1][0] / 60)
    cpus = sorted(p[1] for p in cpu if p[0] >= warmup_min)
    median_cpu = cpus[len(cpus) // 2] if cpus else math.nan
    late = rss[len(rss) // 2 :]  # a step early after the warm-up weighs on the first slope: this one leaves it out
    print_table(
        [
            [f"RSS slope after {warmup_min:g} min, MiB/h ({len(after)} samples)", f"{per_h:+.2f}", "0", "-"],
            [f"RSS slope over the second half, from {late[0][0]:.0f} min, MiB/h", f"{slope(late) * 60:+.2f}", "0", "-"],
            [
                "RSS at 24 h by that slope, MiB",
                f"{at_24h:.0f}",
                f"{RSS_TARGET_24H_MIB:.0f}",
                f"{at_24h / RSS_TARGET_24H_MIB:.2f}",
            ],
            ["console CPU after the warm-up, median %", f"{median_cpu:.2f}", "3", f"{median_cpu / 3:.2f}"],
        ]
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=Path("/tmp/eagle3-soak"))
    parser.add_argument("--size", default="160x48")
    parser.add_argument("--report", type=Path, help="print the table, plot and slope of a samples file, and stop")
    parser.add_argument("--warmup-min", type=float, default=20.0)
    parser.add_argument("--minute-s", type=float, default=SAMPLE_S, help="a shorter 'minute' for a quick check")
    args = parser.parse_args()
    if args.report:
        return report(args.report, args.warmup_min)
    width, height = (int(v) for v in args.size.split("x"))
    samples = soak(args.hours, args.out, (width, height), args.minute_s)
    return report(samples, args.warmup_min)


if __name__ == "__main__":
    sys.exit(main())
