"""The console's GPU panel against a real GPU (run on the lent H200): what it draws from the agent's status,
beside what nvidia-smi says at the same moments.

    PYTHONPATH=$PWD/build/devicepkgs:$PWD python -m benchmarks.gpu_panel_check

(`build/devicepkgs`: textual and rich copied from .venv, for a machine without them.) A process holds 4.6 GB
and another runs bf16 matmuls for a while then stops; every 2 s, as the console polls, the real agent's status
(NVML) goes into the panel's history while nvidia-smi is read too. Prints the samples side by side, then the
panel as drawn (its sparklines over the 30 s polled) at the widths of its column at 100 and 160 terminal
columns, with the busy run selected.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from backends.protocol import GpuInfo, RunInfo
from benchmarks._common import print_table
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.tui.gpu_panel import GpuHistory, Selection, gpu_text

POLL_S = 2.0
POLLS = 15
BUSY_S = 14  # the matmuls stop half way through: the sparkline falls
WORK = (
    "import sys, time, torch\n"
    "x = torch.empty(4600 * 2**20, dtype=torch.uint8, device='cuda')\n"
    "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
    f"end = time.time() + {BUSY_S}\n"
    "while time.time() < end: a @ a\n"
    "torch.cuda.synchronize(); print('idle now', flush=True); time.sleep(600)\n"
)
PANEL_WIDTHS = (53, 86)  # the left column's inside at 100 and 160 terminal columns


def smi() -> list[tuple[int, int]]:
    """(util %, memory used MiB) of each GPU, as nvidia-smi says."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [(int(u), int(m)) for u, m in (line.split(", ") for line in out.strip().splitlines())]


async def check(workdir: Path) -> None:
    history = GpuHistory()
    rows: list[list[str]] = []
    gpus: list[GpuInfo] = []
    async with AgentClient(LocalTransport(workdir)) as client:
        run = (await client.launch("train", [sys.executable, "-c", WORK], name="busy"))["run"]
        start = time.monotonic()
        for _ in range(POLLS):
            status = await client.status(gpus=True)
            now = time.monotonic()
            gpus = status.get("gpus") or []
            history.add(gpus, now)
            seen = smi()
            for gpu, (util, used) in zip(gpus, seen, strict=False):
                rows.append(
                    [
                        f"{now - start:.0f}",
                        str(gpu["index"]),
                        f"{gpu['util']}",
                        str(util),
                        f"{gpu['mem_used_mib']}",
                        str(used),
                        str(sum(p.get("run_id") == run for p in gpu["processes"])),
                    ]
                )
            await asyncio.sleep(POLL_S)
        info: RunInfo = await client.run_info(run)
        await client.kill(run, signal="KILL", grace=0.0)
    print(f"GPU source: {status['gpu_source']}; {len(gpus)} GPU(s); the busy run is {run}")
    print_table(rows, headers=("t s", "gpu", "util nvml", "util smi", "MiB nvml", "MiB smi", "run's procs"))
    for width in PANEL_WIDTHS:
        print(f"\nthe panel at {width} columns, the busy run selected:")
        drawn = gpu_text(gpus, history, time.monotonic(), width, None, Selection.of(info), window=POLLS * POLL_S)
        print(drawn.plain)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(check(Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
