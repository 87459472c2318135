"""A launch asked twice starts one run. The console names each launch (`launch_id`, one per user action) and,
when its link drops before the reply (the agent killed right after it started the run, a network gone), asks
again with the same name once the link is back: the run the first ask started is the answer, never a second.

The name is claimed in the store (`launches/ID`, made whole or not at all) before anything starts, by the agent
that handles it; the run made then carries it in its spec.json, which the store writes atomically with the
run. A second ask finds the run; or a claim whose agent still lives (still checking the launch: it is refused,
not doubled); or a claim whose agent died before it made a run (nothing started: the claim is taken over).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path
from typing import Any

from backends.fileio import atomic_write_json, private_dir, read_json
from backends.host import procinfo
from backends.protocol import LaunchResult
from backends.runs.control import OpError, launch_result
from backends.runs.store import LAUNCHES, SPEC, RunDir, RunStore

LAUNCH_ID = re.compile(r"^[A-Za-z0-9_-]{8,64}$")


def _claim_path(store: RunStore, launch_id: str) -> Path:
    if not LAUNCH_ID.match(launch_id):
        raise OpError("bad_args", "a launch id is 8 to 64 letters, digits, '-' or '_'")
    return store.workdir / LAUNCHES / launch_id


def claim(store: RunStore, launch_id: str) -> RunDir | None:
    """The run this launch id already started; else None, with the id now claimed by this agent (`release` it
    when nothing starts). OpError("launch_under_way") while another live agent is still launching it."""
    path = _claim_path(store, launch_id)
    me = procinfo.identify(os.getpid())
    record = {"agent": me.to_json() if me is not None else None, "run": None}
    private_dir(path.parent)
    for _ in range(3):
        if _created(path, record):
            return None
        held = read_json(path)
        run = started_by(store, launch_id, held.get("run") if isinstance(held, dict) else None)
        if run is not None:
            return run
        holder = procinfo.ProcIdentity.from_json(held.get("agent")) if isinstance(held, dict) else None
        if holder is not None and procinfo.is_alive(holder):
            raise OpError(
                "launch_under_way",
                f"this launch is still being started on the host (by agent pid {holder.pid}); "
                "`status` shows its run once it has one",
            )
        path.unlink(missing_ok=True)  # its agent died before it made a run: nothing was started
    raise OpError("launch_under_way", "this launch is being asked for from several places at once; ask once")


def _created(path: Path, record: dict[str, Any]) -> bool:
    """`path` made with `record` whole, unless it exists already: a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    atomic_write_json(tmp, record)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def started_by(store: RunStore, launch_id: str, recorded: object) -> RunDir | None:
    """The run whose spec carries `launch_id`: the one the claim names, else any (the agent may have died
    between making the run and naming it in the claim)."""
    ids = store.ids()
    candidates = [recorded] if isinstance(recorded, str) and recorded in ids else []
    for run_id in [*candidates, *reversed(ids)]:
        data = read_json(store.runs / run_id / SPEC)
        if isinstance(data, dict) and data.get("launch_id") == launch_id:
            return RunDir(store.runs / run_id)
    return None


def done(store: RunStore, launch_id: str, run: str) -> None:
    """Name the run in the claim: a later ask finds it without reading every run's spec."""
    with contextlib.suppress(OSError):
        atomic_write_json(_claim_path(store, launch_id), {"agent": None, "run": run})


def release(store: RunStore, launch_id: str) -> None:
    """The launch started nothing (refused, or failed before a run was made): a later ask may launch."""
    path = _claim_path(store, launch_id)
    if started_by(store, launch_id, None) is None:
        path.unlink(missing_ok=True)


def again(run: RunDir) -> LaunchResult:
    """The reply to a launch asked again: its run as it stands now (its checks were told the first time)."""
    return launch_result(run, None, None)
