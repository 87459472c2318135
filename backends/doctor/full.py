"""doctor's whole verdict on a draft: the static rules, and the real loader's dry-load when it can run quickly."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from backends.doctor import dryload
from backends.doctor.diagnosis import diagnose
from backends.doctor.versions import Installed
from backends.protocol import DoctorResult
from backends.sglang import facts

AUTO_DRY_LOAD_MAX_S = 60.0


def full_diagnosis(
    draft: Path,
    *,
    target: Path | None = None,
    data: Path | None = None,
    sglang_version: str | None = None,
    context_length: int | None = None,
    dry_load: bool | None = None,
    sglang_python: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    unknown_python: str | None = None,
) -> DoctorResult:
    """doctor's static rules, plus the real loader when asked (True) or, for None, when the serving
    interpreter (`sglang_python` with `env` in `cwd`; default: this one) has sglang and the dry-load
    is estimated under a minute. Without --sglang-version the rules are that interpreter's release's.
    `unknown_python` says why the interpreter that serves cannot be known (a container): every known release's
    rules then, and no dry-load."""
    installed = None
    if unknown_python is not None:
        installed, dry_load = Installed(None, unknown=unknown_python), False
    elif sglang_version is None or dry_load is None:
        installed = Installed(facts.installed_version(sglang_python, env, cwd), sglang_python)
    result = diagnose(
        draft,
        target=target,
        data=data,
        sglang_version=sglang_version,
        context_length=context_length,
        installed=installed,
    )
    if dry_load is None:
        has_sglang = installed is not None and installed.version is not None
        dry_load = has_sglang and dryload.estimate_seconds(draft) < AUTO_DRY_LOAD_MAX_S
    if dry_load:
        # What the static rules already said (an unreadable file) is not said twice.
        extra = [
            f for f in dryload.dry_load(draft, python=sglang_python, env=env, cwd=cwd) if f not in result["findings"]
        ]
        result["findings"] += extra
        result["errors"] += sum(f["severity"] == "error" for f in extra)
        result["warnings"] += sum(f["severity"] == "warning" for f in extra)
    return result
