"""A stand-in for pynvml, driven by a JSON state file, for tests and benchmarks on hosts without GPUs.

Select it with EAGLE3_NVML_MODULE=tests.fake_nvml. The JSON file named by
$FAKE_NVML_STATE describes the GPUs (see `write_state` and `gpu`) and is read
again on every call, so another process can change it mid-run. As on a real GPU:
a listed process counts only while its pid is alive and not a zombie; used
memory is base_used_mib plus the live processes' mem_mib, so killing a process
releases its memory; the driver's reserved_mib counts as used only in the v1
memory call. `fail` names fields (of FIELDS) whose call raises NVMLError.
`host_processes` are listed as NVML lists processes inside a container: under
pids of the host's pid namespace, so they count whatever this namespace holds
under that number. Each GPU has a UUID (`gpu_uuid`) and, with `mig`, MIG devices
with the UUIDs given. Without $FAKE_NVML_STATE: 8 idle H200s.

Device nodes: free-gpus stops a listed process only while its GPU's device node
is mapped into its memory, as a CUDA context's is (backends/host/gpunodes.py).
There are no /dev/nvidiaN here, so the state's `dev_dir` names a folder of plain
files standing in for them (`stand_in_nodes` makes it), and `eagle3_device_dir`
hands that folder to the sampler, the seam gpunodes documents; pynvml has no such
function, so a real host always uses /dev. A test's GPU holder maps
`dev_dir`/nvidiaN (N being the GPU's minor number, which is its index here) with
MAP_NODES, or is HOLDER itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

STATE_ENV = "FAKE_NVML_STATE"
NVML_TEMPERATURE_GPU = 0
nvmlMemory_v2 = 0x02000028
MIB = 1024 * 1024
FIELDS = ("name", "util", "memory", "temperature", "power", "processes", "minor")
H200_MIB = 143771

# Python that maps the stand-in nodes named by its arguments, as a CUDA context maps its GPU's node; the files
# are closed again (the mappings stay), and `nodes` holds the mappings.
MAP_NODES = (
    "import mmap, sys\n"
    "def _map(path):\n"
    "    with open(path, 'rb') as node:\n"
    "        return mmap.mmap(node.fileno(), 0, access=mmap.ACCESS_READ)\n"
    "nodes = [_map(path) for path in sys.argv[1:]]\n"
)
# A GPU holder: maps the nodes named by its arguments, says "ready", sleeps (argv: python -c HOLDER NODE...).
HOLDER = MAP_NODES + "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


class NVMLError(Exception):
    def __init__(self, value: str) -> None:
        super().__init__(value)
        self.value = value


# nvmlInit/nvmlShutdown nest like the real library's reference count.
_init_count = 0


def gpu(
    *,
    name: str = "NVIDIA H200",
    util: int = 0,
    mem_util: int = 0,
    mem_total_mib: int = H200_MIB,
    base_used_mib: int = 0,
    reserved_mib: int = 0,
    temp_c: int = 30,
    power_w: float = 75.0,
    processes: Iterable[tuple[int, int | None]] = (),
    host_processes: Iterable[tuple[int, int | None]] = (),
    mig: Iterable[str] = (),
    fail: Iterable[str] = (),
) -> dict[str, Any]:
    """One GPU of the state file; `processes` and `host_processes` are (pid, mem_mib) pairs."""
    unknown = set(fail) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown fail field(s) {sorted(unknown)}; known: {FIELDS}")
    return {
        "name": name,
        "util": util,
        "mem_util": mem_util,
        "mem_total_mib": mem_total_mib,
        "base_used_mib": base_used_mib,
        "reserved_mib": reserved_mib,
        "temp_c": temp_c,
        "power_w": power_w,
        "processes": [{"pid": pid, "mem_mib": mem} for pid, mem in processes]
        + [{"pid": pid, "mem_mib": mem, "host": True} for pid, mem in host_processes],
        "mig": list(mig),
        "fail": list(fail),
    }


def write_state(
    path: Path,
    gpus: list[dict[str, Any]],
    *,
    init_fails: bool = False,
    smi_fails: bool = False,
    dev_dir: Path | None = None,
) -> Path:
    """Write the state file atomically (readers in other processes never see half of it); `dev_dir` is the
    folder of stand-in device nodes (`stand_in_nodes`), /dev without it."""
    state = {"gpus": gpus, "init_fails": init_fails, "smi_fails": smi_fails}
    if dev_dir is not None:
        state["dev_dir"] = str(dev_dir)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)
    return path


def stand_in_nodes(folder: Path, count: int = 8) -> Path:
    """A folder of plain files named as a GPU host's device nodes (nvidia0.., nvidiactl, nvidia-uvm), one page
    each so that they can be mapped, for `write_state(dev_dir=...)`; returned as the kernel names it (no
    symlinks), as /proc/PID/maps does."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"nvidia{index}" for index in range(count)] + ["nvidiactl", "nvidia-uvm"]:
        (folder / name).write_bytes(bytes(4096))
    return folder.resolve()


