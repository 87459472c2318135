"""Which SGLang releases doctor checks a draft against, and one list of findings out of theirs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from backends.doctor.codes import finding
from backends.protocol import Finding
from backends.sglang import facts
from backends.sglang.launch import SGLANG_PYTHON_FLAG


@dataclass(frozen=True)
class Installed:
    """The sglang version (None: no sglang) of the interpreter that will serve; python None: this one, unless
    `unknown` says why the one that serves cannot be known (a server inside a container)."""

    version: str | None
    python: str | None = None
    unknown: str | None = None

    def source(self) -> str:
        return "the installed sglang" if self.python is None else f"the sglang of {self.python}"


def versions_to_check(requested: str | None, installed: Installed | None = None) -> tuple[list[str], list[Finding]]:
    """The releases whose rules apply: --sglang-version's, else the serving interpreter's, else every known one."""
    source = "--sglang-version"
    if requested is None:
        installed = installed or Installed(facts.installed_version())
        requested, source = installed.version, installed.source()
    if requested is None:
        versions = list(facts.KNOWN_VERSIONS)
        checked = f"checked against {', '.join(versions)}"
        if installed is not None and installed.unknown is not None:
            # A launch: the fix is an option of launch and serve (doctor takes it too).
            msg = f"the SGLang that serves is not known here ({installed.unknown}): {checked}"
            fix = f"give {SGLANG_PYTHON_FLAG} PATH, a host Python with the same SGLang"
            return versions, [finding("sglang-version", "info", msg, fix)]
        where, fix = "installed here", "pass --sglang-version, or run doctor on the host that serves"
        if installed is not None and installed.python is not None:
            where, fix = f"for {installed.python}", f"name the Python that serves SGLang with {SGLANG_PYTHON_FLAG} PATH"
        msg = f"no --sglang-version and no sglang {where}: {checked}"
        return versions, [finding("sglang-version", "info", msg, fix)]
    nearest = facts.nearest_known(requested)
    if nearest is None:
        versions = list(facts.KNOWN_VERSIONS)
        return versions, [
            finding("sglang-version", "warning", f"{source} {requested!r} is not a version; checked all known")
        ]
    if nearest != requested:
        msg = f"SGLang {requested} ({source}) is not one doctor knows; applied the rules of {nearest}"
        return [nearest], [finding("sglang-version", "info", msg)]
    return [nearest], [finding("sglang-version", "info", f"checked against SGLang {nearest} ({source})")]


def merge_per_release(per_version: Mapping[str, list[Finding]]) -> list[Finding]:
    """One finding where all releases agree; otherwise each tagged with its release."""
    versions = list(per_version)
    keys = [[(f["code"], f["severity"], f["message"], f["fix"]) for f in per_version[v]] for v in versions]
    merged: list[Finding] = []
    for version, findings, own in zip(versions, per_version.values(), keys, strict=True):
        for item, key in zip(findings, own, strict=True):
            if all(key in other for other in keys):
                if version == versions[0]:
                    merged.append(item)
            else:
                message = item["message"]
                if f"SGLang {version}" not in message:
                    message = f"[SGLang {version}] {message}"
                merged.append({**item, "message": message})
    return merged
