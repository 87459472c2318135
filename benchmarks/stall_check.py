"""Stall detection against real GPU processes (run on the lent H200), through the CLI and a real agent.

    PYTHONPATH=. python3 -m benchmarks.stall_check [--stall-after 30]

Four `train` runs, watched with real NVML (one GPU: `busy` and `spin` each run
alone after the others, since their GPU's activity would also count for `hung`):
1. hung: allocates 4.6 GB on GPU 0, prints a SGLang-like `Load weight begin`
   line, then sleeps holding its CUDA context (a launch that hangs silently);
2. chatty, beside it: prints a progress bar every second, GPU idle;
3. busy, afterwards: bf16 matmuls on GPU 0 for the whole check, printing nothing;
4. spin, last: after the same line, a kernel that spins for ever on one block
   (`torch.cuda._sleep`), waited for by `torch.cuda.synchronize()`: a rank
   stuck in a collective, its GPU 100% "utilised" and its host spinning.
Expected: `hung` becomes `stalled` (idle) and `spin` `stalled` (spinning), each
about --stall-after seconds after its last line, in phase `load-weights`, with
its stack dumped; `busy` and `chatty` stay running. Prints a table: the state
each run ended the check in, when each stall was called (seconds after the
last output line), and what the stack dumps hold.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from backends.runs.store import RunDir
from benchmarks._common import print_table
from benchmarks.stall_report import stall_facts

HUNG = (
    "import time, torch\n"
    "x = torch.empty(int(4.6e9), dtype=torch.uint8, device='cuda')\n"
    "torch.cuda.synchronize()\n"
    "print('[2026-11-29 07:00:01] Load weight begin. avail mem=139.52 GB', flush=True)\n"
    "print(f'last output at {time.time()}', flush=True)\n"
    "while True:\n    time.sleep(3600)\n"
)
SPIN = (
    "import time, torch\n"
    "torch.cuda.init()\n"
    "print('[2026-11-29 07:00:01] Load weight begin. avail mem=139.52 GB', flush=True)\n"
    "torch.cuda._sleep(2**60)\n"
    "print(f'last output at {time.time()}', flush=True)\n"
    "torch.cuda.synchronize()\n"
)
BUSY = (
    "import time, torch\n"
    "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
    "end = time.time() + {seconds}\n"
    "while time.time() < end:\n    b = a @ a\n    torch.cuda.synchronize()\n"
)
CHATTY = (
    "import time\nfor i in range({seconds}):\n    print(f'step {{i}} 10%|#', end='\\r', flush=True); time.sleep(1)\n"
)


def console(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "console", "--workdir", str(workdir), "local", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)


def launch(workdir: Path, name: str, stall_after: float, script: str) -> str:
    flags = ["--name", name, "--stall-after", str(stall_after)]
    done = console(workdir, "launch", "train", *flags, "--", "python3", "-c", script)
    if done.returncode != 0:
        raise SystemExit(f"launch {name} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def runs(workdir: Path) -> dict[str, dict[str, Any]]:
    status = json.loads(console(workdir, "status", "--json").stdout)
    return {r["name"]: r for r in status["runs"]}


def last_live_state(workdir: Path, run_id: str) -> str:
    """The run's last state before our kill (from its events)."""
    events = RunDir(workdir / "runs" / run_id).events()
    states = [e["state"] for e in events if e["type"] == "state" and e["state"] != "killed"]
    return str(states[-1]) if states else "?"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stall-after", type=float, default=30.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="stall-check-"))
    check_s = args.stall_after + 25
    seconds = int(check_s) + 30
    ids = {
        "hung": launch(workdir, "hung", args.stall_after, HUNG),
        "chatty": launch(workdir, "chatty", args.stall_after, CHATTY.format(seconds=seconds)),
    }
    started = time.time()
    stalled_seen: float | None = None
    gpu_util: list[int] = []
    while time.time() - started < check_s:
        status = json.loads(console(workdir, "status", "--json").stdout)
        state = {r["name"]: r for r in status["runs"]}
        if stalled_seen is None and state["hung"]["state"] == "stalled":
            stalled_seen = time.time()
        gpu_util += [g["util"] for g in status["gpus"][:1] if g["util"] is not None]
        time.sleep(1)
    for run_id in ids.values():
        console(workdir, "kill", run_id, "--grace", "2")
    ids["busy"] = launch(workdir, "busy", args.stall_after, BUSY.format(seconds=seconds))
    time.sleep(check_s)
    console(workdir, "kill", ids["busy"], "--grace", "2")
    ids["spin"] = launch(workdir, "spin", args.stall_after, SPIN)
    time.sleep(check_s)
    console(workdir, "kill", ids["spin"], "--grace", "2")
    final = runs(workdir)
    hung, spin = stall_facts(workdir / "runs" / ids["hung"]), stall_facts(workdir / "runs" / ids["spin"])
    stalled, stack, spun, spin_stack = hung.stalled, hung.stack, spin.stalled, spin.stack
    expected = {"hung": "stalled", "busy": "running", "chatty": "running", "spin": "stalled"}
    rows = [[name, expected[name], last_live_state(workdir, ids[name]), str(final[name]["phase"])] for name in ids]
    print(f"stall window {args.stall_after:.0f} s; GPU 0 utilisation seen during the check: {sorted(set(gpu_util))}")
    print_table(rows, ("run", "expected", "last state before the kill", "phase"))
    polled = stalled_seen - hung.last_output if stalled_seen else float("nan")
    window = f"{args.stall_after:.0f}"
    print()
    print_table(
        [
            [
                "hung: stalled event, s after the last output line",
                f"{hung.called_after_s:.1f}",
                window,
            ],
            ["hung: state seen by a status poll, s after it", f"{polled:.1f}", window],
            ["hung: how it sits still", str(stalled and stalled["kind"]), "idle"],
            ["hung: busiest process CPU in the window (%)", str(stalled and stalled["cpu_percent"]), "< 5"],
            ["hung: GPU utilisation in the stalled event", str(stalled and stalled["gpu_util"]), "< 5"],
            ["hung: stack dump has Python frames (py-spy)", str("(<string>" in stack), "True"],
            [
                "spin: stalled event, s after the last output line",
                f"{spin.called_after_s:.1f}",
                window,
            ],
            ["spin: how it sits still", str(spun and spun["kind"]), "spinning"],
            ["spin: busiest process CPU in the window (%)", str(spun and spun["cpu_percent"]), "any"],
            ["spin: GPU utilisation / memory utilisation", str(spun and (spun["gpu_util"], spun["gpu_mem_util"])), ""],
            ["spin: stack dump shows the wait", str("synchronize" in spin_stack), "True"],
        ],
        ("metric", "measured", "expected"),
    )
    print("\n--- stack dump of the hung run ---\n" + stack[:2000])
    print("\n--- stack dump of the spinning run ---\n" + spin_stack[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
