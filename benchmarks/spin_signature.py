"""What NVML sees of a GPU that spins in a kernel that never ends (run on the lent H200).

    python3 -m benchmarks.spin_signature [--seconds 10]

A rank stuck in an NCCL collective keeps a kernel resident that polls a flag
no peer will ever set: NVML's "utilization" (the share of time some kernel
runs) reads 100% although the GPU does no work, so "silent + idle GPU" misses
that hang. This measures, for workloads run one after another in a child
process, what each NVML counter reads, to find one that tells such a spin from
real work:
- idle: a CUDA context holding 1 GB, asleep;
- spin-clock: `torch.cuda._sleep`, a one-block kernel that spins on the clock,
  waited for by `torch.cuda.synchronize()` (the host spins too, as in a hang);
- spin-flag: a one-block Triton kernel polling a flag in GPU memory with
  volatile loads (what NCCL's wait does), when Triton is installed;
- spin-flag-32: the same with 32 blocks (NCCL runs one block per channel);
- graph-tiny: a CUDA graph of 2,000 64-element adds replayed back to back
  (tiny kernels with the GPU never waiting for the host);
- matmul: bf16 8192^3 matmuls back to back;
- tiny-kernels: 64-element adds, launch-bound (a small model's loop);
- copy: a 2 GB elementwise copy loop (memory-bound).
Counters: utilization.gpu and .memory (nvmlDeviceGetUtilizationRates), power
against the limit, and on Hopper the GPM metrics SM utilisation, SM occupancy
and DRAM bandwidth utilisation (nvmlGpmMetricsGet over 1 s).
"""

from __future__ import annotations

import argparse
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import print_table

SETUP = "import time, torch\ntorch.cuda.init()\n"
FLAG_SPIN = (
    "import triton, triton.language as tl\n"
    "@triton.jit\n"
    "def wait(flag):\n"
    "    while tl.load(flag, volatile=True) == 0:\n"
    "        pass\n"
    "f = torch.zeros(1, dtype=torch.int32, device='cuda')\n"
    "wait[({blocks},)](f)\n"
    "print('launched', flush=True)\n"
    "torch.cuda.synchronize()\n"
)
WORKLOADS: dict[str, str] = {
    "idle": (
        "x = torch.empty(2**30, dtype=torch.uint8, device='cuda')\ntorch.cuda.synchronize()\n"
        "print('launched', flush=True)\ntime.sleep(3600)\n"
    ),
    "spin-clock": "torch.cuda._sleep(2**60)\nprint('launched', flush=True)\ntorch.cuda.synchronize()\n",
    "spin-flag": FLAG_SPIN.format(blocks=1),
    "spin-flag-32": FLAG_SPIN.format(blocks=32),
    "graph-tiny": (
        "x = torch.zeros(64, device='cuda')\ng = torch.cuda.CUDAGraph()\n"
        "s = torch.cuda.Stream()\ns.wait_stream(torch.cuda.current_stream())\n"
        "with torch.cuda.stream(s):\n    x.add_(1.0)\ntorch.cuda.current_stream().wait_stream(s)\n"
        "with torch.cuda.graph(g):\n    [x.add_(1.0) for _ in range(2000)]\n"
        "print('launched', flush=True)\n"
        "while True:\n    g.replay()\n    torch.cuda.synchronize()\n"
    ),
    "matmul": (
        "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
        "print('launched', flush=True)\n"
        "while True:\n    b = a @ a\n    torch.cuda.synchronize()\n"
    ),
    "tiny-kernels": "x = torch.zeros(64, device='cuda')\nprint('launched', flush=True)\nwhile True:\n    x = x + 1.0\n",
    "copy": (
        "x = torch.empty(2**29, device='cuda')\ny = torch.empty_like(x)\n"
        "print('launched', flush=True)\n"
        "while True:\n    y.copy_(x)\n    torch.cuda.synchronize()\n"
    ),
}
SETTLE_S = 2.0  # after the child says its kernel is launched: NVML's utilisation looks back over its last period
LAUNCH_TIMEOUT_S = 120.0


