"""A doctor result as text, for people: one line per finding, its fix under it, the counts last."""

from __future__ import annotations

from backends.protocol import DoctorResult


def format_result(result: DoctorResult) -> str:
    lines = [
        f"draft {result['draft']} ({result['format']}), SGLang {', '.join(result['sglang_versions'])}",
    ]
    for item in result["findings"]:
        lines.append(f"{item['severity'].upper()} {item['code']}: {item['message']}")
        if item["fix"]:
            lines.append(f"  fix: {item['fix']}")
    lines.append(f"{result['errors']} error(s), {result['warnings']} warning(s)")
    return "\n".join(lines)
