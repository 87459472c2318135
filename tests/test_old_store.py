"""A run store written by 0.1.0 (before the backends were grouped into folders) still reads and relaunches.

`tests/old_store_0_1_0/` is a real run's folder as 0.1.0 left it (`train --help` through the local agent), with
only the host's paths replaced: the interpreter by @PYTHON@ and the checkout by @ROOT@.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from backends import PACKAGE_ROOT
from console.link.client import AgentClient
from console.link.local import LocalTransport
from tests.conftest import run_state, wait_for

OLD_STORE = Path(__file__).with_name("old_store_0_1_0")
OLD_RUN = "20261130-232901-775-5244"


def old_store(workdir: Path) -> None:
    shutil.copytree(OLD_STORE, workdir, dirs_exist_ok=True)
    for path in (workdir / "runs" / OLD_RUN).iterdir():
        text = path.read_text().replace("@PYTHON@", sys.executable).replace("@ROOT@", str(PACKAGE_ROOT))
        path.write_text(text)
    for path in [workdir, *workdir.rglob("*")]:
        os.chmod(path, 0o700 if path.is_dir() else 0o600)


async def test_a_run_from_a_0_1_0_store_is_listed_and_relaunches_with_its_module_path(workdir: Path) -> None:
    old_store(workdir)
    async with AgentClient(LocalTransport(workdir)) as client:
        status = await client.request("status")
        (old,) = [run for run in status["runs"] if run["id"] == OLD_RUN]
        assert old["state"] == "exited" and old["argv"][1:] == ["-m", "backends.train", "--help"]
        relaunched = await client.request("relaunch", run=OLD_RUN, set=[], unset=[])
    child = relaunched["run"]
    wait_for(lambda: run_state(workdir, child) in {"exited", "failed"}, what="the relaunched run to end")
    assert run_state(workdir, child) == "exited"  # `python -m backends.train --help` still finds the trainer
    log = (workdir / "runs" / child / "output.log").read_text()
    assert "usage: python -m backends.train" in log
