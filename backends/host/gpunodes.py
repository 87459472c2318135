"""Which device mapping proves that a process NVML lists is the one holding that GPU here.

NVML lists compute processes by pid, and inside a container those are the host's pids, so such a pid
may name an unrelated process of ours in this pid namespace; its identity (pid plus start time) proves
only that it is the process we looked at. A CUDA context maps its GPU's device node (/dev/nvidiaN, N the
GPU's minor number) into its memory for its whole life, so a process counts as the GPU's holder only while
that node is among its mappings (/proc/PID/maps). An open file is not enough: on an H200 with driver 580, an
NVML-only process, `nvidia-smi dmon` and a CUDA process all hold /dev/nvidia0, /dev/nvidiactl and
/dev/nvidia-uvm open, but only the CUDA process maps /dev/nvidia0 (the others map /dev/nvidiactl alone).

The nodes are in /dev. The NVML module may name another folder through a function `eagle3_device_dir()`
(DEVICE_DIR_HOOK), read on every use: the test double tests/fake_nvml.py names a folder of plain files that
stand in for the nodes, which its GPU holder processes map. pynvml has no such function, so on a real host
the folder is always /dev; with nvidia-smi as the source it is /dev too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from backends.host import procinfo

DEVICE_DIR = Path("/dev")
DEVICE_DIR_HOOK = "eagle3_device_dir"
_GPU_NODE = re.compile(r"nvidia[0-9]+")


@dataclass(frozen=True)
class GpuNode:
    """A GPU's device node: `folder`/nvidia<minor>. With minor None (the source could not tell), the node
    of any GPU in `folder` counts."""

    folder: Path
    minor: int | None

    def __str__(self) -> str:
        return str(self.folder / f"nvidia{'N' if self.minor is None else self.minor}")

    def matches(self, target: str) -> bool:
        """True when `target` (a path from a memory map) is this node."""
        path = Path(target)
        if path.parent != self.folder:
            return False
        if self.minor is None:
            return _GPU_NODE.fullmatch(path.name) is not None
        return path.name == f"nvidia{self.minor}"


def not_held(pid: int, node: GpuNode) -> str | None:
    """Why `pid` is not proven to hold `node` (None: the node is mapped into its memory)."""
    mapped = procinfo.mapped_files(pid)
    if mapped is None:
        return "gone, or its memory map cannot be read, so it is not proven to hold the GPU"
    if any(node.matches(path) for path in mapped):
        return None
    return (
        f"does not hold an NVIDIA device here (no CUDA context mapping {node}): "
        "NVML's pid is likely from another pid namespace (a container?)"
    )
