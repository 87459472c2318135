"""`diagnose`: read the draft, its target and its extraction, and run every rule for each SGLang release."""

from __future__ import annotations

from pathlib import Path

from backends.doctor.codes import convert_fix, finding
from backends.doctor.config_rules import aux_ids_ignored_rule
from backends.doctor.draft_config import enabled_options, geometry, sglang_view
from backends.doctor.layer_names import layer_spelling
from backends.doctor.reading import read_data, read_draft, read_target
from backends.doctor.rule_context import Context
from backends.doctor.rules import release_rules, version_independent_rules
from backends.doctor.versions import Installed, merge_per_release, versions_to_check
from backends.eagle3_contract import MANIFEST
from backends.protocol import DoctorResult, Finding
from backends.sglang import facts


def diagnose(
    draft: Path,
    *,
    target: Path | None = None,
    data: Path | None = None,
    sglang_version: str | None = None,
    context_length: int | None = None,
    installed: Installed | None = None,
) -> DoctorResult:
    """Every finding about `draft` (and its target and extraction data) for the SGLang release(s) that serve it:
    `sglang_version`'s, else that of the `installed` sglang (default: this interpreter's)."""
    versions, findings = versions_to_check(sglang_version, installed)
    fmt = "unknown"
    try:
        fmt = _diagnose(draft, target, data, versions, context_length, findings)
    except Exception as exc:  # the promise is findings, never a traceback
        findings.append(finding("doctor-failed", "error", f"doctor failed: {type(exc).__name__}: {exc}"))
    return {
        "draft": str(draft),
        "format": fmt,
        "sglang_versions": versions,
        "findings": findings,
        "errors": sum(f["severity"] == "error" for f in findings),
        "warnings": sum(f["severity"] == "warning" for f in findings),
    }


_FORMAT_NAMES = {
    "sglang": "SpecForge/SGLang layout",
    "speculators": "speculators layout (layers.0.*, speculators_config)",
    "eagle-bin": "original EAGLE pytorch_model.bin",
    "unknown": "unrecognised layout",
}


def _diagnose(
    draft: Path,
    target_path: Path | None,
    data: Path | None,
    versions: list[str],
    context_length: int | None,
    findings: list[Finding],
) -> str:
    files, problems = read_draft(draft)
    findings += problems
    if files is None:
        return "unknown"
    spellings = sorted({s for s in map(layer_spelling, files.tensors) if s})
    findings.append(
        finding(
            "draft-format",
            "warning" if files.format == "unknown" else "info",
            f"{_FORMAT_NAMES[files.format]}: {len(files.tensors)} tensors in {files.loaded.describe()}"
            + (f", decoder layer named {' and '.join(spellings)}" if spellings else ", no decoder layer tensors"),
            convert_fix(files.root) if files.format in ("speculators", "eagle-bin") else None,
        )
    )
    view = sglang_view(files)
    geo, problems = geometry(view)
    findings += problems
    target, manifest = None, None
    if target_path is not None:
        target, problems = read_target(target_path)
        findings += problems
    if data is None and (draft / MANIFEST).is_file():
        data = draft  # the data contract a checkpoint of ours carries (online training has no extraction folder)
    if data is not None:
        manifest, problems = read_data(data)
        findings += problems
    ctx = Context(files, view, geo, target, manifest, context_length, enabled_options(view))
    findings += aux_ids_ignored_rule(ctx)
    findings += version_independent_rules(ctx)
    findings += merge_per_release({v: release_rules(ctx, facts.RELEASES[v]) for v in versions})
    return files.format
