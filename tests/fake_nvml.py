"""A stand-in for pynvml, driven by a JSON state file, for tests and benchmarks on hosts without GPUs.

Select it with EAGLE3_NVML_MODULE=tests.fake_nvml. The JSON file named by
$FAKE_NVML_STATE describes the GPUs (see `write_state` and `gpu`) and is read
again on every call, so another process can change it mid-run. As on a real GPU:
a listed process counts only while its pid is alive and not a zombie; used
memory is base_used_mib plus the live processes' mem_mib, so killing a process
releases its memory; the driver's reserved_mib counts as used only in the v1
memory call. `fail` names fields (of FIELDS) whose call raises NVMLError.
Without $FAKE_NVML_STATE: 8 idle H200s.
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
FIELDS = ("name", "util", "memory", "temperature", "power", "processes")
H200_MIB = 143771


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
    fail: Iterable[str] = (),
) -> dict[str, Any]:
    """One GPU of the state file; `processes` are (pid, mem_mib) pairs."""
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
        "processes": [{"pid": pid, "mem_mib": mem} for pid, mem in processes],
        "fail": list(fail),
    }


def write_state(path: Path, gpus: list[dict[str, Any]], *, init_fails: bool = False, smi_fails: bool = False) -> Path:
    """Write the state file atomically (readers in other processes never see half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"gpus": gpus, "init_fails": init_fails, "smi_fails": smi_fails}))
    os.replace(tmp, path)
    return path


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
    return [p for p in entry.get("processes", []) if pid_alive(p["pid"])]


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


def initialized() -> bool:
    return _init_count > 0


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
