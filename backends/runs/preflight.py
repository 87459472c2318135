"""The pre-launch gate: the serving engine's own parser on a serve command's flags, `doctor` on the draft it names.

A serve run is checked before it starts (and a relaunch before its parent is
stopped); errors refuse the launch unless forced, warnings go into the run's
events. Both ask the engine that will serve: for a `PYTHON -m
sglang.launch_server` command, that PYTHON with the command's environment (its
version for doctor's rules, and the real-loader dry-load, which joins in
automatically when that SGLang can do it quickly); otherwise the agent's own.
"""

from __future__ import annotations

from collections.abc import Mapping

from backends import serving
from backends.doctor.full import full_diagnosis
from backends.protocol import DoctorResult, PreflightResult


def check_serve(
    kind: str, argv: list[str], cwd: str | None, env: Mapping[str, str] | None = None
) -> DoctorResult | None:
    """doctor's verdict on a serve command's draft, or None when it names none."""
    if kind != "serve":
        return None
    served = serving.served_draft(argv, cwd, env)
    if served is None:
        return None
    return full_diagnosis(
        served.draft,
        target=served.target,
        context_length=served.context_length,
        sglang_python=served.python,
        env=served.env,
        cwd=cwd,
    )


def check_launch(kind: str, argv: list[str], cwd: str | None, env: Mapping[str, str] | None = None) -> PreflightResult:
    """Every pre-launch check of a command (none but for a serve command), with the launch's environment."""
    if kind != "serve":
        return PreflightResult(flags=None, doctor=None)
    engine = serving.engine_for(argv)
    flags = engine.check_flags(argv, env, cwd) if engine is not None else None
    return PreflightResult(flags=flags, doctor=check_serve(kind, argv, cwd, env))
