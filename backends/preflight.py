"""The pre-launch gate: SGLang's own parser on a serve command's flags, `doctor` on the draft it names.

A serve run is checked before it starts (and a relaunch before its parent is
stopped); errors refuse the launch unless forced, warnings go into the run's
events. Both ask the SGLang that will serve: for a `PYTHON -m
sglang.launch_server` command, that PYTHON with the command's environment (its
version for doctor's rules, and the real-loader dry-load, which joins in
automatically when that SGLang can do it quickly); otherwise the agent's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from backends import dryload, serve_flags
from backends import sglang_facts as facts
from backends.argv_edit import flag_value
from backends.doctor import diagnose
from backends.doctor.versions import Installed
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
    sglang_python: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> DoctorResult:
    """doctor's static rules, plus the real loader when asked (True) or, for None, when the serving
    interpreter (`sglang_python` with `env` in `cwd`; default: this one) has sglang and the dry-load
    is estimated under a minute. Without --sglang-version the rules are that interpreter's release's."""
    installed = None
    if sglang_version is None or dry_load is None:
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


def _path(value: str | None, cwd: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() or cwd is None else Path(cwd) / path


def check_serve(
    kind: str, argv: list[str], cwd: str | None, env: Mapping[str, str] | None = None
) -> DoctorResult | None:
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
    server = serve_flags.server_command(argv)
    return full_diagnosis(
        draft,
        target=target if target is not None and target.is_dir() else None,
        context_length=int(context) if context is not None and context.isdigit() else None,
        sglang_python=server[0] if server is not None else None,
        env=env if server is not None else None,
        cwd=cwd,
    )


def check_launch(kind: str, argv: list[str], cwd: str | None, env: Mapping[str, str] | None = None) -> PreflightResult:
    """Every pre-launch check of a command (none but for a serve command), with the launch's environment."""
    if kind != "serve":
        return PreflightResult(flags=None, doctor=None)
    return PreflightResult(flags=serve_flags.check(argv, env, cwd), doctor=check_serve(kind, argv, cwd, env))