def read_state() -> dict[str, Any]:
    path = os.environ.get(STATE_ENV)
    if not path:
        return {"gpus": [gpu() for _ in range(8)]}
    state: dict[str, Any] = json.loads(Path(path).read_text())
    return state


def gpu_uuid(index: int) -> str:
    return f"GPU-fa4e0000-0000-0000-0000-{index:012d}"


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie: what a GPU driver would still count as holding memory."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[:1] != [b"Z"]


def live_processes(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in entry.get("processes", []) if p.get("host") or pid_alive(p["pid"])]


def used_mib(entry: dict[str, Any]) -> int:
    return int(entry.get("base_used_mib", 0)) + sum(p["mem_mib"] or 0 for p in live_processes(entry))


def _gpu(handle: SimpleNamespace, field: str) -> dict[str, Any]:
    if _init_count <= 0:
        raise NVMLError("Uninitialized")
    gpus = read_state()["gpus"]
    if handle.index >= len(gpus):
        raise NVMLError("GPU is lost")
    entry: dict[str, Any] = gpus[handle.index]
    if field in entry.get("fail", []):
        raise NVMLError(f"{field}: Not Supported")
    return entry


def eagle3_device_dir() -> str:
    """The folder whose nvidia* files count as device nodes (see the module's docstring)."""
    return str(read_state().get("dev_dir", "/dev"))


def init_count() -> int:
    """nvmlInit calls not yet shut down, in this process (another test's open sampler among them)."""
    return _init_count


def nvmlInit() -> None:
    global _init_count
    if read_state().get("init_fails"):
        raise NVMLError("Driver Not Loaded")
    _init_count += 1


def nvmlShutdown() -> None:
    global _init_count
    if _init_count <= 0:
        raise NVMLError("Uninitialized")
    _init_count -= 1


def nvmlDeviceGetCount() -> int:
    if _init_count <= 0:
        raise NVMLError("Uninitialized")
    return len(read_state()["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> SimpleNamespace:
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError("Invalid Argument")
    return SimpleNamespace(index=index)


def nvmlDeviceGetName(handle: SimpleNamespace) -> str:
    return str(_gpu(handle, "name")["name"])


def nvmlDeviceGetUtilizationRates(handle: SimpleNamespace) -> SimpleNamespace:
    entry = _gpu(handle, "util")
    return SimpleNamespace(gpu=entry["util"], memory=entry.get("mem_util", 0))


def nvmlDeviceGetMemoryInfo(handle: SimpleNamespace, version: int | None = None) -> SimpleNamespace:
    """v1 counts the driver's reserved memory as used; v2 (and nvidia-smi) do not."""
    entry = _gpu(handle, "memory")
    total = entry["mem_total_mib"] * MIB
    used = used_mib(entry) * MIB
    reserved = entry.get("reserved_mib", 0) * MIB
    if version is None:
        return SimpleNamespace(total=total, used=used + reserved, free=total - used - reserved)
    if version != nvmlMemory_v2:
        raise NVMLError("Argument Version Mismatch")
    return SimpleNamespace(version=version, total=total, reserved=reserved, free=total - used - reserved, used=used)


def nvmlDeviceGetTemperature(handle: SimpleNamespace, sensor: int) -> int:
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError("Invalid Argument")
    return int(_gpu(handle, "temperature")["temp_c"])


def nvmlDeviceGetPowerUsage(handle: SimpleNamespace) -> int:
    return round(float(_gpu(handle, "power")["power_w"]) * 1000)  # milliwatts, as NVML reports


def nvmlDeviceGetComputeRunningProcesses(handle: SimpleNamespace) -> list[SimpleNamespace]:
    entry = _gpu(handle, "processes")
    return [
        SimpleNamespace(pid=p["pid"], usedGpuMemory=None if p["mem_mib"] is None else p["mem_mib"] * MIB)
        for p in live_processes(entry)
    ]


def nvmlDeviceGetMinorNumber(handle: SimpleNamespace) -> int:
    """N of the GPU's /dev/nvidiaN: its index here."""
    _gpu(handle, "minor")
    return int(handle.index)


# MIG slots per GPU, as an H200's: slots without a MIG device raise NotFound.
MAX_MIG_DEVICES = 7


def nvmlDeviceGetUUID(handle: SimpleNamespace) -> str:
    entry = _gpu(handle, "name")
    mig = getattr(handle, "mig", None)
    return gpu_uuid(handle.index) if mig is None else str(entry["mig"][mig])


def nvmlDeviceGetMaxMigDeviceCount(handle: SimpleNamespace) -> int:
    _gpu(handle, "name")
    return MAX_MIG_DEVICES


def nvmlDeviceGetMigDeviceHandleByIndex(handle: SimpleNamespace, slot: int) -> SimpleNamespace:
    if slot >= len(_gpu(handle, "name").get("mig", [])):
        raise NVMLError("Not Found")
    return SimpleNamespace(index=handle.index, mig=slot)
