"""Faults in what the run store holds and in what a reply carries: one damaged file, a line nested
too deep, a folder removed under a follower, megabytes of argv. Real agent, real runs, real files."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backends.runs.store import RunSpec, RunStore
from console.fleet.hosts import Fleet
from console.link.client import AgentClient, Subscription
from console.link.local import LocalTransport
from console.link.transport import AgentError, TransportError
from console.tui.app import ConsoleApp
from console.tui.panels import RunDetail, RunsTable
from tests.conftest import CLI, REPO, launch, remove_live_folder, status, until, wait_state

DEEP = "[" * 200_000  # deeper than any JSON parser's stack
BIG_ARGV = ["x" * 100_000] * 17  # 1.7 MB of arguments, each under the kernel's 128 KiB per argument


def run_dir(workdir: Path, run_id: str) -> Path:
    return workdir / "runs" / run_id


def infinite_pid(path: Path) -> None:
    proc = json.loads(path.read_text())
    path.write_text(json.dumps(proc).replace(f'"pid": {proc["child"]["pid"]}', '"pid": Infinity'))


def append_deep_line(path: Path) -> None:
    with path.open("a") as fh:
        fh.write(DEEP + "\n")


DAMAGE: dict[str, Callable[[Path], object]] = {
    "spec.json": lambda path: path.write_text(DEEP),
    "events.jsonl": append_deep_line,
    "proc.json": infinite_pid,
    "exit.json": lambda path: path.write_text('{"code": 0, "ended_at": '),
}
# Arguments a status reply cuts to about 8 KiB, a run's whole command line.
WIDE_ARGV = ["true", *["y" * 2000] * 10]


@pytest.mark.parametrize("file", list(DAMAGE))
def test_one_damaged_file_makes_only_its_run_corrupt_and_says_which_and_why(cli: CLI, workdir: Path, file: str) -> None:
    damaged = launch(cli, "command", "--name", "damaged", "--", "true")
    sound = launch(cli, "command", "--name", "sound", "--", "true")
    wait_state(cli, damaged, {"exited"})
    wait_state(cli, sound, {"exited"})
    DAMAGE[file](run_dir(workdir, damaged) / file)

    runs = {r["id"]: r for r in status(cli)["runs"]}
    assert runs[sound]["state"] == "exited" and runs[sound]["corrupt"] is None
    assert runs[damaged]["state"] == "corrupt"
    assert runs[damaged]["corrupt"]["file"] == file and runs[damaged]["corrupt"]["reason"]
    text = cli("status")
    assert text.returncode == 0, text.stderr
    row = next(line for line in text.stdout.decode().splitlines() if line.startswith(damaged))
    assert " corrupt " in row
    assert f"run {damaged} is corrupt: {file}: " in text.stdout.decode()
    assert cli("logs", damaged).returncode == 0  # its output is still there to read
    if file == "proc.json":
        kill = cli("kill", damaged)
        assert kill.returncode == 1 and b"corrupt" in kill.stderr and b"Traceback" not in kill.stderr


async def test_the_console_shows_a_corrupt_run_and_why(workdir: Path, nvml_state: Path) -> None:
    run = RunStore(workdir).create(RunSpec(kind="command", argv=["true"], name="broken"))
    (run.path / "spec.json").write_text(DEEP)
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(160, 50)) as pilot:
        table = app.query_one(RunsTable)
        await until(pilot, lambda: table.row_count == 1, what="the run's row")
        assert str(table.get_row(run.id)[3]) == "corrupt"
        detail = app.query_one(RunDetail)
        await until(pilot, lambda: "spec.json" in str(detail.render()), what="the reason in the detail panel")
        assert f"run {run.id} is corrupt: spec.json: not valid JSON" in str(detail.render())
        await pilot.press("q")


async def drain(sub: Subscription) -> list[dict[str, Any]]:
    """Every message of a subscription, to its end."""
    return [msg async for msg in sub]


async def collect(client: AgentClient, run: str, offsets: dict[str, int]) -> list[dict[str, Any]]:
    return await drain(await client.subscribe(run=run, offsets=offsets))


DEEP_METRICS = (
    "import json, os, time\n"
    "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:\n"
    "    m.write(json.dumps({'step': 1}) + '\\n' + '[' * 200000 + '\\n'); m.flush()\n"
    "    time.sleep(1)\n"
    "    m.write(json.dumps({'step': 2}) + '\\n')\n"
    "time.sleep(1)\n"
)
TICKER = "import time\nfor i in range(15):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.2)\n"


async def test_a_deeply_nested_metric_line_stops_no_stream_of_the_agent(client: AgentClient) -> None:
    deep = (await client.request("launch", kind="train", argv=[sys.executable, "-c", DEEP_METRICS]))["run"]
    ticker = (await client.request("launch", kind="command", argv=[sys.executable, "-c", TICKER]))["run"]
    metrics, ticks = await asyncio.wait_for(
        asyncio.gather(collect(client, deep, {}), collect(client, ticker, {})), timeout=30
    )
    rows = [row for msg in metrics if msg["stream"] == "metrics" for row in msg["rows"]]
    assert rows == [{"step": 1}, {"step": 2}]
    assert sum(msg["skipped"] for msg in metrics if msg["stream"] == "metrics") == 1
    assert metrics[-1]["stream"] == "end" and metrics[-1]["state"] == "exited"
    log = b"".join(base64.b64decode(msg["data_b64"]) for msg in ticks if msg["stream"] == "log")
    assert log == b"".join(f"tick {i}\n".encode() for i in range(15))
    assert ticks[-1]["stream"] == "end" and ticks[-1]["state"] == "exited"


def test_metrics_follow_ends_with_the_run_despite_a_deeply_nested_line(cli: CLI) -> None:
    run_id = launch(cli, "train", "--", sys.executable, "-c", DEEP_METRICS)
    result = cli("metrics", run_id, "--follow", timeout=30)
    assert result.returncode == 0, result.stderr
    assert [line.split() for line in result.stdout.decode().splitlines()] == [["step"], ["1"], ["2"]]


async def test_a_stream_that_fails_ends_with_the_reason_and_the_others_go_on(
    client: AgentClient, workdir: Path
) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(3)"]
    unreadable = (await client.request("launch", kind="train", argv=sleeper))["run"]
    ticker = (await client.request("launch", kind="command", argv=[sys.executable, "-c", TICKER]))["run"]
    metrics = run_dir(workdir, unreadable) / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    metrics.mkdir()  # now no read of it can succeed, for root too
    broken, ticks = await asyncio.wait_for(
        asyncio.gather(collect(client, unreadable, {}), collect(client, ticker, {})), timeout=30
    )
    assert broken[-1]["stream"] == "end" and "IsADirectoryError" in broken[-1]["error"]
    assert unreadable in broken[-1]["error"]
    log = b"".join(base64.b64decode(msg["data_b64"]) for msg in ticks if msg["stream"] == "log")
    assert log.count(b"tick") == 15 and ticks[-1]["state"] == "exited"


async def test_a_follower_of_a_run_that_turns_corrupt_ends_with_the_file_and_why(
    client: AgentClient, workdir: Path
) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(20)"]
    run_id = (await client.request("launch", kind="command", argv=sleeper))["run"]
    sub = await client.subscribe(run=run_id)
    (run_dir(workdir, run_id) / "spec.json").write_text(DEEP)
    messages = await asyncio.wait_for(drain(sub), timeout=15)
    assert messages[-1]["stream"] == "end" and messages[-1]["state"] == "corrupt"
    assert messages[-1]["error"].startswith(f"run {run_id} is corrupt: spec.json: not valid JSON")


def test_logs_follow_ends_with_a_message_when_the_run_folder_is_removed(cli: CLI, workdir: Path) -> None:
    script = "import time\nprint('up', flush=True)\ntime.sleep(30)"
    run_id = launch(cli, "command", "--", sys.executable, "-c", script)
    follower = subprocess.Popen(
        [sys.executable, "-m", "console", "--workdir", str(workdir), "local", "logs", run_id, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc = json.loads((run_dir(workdir, run_id) / "proc.json").read_text())
    try:
        assert follower.stdout is not None and follower.stdout.readline() == b"up\n"
        remove_live_folder(run_dir(workdir, run_id))
        _, err = follower.communicate(timeout=15)
    finally:
        follower.kill()
        for role in ("child", "supervisor"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc[role]["pid"], signal.SIGKILL)  # each leads its own group
    assert follower.returncode == 1
    said = err.decode()
    # Its stream says the folder went; a follow still asking for the log's tail then (a loaded machine) is told
    # there is no such run: either way one line naming the run.
    assert (f"run {run_id}: its folder" in said and "is gone" in said) or f"no run '{run_id}'" in said, said
    assert said.count("\n") == 1 and "Traceback" not in said


def test_status_of_megabytes_of_argv_is_bounded_and_marked_and_status_run_gives_it_whole(
    cli: CLI, workdir: Path
) -> None:
    async def launch_ten() -> list[str]:
        async with AgentClient(LocalTransport(workdir)) as client:
            argv = [sys.executable, "-c", "pass", *BIG_ARGV]
            return [(await client.request("launch", kind="command", argv=argv))["run"] for _ in range(10)]

    ids = asyncio.run(launch_ten())
    text = cli("status")
    assert text.returncode == 0, text.stderr
    assert b"cut to keep this reply small" in text.stdout
    data = cli("status", "--json")
    assert data.returncode == 0, data.stderr
    assert len(data.stdout) < 1024 * 1024
    runs = json.loads(data.stdout)["runs"]
    assert [r["id"] for r in runs] == ids
    for run in runs:
        assert run["truncated"] == ["argv"]
        assert sum(len(arg) for arg in run["argv"]) < 10 * 1024
        assert run["argv"][3].startswith("x" * 100) and run["argv"][3].endswith(" more bytes)")
        assert "more bytes)" in run["argv"][-1]

    whole = cli("status", ids[0], "--json")
    assert whole.returncode == 0, whole.stderr
    info = json.loads(whole.stdout)
    assert info["argv"] == [sys.executable, "-c", "pass", *BIG_ARGV] and info["truncated"] == []
    shown = cli("status", ids[0])
    assert shown.returncode == 0 and b"x" * 100_000 + b" " + b"x" * 100_000 in shown.stdout


def test_a_store_larger_than_a_reply_leaves_out_the_oldest_runs_and_says_so(cli: CLI, workdir: Path) -> None:
    store = RunStore(workdir)
    ids = [store.create(RunSpec(kind="command", argv=WIDE_ARGV)).id for _ in range(600)]
    data = status(cli)
    assert data["omitted"] > 0 and len(data["runs"]) + data["omitted"] == 600
    # The newest are the ones shown; runs made in the same millisecond are ordered by their ids.
    assert [r["id"] for r in data["runs"]] == sorted(ids)[data["omitted"] :]
    text = cli("status")
    assert text.returncode == 0 and f"{data['omitted']} older runs not shown".encode() in text.stdout
    assert cli("status", ids[0], "--json").returncode == 0  # any run, left out or not


def test_a_reply_too_large_to_send_is_refused_and_the_agent_keeps_serving(workdir: Path, nvml_state: Path) -> None:
    run = RunStore(workdir).create(RunSpec(kind="command", argv=["true"]))
    spec = json.loads((run.path / "spec.json").read_text())
    spec["argv"] = ["true", "\x01" * 3_000_000]  # 3 MB here, 18 MB as JSON on the wire
    (run.path / "spec.json").write_text(json.dumps(spec))

    async def ask() -> None:
        async with AgentClient(LocalTransport(workdir)) as client:
            with pytest.raises(AgentError) as refused:
                await client.request("run_info", run=run.id)
            assert refused.value.code == "too_large" and refused.value.message.startswith("run_info: ")
            runs = (await client.request("status", gpus=False))["runs"]
            assert runs[0]["truncated"] == ["argv"]

    asyncio.run(ask())


def test_metrics_larger_than_a_reply_arrive_whole(cli: CLI, workdir: Path) -> None:
    run = RunStore(workdir).create(RunSpec(kind="train", argv=["true"]))
    rows = [{"step": i, "loss": 1.0 / (i + 1), "pad": "p" * 180} for i in range(100_000)]  # 20 MB
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = cli("metrics", run.id, "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == rows


def small_reply_cli(workdir: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    """The CLI whose client reads lines of at most 64 KiB: a larger message is dropped and stands for an error."""
    script = (
        "import sys\n"
        "import console.link.transport\n"
        "console.link.transport.MAX_LINE_BYTES = 64 * 1024\n"
        f"sys.argv[1:] = ['--workdir', {str(workdir)!r}, 'local', *sys.argv[1:]]\n"
        "from console.__main__ import main\n"
        "sys.exit(main())\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, timeout=timeout, check=False, cwd=REPO
    )


def test_watch_stops_at_a_reply_too_large_to_read_in_one_line_naming_it(workdir: Path, nvml_state: Path) -> None:
    store = RunStore(workdir)
    for _ in range(12):
        store.create(RunSpec(kind="command", argv=WIDE_ARGV))
    result = small_reply_cli(workdir, "watch", "--json", "--interval", "0.2")
    err = result.stderr.decode()
    assert result.returncode == 1, err
    assert "connection lost" not in err and len(err.splitlines()) == 1  # the line was dropped, the link kept
    assert err.startswith("eagle3-console: status: the agent's reply was ") and "one message may carry" in err


def test_logs_follow_stops_at_a_message_too_large_to_read_in_one_line(cli: CLI, workdir: Path) -> None:
    # The line again every half second: the follow starts at the end of the output (--tail 0) whenever it gets
    # there, and the next one is the first it reads (a line printed once, 2 s in, went unseen on a busy machine).
    script = "import time\nwhile True:\n    print('w' * 100_000, flush=True)\n    time.sleep(0.5)"
    run_id = launch(cli, "command", "--", sys.executable, "-c", script)
    try:
        result = small_reply_cli(workdir, "logs", run_id, "--follow", "--tail", "0")
    finally:
        cli("kill", run_id, "--signal", "KILL")
    err = result.stderr.decode()
    assert result.returncode == 1, err
    assert "connection lost" not in err and len(err.splitlines()) == 1
    assert "a log message of the agent's was" in err and "the stream stopped there" in err


class ClosedAfterSubscribe(LocalTransport):
    """The local agent, its link closed by this console as soon as a subscription is made: the link is lost the
    same way right after every reconnect, before any data came."""

    async def receive(self) -> bytes:
        line = await super().receive()
        if b'"result":{"sub":' in line and self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()  # the agent reads its end and exits
        return line


async def test_a_link_lost_the_same_way_after_every_reconnect_stops_with_the_reason(
    workdir: Path, nvml_state: Path
) -> None:
    client = AgentClient(ClosedAfterSubscribe(workdir))
    await client.start()
    told: list[TransportError] = []
    try:
        with pytest.raises(TransportError) as stopped:
            while True:
                async for _ in await client.subscribe():  # no run, no GPU samples: nothing comes
                    pass
                await client.reconnect_until_back(told.append)
    finally:
        await client.close()
    assert not stopped.value.transient and told == []
    assert str(stopped.value).startswith("the agent closed the connection")
    assert str(stopped.value).endswith("came right after each of 3 reconnects, so reconnecting again cannot help")
