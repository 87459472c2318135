"""Which SGLang releases doctor checks a draft against, and one list of findings out of theirs."""

from __future__ import annotations

from collections.abc import Mapping

from backends import sglang_facts as facts
from backends.doctor.codes import finding
from backends.protocol import Finding


def versions_to_check(requested: str | None) -> tuple[list[str], list[Finding]]:
    source = "--sglang-version"
    if requested is None:
        requested = facts.installed_version()
        source = "the installed sglang"
    if requested is None:
        versions = list(facts.KNOWN_VERSIONS)
        msg = f"no --sglang-version and no sglang installed here: checked against {', '.join(versions)}"
        fix = "pass --sglang-version, or run doctor on the host that serves"
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
