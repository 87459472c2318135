"""Check GPU telemetry and free-gpus against a real GPU (run on the lent H200).

    PYTHONPATH=. python -m benchmarks.gpu_check

1. Samples the GPUs through NVML and through nvidia-smi while one process holds
   4.6 GB and another runs bf16 matmuls, and prints both side by side.
2. Launches a `train` run holding GPU memory through the real CLI (`local` host),
   checks that status attributes its GPU process to the run, then frees the GPU
   with `free-gpus --yes` and reports MiB freed and the time it took.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from backends.host.gpus import NVML_MODULE_ENV, GpuSampler
from benchmarks._common import print_table

HOLD = (
    "import time, torch\n"
    "x = torch.empty(4600 * 2**20, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()\n"
    "print('ready', flush=True); time.sleep(600)\n"
)
BUSY = (
    "import time, torch\n"
    "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
    "print('ready', flush=True); end = time.time() + 20\n"
    "while time.time() < end: a @ a\n"
    "torch.cuda.synchronize()\n"
)


def start(script: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def compare_sources() -> None:
    holder, busy = start(HOLD), start(BUSY)
    try:
        time.sleep(3)
        nvml = GpuSampler()
        os.environ[NVML_MODULE_ENV] = "no_such_nvml_module"  # forces the nvidia-smi fallback
        smi = GpuSampler()
        del os.environ[NVML_MODULE_ENV]
        t0 = time.perf_counter()
        a = nvml.sample()
        t_nvml = time.perf_counter() - t0
        t0 = time.perf_counter()
        b = smi.sample()
        t_smi = time.perf_counter() - t0
        print(f"sources: {nvml.source} vs {smi.source}; sample time {t_nvml * 1000:.1f} ms vs {t_smi * 1000:.1f} ms")
        for ga, gb in zip(a, b, strict=True):
            fields = ("index", "name", "util", "mem_used_mib", "mem_total_mib", "temp_c", "power_w")
            rows = [(field, str(ga[field]), str(gb[field])) for field in fields]  # type: ignore[literal-required]
            pa = sorted((p["pid"], p["mem_mib"]) for p in ga["processes"])
            pb = sorted((p["pid"], p["mem_mib"]) for p in gb["processes"])
            rows.append(("processes (pid, MiB)", str(pa), str(pb)))
            print_table(rows, headers=("field", "nvml", "nvidia-smi"))
            expected = {holder.pid, busy.pid}
            print(f"our pids {sorted(expected)} listed: {expected <= {p for p, _ in pa}}")
    finally:
        for proc in (holder, busy):
            proc.kill()
            proc.wait()


def cli(workdir: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "console", "--workdir", workdir, "local", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def free_a_run() -> None:
    with tempfile.TemporaryDirectory() as workdir:
        run = cli(workdir, "launch", "train", "--name", "holder", "--gpus", "0", "--", sys.executable, "-c", HOLD)
        run_id = run.stdout.strip()
        deadline = time.time() + 60
        while "ready" not in cli(workdir, "logs", run_id).stdout and time.time() < deadline:
            time.sleep(0.2)
        status = json.loads(cli(workdir, "status", "--json").stdout)
        owners = {p["pid"]: p["run_id"] for g in status["gpus"] for p in g["processes"]}
        print(f"status: GPU processes -> runs {owners}; run id {run_id}")
        t0 = time.perf_counter()
        freed = cli(workdir, "free-gpus", "--gpus", "0", "--yes", "--json")
        elapsed = time.perf_counter() - t0
        report = json.loads(freed.stdout)["gpus"][0]
        state = next(r["state"] for r in json.loads(cli(workdir, "status", "--json").stdout)["runs"])
        print_table(
            [
                ("MiB used before", str(report["mem_used_before_mib"])),
                ("MiB freed", str(report["freed_mib"])),
                ("still held", str(report["still_held"])),
                ("actions", str([p["action"] for p in report["processes"]])),
                ("wall time of free-gpus, s", f"{elapsed:.2f}"),
                ("run state after", state),
            ],
            headers=("free-gpus", "value"),
        )


def main() -> int:
    subprocess.run(["nvidia-smi", "-L"], check=False)
    compare_sources()
    free_a_run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
