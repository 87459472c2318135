"""`kill` of a serve run whose launcher has exited, on a real GPU: SGLang's shape, where each scheduler holds GPU
memory and renames itself with `setproctitle` (which clears its /proc/PID/environ, the run's marker with it).

    python -m benchmarks.gpu_renamed_schedulers      # on a GPU host (the device tool's H200), setproctitle installed

A run of the run engine (backends.runs.control, as the agent starts it) whose child starts two "schedulers": each
makes a CUDA context on GPU 0, holds 2 GiB, calls the real `setproctitle("sglang::scheduler_TP<rank>")`, and
sleeps; the child then exits. Printed: what NVML lists on GPU 0 and whether each scheduler's environment still
holds the run's marker; then what `kill RUN` signals, how long until NVML lists none of them, and GPU 0's used
memory before the run, while it held the memory and after the kill. Before issue 23 the kill said "nothing to
kill" here and the schedulers kept the memory.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pynvml

from backends.host import procinfo
from backends.protocol import ENV_RUN_ID
from backends.runs import control
from backends.runs.store import RunSpec, RunStore
from benchmarks._common import print_table

HOLD_GIB = 2
SCHEDULER = f"""
import sys, time, torch, setproctitle
held = torch.empty({HOLD_GIB} << 30, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
setproctitle.setproctitle(f"sglang::scheduler_TP{{sys.argv[1]}}")
open(sys.argv[2], "w").close()
time.sleep(600)
"""
LAUNCHER = f"""
import os, subprocess, sys, time
ready = sys.argv[1]
for rank in range(2):
    print(subprocess.Popen([sys.executable, "-c", {SCHEDULER!r}, str(rank), os.path.join(ready, str(rank))]).pid,
          flush=True)
while len(os.listdir(ready)) < 2:
    time.sleep(0.05)
"""


def gpu0() -> tuple[int, dict[int, int]]:
    """GPU 0's used MiB and its compute processes (pid -> MiB)."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    used = pynvml.nvmlDeviceGetMemoryInfo(handle).used >> 20
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    return used, {p.pid: (p.usedGpuMemory or 0) >> 20 for p in procs}


def wait(predicate: Callable[[], bool], seconds: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > seconds:
            sys.exit(f"timed out after {seconds} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def main() -> None:
    if importlib.util.find_spec("setproctitle") is None:
        sys.exit("setproctitle is not installed here (pip install setproctitle): the attack needs the real one")
    pynvml.nvmlInit()
    with tempfile.TemporaryDirectory() as folder:
        store, ready = RunStore(Path(folder) / "work"), Path(folder) / "ready"
        ready.mkdir()
        before, _ = gpu0()
        spec = RunSpec(kind="serve", argv=[sys.executable, "-c", LAUNCHER, str(ready)], name="renamed")
        run = store.get(control.launch(store, spec)["run"])
        wait(lambda: run.state() == "exited", 120, "the launcher to exit after its schedulers were ready")
        schedulers = [int(line) for line in run.file("output.log").read_text().split()]
        held, listed = gpu0()
        rows = []
        for pid in schedulers:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            marked = procinfo.environ_value(pid, ENV_RUN_ID) is not None
            rows.append((str(pid), title, f"{listed.get(pid, 0)} MiB", "yes" if marked else "no (cleared)"))
        print_table(rows, ("scheduler pid", "its title", "NVML: on GPU 0", f"{ENV_RUN_ID} in its environ"))
        start = time.monotonic()
        result = control.kill(run, "TERM", grace=10)
        killed_s = time.monotonic() - start
        freed_s = wait(lambda: not set(schedulers) & set(gpu0()[1]), 60, "NVML to list none of them") + killed_s
        after, _ = gpu0()
        print()
        print_table(
            [
                (str(p["pid"]), ",".join(p["signals"]) or "-", "died" if p["died"] else "alive")
                for p in result["processes"]
            ],
            ("kill RUN signalled", "signals", "then"),
        )
        print()
        print_table(
            [
                ("GPU 0 used before the run", f"{before} MiB"),
                ("while the renamed schedulers held it", f"{held} MiB"),
                ("after kill RUN", f"{after} MiB"),
                ("kill RUN returned after", f"{killed_s:.2f} s"),
                ("NVML listed none of them after", f"{freed_s:.2f} s"),
            ],
            ("figure", "value"),
        )
        missed = set(schedulers) - {p["pid"] for p in result["processes"]}
        if missed:
            sys.exit(f"kill RUN did not signal the schedulers {sorted(missed)}")


if __name__ == "__main__":
    main()
