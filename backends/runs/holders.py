"""Which run a process is part of, proven by a run store's own record: a run of this store, or a run of another
workdir on the same host (free-gpus says which, and records its kill there).

A run's processes are what `RunDir.processes` proves from its record (the child's identity, its session, the
marker its child carries). Another store is found through the run folder its child's environment names
(ENV_RUN_DIR, set for the child alone and inherited by its children), read from the process, its ancestors or
its session's leader: only a hint where to look. That store's record must then prove the process, and the run
folder must be the user's own, or the process is counted as no run's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from backends.host import procinfo
from backends.host.freegpus import RunHolder
from backends.protocol import ENV_RUN_DIR
from backends.runs.store import RUN_ID_RE, RUNS, CorruptFile, RunDir, RunStore


class RunHolders:
    """A lookup of the runs that processes are part of, over one scan of /proc taken when it is made."""

    def __init__(self, store: RunStore) -> None:
        self.workdir = store.workdir.resolve()
        self.stats = procinfo.live_stats()
        self._by_pid = {s.pid: s for s in self.stats}
        self._mine: dict[int, str] = {}
        for run in store.all():
            try:
                self._mine.update(dict.fromkeys(run.processes(self.stats), run.id))
            except (CorruptFile, OSError):  # a run that cannot be read proves nothing
                continue

    def __call__(self, pid: int) -> RunHolder | None:
        """The run `pid` is proven part of: this store's (workdir None), else another store's; None when none."""
        if pid in self._mine:
            return RunHolder(self._mine[pid])
        folder = self._named_run_folder(pid)
        if folder is None:
            return None
        try:
            proven = pid in RunDir(folder).processes(self.stats)
        except (CorruptFile, OSError):
            return None
        return RunHolder(folder.name, str(folder.parent.parent)) if proven else None

    def _named_run_folder(self, pid: int) -> Path | None:
        """The run folder of another store that the environment of `pid`, an ancestor or its session's leader
        names, when it is one: a run id's folder under a `runs` folder, owned by us, not a link."""
        leader = self._by_pid[pid].sid if pid in self._by_pid else None
        for candidate in (pid, *procinfo.ancestors(pid), *([leader] if leader else [])):
            named = procinfo.environ_value(candidate, ENV_RUN_DIR)
            if named is not None:
                break
        else:
            return None
        folder = Path(named)
        if not folder.is_absolute() or not RUN_ID_RE.fullmatch(folder.name) or folder.parent.name != RUNS:
            return None
        if folder.parent.parent.resolve() == self.workdir:
            return None  # this store's, and not proven by its record: no run's
        try:
            info = os.lstat(folder)
        except OSError:
            return None
        return folder if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() else None
