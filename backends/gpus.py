"""GPU telemetry: the one module that calls NVML, with nvidia-smi and "none" as fallbacks.

The source is chosen once, when a GpuSampler is made: NVML through the module
named by $EAGLE3_NVML_MODULE (default `pynvml`, from nvidia-ml-py), else the
CSV queries of `nvidia-smi`, else nothing. Every NVML call goes through `_nvml`,
which turns any failure into None, so a missing function, a MIG quirk or a GPU
that fell off the bus shows as "n/a" in one field, never as an exception.
"""

from __future__ import annotations

import importlib
import math
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any

from backends import procinfo
from backends.protocol import GpuInfo, GpuProcess, GpuSourceName

NVML_MODULE_ENV = "EAGLE3_NVML_MODULE"
DEFAULT_NVML_MODULE = "pynvml"
SMI_TIMEOUT_S = 5.0
SMI_GPU_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
)
SMI_APP_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "used_memory")
_MIB = 1024 * 1024

OwnerOf = Callable[[int], "str | None"]


def _nvml(call: Callable[[], Any]) -> Any:
    """Run one NVML call; any failure at all means "not available" (None)."""
    try:
        return call()
    except Exception:  # NVMLError subclasses, a function missing from an old driver, ctypes errors
        return None


def _as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bytes_to_mib(value: object) -> int | None:
    count = _as_int(value)
    return None if count is None else count // _MIB


def _as_text(value: object) -> str | None:
    # Older nvidia-ml-py releases return names as bytes.
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None


def _empty_gpu(index: int) -> GpuInfo:
    return {
        "index": index,
        "name": None,
        "util": None,
        "mem_util": None,
        "mem_used_mib": None,
        "mem_total_mib": None,
        "temp_c": None,
        "power_w": None,
        "processes": [],
    }


@dataclass(frozen=True)
class SmiGpu:
    """One line of `nvidia-smi --query-gpu=<SMI_GPU_FIELDS>`."""

    uuid: str
    info: GpuInfo


@dataclass(frozen=True)
class SmiApp:
    """One line of `nvidia-smi --query-compute-apps=<SMI_APP_FIELDS>`."""

    gpu_uuid: str
    pid: int
    mem_mib: int | None


def smi_number(text: str) -> float | None:
    """A CSV value as a number; "[N/A]", "[Not Supported]" and any other non-number are None."""
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def smi_int(text: str) -> int | None:
    value = smi_number(text)
    return None if value is None else int(value)


def smi_text(text: str) -> str | None:
    value = text.strip()
    return None if not value or (value.startswith("[") and value.endswith("]")) else value


def parse_smi_gpus(text: str) -> tuple[list[SmiGpu], list[str]]:
    """Parse `--query-gpu` output; returns the GPUs and the lines not understood."""
    gpus: list[SmiGpu] = []
    rejected: list[str] = []
    numeric = len(SMI_GPU_FIELDS) - 3  # everything after index, uuid, name
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(",")
        index = smi_int(fields[0])
        if len(fields) < len(SMI_GPU_FIELDS) or index is None or index < 0:
            rejected.append(line)
            continue
        # A name may itself hold a comma; the fields around it are fixed.
        util, mem_util, used, total, temp, power = fields[-numeric:]
        info: GpuInfo = {
            "index": index,
            "name": smi_text(",".join(fields[2:-numeric])),
            "util": smi_int(util),
            "mem_util": smi_int(mem_util),
            "mem_used_mib": smi_int(used),
            "mem_total_mib": smi_int(total),
            "temp_c": smi_int(temp),
            "power_w": smi_number(power),
            "processes": [],
        }
        gpus.append(SmiGpu(fields[1].strip(), info))
    return gpus, rejected


def parse_smi_apps(text: str) -> tuple[list[SmiApp], list[str]]:
    """Parse `--query-compute-apps` output; returns the processes and the lines not understood."""
    apps: list[SmiApp] = []
    rejected: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(",")
        pid = smi_int(fields[1]) if len(fields) == len(SMI_APP_FIELDS) else None
        if pid is None or pid <= 0:
            rejected.append(line)
            continue
        apps.append(SmiApp(fields[0].strip(), pid, smi_int(fields[2])))
    return apps, rejected


class SmiError(Exception):
    """nvidia-smi could not be run, timed out or failed."""


