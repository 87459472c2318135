"""The command line as a user runs it: real agent, real supervisor, real child processes."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from backends.protocol import GpuInfo, RunInfo
from backends.runs.store import RunDir, RunStore
from tests.conftest import CLI, Spawn, launch, run_info, status, wait_for, wait_state
from tests.fake_nvml import HOLDER, gpu, stand_in_nodes, write_state

PRINTER = (
    "import sys, time, json, os\n"
    "out = sys.stdout.buffer\n"
    "out.write(b'start\\n'); out.write(b'progress 10%\\rprogress 100%\\n')\n"
    "out.write(b'bad utf8: \\xff\\xfe\\n')\n"
    "out.write(b'x' * (10 * 1024 * 1024) + b'\\n')\n"
    "sys.stderr.write('to stderr\\n')\n"
    "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:\n"
    "    m.write(json.dumps({'step': 1, 'loss': 5.4}) + '\\n')\n"
    "    m.write('garbage{\\n')\n"
    "    m.write(json.dumps({'step': 2, 'loss': 4.9}) + '\\n')\n"
    '    m.write(\'{"step": 3, "lo\')\n'
    "out.flush(); sys.exit(3)\n"
)


def test_launch_logs_metrics_status_round_trip(cli: CLI, workdir: Path) -> None:
    run_id = launch(cli, "command", "--name", "printer", "--", sys.executable, "-c", PRINTER)
    info = wait_state(cli, run_id, {"failed"})
    assert info["exit_code"] == 3
    assert info["name"] == "printer" and info["kind"] == "command"
    assert info["argv"][0] == sys.executable
    for field in ("phase", "health", "stalled_since", "stall_kind", "stack_dumps"):
        assert info[field] is None

    logs = cli("logs", "printer")
    assert logs.returncode == 0
    on_disk = (workdir / "runs" / run_id / "output.log").read_bytes()
    assert logs.stdout == on_disk
    assert b"progress 10%\rprogress 100%\n" in on_disk
    assert b"bad utf8: \xff\xfe\n" in on_disk
    assert b"x" * (10 * 1024 * 1024) + b"\n" in on_disk
    assert b"to stderr\n" in on_disk

    tail = cli("logs", run_id, "--tail", "2")
    assert tail.stdout == b"x" * (10 * 1024 * 1024) + b"\nto stderr\n"

    metrics = cli("metrics", run_id, "--json")
    assert metrics.returncode == 0
    rows = [json.loads(line) for line in metrics.stdout.splitlines()]
    assert rows == [{"step": 1, "loss": 5.4}, {"step": 2, "loss": 4.9}]
    assert b"skipped 1 malformed" in metrics.stderr

    table = cli("metrics", run_id)
    assert b"step" in table.stdout and b"4.9" in table.stdout
    last = cli("metrics", run_id, "--tail", "1").stdout.decode().splitlines()
    assert last[0].split() == ["step", "loss"] and last[1].split() == ["2", "4.9"]


def test_the_local_host_needs_no_ssh_library(workdir: Path, nvml_state: Path) -> None:
    # A GPU host runs `local` commands (benchmarks, scripts) where asyncssh is not installed.
    script = (
        "import sys; sys.modules['asyncssh'] = None\n"  # any import of it now fails
        f"sys.argv[1:] = ['--workdir', {str(workdir)!r}, 'local', 'status']\n"
        "from console.__main__ import main\n"
        "sys.exit(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "no runs yet" in done.stdout


def test_status_table_and_json_shape(cli: CLI) -> None:
    row = "import json, os; open(os.environ['EAGLE3_METRICS_FILE'], 'a').write(json.dumps({'step': 7}) + '\\n')"
    run_id = launch(cli, "train", "--", sys.executable, "-c", row)
    wait_state(cli, run_id, {"exited"})
    data = status(cli)
    assert set(data) >= {"host", "gpu_source", "runs", "gpus"}
    assert data["gpu_source"] == "nvml"
    gpu = data["gpus"][0]
    assert set(gpu) == GpuInfo.__required_keys__  # the status JSON is the protocol's, field for field
    assert set(data["runs"][0]) == RunInfo.__required_keys__
    text = cli("status").stdout.decode()
    assert run_id in text and "exited" in text and "NVIDIA H200" in text
    header, row_shown = next(line for line in text.splitlines() if line.startswith("RUN ")), text.split(run_id)[1]
    assert data["runs"][0]["progress"] == {"step": 7}
    assert row_shown[header.index("PHASE") - len(run_id) :].startswith("step 7")  # how far it got, as its rows say


def test_status_shows_the_gpus_each_run_holds_and_how_busy_they_are(cli: CLI, nvml_state: Path) -> None:
    trainer = launch(cli, "train", "--", sys.executable, "-c", "import time; time.sleep(60)")
    idle = launch(cli, "command", "--", sys.executable, "-c", "import time; time.sleep(60)")
    pid = wait_for(lambda: run_info(cli, trainer)["pid"], what="the trainer's pid")
    write_state(nvml_state, [gpu(util=97, processes=[(pid, 4096)]), gpu(util=0), gpu(processes=[(pid, 10)])])
    rows = {line.split()[0]: line for line in cli("status").stdout.decode().splitlines() if line[:1].isdigit()}
    header = next(line for line in cli("status").stdout.decode().splitlines() if line.startswith("RUN "))
    column = header.index("GPUS")
    assert rows[trainer][column:].split()[:2] == ["0:97%", "2:0%"]
    assert rows[idle][column:].split()[0] == "-"
    for run_id in (trainer, idle):
        cli("kill", run_id, "--grace", "1")


def test_missing_program_fails_with_os_error(cli: CLI, workdir: Path) -> None:
    result = cli("launch", "command", "--", "/nonexistent/program", "--flag")
    assert result.returncode == 1
    run_id = result.stdout.decode().strip()
    assert b"No such file or directory" in result.stderr and len(result.stderr.splitlines()) == 1
    assert run_info(cli, run_id)["state"] == "failed"
    events = (workdir / "runs" / run_id / "events.jsonl").read_text()
    assert "No such file or directory" in events


def test_argv_never_goes_through_a_shell(cli: CLI, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    run_id = launch(cli, "command", "--", "echo", f"$(touch {marker})", ";", "touch", str(marker))
    wait_state(cli, run_id, {"exited"})
    assert not marker.exists()
    assert cli("logs", run_id).stdout == f"$(touch {marker}) ; touch {marker}\n".encode()


def test_secrets_are_masked_in_status_and_events_but_reach_the_run(cli: CLI, workdir: Path) -> None:
    run_id = launch(
        cli,
        "command",
        "--env",
        "HF_TOKEN=hf_supersecret",
        "--env",
        "PLAIN=visible",
        "--",
        sys.executable,
        "-c",
        "import os; print(os.environ['HF_TOKEN'])",
        "--api-key",
        "sk-secret2",
    )
    wait_state(cli, run_id, {"exited"})
    info = run_info(cli, run_id)
    assert info["env"] == {"HF_TOKEN": "***", "PLAIN": "visible"}
    assert "sk-secret2" not in json.dumps(info) and "--api-key" in info["argv"]
    assert "hf_supersecret" not in cli("status").stdout.decode()
    events = (workdir / "runs" / run_id / "events.jsonl").read_text()
    assert "hf_supersecret" not in events and "sk-secret2" not in events
    assert cli("logs", run_id).stdout == b"hf_supersecret\n"


def test_unknown_run_is_a_one_line_failure(cli: CLI) -> None:
    for command in (["logs", "nope"], ["kill", "nope"], ["metrics", "nope"], ["relaunch", "nope"]):
        result = cli(*command)
        assert result.returncode == 1, command
        assert result.stderr.decode().count("\n") == 1 and "no run 'nope'" in result.stderr.decode()


def test_usage_errors_exit_2_with_one_line(cli: CLI) -> None:
    cases = [
        ["launch", "command"],  # no argv after --
        ["launch", "bogus-kind", "--", "true"],
        ["launch", "command", "--gpus", "a,b", "--", "true"],
        ["kill", "x", "--signal", "HUP"],
        ["status", "--", "true"],
        [],
    ]
    for args in cases:
        result = cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.decode().count("\n") == 1, result.stderr
        assert b"Traceback" not in result.stderr


def test_corrupt_or_missing_spec_is_reported_not_fatal(cli: CLI, workdir: Path) -> None:
    good = launch(cli, "command", "--", "true")
    runs = workdir / "runs"
    (runs / "20200101-000000-000-aaaa").mkdir()
    (runs / "20200101-000000-000-aaaa" / "spec.json").write_text("{not json")
    (runs / "20200101-000000-001-bbbb").mkdir()
    os.utime(runs / "20200101-000000-001-bbbb", (0, 0))  # long past the moment a launch writes its spec
    (runs / "20200101-000000-002-cccc").mkdir()  # a launch between making its folder and writing its spec
    data = status(cli)
    assert [r["id"] for r in data["runs"] if r["state"] != "corrupt"] == [good]
    corrupt = {r["id"]: r["corrupt"] for r in data["runs"] if r["state"] == "corrupt"}
    assert set(corrupt) == {"20200101-000000-000-aaaa", "20200101-000000-001-bbbb"}  # not cccc: being made
    assert corrupt["20200101-000000-001-bbbb"] == {"file": "spec.json", "reason": "missing"}
    assert "not valid JSON" in corrupt["20200101-000000-000-aaaa"]["reason"]
    text = cli("status")
    assert text.returncode == 0 and b"run 20200101-000000-000-aaaa is corrupt: spec.json: not valid JSON" in text.stdout
    result = cli("relaunch", "20200101-000000-000-aaaa")
    assert result.returncode == 1 and b"spec.json: not valid JSON" in result.stderr


def test_kill_stops_the_whole_process_group(cli: CLI) -> None:
    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print('up', flush=True); time.sleep(300)\n"
    )
    run_id = launch(cli, "command", "--", sys.executable, "-c", script)
    wait_for(lambda: cli("logs", run_id).stdout == b"up\n", what="child up")
    result = cli("kill", run_id, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert len(report["processes"]) == 2 and all(p["died"] for p in report["processes"])
    assert all(p["signals"] == ["TERM"] for p in report["processes"])
    assert report["state"] == "killed" and not report["escalated"]
    for p in report["processes"]:
        assert not Path(f"/proc/{p['pid']}").exists() or "Z" in Path(f"/proc/{p['pid']}/stat").read_text().split()[2]


def test_kill_escalates_to_sigkill_after_grace(cli: CLI, workdir: Path) -> None:
    script = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\ntime.sleep(300)\n"
    )
    run_id = launch(cli, "command", "--", sys.executable, "-c", script)
    wait_for(lambda: cli("logs", run_id).stdout == b"ready\n", what="child ready")
    result = cli("kill", run_id, "--grace", "0.5", "--json")
    report = json.loads(result.stdout)
    assert report["escalated"] and report["processes"][0]["signals"] == ["TERM", "KILL"]
    assert report["processes"][0]["died"]
    info = run_info(cli, run_id)
    assert info["state"] == "killed" and info["signal"] == "KILL"
    events = RunDir(workdir / "runs" / run_id).events()
    assert [e["signal"] for e in events if e["type"] == "signal"] == ["TERM", "KILL"]


def test_kill_of_an_ended_run_says_so(cli: CLI) -> None:
    run_id = launch(cli, "command", "--", "true")
    wait_state(cli, run_id, {"exited"})
    result = cli("kill", run_id)
    assert result.returncode == 1 and b"nothing to kill" in result.stderr


def test_recycled_pid_is_never_signalled(cli: CLI, workdir: Path, spawn: Spawn) -> None:
    """The recorded child is gone and its pid now names another process of ours."""

    run_id = launch(cli, "command", "--", "true")
    wait_state(cli, run_id, {"exited"})
    bystander = spawn(["sleep", "60"])
    run_dir = RunStore(workdir).get(run_id)
    proc = json.loads(run_dir.file("proc.json").read_text())
    proc["child"]["pid"] = bystander.pid  # same pid, start time of the old process
    run_dir.file("proc.json").write_text(json.dumps(proc))
    result = cli("kill", run_id, "--signal", "KILL")
    assert result.returncode == 1 and b"nothing to kill" in result.stderr
    assert bystander.poll() is None
    assert os.path.exists(f"/proc/{bystander.pid}")


def test_relaunch_sets_and_unsets_flags_and_links_parent(cli: CLI) -> None:
    script = "import sys, time; print(' '.join(sys.argv[1:]), flush=True); time.sleep(300)"
    parent = launch(
        cli, "serve", "--name", "srv", "--", sys.executable, "-c", script, "--cuda-graph-max-bs", "8", "--tp-size", "2"
    )
    wait_for(lambda: cli("logs", parent).stdout, what="parent output")
    result = cli(
        "relaunch",
        "srv",
        "--set",
        "--disable-cuda-graph",
        "--set",
        "--tp-size=1",
        "--unset",
        "--cuda-graph-max-bs",
        "--grace",
        "2",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    child = report["run"]
    assert report["parent"] == parent
    assert report["stopped_parent"]["state"] == "killed"
    assert run_info(cli, child)["parent"] == parent
    wait_for(lambda: cli("logs", child).stdout, what="child output")
    assert cli("logs", child).stdout == b"--tp-size 1 --disable-cuda-graph\n"
    assert run_info(cli, child)["name"] == "srv"
    cli("kill", child, "--grace", "1")


def test_logs_follow_streams_until_the_run_ends(cli: CLI) -> None:
    script = "import time\nfor i in range(5):\n    print(f'line {i}', flush=True)\n    time.sleep(0.2)\n"
    run_id = launch(cli, "command", "--", sys.executable, "-c", script)
    result = cli("logs", run_id, "--follow", timeout=30)
    assert result.returncode == 0
    assert result.stdout == b"".join(f"line {i}\n".encode() for i in range(5))


def test_free_gpus_dry_run_then_for_real(cli: CLI, nvml_state: Path, spawn: Spawn, tmp_path: Path) -> None:
    nodes = stand_in_nodes(tmp_path / "dev")  # the NVML double's /dev/nvidiaN, which a GPU holder maps
    holder = spawn([sys.executable, "-c", HOLDER, str(nodes / "nvidia0")], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
    state = json.loads(nvml_state.read_text())
    state["gpus"][0]["processes"] = [{"pid": holder.pid, "mem_mib": 4600}, {"pid": 1, "mem_mib": 100}]
    state["dev_dir"] = str(nodes)
    nvml_state.write_text(json.dumps(state))

    plan = cli("free-gpus", "--dry-run")
    assert plan.returncode == 0
    text = plan.stdout.decode()
    assert f"pid {holder.pid}" in text and "kill" in text and "dry run" in text
    assert "pid 1 " in text and "skip" in text
    assert holder.poll() is None

    refused = cli("free-gpus")  # no tty, no --yes
    assert refused.returncode == 2 and b"--yes" in refused.stderr
    assert holder.poll() is None

    done = cli("free-gpus", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["gpus"][0]
    assert report["freed_mib"] == 4600
    assert [p["pid"] for p in report["still_held"]] == [1]
    holder.wait(timeout=5)


def test_gpu_processes_are_attributed_to_their_run_and_freeing_them_kills_it(
    cli: CLI, nvml_state: Path, tmp_path: Path
) -> None:
    nodes = stand_in_nodes(tmp_path / "dev")
    # The grandchild maps GPU 0's node (the double's stand-in) before it says its pid, as a CUDA context would.
    script = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {HOLDER!r}, sys.argv[1]], stdout=subprocess.PIPE)\n"
        "p.stdout.readline(); print(p.pid, flush=True); p.wait()\n"
    )
    run_id = launch(cli, "train", "--gpus", "0", "--", sys.executable, "-c", script, str(nodes / "nvidia0"))
    grandchild = int(wait_for(lambda: cli("logs", run_id).stdout.split(b"\n")[0], what="pid"))
    state = json.loads(nvml_state.read_text())
    state["gpus"][0]["processes"] = [{"pid": grandchild, "mem_mib": 2048}]
    state["dev_dir"] = str(nodes)
    nvml_state.write_text(json.dumps(state))
    gpu = status(cli)["gpus"][0]
    assert gpu["processes"][0]["run_id"] == run_id
    assert gpu["mem_used_mib"] == 2048
    assert f"{grandchild}(" in cli("status").stdout.decode() and run_id in cli("status").stdout.decode()

    freed = cli("free-gpus", "--yes")
    assert freed.returncode == 0 and b"freed 2048 MiB" in freed.stdout
    # The run lost its GPU process to our own action: killed, not failed.
    assert wait_state(cli, run_id, {"killed", "failed", "exited"})["state"] == "killed"


def test_metrics_from_specforge_stdout_reach_the_metrics_command(cli: CLI) -> None:
    script = (
        'print(\'step 10: {"train/loss": 5.4, "train/acc_0": 0.03}\')\n'
        'print(\'step 20: {"train/loss": 4.1, "train/acc_0": 0.21}\')\n'
    )
    run_id = launch(cli, "train", "--metrics-from", "specforge", "--", sys.executable, "-c", script)
    wait_state(cli, run_id, {"exited"})
    rows = [json.loads(line) for line in cli("metrics", run_id, "--json").stdout.splitlines()]
    assert [(r["step"], r["loss"], r["acc_0"]) for r in rows] == [(10, 5.4, 0.03), (20, 4.1, 0.21)]
    bad = cli("launch", "train", "--metrics-from", "wandb", "--", "true")
    assert bad.returncode == 2 and b"specforge" in bad.stderr


def test_metrics_follow_prints_a_live_table_until_the_run_ends(cli: CLI) -> None:
    script = (
        "import json, os, time\n"
        "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:\n"
        "    for step in range(1, 4):\n"
        "        m.write(json.dumps({'step': step, 'loss': 6.0 - step}) + '\\n'); m.flush(); time.sleep(0.2)\n"
    )
    run_id = launch(cli, "train", "--", sys.executable, "-c", script)
    result = cli("metrics", run_id, "--follow")
    assert result.returncode == 0
    lines = [line.split() for line in result.stdout.decode().splitlines()]
    assert lines == [["step", "loss"], ["1", "5"], ["2", "4"], ["3", "3"]]
    assert f"run {run_id} exited".encode() in result.stderr


# A run that writes rows while `metrics --follow` reads them: a wall time t (1.796e+09 in %g), a row with a name the
# first rows lack (val_loss), and rows after the follow has started (it waits for the go file, made once the follow
# has printed the first rows). Real agent, real run, real CLI.
FOLLOWED = (
    "import json, os, sys, time\n"
    "go = sys.argv[1]\n"
    "def row(r):\n"
    "    m.write(json.dumps(r) + '\\n'); m.flush()\n"
    "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:\n"
    "    row({'step': 1, 'loss': 5.25, 't': 1796000000.123456})\n"
    "    while not os.path.exists(go): time.sleep(0.02)\n"
    "    for step in range(2, 6):\n"
    "        row({'step': step, 'loss': 6.0 - step, 't': 1796000000.123456 + step})\n"
    "    row({'step': 6, 'loss': 0.5, 'val_loss': 0.75, 't': 1796000006.5})\n"
)


def follow_while_writing(cli: CLI, workdir: Path, form: str) -> tuple[str, list[bytes], bytes, int]:
    """`metrics RUN --follow FORM` read line by line while the run writes; the run, the lines, stderr, the exit."""
    go = workdir / "go"
    run_id = launch(cli, "train", "--", sys.executable, "-c", FOLLOWED, str(go))
    argv = [sys.executable, "-m", "console", "--workdir", str(workdir), "local", "metrics", run_id, "--follow", form]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    watchdog = threading.Timer(20, proc.kill)  # a follow that never prints fails the test, never hangs it
    watchdog.start()
    try:
        lines = [proc.stdout.readline()]  # the first row (JSON) or the header (CSV): the follow is under way
        go.touch()
        lines += proc.stdout.readlines()
        _, err = proc.communicate(timeout=20)
    finally:
        watchdog.cancel()
    return run_id, lines, err, proc.returncode


def test_metrics_follow_json_streams_the_rows_metrics_json_prints(cli: CLI, workdir: Path) -> None:
    run_id, lines, err, code = follow_while_writing(cli, workdir, "--json")
    assert code == 0 and f"run {run_id} exited".encode() in err
    followed = [json.loads(line) for line in lines]  # JSON Lines: each line parses alone
    assert [r["step"] for r in followed] == [1, 2, 3, 4, 5, 6]  # every row once
    whole = cli("metrics", run_id, "--json")
    assert followed == [json.loads(line) for line in whole.stdout.splitlines()]
    assert followed[0]["t"] == 1796000000.123456 and followed[5]["val_loss"] == 0.75
    for out in (b"".join(lines), whole.stdout):
        assert b"1796000000.123456" in out and b"e+09" not in out


def test_metrics_follow_csv_writes_the_header_once_then_every_row(cli: CLI, workdir: Path) -> None:
    run_id, lines, err, code = follow_while_writing(cli, workdir, "--csv")
    assert code == 0 and f"run {run_id} exited".encode() in err
    followed = list(csv.reader(io.StringIO(b"".join(lines).decode(), newline="")))
    assert followed[0] == ["step", "loss", "t"]  # the header, once, from the first row
    assert [r[0] for r in followed[1:]] == ["1", "2", "3", "4", "5", "6"]
    assert followed[1] == ["1", "5.25", "1796000000.123456"]
    # val_loss appeared after the header: left out of the stream and said once; `metrics --csv` has it.
    assert followed[6] == ["6", "0.5", "1796000006.5"]
    assert err.count(b"val_loss") == 1 and b"left out" in err
    whole = list(csv.reader(io.StringIO(cli("metrics", run_id, "--csv").stdout.decode(), newline="")))
    assert whole[0] == ["step", "loss", "t", "val_loss"]
    assert [r[:3] for r in whole] == [r[:3] for r in followed]


def test_metrics_follow_table_shows_the_wall_time_as_a_clock(cli: CLI, workdir: Path) -> None:
    _, lines, _, code = follow_while_writing(cli, workdir, "--wide")
    assert code == 0
    text = b"".join(lines).decode()
    assert "e+09" not in text and time.strftime("%m-%d %H:%M:%S", time.localtime(1796000000.123456)) in text
    table = [line for line in text.splitlines() if not line.startswith("eval ")]
    assert table[0].split() == ["step", "loss", "t"] and len(table) == 6
    assert len({len(line) for line in table}) == 1  # the clock fits its column: header and cells line up


# Modules only some commands need: scripts call `status` and `kill` in loops, and each start pays for its imports.
HEAVY = ("asyncio", "backends.serving", "backends.sglang", "backends.train", "backends.extract", "asyncssh", "textual")


def modules_after(script: str, tmp_path: Path) -> list[str]:
    """The heavy modules loaded by `script` in a Python of its own (no multiplexer runs for any host)."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "HOME": str(tmp_path)}
    script += "\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    return [name for name in done.stdout.split() if name.startswith(HEAVY)]


def test_status_and_kill_over_ssh_start_without_an_event_loop_the_serving_engine_or_a_stage(tmp_path: Path) -> None:
    for words in (["gpu-host", "status", "--json"], ["gpu-host", "kill", "r1", "--signal", "KILL"]):
        # No multiplexer serves gpu-host: the quick way declines, having loaded nothing heavy.
        assert modules_after(f"from console.cli import quick\nassert quick.answer({words!r}) is None", tmp_path) == []
    # ... which serve does load, when it builds the server's command line.
    parsed = "grammar.build_parser(grammar.GRAMMARS).parse_args(['h', 'serve', 'T', 'D'])"
    serve = "from console import actions\nfrom console.cli import fleet_commands, grammar\n"
    serve += f"actions.serve_argv(fleet_commands.launched({parsed}, []))"
    assert "backends.serving" in modules_after(serve, tmp_path)
