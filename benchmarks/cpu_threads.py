"""The demo's training on the CPU with 1 thread, with every core, and with the trainer's own choice
(`backends.host.cpus`: the idle CPUs), on a quiet box and beside a process that keeps one core busy.

    PYTHONPATH=. python -m benchmarks.cpu_threads [--steps 60] [--work DIR]

Builds the demo target and extracts the built-in corpus once (in --work), then times `python -m backends.train`
with the demo's settings for --steps steps per case, as real processes. The figure is the training's wall time
from its first to its last step line (start-up and the data's first read left out) and the ratio to the best case.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import print_table

DEMO_TRAIN = ["--batch-size", "8", "--lr", "3e-3", "--log-every", "10", "--eval-every", "0", "--save-every", "0"]
BUSY = "while True: pass"


def prepare(work: Path) -> tuple[Path, Path]:
    target, hidden = work / "target", work / "hidden"
    if not (target / "config.json").exists():
        subprocess.run([sys.executable, "-m", "backends.demo_target", "--out", str(target)], check=True)
    if not (hidden / "manifest.json").exists():
        extract = [sys.executable, "-m", "backends.extract", "--target", str(target), "--data", "demo"]
        subprocess.run([*extract, "--out", str(hidden)], check=True, stdout=subprocess.DEVNULL)
    return target, hidden


def train_seconds(target: Path, hidden: Path, out: Path, steps: int, threads: str | None) -> float:
    """Seconds between the first and the last step line a training of `steps` steps prints."""
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, "-m", "backends.train", "--data", str(hidden), "--target", str(target)]
    argv += ["--out", str(out), "--steps", str(steps), *DEMO_TRAIN, "--draft-vocab-size", "512"]
    argv += ["--threads", threads] if threads else []
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["EAGLE3_METRICS_FILE"] = str(out.with_suffix(".jsonl"))
    stamps: list[float] = []
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) as training:
        assert training.stdout is not None
        for line in training.stdout:
            if line.startswith("step "):
                stamps.append(time.monotonic())
            elif "CPU thread" in line:
                print("  " + line.split("compile")[-1].strip(" ,;\n"), flush=True)
    if training.returncode != 0 or len(stamps) < 2:
        raise SystemExit(f"training failed (exit {training.returncode})")
    return stamps[-1] - stamps[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "eagle3-cpu-threads")
    args = parser.parse_args()
    target, hidden = prepare(args.work)
    cores = len(os.sched_getaffinity(0))
    rows: list[tuple[str, str, float]] = []
    for load in ("quiet", "one core busy"):
        busy = subprocess.Popen([sys.executable, "-c", BUSY]) if load != "quiet" else None
        time.sleep(1.0 if busy else 0)
        try:
            for threads in ("1", str(cores), None):
                print(f"{load}, threads {threads or 'auto'}", flush=True)
                seconds = train_seconds(target, hidden, args.work / "draft", args.steps, threads)
                rows.append((load, threads or "auto (idle CPUs)", seconds))
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    table = []
    for load, threads, seconds in rows:
        best = min(s for lo, _, s in rows if lo == load)
        table.append([load, threads, f"{seconds:.1f} s", f"{seconds / best:.2f}"])
    print(f"\n{args.steps} demo training steps on {cores} CPUs (torch {__import__('torch').__version__})")
    print_table(table, ("box", "threads", "training time", "ratio to the best"))


if __name__ == "__main__":
    main()
