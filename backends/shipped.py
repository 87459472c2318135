"""What the console ships beside this package on an SSH host, and how the host side finds it.

- `WORKDIR/agent/<version>/vendor/`: the agent's pure-Python dependencies (httpx and what it needs,
  prometheus_client), copied from the console's own environment, since a host's python3 typically lacks
  them. The agent (its launcher) and the run supervisors (importing `backends.runs`, which only they do: a
  run's stages sit below it) put this folder FIRST on sys.path (`vendor_first`), before the
  host's PYTHONPATH and site-packages: they then import the very versions the console was tested with,
  whatever older or newer ones the host holds (httpx 1.x or an old anyio would break us, and mixing our
  httpx with the host's httpcore is worse). A run's own processes never get the folder (it is on no
  PYTHONPATH), so a server or a training keeps the host's versions.
- `WORKDIR/agent/bin/py-spy`: py-spy for the host's architecture, uploaded when the host has none, so a
  stalled run's stack dump shows Python frames (`uploaded_py_spy`). It outlives the version folders.

`python -m backends.shipped` says where the agent imports each shipped dependency from.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from backends import PACKAGE_ROOT

AGENT = "agent"  # WORKDIR/agent holds the version folders and BIN
VENDOR = "vendor"  # under the version folder
BIN = "bin"  # under WORKDIR/agent
PY_SPY = "py-spy"
# What the agent imports that a host's Python may lack; the console ships these and what they need.
DEPENDENCIES = ("httpx", "prometheus_client")


def vendor_first() -> None:
    """Put the shipped dependencies right after our own package on sys.path (see the module's docstring)."""
    folder = str(PACKAGE_ROOT / VENDOR)
    if Path(folder).is_dir() and folder not in sys.path:
        sys.path.insert(1, folder)


def uploaded_py_spy() -> Path | None:
    """py-spy as the console uploaded it for this copy of the agent, when this is an uploaded copy and it is there."""
    path = PACKAGE_ROOT.parent / BIN / PY_SPY
    return path if PACKAGE_ROOT.parent.name == AGENT and path.is_file() else None


def origins() -> dict[str, str]:
    """Each dependency the agent needs, and the file it is imported from (or why it cannot be)."""
    found: dict[str, str] = {}
    for name in DEPENDENCIES:
        try:
            found[name] = str(importlib.import_module(name).__file__)
        except ImportError as exc:
            found[name] = f"not importable: {exc}"
    return found


if __name__ == "__main__":
    vendor_first()
    for name, origin in origins().items():
        print(f"{name}: {origin}")
