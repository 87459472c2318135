"""The project as a user gets it from pipx or `uv tool install`: the wheel built from this tree, installed into a
fresh venv (no editable install), run from a folder that is not the repository, with no PYTHONPATH.

Real: the wheel (pip builds it with setuptools, as pipx would), the venv, the console entry point, the local
agent it starts, and the Textual console drawn in a real terminal (tmux). Only the console's own dependencies
are installed (no `agent` or `train` extra), pinned as the other tests pin them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

import backends
from tests.tmux import Tmux

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints-test.txt"
LOCAL_ONLY = (".git", ".venv", ".sglang-*", ".demo", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")


def clean_env(home: Path) -> dict[str, str]:
    """This environment without anything that would find the repository's modules instead of the installed ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "EAGLE3_"))}
    env["HOME"] = str(home)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The venv's bin folder, with the wheel of this tree installed."""
    root = tmp_path_factory.mktemp("wheel")
    env = clean_env(root)
    # The tree as a fresh clone holds it: no build/ left by an earlier build, no venvs.
    source = root / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*LOCAL_ONLY))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(root / "dist"), str(source)], check=True, env=env, cwd=root)
    [wheel] = (root / "dist").glob("eagle3_console-*.whl")
    venv.create(root / "venv", with_pip=True)
    bin_dir = root / "venv" / "bin"
    install = [str(bin_dir / "python"), *pip[1:], "install", "-c", str(CONSTRAINTS), str(wheel)]
    subprocess.run(install, check=True, env=env, cwd=root, timeout=600)
    yield bin_dir


def console(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "eagle3-console"), *args], capture_output=True, text=True, env=clean_env(cwd), cwd=cwd
    )


def test_the_installed_console_says_its_version_and_the_hosts_status(installed: Path, tmp_path: Path) -> None:
    version = console(installed, tmp_path, "--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"eagle3-console {backends.__version__}")
    status = console(installed, tmp_path, "--workdir", str(tmp_path / "work"), "local", "status")
    assert status.returncode == 0, status.stderr
    assert "no runs yet" in status.stdout and "Traceback" not in status.stderr
    # The agent it ran is the installed one, not this tree's.
    shown = subprocess.run(
        [str(installed / "python"), "-c", "import console, backends; print(console.__file__, backends.__file__)"],
        capture_output=True,
        text=True,
        env=clean_env(tmp_path),
        cwd=tmp_path,
        check=True,
    ).stdout
    assert str(REPO) not in shown and "site-packages" in shown


def test_the_installed_console_opens_in_a_terminal_and_quits(installed: Path, tmp_path: Path) -> None:
    argv = [str(installed / "eagle3-console"), "--workdir", str(tmp_path / "work"), "local"]
    with Tmux(argv, width=100, height=30, env=clean_env(tmp_path), cwd=tmp_path) as term:
        # Its stylesheet is read from the installed package: the panels are laid out and the runs table is drawn.
        ready = term.wait_for(lambda shown: "RUN" in shown and "no run selected" in shown, 60, "the console drawn")
        assert ready and "StylesheetError" not in term.screen()
        term.send("q")
        left = term.wait_for(lambda shown: "RUN" not in shown, 20, "the console to quit")
        assert left and "Traceback" not in term.screen()