class GpuSampler:
    """Samples every GPU of this host from the best source found at creation.

    `owner_of(pid)` names the run a GPU process belongs to (None: no run of ours).
    `fallback_reason` says why the source is not NVML; `last_error` says what the
    latest sample could not read (None when it read everything).
    """

    def __init__(self, owner_of: OwnerOf | None = None) -> None:
        self._owner_of = owner_of
        self._nvml_module: ModuleType | None = None
        self._smi_path: str | None = None
        self.fallback_reason: str | None = None
        self.last_error: str | None = None
        self.source: GpuSourceName
        nvml_problem = self._start_nvml()
        if nvml_problem is None:
            self.source = "nvml"
            return
        smi_problem = self._find_smi()
        if smi_problem is None:
            self.source = "nvidia-smi"
            self.fallback_reason = nvml_problem
        else:
            self.source = "none"
            self.fallback_reason = f"{nvml_problem}; {smi_problem}"

    def __enter__(self) -> GpuSampler:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def sample(self) -> list[GpuInfo]:
        """Every GPU now, by index; [] when no source works. Never raises."""
        if self._nvml_module is not None:
            return self._sample_nvml(self._nvml_module)
        if self._smi_path is not None:
            try:
                return self._sample_smi(self._smi_path)
            except SmiError as exc:
                self.last_error = str(exc)
        return []

    def close(self) -> None:
        """Release NVML; later samples are empty."""
        module, self._nvml_module = self._nvml_module, None
        self._smi_path = None
        if module is not None:
            _nvml(module.nvmlShutdown)

    def _start_nvml(self) -> str | None:
        name = os.environ.get(NVML_MODULE_ENV) or DEFAULT_NVML_MODULE
        try:
            module = importlib.import_module(name)
            module.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError (no driver), OSError from ctypes alike
            return f"NVML ({name}) unavailable: {exc or type(exc).__name__}"
        self._nvml_module = module
        return None

    def _find_smi(self) -> str | None:
        path = shutil.which("nvidia-smi")
        if path is None:
            return "nvidia-smi not on PATH"
        # nvidia-smi exists on hosts whose driver is broken; only one that answers counts.
        try:
            _run_smi(path, "--query-gpu", SMI_GPU_FIELDS)
        except SmiError as exc:
            return str(exc)
        self._smi_path = path
        return None

    def _sample_nvml(self, nvml: ModuleType) -> list[GpuInfo]:
        count = _as_int(_nvml(nvml.nvmlDeviceGetCount))
        if count is None:
            self.last_error = "NVML could not count the GPUs"
            return []
        problems: list[str] = []
        gpus = [self._nvml_gpu(nvml, index, problems) for index in range(count)]
        self.last_error = "; ".join(problems) or None
        return gpus

    def _nvml_gpu(self, nvml: ModuleType, index: int, problems: list[str]) -> GpuInfo:
        handle = _nvml(lambda: nvml.nvmlDeviceGetHandleByIndex(index))
        if handle is None:
            problems.append(f"GPU {index}: NVML gave no handle")
            return _empty_gpu(index)
        # Memory info v2 leaves the driver's reserved memory out of "used", as nvidia-smi does
        # (v1 counts it: 615 MiB "used" on an idle H200); v1 only where the driver or binding lacks v2.
        memory = _nvml(lambda: nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2))
        if memory is None:
            memory = _nvml(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        power_mw = _as_int(_nvml(lambda: nvml.nvmlDeviceGetPowerUsage(handle)))
        rates = _nvml(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        info: GpuInfo = {
            "index": index,
            "name": _as_text(_nvml(lambda: nvml.nvmlDeviceGetName(handle))),
            "util": _as_int(getattr(rates, "gpu", None)),
            "mem_util": _as_int(getattr(rates, "memory", None)),
            "mem_used_mib": _bytes_to_mib(getattr(memory, "used", None)),
            "mem_total_mib": _bytes_to_mib(getattr(memory, "total", None)),
            "temp_c": _as_int(_nvml(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
            "power_w": None if power_mw is None else power_mw / 1000,
            "processes": [],
        }
        listed = _nvml(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        if not isinstance(listed, list):
            problems.append(f"GPU {index}: NVML could not list compute processes")
            return info
        for entry in listed:
            pid = _as_int(getattr(entry, "pid", None))
            if pid is None:
                problems.append(f"GPU {index}: NVML listed a process without a pid")
                continue
            info["processes"].append(self._process(pid, _bytes_to_mib(getattr(entry, "usedGpuMemory", None)), problems))
        return info

    def _sample_smi(self, path: str) -> list[GpuInfo]:
        gpus, bad_gpus = parse_smi_gpus(_run_smi(path, "--query-gpu", SMI_GPU_FIELDS))
        apps, bad_apps = parse_smi_apps(_run_smi(path, "--query-compute-apps", SMI_APP_FIELDS))
        problems = [f"nvidia-smi line not understood: {line!r}" for line in bad_gpus + bad_apps]
        by_uuid = {gpu.uuid: gpu.info for gpu in gpus}
        for app in apps:
            info = by_uuid.get(app.gpu_uuid)
            if info is None:
                problems.append(f"nvidia-smi listed pid {app.pid} on unknown GPU {app.gpu_uuid}")
                continue
            info["processes"].append(self._process(app.pid, app.mem_mib, problems))
        self.last_error = "; ".join(problems) or None
        return sorted((gpu.info for gpu in gpus), key=lambda info: info["index"])

    def _process(self, pid: int, mem_mib: int | None, problems: list[str]) -> GpuProcess:
        run_id: str | None = None
        if self._owner_of is not None:
            try:
                run_id = self._owner_of(pid)
            except Exception as exc:  # a sample must never raise, even when the lookup is broken
                problems.append(f"run lookup for pid {pid} failed: {exc}")
        return {
            "pid": pid,
            "user": procinfo.user_name(procinfo.proc_uid(pid)),
            "mem_mib": mem_mib,
            "run_id": run_id,
        }


def _run_smi(path: str, query: str, fields: tuple[str, ...]) -> str:
    argv = [path, f"{query}={','.join(fields)}", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SmiError(f"nvidia-smi failed: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip())[:300]
        raise SmiError(f"nvidia-smi exited with status {done.returncode}: {said}")
    return done.stdout
