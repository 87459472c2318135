"""Agent overhead while idle-monitoring 10 runs and 8 GPUs (NVML double) at 1 Hz.

    .venv/bin/python -m benchmarks.agent_idle [--seconds 60]

Launches 10 quiet runs (`sleep`), subscribes to every one of them plus GPU
samples every second, and measures the agent's CPU and RSS from /proc.
Targets: CPU <= 1% of one core, RSS <= 80 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import cpu_seconds, print_table, rss_mib
from console.client import AgentClient
from console.transport import LocalTransport


async def measure(seconds: float, workdir: Path) -> tuple[float, float, int]:
    client = AgentClient(LocalTransport(workdir))
    hello = await client.start()
    pid = hello["pid"]
    runs = [await client.request("launch", kind="command", argv=["sleep", str(seconds + 30)]) for _ in range(10)]
    subs = [await client.subscribe(run=r["run"]) for r in runs]
    gpu_sub = await client.subscribe(gpu_interval=1.0)
    samples = 0

    async def count_gpu_samples() -> None:
        nonlocal samples
        async for msg in gpu_sub:
            samples += msg["stream"] == "gpus" and len(msg["gpus"]) == 8

    counter = asyncio.create_task(count_gpu_samples())
    await asyncio.sleep(3)  # settle: initial stream catch-up
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    cpu1, t1 = cpu_seconds(pid), time.monotonic()
    rss = rss_mib(pid)
    counter.cancel()
    for r in runs:
        await client.request("kill", run=r["run"], grace=2)
    del subs
    await client.close()
    return (cpu1 - cpu0) / (t1 - t0) * 100, rss, samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    repo = Path(__file__).resolve().parent.parent
    os.environ["EAGLE3_NVML_MODULE"] = "tests.fake_nvml"
    os.environ.pop("FAKE_NVML_STATE", None)  # the double's default: 8 idle H200s
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        cpu, rss, samples = asyncio.run(measure(args.seconds, Path(tmp)))
    print(f"agent idle-monitoring 10 runs + 8 GPUs at 1 Hz for {args.seconds:.0f} s ({samples} GPU samples seen)")
    print_table(
        [
            ("agent CPU, % of one core", f"{cpu:.2f}", "1.00", f"{cpu / 1.0:.2f}"),
            ("agent RSS, MB", f"{rss:.1f}", "80", f"{rss / 80:.2f}"),
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
