"""Running our code and SGLang's own loader in the real-SGLang tier's interpreter (EAGLE3_SGLANG_PYTHON), many
drafts to a process: SGLang's import is most of each one's time."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import REPO

REAL_LOADER = REPO / "tests" / "sglang_real_loader.py"  # SGLang's real loader on each draft: its verdicts
# Our dry-load of each draft folder given, in one process of the tier.
DRY_LOAD = "import json, sys; from pathlib import Path; from backends.doctor.dryload import run_in_process; " + (
    "print(json.dumps({d: run_in_process(Path(d)) for d in sys.argv[1:]}))"
)


def in_tier(python: Path, *argv: str) -> dict[str, Any]:
    """The JSON object the tier's `python ARGV` prints last (our package importable there)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([str(python), *argv], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return verdicts
