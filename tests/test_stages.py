"""Our extraction stage launched from the CLI short form, as a run of the run engine."""

from __future__ import annotations

import json
from pathlib import Path

from backends.eagle3_contract import read_manifest
from tests.conftest import CLI


def test_extract_short_form_runs_as_a_run_and_follows_its_progress(
    cli: CLI, target: Path, tmp_path: Path, workdir: Path
) -> None:
    out = tmp_path / "hidden"
    result = cli(
        "extract", "--name", "ex", "--follow",
        "--target", str(target), "--data", "demo", "--out", str(out), "--limit", "24", "--shard-size", "8",
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    run_id = lines[0]
    header = lines[1].split()
    assert {"stage", "samples", "tokens", "tokens_per_s"} <= set(header)
    assert len(lines) >= 5  # the run id, a header and a progress row per shard
    manifest = read_manifest(out)
    assert manifest.samples == 24 and manifest.aux_layer_ids == [1, 3, 4]
    status = json.loads(cli("status", "--json").stdout)
    run = next(r for r in status["runs"] if r["id"] == run_id)
    assert run["kind"] == "extract" and run["name"] == "ex" and run["state"] == "exited"
    assert run["argv"][1:3] == ["-m", "backends.extract"]


def test_a_failing_stage_exits_1_with_its_state(cli: CLI, tmp_path: Path) -> None:
    result = cli("extract", "--follow", "--target", str(tmp_path / "missing"), "--data", "demo", "--out", "x")
    assert result.returncode == 1
    assert b"failed" in result.stderr
