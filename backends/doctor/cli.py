"""`python -m backends.doctor`: the command line.

Exit codes: 0 no errors, 1 errors in the draft, 2 the command line cannot be
followed; --help exits 0.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from backends.doctor.full import full_diagnosis
from backends.doctor.report import format_result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="doctor", description="Check an EAGLE-3 draft against SGLang before a launch.")
    p.add_argument("draft", type=Path)
    p.add_argument("--target", type=Path, help="the target model folder (config.json, safetensors)")
    p.add_argument("--data", type=Path, help="the extraction folder the draft was trained from")
    p.add_argument("--sglang-version", help="the SGLang release that will serve (default: the serving Python's)")
    p.add_argument("--context-length", type=int, help="the --context-length the server will get")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--dry-load", action="store_true", help="also load the draft with the serving SGLang's loader")
    p.add_argument(
        "--sglang-python",
        metavar="PATH",
        help="the Python that serves SGLang: its version and, with --dry-load, its loader (default: this one)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    result = full_diagnosis(
        args.draft,
        target=args.target,
        data=args.data,
        sglang_version=args.sglang_version,
        context_length=args.context_length,
        dry_load=args.dry_load,
        sglang_python=args.sglang_python,
    )
    print(json.dumps(result, indent=2) if args.json else format_result(result))
    return 1 if result["errors"] else 0
