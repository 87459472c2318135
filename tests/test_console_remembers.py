"""A console that remembers you: config.toml's default_host, theme and [keys], `--config` and
$EAGLE3_CONSOLE_CONFIG, the theme chosen with `t` kept for the next start, `hosts -h`, NVML's install hint.

Real: the CLI as a process (a terminal in tmux where the console opens), OpenSSH's sshd on 127.0.0.1 for the
quick way through a multiplexer, the console driven through Textual's pilot against a real local agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from backends.host.gpus import NVML_INSTALL_HINT
from tests.conftest import REPO

# --- NVML's install hint -------------------------------------------------------------------------------------


def gpu_error(tmp_path: Path, workdir: Path, pythonpath: list[Path]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("EAGLE3_NVML_MODULE", "FAKE_NVML_STATE")}
    env.update(PYTHONPATH=os.pathsep.join(str(p) for p in [*pythonpath, REPO]), PATH="/usr/bin:/bin")
    done = subprocess.run(
        [sys.executable, "-m", "console", "--workdir", str(workdir), "local", "status", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout).get("gpu_error") or "")


def test_a_host_without_nvidia_ml_py_is_told_what_to_install(tmp_path: Path, workdir: Path) -> None:
    without = tmp_path / "without-pynvml"
    without.mkdir()
    # What `import pynvml` raises where nvidia-ml-py is not installed (this environment has it).
    (without / "pynvml.py").write_text("raise ModuleNotFoundError(\"No module named 'pynvml'\", name='pynvml')\n")
    said = gpu_error(tmp_path, workdir, [without])
    assert "NVML (pynvml) unavailable: No module named 'pynvml'; " + NVML_INSTALL_HINT in said
    assert "pip install nvidia-ml-py, or the eagle3-console[agent] extra" in said
    extras = (REPO / "pyproject.toml").read_text()
    assert "\nagent = [\n" in extras and '"nvidia-ml-py' in extras.split("\nagent = [\n")[1].split("]")[0]
    # nvidia-ml-py installed but no driver (or a GPU host): nothing to install
    assert NVML_INSTALL_HINT not in gpu_error(tmp_path, workdir, [])
