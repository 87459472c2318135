"""What the person chose for the console and what it remembers between starts: config.toml's theme and keys come
in as `Preferences`; the theme chosen with `t` is kept in a state file of the console's own (XDG_STATE_HOME), since
config.toml is the person's and never written."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Preferences:
    """What the person chose for the console: config.toml's theme (None: none) and keys (an action's binding id
    -> its key, as `keymap` gives them), the file that says so, and where the theme last chosen with `t` is kept
    (None: nowhere, so that a console under test reads and writes nobody's)."""

    theme: str | None = None
    keymap: Mapping[str, str] = field(default_factory=dict)
    settings_file: str = "config.toml"
    state_file: Path | None = None


def state_path() -> Path:
    """Where the console keeps what it remembers between starts (XDG_STATE_HOME applies)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "eagle3-console" / "state.json"


def read_state(path: Path) -> dict[str, object]:
    """The console's state as it was saved; {} when there is none yet. OSError or ValueError when unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def write_state(path: Path, state: Mapping[str, object]) -> None:
    """The state, whole or not at all (a temp file renamed over it), in a folder of 700 and a file of 600: the
    console's own, as its other files."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # mkstemp's mode: 600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(dict(state), out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
