"""Whether the packages the console runs are its own. The wheel's import packages have generic names (`console`,
`backends`, `themes`): another distribution with a package of the same name, installed into the same environment,
writes over ours. `doctor`, `status` and `--version` say so in one line on stderr, with the fix.

Ours are the files our distribution's RECORD lists, with the hashes it lists. The RECORD is read here, not through
importlib.metadata, whose import alone (email, zipfile, csv...) costs ~25 ms on every status; the check itself
costs well under a millisecond. A development install (editable: its RECORD lists no package file) is the source
tree, which is ours by definition.

`--version` runs it before anything else is imported (`console.cli.instant`, issue 28's 40 ms), so it imports
nothing beyond what every Python starts with but hashlib, and that only on a wheel's install, which has hashes to
check: paths are os.path's, not pathlib's (~5 ms), and a package is looked for by the import system's own finders,
not through importlib.util (~3 ms).
"""

from __future__ import annotations

import binascii
import os
import sys

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
    install = wheel_install()
    if install is None:
        return None
    dist_info, record = install
    for name in PACKAGES:
        file = imported_file(name)
        if file is None or not written_by_us(file, os.path.dirname(dist_info), record):
            where = file or "no file (a package without __init__.py)"
            return (
                f"eagle3-console: the package {name!r} at {where} is not eagle3-console's (another package of that "
                f"name was installed over it); {FIX}"
            )
    return None


def wheel_install() -> tuple[str, dict[str, str]] | None:
    """Our .dist-info folder and its RECORD's hashes when our packages were installed from the wheel; None for the
    source tree: no install, or one that lists no package file (an editable one)."""
    dist_info = our_dist_info()
    if dist_info is None:
        return None
    record = recorded_hashes(dist_info)
    if not any(path.startswith(f"{PACKAGES[0]}/") for path in record):
        return None
    return dist_info, record


def our_dist_info() -> str | None:
    """Our distribution's .dist-info folder: the first on the import path, as importlib.metadata would find it."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue  # a zip, a folder gone
        for name in names:
            if name.startswith(DIST_INFO_PREFIX) and name.endswith(".dist-info"):
                return os.path.join(entry or ".", name)
    return None


def recorded_hashes(dist_info: str) -> dict[str, str]:
    """Each file RECORD lists (relative to site-packages) and its hash as RECORD writes it (`sha256=...`)."""
    try:
        with open(os.path.join(dist_info, "RECORD"), encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError:
        return {}
    # Our package files have no comma in their paths, so the csv module (an import of its own) is not needed.
    rows = (line.rsplit(",", 2) for line in lines)
    return {row[0]: row[1] for row in rows if len(row) == 3}


def imported_file(name: str) -> str | None:
    """The file the package `name` is (or would be) imported from: the first of the import system's finders
    (`sys.meta_path`) that finds it, as an import asks them."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = None if find_spec is None else find_spec(name, None)
        if spec is not None:
            return spec.origin if spec.has_location else None
    return None


def written_by_us(file: str, site: str, record: dict[str, str]) -> bool:
    relative = os.path.relpath(file, site)
    listed = record.get(relative)
    if listed is None:
        return False
    algorithm, _, expected = listed.partition("=")
    import hashlib  # a wheel's install alone hashes: a source tree's `status` loads no OpenSSL for it

    try:
        with open(file, "rb") as opened:
            digest = hashlib.new(algorithm, opened.read()).digest()
    except (OSError, ValueError):
        return False
    # RECORD's digest is urlsafe base64 without padding; binascii spares the base64 module's import (~2 ms).
    encoded = binascii.b2a_base64(digest, newline=False).rstrip(b"=").replace(b"+", b"-").replace(b"/", b"_")
    return encoded.decode() == expected
