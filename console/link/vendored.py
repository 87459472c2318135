"""The agent's pure-Python dependencies, as this console's own environment holds them, to ship to an SSH host.

`backends.shipped.DEPENDENCIES` and what they require (their requirements without an extra, read from their
metadata) are copied from the distributions installed here into WORKDIR/agent/<version>/vendor/ on the host:
each distribution's files as its RECORD lists them (the importable packages and modules, their data, and its
METADATA so that importlib.metadata still answers), never a compiled one, since the host's Python and
architecture need not be this console's. A requirement for another Python only (a marker such as
`python_version < "3.11"`) that is not installed here is left to the host's own site-packages.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from pathlib import Path, PurePosixPath

from backends.shipped import DEPENDENCIES, VENDOR

COMPILED = (".so", ".pyd", ".dylib", ".dll")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class VendorError(Exception):
    """A dependency cannot be shipped: missing here, or compiled; the message says what to do."""


@functools.cache
def vendor_files() -> dict[str, Path]:
    """Each file to ship, as its path under the version folder (`vendor/...`), and the file here."""
    files: dict[str, Path] = {}
    for dist in _distributions():
        files.update(_files_of(dist))
    return files


def _distributions() -> list[importlib.metadata.Distribution]:
    """The dependencies and what they require, each once, as installed here."""
    found: dict[str, importlib.metadata.Distribution] = {}
    wanted = [(name, "") for name in DEPENDENCIES]
    while wanted:
        name, marker = wanted.pop()
        key = _normal(name)
        if key in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            if marker:  # needed by another Python only: the host's own copy serves there
                continue
            raise VendorError(
                f"{name} is not installed beside this console, so the agent cannot take it to the host: "
                f"reinstall eagle3-console (or pip install {name})"
            ) from None
        found[key] = dist
        for requirement in dist.requires or []:
            spec, _, condition = requirement.partition(";")
            match = _NAME.match(spec)
            if match and "extra" not in condition:
                wanted.append((match.group(1), condition.strip()))
    return [found[key] for key in sorted(found)]


def _files_of(dist: importlib.metadata.Distribution) -> dict[str, Path]:
    name = dist.metadata["Name"]
    wheel = dist.read_text("WHEEL") or ""
    listed = dist.files or []
    if "Root-Is-Purelib: false" in wheel or any(str(path).endswith(COMPILED) for path in listed):
        raise VendorError(
            f"{name} is installed here as a compiled build, which the agent cannot take to a host of another Python "
            f"or architecture: reinstall it from its pure-Python (py3-none-any) wheel"
        )
    files: dict[str, Path] = {}
    for path in listed:
        parts = PurePosixPath(path.as_posix()).parts
        if not parts or parts[0] == ".." or "__pycache__" in parts or path.suffix == ".pyc":
            continue  # a script outside site-packages, or a compiled copy the host makes itself
        if parts[0].endswith(".dist-info") and parts[1:] != ("METADATA",):
            continue
        files[f"{VENDOR}/{path.as_posix()}"] = Path(str(dist.locate_file(path)))
    return files


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
