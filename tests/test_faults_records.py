"""Faults in a run's records as a power cut leaves them, met by the real agent and CLI: the run's fate survives.

Real: the CLI and agent as processes, the run's supervisor and child (killed with SIGKILL, as a power cut ends
them without a word), its files on disk.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from backends.host import procinfo
from tests.conftest import CLI, launch, run_info, wait_for, wait_state

# What a power cut leaves at the end of events.jsonl: a line cut short, or the zeros of a block never written.
TORN = [b'{"t": 1764000000.25, "type": "sig', b"\x00" * 512]


@pytest.mark.parametrize("torn", TORN, ids=["json-prefix", "zeros"])
def test_a_run_whose_last_event_a_power_cut_tore_is_lost_not_corrupt(cli: CLI, workdir: Path, torn: bytes) -> None:
    run_id = launch(cli, "command", "--", sys.executable, "-c", "import time; time.sleep(120)")
    wait_state(cli, run_id, {"running"})
    folder = workdir / "runs" / run_id
    proc = json.loads((folder / "proc.json").read_text())
    idents = [procinfo.ProcIdentity.from_json(proc[role]) for role in ("supervisor", "child")]
    for ident in idents:  # the power cut: both end at once, nobody writes anything
        assert ident is not None
        os.kill(ident.pid, signal.SIGKILL)
    wait_for(lambda: not any(i is not None and procinfo.is_alive(i) for i in idents), what="supervisor and child gone")
    with (folder / "events.jsonl").open("ab") as events:
        events.write(torn)

    for _ in range(2):  # the first status records `lost` after the torn line, the next reads it back
        info = run_info(cli, run_id)
        assert (info["state"], info["corrupt"]) == ("lost", None)
    text = cli("status")
    assert text.returncode == 0 and b"corrupt" not in text.stdout
    lines = (folder / "events.jsonl").read_bytes().split(b"\n")
    assert torn in lines  # the torn bytes stay to be seen, as a line of their own
    after = [json.loads(line) for line in lines[lines.index(torn) + 1 :] if line]
    assert [(e["type"], e.get("bytes"), e.get("state")) for e in after] == [
        ("torn", len(torn), None),
        ("state", None, "lost"),
    ]
