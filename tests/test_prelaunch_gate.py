"""The pre-launch gate, as a user meets it: `launch serve` and `relaunch` run doctor on the draft first."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from backends.runs.store import RunDir
from console.link.client import AgentClient
from console.link.transport import AgentError
from tests.conftest import CLI
from tests.draft_fixtures import HIDDEN, good_draft, write_target

SERVER = "import sys, time; print('serving', flush=True); time.sleep(60)"


def serve_argv(draft: Path, target: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-c", SERVER, "--model-path", str(target),
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft), *extra,
    ]  # fmt: skip


def runs(workdir: Path) -> list[str]:
    folder = workdir / "runs"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_broken_draft_refuses_the_launch_with_its_findings(cli: CLI, workdir: Path, tmp_path: Path) -> None:
    target = write_target(tmp_path / "target")
    # The story's second fault: a draft whose fc was trained on one layer's features.
    draft = good_draft(tmp_path / "draft", fc_in=HIDDEN)
    result = cli("launch", "serve", "--", *serve_argv(draft, target))
    assert result.returncode == 1
    err = result.stderr.decode()
    assert "ERROR fc-width" in err and "fix:" in err
    assert err.strip().splitlines()[-1].startswith("eagle3-console: doctor found")
    assert "--force" in err
    assert runs(workdir) == []  # nothing was started


def test_force_launches_anyway_and_records_the_findings(cli: CLI, workdir: Path, tmp_path: Path) -> None:
    target = write_target(tmp_path / "target")
    draft = good_draft(tmp_path / "draft", fc_in=HIDDEN)
    result = cli("launch", "serve", "--force", "--", *serve_argv(draft, target))
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.decode().strip()
    events = RunDir(workdir / "runs" / run_id).events()
    doctor = next(e for e in events if e["type"] == "doctor")
    assert doctor["errors"] >= 1 and any(f["code"] == "fc-width" for f in doctor["findings"])
    cli("kill", run_id, "--grace", "1")


def test_a_good_draft_launches_and_the_check_is_in_the_reply(cli: CLI, tmp_path: Path) -> None:
    target = write_target(tmp_path / "target")
    draft = good_draft(tmp_path / "draft")
    result = cli("launch", "serve", "--json", "--", *serve_argv(draft, target))
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["doctor"]["errors"] == 0 and reply["doctor"]["draft"] == str(draft)
    cli("kill", reply["run"], "--grace", "1")


def test_relaunch_onto_a_broken_draft_is_refused_before_the_parent_is_stopped(
    cli: CLI, workdir: Path, tmp_path: Path
) -> None:
    target = write_target(tmp_path / "target")
    good = good_draft(tmp_path / "good")
    broken = good_draft(tmp_path / "broken", layer="layers.0", fc_in=HIDDEN)
    parent = cli("launch", "serve", "--", *serve_argv(good, target)).stdout.decode().strip()
    refused = cli("relaunch", parent, "--set", f"--speculative-draft-model-path={broken}")
    assert refused.returncode == 1 and b"doctor found" in refused.stderr
    status = json.loads(cli("status", "--json").stdout)
    assert [(r["id"], r["state"]) for r in status["runs"]] == [(parent, "running")]
    cli("kill", parent, "--grace", "1")


def test_other_kinds_and_serve_without_a_draft_are_not_checked(cli: CLI, tmp_path: Path) -> None:
    result = cli("launch", "serve", "--json", "--", sys.executable, "-c", "pass", "--model-path", "/nowhere")
    assert result.returncode == 0 and json.loads(result.stdout)["doctor"] is None


def test_doctor_and_convert_commands(cli: CLI, tmp_path: Path) -> None:
    target = write_target(tmp_path / "target")
    broken = good_draft(tmp_path / "draft", layer="layers.0")
    checked = cli("doctor", str(broken), "--target", str(target), "--sglang-version", "0.5.5")
    assert checked.returncode == 1 and b"ERROR weights-dropped" in checked.stdout
    converted = cli("convert", str(broken), str(tmp_path / "fixed"), "--json")
    assert converted.returncode == 0, converted.stderr
    again = cli("doctor", str(tmp_path / "fixed"), "--target", str(target), "--sglang-version", "0.5.5", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["errors"] == 0
    refused = cli("convert", str(broken), str(tmp_path / "fixed"))
    assert refused.returncode == 1 and refused.stderr.decode().count("\n") == 1


async def test_the_console_can_ask_for_the_verdict_before_launching(client: AgentClient, tmp_path: Path) -> None:
    target = write_target(tmp_path / "target")
    draft = good_draft(tmp_path / "draft", fc_in=HIDDEN)
    reply = await client.request("preflight", kind="serve", argv=serve_argv(draft, target))
    assert reply["doctor"]["errors"] >= 1
    assert {"code", "severity", "message", "fix"} <= set(reply["doctor"]["findings"][0])
    assert (await client.request("preflight", kind="train", argv=["python", "train.py"]))["doctor"] is None
    with pytest.raises(AgentError) as err:
        await client.request("launch", kind="serve", argv=serve_argv(draft, target))
    assert err.value.code == "doctor_refused" and err.value.details["errors"] >= 1


def test_a_good_serve_launch_with_sglang_in_its_python_is_checked_there_and_not_refused(
    cli: CLI, tmp_path: Path, sglang_python: Path
) -> None:
    """The gate asks the serve command's own interpreter (the real SGLang 0.5.23 tier, not the agent's Python):
    its version for doctor's rules, and its loader for the dry-load. The server then fails on this CPU machine."""
    target, draft = write_target(tmp_path / "target"), good_draft(tmp_path / "draft")
    argv = [
        str(sglang_python), "-m", "sglang.launch_server", "--model-path", str(target),
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
    ]  # fmt: skip
    result = cli("launch", "serve", "--json", "--", *argv, timeout=180)
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    doctor = reply["doctor"]
    assert doctor["errors"] == 0 and doctor["sglang_versions"] == ["0.5.23"]
    codes = {f["code"]: f["message"] for f in doctor["findings"]}
    assert codes["sglang-version"] == f"checked against SGLang 0.5.23 (the sglang of {sglang_python})"
    assert codes["dry-load-unwritten"].startswith("SGLang 0.5.23's loader consumed every tensor")
    cli("kill", reply["run"], "--grace", "1")


def test_doctor_command_over_the_agent_names_the_serving_python(cli: CLI, tmp_path: Path, sglang_python: Path) -> None:
    draft = good_draft(tmp_path / "draft")
    checked = cli("doctor", str(draft), "--dry-load", "--sglang-python", str(sglang_python), "--json", timeout=180)
    assert checked.returncode == 0, checked.stderr
    result = json.loads(checked.stdout)
    assert result["sglang_versions"] == ["0.5.23"]
    assert any(f["message"].startswith("SGLang 0.5.23's loader consumed every tensor") for f in result["findings"])
