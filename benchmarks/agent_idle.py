"""Agent and supervisor overhead while idle-monitoring 10 runs and 8 GPUs (NVML double) at 1 Hz.

    .venv/bin/python -m benchmarks.agent_idle [--seconds 60]

Launches 10 quiet `train` runs (`sleep`: each supervisor keeps the full watch,
output, /proc and GPU samples, and calls the run stalled after 30 s with a
stack dump), subscribes to every one of them plus GPU samples every second,
and measures from /proc the agent's CPU and RSS and each supervisor's CPU.
Targets: agent CPU <= 1% of one core, agent RSS <= 80 MB, one supervisor's
CPU <= 0.5% of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import cpu_seconds, print_table, rss_mib
from console.link.client import AgentClient
from console.link.local import LocalTransport


def supervisor_pids(workdir: Path) -> list[int]:
    return [json.loads((run / "proc.json").read_text())["supervisor"]["pid"] for run in (workdir / "runs").iterdir()]


async def measure(seconds: float, workdir: Path) -> tuple[float, float, float, int]:
    client = AgentClient(LocalTransport(workdir))
    hello = await client.start()
    pid = hello["pid"]
    runs = [await client.request("launch", kind="train", argv=["sleep", str(seconds + 30)]) for _ in range(10)]
    subs = [await client.subscribe(run=r["run"]) for r in runs]
    gpu_sub = await client.subscribe(gpu_interval=1.0)
    samples = 0

    async def count_gpu_samples() -> None:
        nonlocal samples
        async for msg in gpu_sub:
            samples += msg["stream"] == "gpus" and len(msg["gpus"]) == 8

    counter = asyncio.create_task(count_gpu_samples())
    await asyncio.sleep(3)  # settle: initial stream catch-up
    supervisors = supervisor_pids(workdir)
    cpu0, sup0, t0 = cpu_seconds(pid), sum(map(cpu_seconds, supervisors)), time.monotonic()
    await asyncio.sleep(seconds)
    cpu1, sup1, t1 = cpu_seconds(pid), sum(map(cpu_seconds, supervisors)), time.monotonic()
    rss = rss_mib(pid)
    counter.cancel()
    for r in runs:
        await client.request("kill", run=r["run"], grace=2)
    del subs
    await client.close()
    per_supervisor = (sup1 - sup0) / (t1 - t0) * 100 / len(supervisors)
    return (cpu1 - cpu0) / (t1 - t0) * 100, rss, per_supervisor, samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    repo = Path(__file__).resolve().parent.parent
    os.environ["EAGLE3_NVML_MODULE"] = "tests.fake_nvml"
    os.environ.pop("FAKE_NVML_STATE", None)  # the double's default: 8 idle H200s
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        cpu, rss, supervisor, samples = asyncio.run(measure(args.seconds, Path(tmp)))
    print(f"agent idle-monitoring 10 runs + 8 GPUs at 1 Hz for {args.seconds:.0f} s ({samples} GPU samples seen)")
    print_table(
        [
            ("agent CPU, % of one core", f"{cpu:.2f}", "1.00", f"{cpu / 1.0:.2f}"),
            ("agent RSS, MB", f"{rss:.1f}", "80", f"{rss / 80:.2f}"),
            ("one supervisor's CPU (watch), % of one core", f"{supervisor:.2f}", "0.50", f"{supervisor / 0.5:.2f}"),
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
