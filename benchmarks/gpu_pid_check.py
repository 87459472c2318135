"""What a real GPU host says of a CUDA process: NVML's pid for it, the device nodes it holds open, and the GPU's
minor number, the facts free-gpus and the container fallback rely on.

    python -m benchmarks.gpu_pid_check        # on a GPU host (the device tool's H200)

Starts a child that makes a CUDA context on GPU 0 and holds it, then prints: the child's pid as this pid
namespace sees it and as NVML lists it (equal outside a container, the host's inside one), the NVIDIA device
nodes among the child's open files and its memory mappings (and this NVML-only process's mappings), GPU 0's
minor number, and whether CUDA_VISIBLE_DEVICES was set.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

HOLDER = "import torch, time\nx = torch.ones(1024, 1024, device='cuda:0')\nprint('ready', flush=True)\ntime.sleep(60)\n"


def nvidia_fds(pid: int) -> list[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            found.add(target)
    return sorted(found)


def nvidia_maps(pid: int) -> list[str]:
    """The NVIDIA nodes mapped into the process's memory: a CUDA context maps its GPU's /dev/nvidiaN, a process
    that only asks NVML maps /dev/nvidiactl alone (what free-gpus' proof of a holder rests on)."""
    with open(f"/proc/{pid}/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "/dev/nvidia" in line})


def main() -> None:
    import pynvml

    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    try:
        if holder.stdout.readline().strip() != "ready":
            raise SystemExit("the CUDA holder did not start")
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        listed: list[int] = []
        for _ in range(20):
            listed = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
            if listed:
                break
            time.sleep(0.25)
        print(f"holder pid here            {holder.pid}")
        print(f"NVML compute pids on GPU 0 {listed}")
        print(f"pid namespaces agree       {holder.pid in listed}")
        print(f"holder's NVIDIA fds        {nvidia_fds(holder.pid)}")
        print(f"holder's NVIDIA mappings   {nvidia_maps(holder.pid)}")
        print(f"this NVML-only process maps {nvidia_maps(os.getpid())}")
        print(f"GPU 0 minor number         {pynvml.nvmlDeviceGetMinorNumber(handle)}")
        print(f"CUDA_VISIBLE_DEVICES       {os.environ.get('CUDA_VISIBLE_DEVICES')!r}")
        print(f"driver                     {pynvml.nvmlSystemGetDriverVersion()}")
        pynvml.nvmlShutdown()
    finally:
        holder.kill()
        holder.wait()


if __name__ == "__main__":
    main()
