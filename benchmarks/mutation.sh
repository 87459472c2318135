#!/usr/bin/env bash
# A mutation score for the modules that keep a run's fate and send signals (issue 27): mutmut 3 over each of
# them against its own tests, a table per module. By hand, from the repo root, never in CI:
#   bash benchmarks/mutation.sh [MODULE ...] [--workdir DIR] [--max-children 2]
# benchmarks/mutation.py says what it runs, where, and what the columns mean.
set -euo pipefail
cd "$(dirname "$0")/.."
export EAGLE3_SGLANG_PARSER_PATH="${EAGLE3_SGLANG_PARSER_PATH:-$PWD/.sglang-parser}"
export EAGLE3_SGLANG_PYTHON="${EAGLE3_SGLANG_PYTHON:-$PWD/.sglang-real/bin/python}"
# Lowest priority, CPU and disk: the machine is shared with whoever else is at work on it.
low=(nice -n 19)
if command -v ionice >/dev/null && ionice -c3 true 2>/dev/null; then
    low+=(ionice -c3)
fi
exec "${low[@]}" .venv/bin/python -m benchmarks.mutation "$@"
