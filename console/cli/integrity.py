"""Whether the packages the console runs are its own. The wheel's import packages have generic names (`console`,
`backends`, `themes`): another distribution with a package of the same name, installed into the same environment,
writes over ours. `doctor`, `status` and `--version` say so in one line on stderr, with the fix.

Ours are the files our distribution's RECORD lists, with the hashes it lists. The RECORD is read here, not through
importlib.metadata, whose import alone (email, zipfile, csv...) costs ~25 ms on every status; the check itself
costs well under a millisecond. A development install (editable: its RECORD lists no package file) is the source
tree, which is ours by definition.
"""

from __future__ import annotations

import binascii
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

DIST_INFO_PREFIX = "eagle3_console-"  # pyproject's [project] name as a wheel spells its .dist-info folder
PACKAGES = ("console", "backends", "themes")
CHECKED_COMMANDS = ("status", "doctor")
FIX = (
    "reinstall eagle3-console into its own environment: pipx install eagle3-console, or uv tool install eagle3-console"
)


def checks(words: list[str], command: str | None) -> bool:
    """Whether the command line (its COMMAND: `grammar.command_of`) is one that says whose packages run:
    --version, status or doctor."""
    if "_ARGCOMPLETE" in os.environ:
        return False  # a shell completing: its line is no place for a warning
    own = words[: words.index("--")] if "--" in words else words
    return "--version" in own or command in CHECKED_COMMANDS


def warn() -> None:
    line = foreign_package()
    if line is not None:
        print(line, file=sys.stderr)


def foreign_package() -> str | None:
    """The warning's line when a package imported as one of ours is not the one our install wrote; else None."""
    dist_info = our_dist_info()
    if dist_info is None or editable(dist_info):
        return None
    record = recorded_hashes(dist_info)
    if not any(path.startswith(f"{PACKAGES[0]}/") for path in record):
        return None  # an install that lists no package file: the source tree's
    for name in PACKAGES:
        file = imported_file(name)
        if file is None or not written_by_us(file, dist_info.parent, record):
            where = file or "no file (a package without __init__.py)"
            return (
                f"eagle3-console: the package {name!r} at {where} is not eagle3-console's (another package of that "
                f"name was installed over it); {FIX}"
            )
    return None


def our_dist_info() -> Path | None:
    """Our distribution's .dist-info folder: the first on the import path, as importlib.metadata would find it."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue  # a zip, a folder gone
        for name in names:
            if name.startswith(DIST_INFO_PREFIX) and name.endswith(".dist-info"):
                return Path(entry or ".") / name
    return None


def editable(dist_info: Path) -> bool:
    try:
        direct_url = json.loads((dist_info / "direct_url.json").read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(direct_url, dict) and bool(direct_url.get("dir_info", {}).get("editable"))


def recorded_hashes(dist_info: Path) -> dict[str, str]:
    """Each file RECORD lists (relative to site-packages) and its hash as RECORD writes it (`sha256=...`)."""
    try:
        lines = (dist_info / "RECORD").read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    # Our package files have no comma in their paths, so the csv module (an import of its own) is not needed.
    rows = (line.rsplit(",", 2) for line in lines)
    return {row[0]: row[1] for row in rows if len(row) == 3}


def imported_file(name: str) -> str | None:
    """The file the package `name` is (or would be) imported from."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    spec = importlib.util.find_spec(name)
    return spec.origin if spec is not None and spec.has_location else None


def written_by_us(file: str, site: Path, record: dict[str, str]) -> bool:
    relative = os.path.relpath(file, site)
    listed = record.get(relative)
    if listed is None:
        return False
    algorithm, _, expected = listed.partition("=")
    try:
        digest = hashlib.new(algorithm, Path(file).read_bytes()).digest()
    except (OSError, ValueError):
        return False
    # RECORD's digest is urlsafe base64 without padding; binascii spares the base64 module's import (~2 ms).
    encoded = binascii.b2a_base64(digest, newline=False).rstrip(b"=").replace(b"+", b"-").replace(b"/", b"_")
    return encoded.decode() == expected
