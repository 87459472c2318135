"""`status` through the run store's index (`backends.runs.index`): the live runs and the newest ended ones, a line
for the rest, `--all` and pages of them; and the index itself, private, rebuilt without a word, never trusted over a
run's own files. Real CLI, real agent, real run folders: the ended runs' records are written as their supervisor
writes them (exit.json, aged with utime as time would age it), the live run is a real sleeping process."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from backends import protocol
from backends.fileio import atomic_write_json
from backends.runs.store import EXIT, INDEX, SPEC, RunSpec, RunStore
from console.cli import grammar, output, quick
from console.link.transport import AgentError, AgentOps
from tests.conftest import CLI, SLEEPER, launch

HOUR = 3600.0


def ended_run(store: RunStore, ended_at: float, code: int = 0) -> str:
    """A run that ended at `ended_at`, as its supervisor leaves it."""
    run = store.create(RunSpec(kind="command", argv=["true"], created_at=ended_at - 5))
    atomic_write_json(run.file(EXIT), {"code": code, "signal": None, "error": None, "ended_at": ended_at})
    os.utime(run.file(EXIT), (ended_at, ended_at))
    return run.id


@pytest.fixture
def thirty_ended(workdir: Path) -> list[str]:
    """30 runs that ended an hour ago and before, the first launched the last to end: newest ended first is the
    order of their ids here, the reverse of their launches'."""
    store = RunStore(workdir)
    now = time.time()
    return [ended_run(store, now - HOUR - i * 60, code=i % 3) for i in range(30)]


def status_json(cli: CLI, *args: str) -> dict[str, Any]:
    done = cli("status", *args, "--json")
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def ids(status: dict[str, Any]) -> list[str]:
    return [run["id"] for run in status["runs"]]


def test_status_shows_the_live_runs_and_the_newest_ended_and_one_line_for_the_rest(
    cli: CLI, thirty_ended: list[str]
) -> None:
    live = launch(cli, "command", "--", sys.executable, "-c", SLEEPER)
    assert ids(status_json(cli)) == sorted([live, *thirty_ended[:20]])
    text = cli("status")
    assert text.returncode == 0 and text.stderr == b""
    said = [line for line in text.stdout.decode().splitlines() if "not shown" in line]
    assert said == ["10 more ended runs not shown: `status --all` lists every run, `status --page 2` the next page"]
    every = cli("status", "--all")
    assert every.returncode == 0 and b"not shown" not in every.stdout
    assert all(run_id.encode() in every.stdout for run_id in [live, *thirty_ended])
    assert ids(status_json(cli, "--all")) == sorted([live, *thirty_ended])


def test_status_pages_through_the_ended_runs_newest_ended_first_in_one_json_shape(
    cli: CLI, thirty_ended: list[str]
) -> None:
    pages = [status_json(cli, "--limit", "12", "--page", str(page)) for page in (1, 2, 3, 4)]
    assert [ids(page) for page in pages] == [
        sorted(thirty_ended[:12]),
        sorted(thirty_ended[12:24]),
        sorted(thirty_ended[24:]),
        [],
    ]
    assert [(page["ended_total"], page["hidden"]) for page in pages] == [(30, 18), (30, 18), (30, 24), (30, 30)]
    every = status_json(cli, "--all")
    assert (every["ended_total"], every["hidden"], len(every["runs"])) == (30, 0, 30)
    assert {tuple(sorted(reply)) for reply in [*pages, every, status_json(cli)]} == {tuple(sorted(every))}


@pytest.mark.parametrize(
    "args", [("--all", "--page", "2"), ("--page", "2", "--all"), ("--all", "--limit", "5"), ("--page", "0")]
)
def test_status_refuses_pages_that_mean_nothing_in_one_line(cli: CLI, args: tuple[str, ...]) -> None:
    done = cli("status", *args)
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1, err


def index_of(workdir: Path) -> Path:
    return workdir / INDEX


