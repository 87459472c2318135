"""Which GPUs a run was given: the CUDA_VISIBLE_DEVICES its child started with, as the supervisor sets it.

Read only to say where a run most likely is when NVML's pids match none of its processes (inside a container);
see `backends.host.gpus.infer_by_visible_devices`. Nothing here is proof of anything about a process.
"""

from __future__ import annotations

from collections.abc import Iterable

from backends.host.gpus import VISIBLE_DEVICES
from backends.runs.store import RunStore, StoreError
from backends.runs.supervise import child_env


def visible_devices(store: RunStore, run_ids: Iterable[str]) -> dict[str, str]:
    """Run id -> the CUDA_VISIBLE_DEVICES its child was started with (its --env, else its --gpus, else what the
    supervisor had); runs whose child saw every GPU (the variable unset), or whose record cannot be read, are
    left out."""
    visible: dict[str, str] = {}
    for run_id in run_ids:
        try:
            run = store.get(run_id)
            spec = run.spec()
        except StoreError:  # removed or corrupt since the lookup: it places nothing
            continue
        value = child_env(run, spec.env, spec.gpus).get(VISIBLE_DEVICES)
        if value is not None:
            visible[run_id] = value
    return visible
