"""The pre-launch gate: the serving engine's own parser on a serve command's flags, `doctor` on the draft it names.

A serve run is checked before it starts (and a relaunch before its parent is
stopped); errors refuse the launch unless forced, warnings go into the run's
events. Both ask the engine that will serve, however the command is spelled
(`python -m sglang.launch_server`, `sglang serve`, behind env, a shell string,
numactl, inside docker run: `backends.sglang.launch`): its interpreter with the
command's environment (its version for doctor's rules, and the real-loader
dry-load, which joins in automatically when that SGLang can do it quickly), or
the one `--sglang-python` names. What cannot be checked from the host (a
server inside a container, a wrapper) is said in the flags' finding, once, with
the option that makes it checkable.
"""

from __future__ import annotations

from collections.abc import Mapping

from backends import serving
from backends.doctor.full import full_diagnosis
from backends.protocol import DoctorResult, Finding, PreflightResult


def check_serve(
    kind: str, argv: list[str], cwd: str | None, env: Mapping[str, str] | None = None, sglang_python: str | None = None
) -> DoctorResult | None:
    """doctor's verdict on a serve command's draft, or None when it names none the host can read."""
    if kind != "serve":
        return None
    served = serving.served_draft(argv, cwd, env, sglang_python)
    if served is None:
        return None
    return full_diagnosis(
        served.draft,
        target=served.target,
        context_length=served.context_length,
        sglang_python=served.python,
        env=served.env,
        cwd=cwd,
        unknown_python=served.unknown_python,
    )


def check_launch(
    kind: str, argv: list[str], cwd: str | None, env: Mapping[str, str] | None = None, sglang_python: str | None = None
) -> PreflightResult:
    """Every pre-launch check of a command (none but for a serve command), with the launch's environment."""
    if kind != "serve":
        return PreflightResult(flags=None, doctor=None)
    engine, found = serving.serve_launch(argv, env, sglang_python)
    flags = with_unseen_draft(engine.check_flags(found, env, cwd), serving.draft_unseen(argv, env))
    return PreflightResult(flags=flags, doctor=check_serve(kind, argv, cwd, env, sglang_python))


def with_unseen_draft(flags: Finding | None, unseen: str | None) -> Finding | None:
    """The flags' finding, also saying (once) that doctor cannot read the draft from the host."""
    if unseen is None:
        return flags
    said = f"doctor does not check the draft: {unseen}"
    if flags is None:
        return Finding(code="launch-flags-unchecked", severity="info", message=said, fix="mount it with -v HOST:PATH")
    return {**flags, "message": f"{flags['message']}; {said}"}
