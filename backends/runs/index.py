"""The run store's index (`INDEX`, beside runs/): which runs have ended for good, so that a look at the store reads
the live runs and the few ended ones it shows, not every run's folder (issue 28: `status` took 0.25 ms per ended
run, 592 ms with 2,000 of them).

A run is settled once nothing can change its state (`store.derive_state`'s) any more: its exit record is there and
older than SETTLE_S (a kill records its signal before sending it, and exit.json is written once), or it is `lost`
with its supervisor on record (a process that is gone never comes back). Of a settled run the index keeps when it
ended, which orders the ended runs and counts those a look leaves out; a run that is shown is read from its own
folder, its state derived there, as every run was before. Every other run (live, starting, just ended, corrupt: a
file may be repaired) is derived afresh at each look.

It is a cache, rebuilt from the run folders without a word when it is missing, unreadable, not its owner's alone,
or of another release (whose rules may derive states otherwise). It is written whole (`fileio.atomic_write_bytes`:
a crash leaves the old index or the new one, never half of one), and only when what it says changed. Two agents
that write it at once lose nothing but the other's additions, which the next look finds again. The folder listing
is skipped while runs/ is unchanged since the index listed it: its mtime, trusted as git trusts its index's, only
when it was RACY_S older than the listing (a run made in the same clock tick as the listing would change nothing).
"""

from __future__ import annotations

import binascii
import bisect
import json
import os
import time
from typing import Any

import backends
from backends.fileio import atomic_write_bytes, sweep_atomic_leftovers
from backends.protocol import RunInfo
from backends.runs.store import EXIT, INDEX, OUTPUT, RUN_ID_RE, CorruptFile, RunDir, RunStore

FORMAT = 1
SETTLE_S = 10.0  # an exit record this old is the run's last word
RACY_S = 2.0  # runs/ unchanged this long before its listing: the listing holds until its mtime moves
SETTLED_STATES = frozenset({"exited", "failed", "killed", "lost"})  # of TERMINAL_STATES, all but `corrupt`
LEFTOVER_S = 60.0  # a temp file of the index this old is a writer's that died mid-write: a write takes milliseconds


class Look:
    """The store as its index and its folder listing tell it: the settled runs (`ended`: when each ended and its id,
    oldest first) and every other run (`unsettled`), whose state is to be derived now."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.unsettled: list[RunDir] = []
        self._ended: list[tuple[float, str]] | None = []
        # The index's settled runs as written, a line each, read only where they are asked for (`newest`): a look
        # that pages its status reads the last lines, not 20,000 (parsed whole, they took 8 ms).
        self._lines = ""
        self._mtime_ns: int | None = None  # runs/'s when listed
        self._listed_at = 0.0
        self._changed = False

    @property
    def ended(self) -> list[tuple[float, str]]:
        if self._ended is None:
            self._ended = [_entry(line) for line in self._lines.splitlines()]
        return self._ended

    def count(self) -> int:
        """How many runs are settled."""
        return self._lines.count("\n") if self._ended is None else len(self._ended)

    def newest(self, count: int | None) -> list[tuple[float, str]]:
        """The `count` settled runs that ended last (None: all), newest first."""
        if self._ended is None and count is not None:
            return [_entry(line) for line in reversed(self._lines.rsplit("\n", count + 1)[-count - 1 : -1])]
        return self.ended[::-1] if count is None else self.ended[: -count - 1 : -1]

    def settle(self, run: RunDir, info: RunInfo) -> bool:
        """Keep `run` as settled when `info` (derived just now) shows it ended for good; whether it did."""
        state = info["state"]
        if state == "lost":
            if run.supervisor() is None:
                return False  # a supervisor that never recorded itself may yet do so
        elif state in SETTLED_STATES:
            written = _mtime(run, EXIT)
            if written is None or time.time() - written < SETTLE_S:
                return False
        else:
            return False
        bisect.insort(self.ended, (ended_time(run, info), run.id))
        self.unsettled = [r for r in self.unsettled if r.id != run.id]
        self._changed = True
        return True

    def save(self) -> None:
        """Write the index when it changed; a store that cannot take it is only slower (nothing said)."""
        if not self._changed or self._mtime_ns is None:
            return
        lines = "".join(f"{at!r} {run_id}\n" for at, run_id in self.ended)
        data = {
            "format": FORMAT,
            "release": backends.__version__,
            "runs_mtime_ns": self._mtime_ns,
            "listed_at": self._listed_at,
            "others": [run.id for run in self.unsettled],
            "ended": lines,  # `at id` a line, oldest first
            "crc": binascii.crc32(lines.encode()),
        }
        try:
            atomic_write_bytes(self.store.workdir / INDEX, json.dumps(data, separators=(",", ":")).encode())
        except OSError:
            return
        self._changed = False


def look(store: RunStore) -> Look:
    """The store's runs now: the index's settled runs still there, every other run to be derived. A run new to the
    index (every run, when it is rebuilt) is settled here if its exit record says so, without deriving the rest."""
    seen = Look(store)
    kept = _read(store)
    listed_at = time.time()
    try:
        mtime_ns = os.stat(store.runs).st_mtime_ns
    except OSError:
        return seen  # no runs yet: nothing to index
    others: list[str] = []
    if kept is not None and kept["runs_mtime_ns"] == mtime_ns and kept["listed_at"] > mtime_ns / 1e9 + RACY_S:
        seen._mtime_ns, seen._listed_at = mtime_ns, kept["listed_at"]
        seen._ended, seen._lines = None, kept["ended"]
        others = kept["others"]
    else:
        seen._mtime_ns, seen._listed_at, seen._changed = mtime_ns, listed_at, True
        ids = store.ids()
        present = set(ids)
        if kept is not None:
            seen._ended = [e for e in map(_entry, kept["ended"].splitlines()) if e[1] in present]
        settled = {run_id for _, run_id in seen.ended}
        known = set(kept["others"]) if kept is not None else set()
        for run_id in ids:
            if run_id in settled:
                continue
            ended = None if run_id in known else _ended(RunDir(store.runs / run_id))
            if ended is None:
                others.append(run_id)
            else:
                seen.ended.append(ended)
        seen.ended.sort()
    seen.unsettled = [RunDir(store.runs / run_id) for run_id in others]
    return seen


def _entry(line: str) -> tuple[float, str]:
    """A line of the index's settled runs (whole: its checksum held)."""
    at, _, run_id = line.partition(" ")
    return float(at), run_id


