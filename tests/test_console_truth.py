"""The console never states something false (issue 22, item 4): figures from the host's record, not from when the
console started looking; a ready server counted as ready; a NaN marked and told for any run; a stall's frames as
its dumps hold them; a node silent by design not stalled; lineage back to the last attempt that logged; read-only
refusing every change from the CLI.

Real: a local agent and its runs (processes, signals, files), Textual's pilot, the console CLI as a process, py-spy
on a real busy process. The stand-in server (tests/sglang_standin.py) stands for a GPU server only.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from backends.host import procinfo
from backends.protocol import RunInfo
from backends.runs import stalled, watch
from backends.runs.store import RunSpec, RunStore
from console import render
from console.fleet import jobs
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.tui.panels import RunDetail
from tests.conftest import CLI, REPO, free_port, until
from tests.test_tui_attention import console, launch

SILENT = "import time\nprint('loaded', flush=True)\ntime.sleep(600)"
NAN_ROWS = (
    "import json, os, time\n"
    "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as f:\n"
    "    f.write(json.dumps({'step': 1, 'loss': 2.5}) + '\\n')\n"
    "    f.write(json.dumps({'step': 2, 'loss': 'nan', 'grad_norm': 'inf'}) + '\\n')\n"
    "time.sleep(600)\n"
)


def detail(app: object) -> str:
    return str(app.query_one(RunDetail).render())  # type: ignore[attr-defined]


async def test_silence_is_the_hosts_figure_not_the_time_since_the_console_looked(
    workdir: Path, nvml_state: Path
) -> None:
    run_id = await launch(workdir, [sys.executable, "-c", SILENT], name="quiet")
    output = RunStore(workdir).get(run_id).file("output.log")
    for _ in range(100):
        if output.exists() and output.read_bytes():
            break
        await asyncio.sleep(0.1)
    then = time.time() - 240
    os.utime(output, (then, then))  # its last output 4 minutes ago, as the host's file says
    async with console(workdir) as (app, pilot, _):
        await until(pilot, lambda: "silent for " in detail(app), what="the silence")
        shown = detail(app)
        assert "over" not in shown
        assert "silent for 4 min\n" in shown, shown  # 240 s and a few: by the minute past two minutes


async def test_the_header_counts_a_ready_server_as_ready(workdir: Path, nvml_state: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "tests.sglang_standin", "--port", str(port)]
    server = await launch(workdir, argv, kind="serve", name="srv", health_url=f"http://127.0.0.1:{port}/health")
    await launch(workdir, [sys.executable, "-c", SILENT], name="busy")
    async with console(workdir) as (app, pilot, _):
        await until(
            pilot, lambda: server in app.runs and app.runs[server]["state"] == "ready", timeout=40, what="ready"
        )
        await until(pilot, lambda: "1 ready · 1 running" in app.sub_title, what="the counts")


async def test_a_nan_row_is_told_for_a_run_nobody_selected_and_marked_in_the_metrics_table(
    workdir: Path, nvml_state: Path, cli: CLI
) -> None:
    async with console(workdir) as (app, pilot, notes):
        first = await launch(workdir, [sys.executable, "-c", SILENT], name="watched")
        await until(pilot, lambda: app.followed == first, what="the first run selected")
        nan_run = await launch(workdir, [sys.executable, "-c", NAN_ROWS], kind="train", name="diverged")
        told = await until(
            pilot,
            lambda: next((n for n in notes if "is nan" in n.message or "is inf" in n.message), None),
            timeout=30,
            what="the NaN told",
        )
        assert app.followed == first  # not selected, and still told
        assert nan_run in told.message and "at step 2" in told.message
        assert sum(nan_run in n.message and n.title == "metrics" for n in notes) == 1
    table = cli("metrics", nan_run)
    assert "\u00d7nan" in table.stdout.decode() and "\u00d7inf" in table.stdout.decode()
    assert f"run {nan_run}: loss is nan at step 2" in table.stderr.decode()


def test_charts_read_a_nan_the_trainer_spelled_as_text() -> None:
    from console.tui.metric_store import MetricStore

    store = MetricStore()
    store.add_row({"step": 1, "loss": 2.0})
    store.add_row({"step": 2, "loss": "nan"})
    series = store.series("loss")
    assert series is not None and series.nonfinite == 1


def test_a_busy_rank_holding_the_gil_is_placed_at_its_frame(tmp_path: Path) -> None:
    script = tmp_path / "spin.py"
    script.write_text("def spin():\n    while True:\n        sum(range(100))\n\nspin()\n")
    child = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(1.0)
        run = RunStore(tmp_path / "work").create(RunSpec("command", [sys.executable, str(script)], name="spin"))
        dump = watch.dump_stacks(run, [child.pid]).read_text()
        found = stalled.with_places(stalled.before_dump([child.pid]), dump)
        assert "(active+gil)" in dump or "(active)" in dump or "(idle)" in dump, dump
        assert found[0]["where"] is not None and "spin (spin.py:3)" in found[0]["where"], dump
    finally:
        child.kill()
        child.wait()


def test_a_job_stall_line_says_what_the_dump_holds_never_no_stack() -> None:
    node: dict[str, Any] = {"id": "r1", "state": "stalled", "kind": "train", "exit_code": None, "error": None}
    node.update(signal=None, stall_kind="idle", job={"id": "j", "node_rank": 0, "nnodes": 1})
    node["stalled_processes"] = [{"pid": 769, "rank": None, "state": "S", "where": None}]
    [found] = jobs.gather([("a", [node])])  # type: ignore[list-item]
    state, story = found.state()
    assert state == "stalled" and "no stack" not in story and "pid 769 S, no frame in its dump" in story


def train_node(rank: int, state: str, host_runs: str = "0") -> RunInfo:
    info = {"id": f"r{rank}-{host_runs}", "state": state, "kind": "train", "exit_code": 0, "error": None}
    info.update(signal=None, stall_kind=None, job={"id": "j", "node_rank": rank, "nnodes": 2})
    return info  # type: ignore[return-value]


def test_a_job_with_a_host_out_of_reach_is_unknown_with_what_was_last_seen() -> None:
    [found] = jobs.gather([("a", [train_node(0, "exited")])])
    since = time.time() - 60
    at = time.strftime("%H:%M:%S", time.localtime(since))
    assert found.state() == ("exited", "node 1 not seen")  # every node seen has ended: never `running`
    text = jobs.jobs_text([found], {"b": since})
    assert text.startswith(f"job j  unknown (b unreachable since {at}; last seen: exited)  1/2 nodes")
    [shown] = jobs.jobs_json([found], {"b": since})
    assert shown["state"] == "unknown" and shown["detail"] == f"b unreachable since {at}; last seen: exited"


def test_a_torchrun_node_of_rank_1_is_silent_by_design_and_only_its_own_hang_stalls_it(tmp_path: Path) -> None:
    follower = RunSpec("train", ["torchrun"], job={"id": "j", "node_rank": 1, "nnodes": 2})
    assert watch.silent_by_design(follower)
    assert not watch.silent_by_design(RunSpec("train", ["torchrun"], job={"id": "j", "node_rank": 0, "nnodes": 2}))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert watch.own_hang("idle", [sleeper.pid]) is None  # waiting for node 0, as it does by design
        assert watch.own_hang("spinning", [sleeper.pid]) == "spinning"
        os.kill(sleeper.pid, signal.SIGSTOP)
        for _ in range(50):
            if (stat := procinfo.read_stat(sleeper.pid)) is not None and stat.state == "T":
                break
            time.sleep(0.05)
        assert watch.own_hang("idle", [sleeper.pid]) == "idle"  # a stopped rank is a hang of its own
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_a_silent_node_1_of_a_training_job_is_not_called_stalled(workdir: Path, nvml_state: Path) -> None:
    async with AgentClient(LocalTransport(workdir)) as client:
        launched = await client.launch(
            "train",
            [sys.executable, "-c", "import time; time.sleep(600)"],
            name="n1",
            stall_after=2,
            job="j",
            node_rank=1,
            nnodes=2,
        )
        await asyncio.sleep(8)  # four windows of silence and idleness
        info = await client.run_info(launched["run"])
        assert info["state"] == "running", info


async def test_lineage_goes_back_to_the_last_attempt_that_logged_and_lists_every_edit_since(
    workdir: Path, nvml_state: Path
) -> None:
    script = (
        "import json, os, sys, time\n"
        "if '--fail' in sys.argv: sys.exit(3)\n"
        "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as f:\n"
        "    for step in (1, 2, 3): f.write(json.dumps({'step': step, 'loss': 3.0 - step / 2}) + '\\n')\n"
        "time.sleep(600 if '--last' in sys.argv else 0)\n"
    )
    async with AgentClient(LocalTransport(workdir)) as client:
        logged = (await client.launch("train", [sys.executable, "-c", script, "--lr", "1"], name="a"))["run"]
        await wait_ended(client, logged)
        failed = (await client.relaunch(logged, set=["--lr=2", "--fail"]))["run"]
        await wait_ended(client, failed)
        last = (await client.relaunch(failed, set=["--last"], unset=["--fail"]))["run"]
    async with console(workdir) as (app, pilot, _):
        await until(pilot, lambda: app.followed == last, what="the newest run selected")
        await until(pilot, lambda: "edits since" in detail(app), timeout=30, what="the edits")
        shown = " ".join(detail(app).split())
        assert f"edits since {logged}, the last attempt that logged" in shown, shown
        assert f"{failed}: --lr 1→2, added --fail" in shown and f"{last}: removed --fail, added --last" in shown
        assert app.overlaid == logged


async def wait_ended(client: AgentClient, run_id: str) -> None:
    for _ in range(300):
        if (await client.run_info(run_id))["state"] in ("exited", "failed"):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"run {run_id} did not end")


def eagle3(workdir: Path, config_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home)}
    return subprocess.run(
        [sys.executable, "-m", "console", "--workdir", str(workdir), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_readonly_refuses_every_change_from_the_cli_saying_where_it_is_set(
    workdir: Path, nvml_state: Path, tmp_path: Path
) -> None:
    settings = tmp_path / "xdg" / "eagle3-console" / "config.toml"
    settings.parent.mkdir(parents=True)
    settings.write_text("[defaults]\nreadonly = true\n")
    xdg = tmp_path / "xdg"
    started = eagle3(workdir, xdg, "--no-readonly", "local", "launch", "command", "--", sys.executable, "-c", SILENT)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip().splitlines()[-1]
    changes = (
        ["kill", run_id],
        ["relaunch", run_id],
        ["free-gpus"],
        ["launch", "command", "--", "true"],
        ["serve", "/models/target", "/models/draft"],
        ["train", "--data", "/d", "--target", "/t", "--out", "/o"],
        ["extract", "--data", "demo", "--target", "/t", "--out", "/o"],
        ["bench", run_id],  # a run of its own on the host
        ["convert", str(tmp_path / "src"), str(tmp_path / "dst")],  # writes DST on the host
    )
    for words in changes:
        refused = eagle3(workdir, xdg, "local", *words)
        assert refused.returncode == 1, (words, refused.stderr)
        assert refused.stderr == (
            f"eagle3-console: {words[0]} refused: local is read-only here (readonly = true in {settings} "
            "[defaults]); --no-readonly allows it for one command\n"
        )
    flagged = eagle3(workdir, tmp_path / "none", "--readonly", "local", "kill", run_id)
    assert flagged.returncode == 1 and "(--readonly)" in flagged.stderr and len(flagged.stderr.splitlines()) == 1
    listed = json.loads(eagle3(workdir, xdg, "local", "status", "--json").stdout)
    assert [run["state"] for run in listed["runs"]] == ["running"]  # nothing was killed
    assert eagle3(workdir, xdg, "local", "relaunch", run_id, "--dry-run").returncode == 0  # a preview changes nothing
    assert render.attention_counts([{"state": "ready"}, {"state": "running"}]) == "1 ready · 1 running"
