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
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from backends.host import procinfo
from backends.host.gpunodes import DEVICE_DIR, DEVICE_DIR_HOOK, GpuNode
from backends.protocol import GpuInfo, GpuProcess, GpuSourceName, InferredHolder

NVML_MODULE_ENV = "EAGLE3_NVML_MODULE"
DEFAULT_NVML_MODULE = "pynvml"
# pynvml comes from nvidia-ml-py, which the `agent` extra (pyproject.toml) pins for the agent's host.
NVML_INSTALL_HINT = (
    "install nvidia-ml-py beside the agent (pip install nvidia-ml-py, or the eagle3-console[agent] extra)"
)
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
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


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
        self._smi_uuids: dict[str, int] = {}  # from the latest nvidia-smi sample, which reads them anyway
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

    def uuids(self) -> dict[str, int]:
        """GPU index by UUID (`GPU-…`), MIG devices' UUIDs (`MIG-…`) by their GPU's index; asked for only when
        a run's CUDA_VISIBLE_DEVICES names GPUs by UUID, so sampling never pays for it."""
        if self._nvml_module is not None:
            return _nvml_uuids(self._nvml_module)
        return dict(self._smi_uuids)

    def gpu_node(self, index: int) -> GpuNode:
        """The device node whose holding proves a process holds GPU `index` (see gpunodes); asked for only by
        free-gpus, so sampling never pays for it. NVML gives the GPU's minor number; nvidia-smi does not."""
        nvml = self._nvml_module
        if nvml is None:
            return GpuNode(DEVICE_DIR, None)
        hook = getattr(nvml, DEVICE_DIR_HOOK, None)  # the test double's stand-in nodes; pynvml has none
        folder = DEVICE_DIR if hook is None else Path(hook())
        minor = _nvml(lambda: nvml.nvmlDeviceGetMinorNumber(nvml.nvmlDeviceGetHandleByIndex(index)))
        return GpuNode(folder, _as_int(minor))

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
            said = f"NVML ({name}) unavailable: {exc or type(exc).__name__}"
            missing = isinstance(exc, ModuleNotFoundError) and exc.name == name == DEFAULT_NVML_MODULE
            return f"{said}; {NVML_INSTALL_HINT}" if missing else said
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
        self._smi_uuids = {gpu.uuid: gpu.info["index"] for gpu in gpus}
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


def _nvml_uuids(nvml: ModuleType) -> dict[str, int]:
    uuids: dict[str, int] = {}
    for index in range(_as_int(_nvml(nvml.nvmlDeviceGetCount)) or 0):
        uuids.update(dict.fromkeys(_nvml_gpu_uuids(nvml, index), index))
    return uuids


def _nvml_gpu_uuids(nvml: ModuleType, index: int) -> list[str]:
    """GPU `index`'s UUID and its MIG devices' UUIDs (none where NVML cannot tell)."""
    handle = _nvml(lambda: nvml.nvmlDeviceGetHandleByIndex(index))
    if handle is None:
        return []
    found = [_as_text(_nvml(lambda: nvml.nvmlDeviceGetUUID(handle)))]
    # A MIG-capable GPU has up to this many MIG devices; the slots not in use raise NotFound (None here).
    for slot in range(_as_int(_nvml(lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle))) or 0):
        found.append(_mig_uuid(nvml, handle, slot))
    return [uuid for uuid in found if uuid]


def _mig_uuid(nvml: ModuleType, handle: object, slot: int) -> str | None:
    return _as_text(_nvml(lambda: nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))))


_INDEX = re.compile(r"[0-9]+")


def visible_indices(value: str, indices: Iterable[int], uuids: Callable[[], Mapping[str, int]]) -> list[int]:
    """The GPUs (by index) a CUDA_VISIBLE_DEVICES value names, read as CUDA reads it: comma-separated indices,
    GPU UUIDs (`GPU-…`, a unique prefix will do) or MIG devices (`MIG-…`, or the older `MIG-GPU-…/gi/ci`; a MIG
    device counts as its GPU); the list ends at the first entry that names no GPU here, as CUDA's does.
    Indices are taken as NVML's, which CUDA's match when CUDA_DEVICE_ORDER=PCI_BUS_ID or the GPUs are alike.
    `uuids()` (GPU index by UUID) is called only when an entry is a UUID."""
    known = set(indices)
    found: list[int] = []
    by_uuid: Mapping[str, int] | None = None
    for entry in (part.strip() for part in value.split(",")):
        if _INDEX.fullmatch(entry):
            index: int | None = int(entry) if int(entry) in known else None
        elif entry.startswith(("GPU-", "MIG-")):
            by_uuid = uuids() if by_uuid is None else by_uuid
            index = _by_uuid(entry, by_uuid)
        else:
            index = None
        if index is None:
            break
        if index not in found:
            found.append(index)
    return found


def _by_uuid(entry: str, by_uuid: Mapping[str, int]) -> int | None:
    if entry.startswith("MIG-GPU-"):  # drivers before R470 named a MIG device by its GPU's UUID
        entry = entry.removeprefix("MIG-").split("/", 1)[0]
    matches = {index for uuid, index in by_uuid.items() if uuid.startswith(entry)}
    return matches.pop() if len(matches) == 1 else None


def infer_by_visible_devices(
    gpus: list[GpuInfo],
    live_runs: Iterable[str],
    visible_of: Callable[[list[str]], Mapping[str, str]],
    uuids: Callable[[], Mapping[str, int]],
) -> None:
    """Mark on each GPU the live runs that no listed GPU process was matched to, by the GPUs their
    CUDA_VISIBLE_DEVICES names (`visible_of(runs)`: run id -> its value, for those that set it), each with
    `inferred_from`.

    Inside a container NVML lists processes under the host's pids (nvitop #134, NVIDIA/nvidia-docker#1483), so
    no pid matches a run's processes there. This says where a run most likely is, for the eye only: it proves
    nothing about any process, and free-gpus and kill never read it (they act on processes proven ours)."""
    matched = {p["run_id"] for gpu in gpus for p in gpu["processes"] if p["run_id"]}
    unmatched = sorted(set(live_runs) - matched)
    if not gpus or not unmatched:
        return
    by_index = {gpu["index"]: gpu for gpu in gpus}
    visible = visible_of(unmatched)
    for run_id in unmatched:
        for index in visible_indices(visible.get(run_id, ""), by_index, uuids):
            holder: InferredHolder = {"run_id": run_id, "inferred_from": VISIBLE_DEVICES}
            by_index[index].setdefault("inferred", []).append(holder)


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