def ended_time(run: RunDir, info: RunInfo) -> float:
    """When an ended run ended, as the order of ended runs has it: its exit record's time, else (lost, corrupt) its
    output's last change, its last word."""
    ended_at = info["ended_at"]
    if isinstance(ended_at, (int, float)):
        return float(ended_at)
    return _mtime(run, OUTPUT) or _mtime(run, EXIT) or time.time()


def _ended(run: RunDir) -> tuple[float, str] | None:
    """A run's end when its exit record settles it (see `Look.settle`); None for any other run."""
    written = _mtime(run, EXIT)
    if written is None or time.time() - written < SETTLE_S:
        return None
    state = run.state()  # its spec and proc.json read too: a corrupt run is never settled
    if state not in SETTLED_STATES:
        return None
    try:
        ended_at = (run.exit() or {}).get("ended_at")
    except CorruptFile:
        return None
    return (float(ended_at) if isinstance(ended_at, (int, float)) else written, run.id)


def _mtime(run: RunDir, name: str) -> float | None:
    try:
        return os.stat(run.file(name)).st_mtime
    except OSError:
        return None


def _read(store: RunStore) -> dict[str, Any] | None:
    """The index as written, or None: missing, not its owner's alone, not whole, or of another format or release."""
    try:
        fd = os.open(store.workdir / INDEX, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with open(fd, "rb") as file:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None  # rebuilt, and written again private
        try:
            data = json.loads(file.read())
        except (OSError, ValueError, RecursionError):
            return None
    return data if _whole(data) else None


def _whole(data: object) -> bool:
    """Whether the index is one this release wrote, whole: its settled runs' lines as their checksum says."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("release") != backends.__version__:
        return False
    lines, others = data.get("ended"), data.get("others")
    return (
        isinstance(lines, str)
        and isinstance(others, list)
        and type(data.get("runs_mtime_ns")) is int
        and type(data.get("listed_at")) is float
        and data.get("crc") == binascii.crc32(lines.encode())
        and all(type(run_id) is str and RUN_ID_RE.match(run_id) for run_id in others)
    )


def sweep_leftovers(store: RunStore) -> int:
    """Remove the index's temp files that writers killed between the write and the rename left beside it (an agent
    is killed with its link: each one left would stay for good); how many."""
    return sweep_atomic_leftovers(store.workdir / INDEX, LEFTOVER_S)