class Gpm:
    """Hopper's GPU performance monitoring counters, read over an interval."""

    METRICS = ("SM_UTIL", "SM_OCCUPANCY", "DRAM_BW_UTIL")

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        self.ok = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        self.samples = (nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc())

    def read(self, interval_s: float) -> dict[str, float]:
        nvml = self.nvml
        nvml.nvmlGpmSampleGet(self.handle, self.samples[0])
        time.sleep(interval_s)
        nvml.nvmlGpmSampleGet(self.handle, self.samples[1])
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self.METRICS)
        request.sample1, request.sample2 = self.samples
        for i, name in enumerate(self.METRICS):
            request.metrics[i].metricId = getattr(nvml, f"NVML_GPM_METRIC_{name}")
        nvml.nvmlGpmMetricsGet(request)
        return {name: float(request.metrics[i].value) for i, name in enumerate(self.METRICS)}


def measure(nvml: Any, handle: Any, gpm: Gpm | None, seconds: float) -> dict[str, float]:
    util, mem, power, sm, occ, dram = [], [], [], [], [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        util.append(rates.gpu)
        mem.append(rates.memory)
        power.append(nvml.nvmlDeviceGetPowerUsage(handle) / 1000)
        if gpm is not None:
            got = gpm.read(1.0)
            sm.append(got["SM_UTIL"])
            occ.append(got["SM_OCCUPANCY"])
            dram.append(got["DRAM_BW_UTIL"])
        else:
            time.sleep(1.0)
    nan = float("nan")
    return {
        "util_min": min(util),
        "util_mean": statistics.mean(util),
        "mem_mean": statistics.mean(mem),
        "mem_max": max(mem),
        "power_w": statistics.mean(power),
        "sm_util": statistics.mean(sm) if sm else nan,
        "sm_occupancy": statistics.mean(occ) if occ else nan,
        "dram_bw": statistics.mean(dram) if dram else nan,
    }


def launched(child: subprocess.Popen[str]) -> bool:
    """Whether the child printed that its workload runs (Triton compiles its kernel first)."""
    ready = selectors.DefaultSelector()
    assert child.stdout is not None
    ready.register(child.stdout, selectors.EVENT_READ)
    return bool(ready.select(LAUNCH_TIMEOUT_S)) and child.stdout.readline().strip() == "launched"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    import pynvml as nvml

    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    limit_w = nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000
    gpm: Gpm | None
    try:
        gpm = Gpm(nvml, handle)
        gpm = gpm if gpm.ok else None
    except nvml.NVMLError as error:
        print(f"GPM not available: {error}")
        gpm = None
    rows = []
    for name, body in WORKLOADS.items():
        # A file, not -c: Triton reads its kernels' source. Not named after the workload: copy.py
        # would stand in for the standard library's copy module.
        script = Path(tempfile.mkdtemp()) / f"workload_{name.replace('-', '_')}.py"
        script.write_text(SETUP + body)
        argv = [sys.executable, str(script)]
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if not launched(child):
            child.kill()
            why = (child.stderr.read() if child.stderr else "").strip()[-100:]
            rows.append([name, f"did not run: {why}", "", "", "", "", ""])
            continue
        time.sleep(SETTLE_S)
        got = measure(nvml, handle, gpm, args.seconds)
        child.kill()
        child.wait()
        time.sleep(2.0)
        rows.append(
            [
                name,
                f"{got['util_min']:.0f}/{got['util_mean']:.0f}",
                f"{got['mem_mean']:.1f}/{got['mem_max']:.0f}",
                f"{got['power_w']:.0f} ({100 * got['power_w'] / limit_w:.0f}%)",
                f"{got['sm_util']:.1f}",
                f"{got['sm_occupancy']:.1f}",
                f"{got['dram_bw']:.1f}",
            ]
        )
    print(f"{nvml.nvmlDeviceGetName(handle)}, power limit {limit_w:.0f} W, {args.seconds:.0f} s per workload")
    print_table(
        rows,
        ["workload", "util min/mean %", "mem util mean/max %", "power W", "GPM SM util %", "SM occ. %", "DRAM bw %"],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
