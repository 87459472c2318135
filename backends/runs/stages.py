"""Our own stages as runs: the command that runs one (`python -m backends.NAME`, under torchrun for several
processes), and the check that its interpreter can, before anything starts.

A Python without torch would start, print `No module named 'torch'` and leave a failed run behind; asking the
interpreter where torch would be found (without importing it) costs one interpreter start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

STAGE_MODULES = ("backends.extract", "backends.train")
LAUNCHER = "torch.distributed.run"
CHECK_TIMEOUT_S = 30.0
_NO_TORCH = 3
_FINDS_TORCH = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else {_NO_TORCH})"


def module_argv(
    python: str, module: str, args: list[str], nproc: int | None, node_args: Sequence[str] = ()
) -> list[str]:
    """argv that runs one of our modules with `python`, under torchrun when nproc > 1 or for a node of a job
    (`node_args`: torchrun's options for it); ValueError for a module not ours."""
    if module not in STAGE_MODULES:
        raise ValueError(f"module {module!r} is not one of ours: {', '.join(STAGE_MODULES)}")
    if (nproc is not None and nproc > 1) or node_args:
        return [python, "-m", LAUNCHER, *node_args, f"--nproc-per-node={nproc or 1}", "-m", module, *args]
    return [python, "-m", module, *args]


def stage_of(argv: list[str]) -> tuple[str, str] | None:
    """(interpreter, module) when argv runs one of our stages, directly or under torchrun; else None."""
    if len(argv) < 3 or not Path(argv[0]).name.startswith("python") or argv[1] != "-m":
        return None
    if argv[2] in STAGE_MODULES:
        return argv[0], argv[2]
    if argv[2] == LAUNCHER:
        for index in range(3, len(argv) - 1):
            if argv[index] == "-m" and argv[index + 1] in STAGE_MODULES:
                return argv[0], argv[index + 1]
    return None


def python_problem(argv: list[str], env: Mapping[str, str], cwd: str | None) -> str | None:
    """Why the interpreter of one of our stages cannot run it (no such program, no torch), or None."""
    stage = stage_of(argv)
    if stage is None:
        return None
    python, module = stage
    merged = {**os.environ, **env}
    fix = "give --python PATH, the host's Python that has torch (pip install 'eagle3-console[train]' into it)"
    here = cwd if cwd and os.path.isdir(cwd) else None
    # A relative path is the run's: its process starts in the run's folder.
    seen = os.path.join(here, python) if here and os.sep in python and not os.path.isabs(python) else python
    if shutil.which(seen, path=merged.get("PATH")) is None:
        return f"{python} is not a Python on the host: {fix}"
    try:
        done = subprocess.run(
            [python, "-c", _FINDS_TORCH],
            env=merged,
            cwd=here,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None  # a slow disk is no reason to refuse: the run itself will tell
    except OSError as exc:
        return f"{python} could not be started ({exc.strerror or exc}): {fix}"
    if done.returncode == _NO_TORCH:
        return f"{python} has no torch, which {module} needs: {fix}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"{python} fails to start (exit {done.returncode}: {last}): {fix}"
    return None