def test_the_index_is_private_and_rebuilt_without_a_word_when_damaged_missing_or_old(
    cli: CLI, workdir: Path, thirty_ended: list[str]
) -> None:
    first = status_json(cli, "--all")
    assert stat.S_IMODE(index_of(workdir).stat().st_mode) == 0o600
    old = index_of(workdir).read_bytes()
    for damage in (b'{"format": 1, "ended_ids": [', b"\x00" * 64, None):
        if damage is None:
            index_of(workdir).unlink()
        else:
            index_of(workdir).write_bytes(damage)
        assert status_json(cli, "--all") == first
        assert json.loads(index_of(workdir).read_bytes())["format"] == 1
    # An index that a crash left behind, older than the store: two runs gone since, three new.
    for run_id in thirty_ended[:2]:
        shutil.rmtree(workdir / "runs" / run_id)
    store = RunStore(workdir)
    newer = [ended_run(store, time.time() - 60) for _ in range(3)]
    index_of(workdir).write_bytes(old)
    reply = status_json(cli, "--all")
    assert ids(reply) == sorted([*thirty_ended[2:], *newer]) and reply["ended_total"] == 31
    # A run made just after a look, in the same clock tick as its listing, is in the next one.
    made = store.create(RunSpec(kind="command", argv=["true"])).id
    assert made in ids(status_json(cli))


def test_ended_runs_that_are_not_shown_are_not_read(cli: CLI, workdir: Path, thirty_ended: list[str]) -> None:
    status_json(cli)
    (workdir / "runs" / thirty_ended[-1] / SPEC).write_text("{")  # the oldest: not shown
    text = cli("status")
    assert text.returncode == 0 and b"corrupt" not in text.stdout + text.stderr
    assert status_json(cli)["ended_total"] == 30
    every = status_json(cli, "--all")
    assert [run["state"] for run in every["runs"] if run["id"] == thirty_ended[-1]] == ["corrupt"]


def test_a_run_that_ends_after_the_index_was_written_is_shown_as_it_ended(cli: CLI, thirty_ended: list[str]) -> None:
    live = launch(cli, "command", "--", sys.executable, "-c", SLEEPER)
    before = status_json(cli)
    assert before["ended_total"] == 30 and live in ids(before)
    assert cli("kill", live).returncode == 0
    after = status_json(cli)
    assert [run["state"] for run in after["runs"] if run["id"] == live] == ["killed"]
    assert after["ended_total"] == 31 and after["hidden"] == 11
    run_dir = Path(cli.workdir) / "runs" / live  # type: ignore[attr-defined]
    os.utime(run_dir / EXIT, (time.time() - HOUR, time.time() - HOUR))  # settled now: kept in the index
    assert [run["state"] for run in status_json(cli)["runs"] if run["id"] == live] == ["killed"]
    assert live in json.loads((Path(cli.workdir) / INDEX).read_bytes())["ended"]  # type: ignore[attr-defined]


class PagesNothing(AgentOps):
    """An agent of this protocol from before `status` paged, as a multiplexer started before an upgrade still runs:
    its requests read by the protocol's own parser with that release's schema, so that it refuses what it does not
    know in its own words; it lists every run."""

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        self.runs = runs

    async def request(self, op: str, **args: Any) -> Any:
        try:
            protocol.parse_request(protocol.request_line(1, op, args))
        except protocol.ProtocolError as exc:
            raise AgentError(exc.code, exc.message) from None
        return {"host": "h", "gpu_source": "none", "gpu_error": None, "runs": self.runs, "gpus": [], "omitted": 0}


def test_status_of_an_agent_that_pages_nothing_lists_every_run_in_the_same_json_shape(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(protocol.OPS, "status", {"gpus": ((bool,), False, True)})
    runs = [{"id": f"r{i}", "state": state} for i, state in enumerate(["running", "exited", "failed"])]
    ns = grammar.build_parser(grammar.GRAMMARS).parse_args(["gpu1", "status", "--json"])
    assert quick.drive(output.cmd_status(PagesNothing(runs), ns, [])) == output.EXIT_OK
    shown = json.loads(capsys.readouterr().out)
    assert shown["runs"] == runs and (shown["ended_total"], shown["hidden"]) == (2, 0)


def test_temp_files_of_the_index_left_by_a_killed_writer_are_swept_when_an_agent_starts(
    cli: CLI, workdir: Path, thirty_ended: list[str]
) -> None:
    status_json(cli)  # the store and its index exist
    stale, fresh = workdir / f".{INDEX}.4242.abc123.tmp", workdir / f".{INDEX}.4243.def456.tmp"
    for leftover in (stale, fresh):
        leftover.write_bytes(b'{"format": 1, "ended_ids": [')  # a write cut short by SIGKILL before its rename
    old = time.time() - 3600
    os.utime(stale, (old, old))
    status_json(cli)  # a new agent (the CLI's local one starts with each command)
    assert not stale.exists()
    assert fresh.exists()  # young enough to be a live writer's
    assert (workdir / INDEX).exists()
