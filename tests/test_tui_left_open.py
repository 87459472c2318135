"""A console left open for weeks, driven headless against a real local agent and real runs: a long history on
screen at once (the coarse first look, then the full view swapped in with the rows that came meanwhile), and the
runs table bounded to the newest ended runs, saying how many older ones it leaves out."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from backends.runs.store import METRICS, RunStore
from console.fleet.hosts import Fleet
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.tui import app as app_module
from console.tui.app import ConsoleApp
from console.tui.panels import RunsTable
from tests.conftest import until


async def wait_ended(client: AgentClient, run: str) -> None:
    for _ in range(200):
        if (await client.run_info(run))["state"] == "exited":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run} did not end")


WRITER = """
import json, math, os, sys, time
with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:
    rows = [{'step': s, 'loss': 50.0 if s == 777 else 5.0 / math.sqrt(s), 'lr': 1e-4} for s in range(1, 30001)]
    m.write(''.join(json.dumps(r) + '\\n' for r in rows))
    m.flush()
    s = 30000
    while True:
        s += 1
        m.write(json.dumps({'step': s, 'loss': 0.01, 'lr': 1e-4}) + '\\n')
        m.flush()
        time.sleep(0.02)
"""


async def test_the_console_shows_a_long_history_coarse_first_then_every_spike(workdir: Path) -> None:
    async with AgentClient(LocalTransport(workdir)) as client:
        run = (await client.launch("train", [sys.executable, "-c", WRITER]))["run"]
    path = RunStore(workdir).get(run).file(METRICS)
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: path.exists() and path.stat().st_size > 30_000 * 40, what="the history")
            await until(pilot, lambda: app.query_one(RunsTable).selected_run() == run, what="the run")
            metrics = await until(pilot, lambda: app.run_metrics.get(run), what="its follow")
            coarse = await until(pilot, lambda: metrics.store if metrics.store.rows else None, what="a first look")
            loss = coarse.series("loss")
            assert loss is not None and loss.last is not None and loss.last[0] >= 30_000  # its end, at once
            await until(pilot, lambda: metrics.since_coarse is None, timeout=30, what="the full view")
            assert metrics.store is not coarse  # swapped in
            full = metrics.store.series("loss")
            assert full is not None and (777.0, 50.0) in list(full.points())  # the spike, long past
            await until(pilot, lambda: full.last is not None and full.last[0] > 30_100, what="live rows after it")
            steps = [x for x, _ in full.points()]
            assert steps == sorted(steps) and len(steps) == len(set(steps))  # no row twice, none out of order
            await pilot.press("q")
    finally:
        async with AgentClient(LocalTransport(workdir)) as client:
            await client.kill(run, signal="KILL", grace=0.0)


async def test_the_console_lists_the_newest_ended_runs_and_says_how_many_older(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "ENDED_LISTED", 5)  # 5 of 8 ended runs, as 50 of thousands
    async with AgentClient(LocalTransport(workdir)) as client:
        ended = [(await client.launch("command", ["true"], name=f"done-{i}"))["run"] for i in range(8)]
        for run in ended:
            await wait_ended(client, run)
        live = (await client.launch("command", [sys.executable, "-c", "import time; time.sleep(60)"]))["run"]
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one(RunsTable)
            await until(pilot, lambda: "3 older ended runs not listed (status --all)" in app.sub_title, what="a note")
            assert table.row_count == 6 and set(app.runs) == {live, *ended[-5:]}  # the newest ended, and the live
            await pilot.press("q")
    finally:
        async with AgentClient(LocalTransport(workdir)) as client:
            await client.kill(live, signal="KILL", grace=0.0)
