"""The agent over its real stdio protocol: bad requests, faults, and streams that resume."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from backends import protocol
from backends.runs.store import EVENTS, RunStore
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.link.transport import AgentError
from tests.conftest import run_state, wait_for
from tests.ordinary_user import as_ordinary_user, ordinary_folder


async def raw_exchange(workdir: Path, lines: list[bytes], ordinary_user: bool = False) -> list[dict]:  # type: ignore[type-arg]
    """Send raw lines to a fresh agent (run by an ordinary user, if asked) and collect one reply per line."""
    argv = [sys.executable, "-m", "backends.agent", "--workdir", str(workdir)]
    proc = await asyncio.create_subprocess_exec(
        *(as_ordinary_user(argv) if ordinary_user else argv),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    replies = []
    for line in lines:
        proc.stdin.write(line)
        await proc.stdin.drain()
        replies.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), 10)))
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    return replies


async def test_malformed_requests_get_error_replies_and_the_agent_keeps_serving(workdir: Path) -> None:
    lines = [
        b"not json\n",
        b"\xff\xfe\n",
        b"[1, 2]\n",
        b'{"v": 1, "op": "status"}\n',
        b'{"v": 99, "id": 5, "op": "status"}\n',
        b'{"v": 1, "id": 6, "op": "explode"}\n',
        b'{"v": 1, "id": 7, "op": "kill", "args": {}}\n',
        b'{"v": 1, "id": 8, "op": "launch", "args": {"kind": "command", "argv": "rm -rf /"}}\n',
        b'{"v": 1, "id": 9, "op": "launch", "args": {"kind": "command", "argv": []}}\n',
        b'{"v": 1, "id": 10, "op": "launch", "args": {"kind": "command", "argv": [1, 2]}}\n',
        b'{"v": 1, "id": 11, "op": "subscribe", "args": {"offsets": {"bogus": 1}}}\n',
        b'{"v": 1, "id": 12, "op": "free_gpus", "args": {"gpus": ["0"]}}\n',
        b'{"v": 1, "id": 13, "op": "status", "args": {"gpus": false}}\n',
    ]
    replies = await raw_exchange(workdir, lines)
    assert [r["ok"] for r in replies] == [False] * 12 + [True]
    codes = [r["error"]["code"] for r in replies[:12]]
    assert codes == [
        "bad_json",
        "bad_json",
        "bad_request",
        "bad_request",
        "bad_version",
        "unknown_op",
        "bad_args",
        "bad_args",
        "bad_args",
        "bad_args",
        "bad_args",
        "bad_args",
    ]
    assert [r["id"] for r in replies[4:]] == list(range(5, 14))
    assert replies[-1]["result"]["runs"] == []


async def test_oversized_request_is_refused_not_fatal(workdir: Path) -> None:
    huge = b'{"v": 1, "id": 1, "op": "status", "pad": "' + b"x" * (protocol.MAX_LINE_BYTES + 10) + b'"}\n'
    replies = await raw_exchange(workdir, [huge, protocol.request_line(2, "hello", {})])
    assert replies[0]["error"]["code"] == "too_long"
    assert replies[1]["ok"] and replies[1]["id"] == 2


async def test_unwritable_store_fails_launch_clearly_and_keeps_serving(client: AgentClient, workdir: Path) -> None:
    workdir.mkdir(parents=True)
    good = await client.request("launch", kind="command", argv=["true"])
    wait_for(lambda: run_state(workdir, good["run"]) == "exited", what="first run done")
    (workdir / "runs").rename(workdir / "runs.keep")
    (workdir / "runs").write_text("not a folder")  # blocks the store even for root
    with pytest.raises(AgentError) as err:
        await client.request("launch", kind="command", argv=["true"])
    assert err.value.code == "store"
    assert "cannot write the run store" in err.value.message and "--workdir" in err.value.message
    status = await client.request("status")
    assert status["runs"] == []
    (workdir / "runs").unlink()
    (workdir / "runs.keep").rename(workdir / "runs")
    status = await client.request("status")
    assert [r["id"] for r in status["runs"]] == [good["run"]]


async def test_a_read_only_workdir_fails_launch_with_the_systems_error_and_the_agent_keeps_serving(
    tmp_path: Path,
) -> None:
    workdir = ordinary_folder(tmp_path)
    workdir.chmod(0o500)  # its owner's choice, which the store keeps
    asks = [
        protocol.request_line(1, "launch", {"kind": "command", "argv": ["true"]}),
        protocol.request_line(2, "hello", {}),
    ]
    launched, hello = await raw_exchange(workdir, asks, ordinary_user=True)
    assert launched.get("error", {}).get("code") == "store", launched
    assert f"{workdir}: Permission denied;" in launched["error"]["message"]
    assert hello["result"]["version"] == protocol.PROTOCOL_VERSION
    assert (workdir.stat().st_mode & 0o777, os.listdir(workdir)) == (0o500, [])


async def test_run_survives_agent_kill_9_and_a_new_agent_sees_it(workdir: Path, nvml_state: Path) -> None:
    first = AgentClient(LocalTransport(workdir))
    hello = await first.start()
    script = "import time, sys\nprint('up', flush=True)\nsys.stdin = None\ntime.sleep(1.5)\nsys.exit(7)\n"
    launched = await first.request("launch", kind="command", argv=[sys.executable, "-c", script])
    os.kill(hello["pid"], signal.SIGKILL)
    await first.close()
    second = AgentClient(LocalTransport(workdir))
    await second.start()
    try:
        runs = (await second.request("status"))["runs"]
        assert runs[0]["state"] == "running"
        for _ in range(100):
            run = (await second.request("status"))["runs"][0]
            if run["state"] != "running":
                break
            await asyncio.sleep(0.1)
        assert run["state"] == "failed" and run["exit_code"] == 7
        assert run["id"] == launched["run"]
    finally:
        await second.close()


async def test_supervisor_kill_9_leaves_the_run_going_then_lost(client: AgentClient, workdir: Path) -> None:
    marker = workdir.parent / "finished"
    script = f"import time, pathlib\ntime.sleep(1.5)\npathlib.Path({str(marker)!r}).write_text('ok')\n"
    launched = await client.request("launch", kind="command", argv=[sys.executable, "-c", script])
    run = RunStore(workdir).get(launched["run"])
    supervisor = run.supervisor()
    assert supervisor is not None
    # Killed once it has recorded the run as running (under load, launch can answer before it has).
    await asyncio.to_thread(wait_for, lambda: [e for e in run.events() if e.get("state") == "running"], 10, "running")
    os.kill(supervisor.pid, signal.SIGKILL)
    await asyncio.sleep(0.2)
    assert (await client.request("status"))["runs"][0]["state"] == "running"
    await asyncio.to_thread(wait_for, marker.exists, 10, "the run to finish its work")
    await asyncio.to_thread(wait_for, lambda: run.state() == "lost", 10, "lost")
    assert (await client.request("status"))["runs"][0]["state"] == "lost"
    states = [e["state"] for e in run.events() if e["type"] == "state"]
    assert states == ["running", "lost"]  # recorded once, however often it is looked at


async def test_stream_resumes_from_offsets_with_a_new_agent(workdir: Path, nvml_state: Path) -> None:
    script = (
        "import json, os, time\n"
        "m = open(os.environ['EAGLE3_METRICS_FILE'], 'a', buffering=1)\n"
        "for i in range(40):\n"
        "    print(f'line {i}', flush=True)\n"
        "    m.write(json.dumps({'step': i}) + '\\n')\n"
        "    time.sleep(0.05)\n"
    )
    first = AgentClient(LocalTransport(workdir))
    await first.start()
    launched = await first.request("launch", kind="train", argv=[sys.executable, "-c", script])
    sub = await first.subscribe(run=launched["run"])
    log = b""
    steps: list[int] = []
    async for msg in sub:
        if msg["stream"] == "log":
            log += base64.b64decode(msg["data_b64"])
        elif msg["stream"] == "metrics":
            steps += [row["step"] for row in msg["rows"]]
        if len(steps) >= 10:
            break
    offsets = dict(sub.offsets)
    await first.close()  # the link drops mid-run

    second = AgentClient(LocalTransport(workdir))
    await second.start()
    try:
        resumed = await second.subscribe(run=launched["run"], offsets=offsets)
        states = []
        async for msg in resumed:
            if msg["stream"] == "log":
                log += base64.b64decode(msg["data_b64"])
            elif msg["stream"] == "metrics":
                steps += [row["step"] for row in msg["rows"]]
            elif msg["stream"] in ("state", "end"):
                states.append(msg["state"])
        assert states[-1] == "exited"
    finally:
        await second.close()
    assert steps == list(range(40))
    assert log == b"".join(f"line {i}\n".encode() for i in range(40))


async def test_gpu_samples_stream_on_a_run_less_subscription(client: AgentClient) -> None:
    sub = await client.subscribe(gpu_interval=0.2)
    samples = []
    async for msg in sub:
        samples.append(msg)
        if len(samples) == 3:
            break
    await sub.close()
    assert all(m["stream"] == "gpus" and m["source"] == "nvml" for m in samples)
    assert samples[2]["t"] - samples[0]["t"] >= 0.3
    assert samples[0]["gpus"][0]["name"] == "NVIDIA H200"


async def test_a_runs_events_are_read_from_an_offset_for_its_timeline(client: AgentClient, workdir: Path) -> None:
    launched = await client.launch("command", [sys.executable, "-c", "print('done')"])
    run = RunStore(workdir).get(launched["run"])
    await asyncio.to_thread(wait_for, lambda: run.state() == "exited", 20, "the run to end")
    first = await client.events(launched["run"])
    assert [row["type"] for row in first["rows"]] == [e["type"] for e in run.events()]
    assert "state" in [row["type"] for row in first["rows"]] and first["skipped"] == 0
    with open(run.file(EVENTS), "a") as events:  # a torn or foreign line is counted, not fatal
        events.write('["not", "an", "event"]\n{"t": 1.0, "type": "phase", "phase": "ready"}\n')
    more = await client.events(launched["run"], offset=first["next_offset"])
    assert more["rows"] == [{"t": 1.0, "type": "phase", "phase": "ready"}] and more["skipped"] == 1
    with pytest.raises(AgentError, match="no run"):
        await client.events("20990101-000000-000-dead")


async def test_a_training_is_offered_no_serving_flags_to_relaunch_with(client: AgentClient) -> None:
    launched = await client.launch("train", [sys.executable, "-c", "print('trained')"])
    assert await client.relaunch_presets(launched["run"]) == {"version": None, "presets": []}
