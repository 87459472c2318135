"""The pre-launch gate: SGLang's own parser on a serve command's flags, `doctor` on the draft it names.

A serve run is checked before it starts (and a relaunch before its parent is
stopped); errors refuse the launch unless forced, warnings go into the run's
events. The real-loader dry-load joins in automatically when the installed
SGLang can do it quickly.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from backends import dryload, serve_flags
from backends.argv_edit import flag_value
from backends.doctor import diagnose
from backends.protocol import DoctorResult, PreflightResult
from backends.sglang_facts import CONTEXT_LENGTH_FLAG, DRAFT_PATH_FLAGS, TARGET_PATH_FLAGS

AUTO_DRY_LOAD_MAX_S = 60.0


def full_diagnosis(
    draft: Path,
    *,
    target: Path | None = None,
    data: Path | None = None,
    sglang_version: str | None = None,
    context_length: int | None = None,
    dry_load: bool | None = None,
) -> DoctorResult:
    """doctor's static rules, plus the real loader when asked (True) or, for None,
    when sglang is importable and the dry-load is estimated under a minute."""
    result = diagnose(draft, target=target, data=data, sglang_version=sglang_version, context_length=context_length)
    if dry_load is None:
        dry_load = dryload.sglang_importable() and dryload.estimate_seconds(draft) < AUTO_DRY_LOAD_MAX_S
    if dry_load:
        extra = dryload.dry_load(draft)
        result["findings"] += extra
        result["errors"] += sum(f["severity"] == "error" for f in extra)
        result["warnings"] += sum(f["severity"] == "warning" for f in extra)
    return result


def _path(value: str | None, cwd: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() or cwd is None else Path(cwd) / path


def check_serve(kind: str, argv: list[str], cwd: str | None) -> DoctorResult | None:
    """doctor's verdict on a serve command's draft, or None when it names none.

    A target given as a hub name rather than a folder is left out: doctor reads files only.
    """
    if kind != "serve":
        return None
    draft = _path(flag_value(argv, DRAFT_PATH_FLAGS), cwd)
    if draft is None:
        return None
    target = _path(flag_value(argv, TARGET_PATH_FLAGS), cwd)
    context = flag_value(argv, (CONTEXT_LENGTH_FLAG,))
    return full_diagnosis(
        draft,
        target=target if target is not None and target.is_dir() else None,
        context_length=int(context) if context is not None and context.isdigit() else None,
    )


def check_launch(kind: str, argv: list[str], cwd: str | None, env: Mapping[str, str] | None = None) -> PreflightResult:
    """Every pre-launch check of a command (none but for a serve command), with the launch's environment."""
    if kind != "serve":
        return PreflightResult(flags=None, doctor=None)
    return PreflightResult(flags=serve_flags.check(argv, env, cwd), doctor=check_serve(kind, argv, cwd))
