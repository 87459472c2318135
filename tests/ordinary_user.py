"""An ordinary user, for the tests of what permission bits refuse: root ignores them, and CI runs the suite as root.

As an ordinary user such a test runs as it is. As root, what must be refused runs in a child process as nobody
(nogroup, no other groups), in a folder of nobody's. Nobody keeps one capability, to read and search any folder
(CAP_DAC_READ_SEARCH), so that it can start this interpreter wherever it lives (CI's is under /root, which is 700);
every write it makes is held to the permission bits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USER, GROUP = "nobody", "nogroup"
AS_USER = [
    "setpriv",
    f"--reuid={USER}",
    f"--regid={GROUP}",
    "--clear-groups",
    "--inh-caps=+dac_read_search",
    "--ambient-caps=+dac_read_search",
    "--",
]

# The child imports the body's module by name and calls it on the folder; an assertion that fails there fails
# the test with the child's traceback.
CHILD = (
    "import importlib, pathlib, sys; "
    "getattr(importlib.import_module(sys.argv[1]), sys.argv[2])(pathlib.Path(sys.argv[3]))"
)


def as_ordinary_user(argv: list[str]) -> list[str]:
    """`argv` started as an ordinary user: as it is when this process is one."""
    return [*AS_USER, *argv] if os.geteuid() == 0 else argv


def ordinary_folder(tmp_path: Path) -> Path:
    """A new empty folder in `tmp_path` that the ordinary user owns."""
    folder = tmp_path / "ordinary"
    folder.mkdir()
    if os.geteuid() == 0:
        shutil.chown(folder, USER, GROUP)
    return folder


def run_as_ordinary_user(body: Callable[[Path], None], folder: Path) -> None:
    """`body(folder)` as an ordinary user: here when this process is one, else in a child process as nobody.
    `body` is a module-level function of a test module, which the child imports."""
    if os.geteuid() != 0:
        body(folder)
        return
    child = subprocess.run(
        as_ordinary_user([sys.executable, "-c", CHILD, body.__module__, body.__qualname__, str(folder)]),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if child.returncode != 0:
        pytest.fail(f"{body.__qualname__} as {USER} failed:\n{child.stdout}{child.stderr}", pytrace=False)
