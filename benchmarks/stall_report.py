"""How a watched run was called stalled, read from its folder: for the stall checks run on GPU hosts.

    python3 -m benchmarks.stall_report RUN_FOLDER

The checked run prints `last output at <unix time>` as its last line; the
report gives how long after it the stall was called, how the run sat still,
its CPU and GPU figures, and the stack dump's lines that show where it waits.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.runs.store import OUTPUT, STACKS, RunDir

WAIT_FRAMES = ("all_reduce", "synchronize", "MainThread")  # the stack lines worth printing


@dataclass
class StallFacts:
    last_output: float  # when the run printed its last line (nan: it never said)
    stalled: dict[str, Any] | None  # its first `stalled` event
    stack: str  # its first stack dump ("" when none)

    @property
    def called_after_s(self) -> float:
        return self.stalled["t"] - self.last_output if self.stalled else float("nan")


def stall_facts(folder: Path) -> StallFacts:
    run = RunDir(folder)
    output = run.file(OUTPUT).read_text()
    last = float(output.split("last output at ")[1].split()[0]) if "last output at " in output else float("nan")
    stalled = next((e for e in run.events() if e["type"] == "stalled"), None)
    dumps = sorted(run.file(STACKS).glob("*.txt")) if run.file(STACKS).is_dir() else []
    return StallFacts(last, stalled, dumps[0].read_text() if dumps else "")


def main() -> int:
    facts = stall_facts(Path(sys.argv[1]))
    if facts.stalled is None:
        print("NOT STALLED; events:", [e["type"] for e in RunDir(Path(sys.argv[1])).events()])
        return 1
    event = facts.stalled
    print(
        f"stalled {facts.called_after_s:.1f} s after the last line; kind {event['kind']}; busiest CPU "
        f"{event['cpu_percent']}%; GPU util {event['gpu_util']}; memory util {event['gpu_mem_util']}"
    )
    print("pids dumped:", facts.stack.count("=== pid "))
    print("\n".join(line for line in facts.stack.splitlines() if any(w in line for w in WAIT_FRAMES))[:1200])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
