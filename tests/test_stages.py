"""Our stages launched from the CLI short forms (`extract`, `train`), as runs of the run engine: real console
processes, real runs, real interpreters (a venv without torch is made for the refusal)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.eagle3_contract import read_manifest
from backends.runs.stages import python_problem
from backends.runs.store import RunDir
from console.cli.grammar import Parser, stage_groups, stage_options
from tests.conftest import CLI


def test_extract_short_form_runs_as_a_run_and_follows_its_progress(
    cli: CLI, target: Path, tmp_path: Path, workdir: Path
) -> None:
    out = tmp_path / "hidden"
    result = cli(
        "extract", "--name", "ex", "--follow", "--python", sys.executable,
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
    assert run["argv"][:3] == [sys.executable, "-m", "backends.extract"]


def test_a_failing_stage_exits_1_with_its_state(cli: CLI, tmp_path: Path) -> None:
    result = cli("extract", "--follow", "--target", str(tmp_path / "missing"), "--data", "demo", "--out", "x")
    assert result.returncode == 1
    assert b"failed" in result.stderr


def runs(workdir: Path) -> list[str]:
    folder = workdir / "runs"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("stage", ["train", "extract"])
def test_stage_help_is_printed_here_and_launches_nothing_even_for_a_host_out_of_reach(
    stage: str, workdir: Path
) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "console", "--workdir", str(workdir), "nobody@host.invalid", stage, "--data", "d", "-h"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"usage: eagle3-console HOST {stage} ")
    assert "run options (anywhere on the line)" in shown.stdout and "--python PATH" in shown.stdout
    assert f"{stage} options (python -m backends.{stage} ...)" in shown.stdout and "--data" in shown.stdout
    assert runs(workdir) == []


def test_a_typo_in_a_stages_options_is_a_usage_error_here_not_a_failed_run(cli: CLI, workdir: Path) -> None:
    typo = cli("train", "--data", "d", "--target", "t", "--out", "o", "--learning-rate", "1e-3")
    assert typo.returncode == 2
    assert typo.stderr.decode() == (
        "eagle3-console: unrecognized arguments: --learning-rate 1e-3 (see 'eagle3-console HOST train --help')\n"
    )
    missing = cli("extract", "--target", "t", "--out", "o")
    assert missing.returncode == 2 and b"the following arguments are required: --data" in missing.stderr
    assert runs(workdir) == []


def test_run_options_after_the_stages_own_reach_the_run(cli: CLI, tmp_path: Path, workdir: Path) -> None:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    launched = cli(
        "extract", "--target", str(tmp_path / "missing"), "--data", "demo", "--out", "x",
        "--env", "OMP_NUM_THREADS=1", "--cwd", str(folder), "--name", "late",
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    run_id = launched.stdout.decode().strip()
    run = json.loads(cli("status", run_id, "--json").stdout)
    assert run["name"] == "late" and run["env"]["OMP_NUM_THREADS"] == "1"
    launch = next(e for e in RunDir(workdir / "runs" / run_id).events() if e["type"] == "launch")
    assert launch["cwd"] == str(folder)
    assert run["argv"][3:] == ["--target", str(tmp_path / "missing"), "--data", "demo", "--out", "x"]


def test_a_python_without_torch_is_refused_before_anything_starts(cli: CLI, tmp_path: Path, workdir: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    python = str(bare / "bin" / "python")
    refused = cli("train", "--python", python, "--data", "d", "--target", "t", "--out", "o")
    assert refused.returncode == 1
    assert refused.stderr.decode() == (
        f"eagle3-console: {python} has no torch, which backends.train needs: give --python PATH, the host's Python "
        "that has torch (pip install 'eagle3-console[train]' into it)\n"
    )
    nowhere = cli("extract", "--python", str(tmp_path / "python9"), "--data", "d", "--target", "t", "--out", "o")
    assert nowhere.returncode == 1
    assert nowhere.stderr.decode().startswith(f"eagle3-console: {tmp_path / 'python9'} is not a Python on the host: ")
    assert runs(workdir) == []


STAGE_WORDS = [["--data", "d"], ["--target", "t"], ["--out", "o"], ["--steps", "3"], ["--resume"]]
RUN_WORDS = [["--name", "n"], ["--gpus", "0,1"], ["--env", "A=1"], ["--follow"], ["--python", "/p"], ["--nproc", "2"]]


@given(st.permutations(STAGE_WORDS + RUN_WORDS))
def test_run_options_go_anywhere_and_the_stages_words_keep_their_order(words: list[list[str]]) -> None:
    opts, rest = stage_options("train", [w for group in words for w in group])
    assert rest == [w for group in words if group in STAGE_WORDS for w in group]
    assert (opts.name, opts.gpus, opts.env, opts.follow, opts.python, opts.nproc) == (
        "n",
        [0, 1],
        [("A", "1")],
        True,
        "/p",
        2,
    )


@pytest.mark.parametrize("stage", ["train", "extract"])
def test_a_stage_option_never_shares_a_name_with_a_run_option(stage: str) -> None:
    stage_groups(Parser(), stage)  # argparse refuses two options of one name in one parser


def test_a_stage_python_given_relative_to_the_runs_folder_is_found_there(tmp_path: Path) -> None:
    """`--python ./venv/bin/python` with the run's folder as --cwd: the run starts there, and so does the check
    (it had looked in the agent's folder and refused the launch: not a Python on the host)."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # this venv's Python, which has torch
    python.chmod(0o755)
    argv = ["./venv/bin/python", "-m", "backends.train"]
    assert python_problem(argv, {}, str(tmp_path)) is None
    elsewhere = python_problem(argv, {}, str(tmp_path / "venv"))
    assert elsewhere is not None and elsewhere.startswith("./venv/bin/python is not a Python on the host: ")
