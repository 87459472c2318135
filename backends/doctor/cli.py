"""`python -m backends.doctor`: the command line, and a result as text.

Exit codes: 0 no errors, 1 errors in the draft, 2 the command line cannot be
followed; --help exits 0.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="doctor", description="Check an EAGLE-3 draft against SGLang before a launch.")
    p.add_argument("draft", type=Path)
    p.add_argument("--target", type=Path, help="the target model folder (config.json, safetensors)")
    p.add_argument("--data", type=Path, help="the extraction folder the draft was trained from")
    p.add_argument("--sglang-version", help="the SGLang release that will serve (default: the installed one)")
    p.add_argument("--context-length", type=int, help="the --context-length the server will get")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--dry-load", action="store_true", help="also load the draft with the installed SGLang's loader")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    from backends.preflight import full_diagnosis  # preflight builds on this package

    result = full_diagnosis(
        args.draft,
        target=args.target,
        data=args.data,
        sglang_version=args.sglang_version,
        context_length=args.context_length,
        dry_load=args.dry_load,
    )
    print(json.dumps(result, indent=2) if args.json else format_result(result))
    return 1 if result["errors"] else 0
