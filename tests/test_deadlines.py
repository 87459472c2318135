"""Every remote call has a deadline, and a launch asked again never starts a second run (issue 23, item 5 and the
launch id of item 6).

Real: one OpenSSH server on 127.0.0.1 standing for two hosts (two Host aliases, each with its own run store), the
agents on it, the CLI and the console in their own processes as a user runs them, SIGSTOP and SIGKILL. A host
whose agent stopped answering is its agent process stopped after the handshake; a host whose agent dies as it
starts is a local one whose store is a file. The launch retry's fault (the agent killed right after it started
the run, before its reply) is a sitecustomize written here, in the agent's own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends import protocol
from backends.protocol import TERMINAL_STATES
from backends.runs import once
from backends.runs.control import OpError, kill
from backends.runs.store import LAUNCHES, RunSpec, RunStore
from console.cli import config, grammar
from console.link import transport as deadlines
from console.link.client import AgentClient
from console.link.transport import Transport
from tests.conftest import REPO, ctrl_c_reaches_it
from tests.sshd import SSHD, Sshd, home_for, start_sshd
from tests.test_many_hosts import Client
from tests.tmux import Tmux

SLEEPER = "import time\ntime.sleep(600)"
DEADLINE_S = 3  # the --timeout of these tests: short, yet far above what an idle agent takes to answer


@dataclass
class Laptop(Client):
    """A user's machine that knows `a` and `b`, two aliases of one sshd with a run store each."""

    stores: dict[str, Path]


@pytest.fixture
def laptop(tmp_path: Path) -> Iterator[Laptop]:
    if not SSHD.is_file():
        pytest.skip(f"{SSHD} is missing: `make test` installs openssh-server")
    server: Sshd = start_sshd(tmp_path / "sshd")
    home = home_for(tmp_path / "laptop", {"gpu-a": server, "gpu-b": server})
    settings = home / ".config" / "eagle3-console" / "config.toml"
    settings.parent.mkdir(parents=True)
    stores = {name: tmp_path / name for name in ("a", "b")}
    settings.write_text(
        "".join(f'[hosts.{n}]\naddress = "gpu-{n}"\nworkdir = "{store}"\n' for n, store in stores.items())
        + '[groups]\nlab = ["a", "b"]\n'
    )
    runtime = Path(tempfile.mkdtemp(prefix="e3d", dir="/tmp"))  # short: socket paths must fit in 108 bytes
    laptop = Laptop(home, runtime, stores)
    try:
        yield laptop
    finally:
        for pid in agents_of(stores["b"]):  # a stopped agent goes once it can read that its link is gone
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        subprocess.run(["pkill", "-TERM", "-f", f"console.link.multiplexer --socket {runtime}"], check=False)
        server.stop()
        end_runs(*stores.values())
        subprocess.run(["rm", "-rf", str(runtime)], check=True)


def end_runs(*stores: Path) -> None:
    """The tests' runs stopped, as `kill` stops them."""
    for store in stores:
        for run in RunStore(store).all():
            if run.state() not in TERMINAL_STATES:
                kill(run, "KILL", 0)


def agents_of(store: Path) -> list[int]:
    """The agents serving the run store `store`: `python ... backends.agent ... --workdir WORKDIR`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            words = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
            pairs = itertools.pairwise(words)
            if (b"--workdir", os.fsencode(store)) in pairs and any(b"backends.agent" in w for w in words):
                found.append(int(entry.name))
    return found


def one_agent_of(store: Path) -> int:
    """The one agent left serving `store` (a multiplexer's, or the console's), once it is the only one."""
    deadline = time.monotonic() + 60
    while len(found := agents_of(store)) != 1 or time.monotonic() - started_at(found[0]) < 1:
        assert time.monotonic() < deadline, f"agents of {store}: {found}"
        time.sleep(0.1)
    return found[0]


def started_at(pid: int) -> float:
    """When the process started, on the monotonic clock (which counts from boot, as /proc does)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    return ticks / os.sysconf("SC_CLK_TCK")


def test_a_host_whose_agent_stopped_answering_is_said_in_one_line_within_the_deadline_and_hides_no_other(
    laptop: Laptop,
) -> None:
    run = laptop.cli("a", "launch", "command", "--", "python3", "-c", SLEEPER).stdout.strip()
    assert run, "a's run did not start"
    assert laptop.cli("b", "status").returncode == 0  # b's shared connection starts, with an agent of its own
    deadline = time.monotonic() + 60
    while len(list(laptop.runtime.rglob("*.sock"))) < 2:  # a's and b's multiplexers listen
        assert time.monotonic() < deadline, "no multiplexers"
        time.sleep(0.1)
    os.kill(one_agent_of(laptop.stores["b"]), signal.SIGSTOP)  # b's agent stops answering after its handshake

    began = time.monotonic()
    both = laptop.cli("--timeout", str(DEADLINE_S), "a,b", "status")
    took = time.monotonic() - began
    assert both.returncode == 1, both.stderr
    a_part, b_part = both.stdout.split("\n\n== b")
    assert a_part.startswith("== a\n") and run in a_part  # the host that answers, on time
    said = f"no answer to hello in {DEADLINE_S} s (the agent stopped answering)"
    assert b_part.startswith(": gpu-b: " + said) and "--timeout" in b_part and len(b_part.splitlines()) == 1
    assert took < DEADLINE_S + 15, took  # the deadline and a CLI's start, not the 400 s of no deadline at all
    hosts = json.loads(laptop.cli("--timeout", str(DEADLINE_S), "a,b", "status", "--json").stdout)["hosts"]
    assert [h["ok"] for h in hosts] == [True, False] and said in hosts[1]["error"]

    began = time.monotonic()
    alone = laptop.cli("--timeout", str(DEADLINE_S), "b", "status")  # one host: the same line, exit 1
    assert alone.returncode == 1 and not alone.stdout
    # Through b's shared connection a status asks no hello first: it is the status that goes unanswered.
    said_alone = f"gpu-b: no answer to status in {DEADLINE_S} s (the agent stopped answering)"
    assert said_alone in alone.stderr and len(alone.stderr.strip().splitlines()) == 1, alone.stderr
    assert time.monotonic() - began < DEADLINE_S + 15


def test_the_console_says_a_host_is_not_answering_within_the_deadline_while_the_other_goes_on(
    laptop: Laptop,
) -> None:
    """The console in tmux over a,b, each host on its own connection: b's agent stopped after the handshake is
    named in the banner with the call it did not answer, and a's runs stay on the screen."""
    runs = {}
    for host in ("a", "b"):
        store = str(laptop.stores[host])  # launched through a local agent on the same store: no SSH agent of b's
        done = laptop.cli(
            "--workdir", store, "local", "launch", "command", "--name", f"on-{host}", "--", "sleep", "600"
        )
        runs[host] = done.stdout.strip()
    assert all(runs.values())
    with Tmux(laptop.argv("--timeout", str(DEADLINE_S), "lab"), width=160, height=48, env=laptop.env(), cwd=REPO) as t:
        t.wait_for(lambda s: "on-a" in s and "on-b" in s, 60, "both hosts' runs")
        os.kill(one_agent_of(laptop.stores["b"]), signal.SIGSTOP)
        t.wait_for(lambda s: f"no answer to status in {DEADLINE_S} s" in s and "b: gpu-b:" in s, 30, "b not answering")
        assert "on-a" in t.screen()  # a is still shown, and not marked down
        assert "a (down)" not in t.screen()


HOOK = """
import os, signal
flag = os.environ.get("E3_DIE_AFTER_LAUNCH")
if flag and not os.path.exists(flag):
    from backends.runs import control
    started = control.launch
    def launch_then_die(*args, **kwargs):
        result = started(*args, **kwargs)  # the run is made and its child running
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # before the reply
        return result
    control.launch = launch_then_die
"""


def test_a_launch_whose_agent_is_killed_before_it_replies_is_asked_again_and_starts_one_run(tmp_path: Path) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    flag, store = tmp_path / "died", tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{REPO}", "E3_DIE_AFTER_LAUNCH": str(flag)}
    argv = ["--workdir", str(store), "local", "launch", "command", "--", "python3", "-c", SLEEPER]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "console", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
        assert flag.exists(), "the agent was not killed"
        assert done.returncode == 0, done.stderr
        assert "asking again once it is back, under the same launch id" in done.stderr
        runs = RunStore(store).all()
        assert [r.id for r in runs] == [done.stdout.strip()]  # one run, the one the first ask started
        assert runs[0].state() == "running"
        assert runs[0].trusted_spec().launch_id
    finally:
        end_runs(store)


HOOK_DIE_EVERY_TIME = """
import os, signal
if os.environ.get("E3_DIE_AT_LAUNCH"):
    from backends.runs import control
    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)  # every agent, at every launch, before anything starts
    control.checked_spec = die
"""


def test_a_launch_whose_agent_dies_at_every_ask_is_asked_four_times_then_said_and_left(tmp_path: Path) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK_DIE_EVERY_TIME)
    store = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{REPO}", "E3_DIE_AT_LAUNCH": "1"}
    argv = ["--workdir", str(store), "local", "launch", "command", "--", "python3", "-c", SLEEPER]
    done = subprocess.run(
        [sys.executable, "-m", "console", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and not done.stdout
    assert done.stderr.count("asking again once it is back, under the same launch id") == 3
    assert "launch was asked 4 times under one launch id: `status` says whether its run started" in done.stderr
    assert RunStore(store).all() == []


def test_a_launch_id_held_by_a_live_agent_is_refused_and_one_whose_agent_died_is_taken_over(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store")
    assert once.claim(store, "launch-1") is None  # claimed by this process, which lives
    with pytest.raises(OpError) as refused:
        once.claim(store, "launch-1")
    assert refused.value.code == "launch_under_way"
    claim = store.workdir / LAUNCHES / "launch-1"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = json.loads(claim.read_text())
    record["agent"]["pid"] = int(dead.stdout)  # an agent that died before it made a run
    claim.write_text(json.dumps(record))
    assert once.claim(store, "launch-1") is None  # nothing was started: this launch may go ahead
    run = store.create(RunSpec(kind="command", argv=["true"], launch_id="launch-1"))
    again = once.claim(store, "launch-1")  # the run it made is the answer (found by its spec: not named yet)
    assert again is not None and again.id == run.id
    with pytest.raises(OpError):
        once.claim(store, "../escape")


def test_a_watch_over_several_hosts_stops_one_whose_agent_dies_as_it_starts_and_goes_on_with_the_others(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    settings = home / ".config" / "eagle3-console" / "config.toml"
    settings.parent.mkdir(parents=True)
    broken = tmp_path / "broken"
    broken.write_text("")  # a run store that is a file: its agent says so and exits, at every start
    settings.write_text(
        f'[hosts.x]\naddress = "local"\nworkdir = "{tmp_path / "x"}"\n'
        f'[hosts.y]\naddress = "local"\nworkdir = "{broken}"\n[groups]\nsolo = ["y"]\n'
    )
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": ""}

    def console(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "console", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=ctrl_c_reaches_it,
        )  # fmt: skip

    run = subprocess.run(
        [sys.executable, "-m", "console", "x", "launch", "command", "--", "python3", "-c", SLEEPER],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout.strip()  # fmt: skip
    watch = console("x,y", "watch", "--interval", "0.3", "--json")
    assert watch.stdout is not None and watch.stderr is not None
    changes, said = lines_of(watch.stdout), lines_of(watch.stderr)
    try:
        first = json.loads(changes.get(timeout=60))
        assert (first["first"], first["run"]["host"], first["run"]["id"]) == (True, "x", run)
        stop = next_line(said, "y: ", "no longer watched")
        assert "cannot read the run store" in stop and "at each of 3 reconnects" in stop
        subprocess.run(
            [sys.executable, "-m", "console", "x", "kill", run], cwd=REPO, env=env, capture_output=True, check=True
        )
        change = json.loads(changes.get(timeout=60))
        assert (change["run"]["host"], change["run"]["id"], change["to"]) == ("x", run, "killed")  # x goes on
        assert watch.poll() is None
    finally:
        os.killpg(watch.pid, signal.SIGINT)
        watch.wait(timeout=30)
        end_runs(tmp_path / "x")
    alone = console("solo", "watch")  # a group of one: once no host is left to watch, it ends, failed
    assert alone.wait(timeout=60) == 1
    assert alone.stderr is not None and "at each of 3 reconnects" in alone.stderr.read()


def lines_of(stream: object) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def next_line(lines: queue.Queue[str], *wanted: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        if all(part in line for part in wanted):
            return line


def test_a_follow_whose_agent_stops_answering_is_told_reconnects_and_goes_on_to_the_runs_end(tmp_path: Path) -> None:
    """`logs -f` of a quiet run: the link stays silent, so the console asks after each quiet spell; the agent
    stopped (SIGSTOP, a real local agent) misses the deadline, and a new one takes the stream to its end."""
    store = tmp_path / "store"
    base = [sys.executable, "-m", "console", "--timeout", "2", "--workdir", str(store), "local"]
    run = subprocess.run(
        [*base, "launch", "command", "--", "python3", "-c", f"print('up', flush=True)\n{SLEEPER}"],
        cwd=REPO, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    follow = subprocess.Popen(
        [*base, "logs", run, "-f"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert follow.stdout is not None and follow.stderr is not None
    said = lines_of(follow.stderr)
    assert lines_of(follow.stdout).get(timeout=60) == "up\n"  # it follows: its agent greeted and streams
    stopped = one_agent_of(store)
    try:
        os.kill(stopped, signal.SIGSTOP)
        lost = next_line(said, "connection lost (local: no answer to hello in 2 s (the agent stopped answering)")
        assert "reconnecting" in lost
        next_line(said, "reconnected after")
        kill(RunStore(store).get(run), "TERM", 5)
        assert follow.wait(timeout=60) == 0  # the new link took the stream to the run's end
    finally:
        with contextlib.suppress(ProcessLookupError):  # the console killed it when it let the link go
            os.kill(stopped, signal.SIGCONT)
        if follow.poll() is None:
            follow.kill()
        end_runs(store)


def test_each_call_gets_its_kinds_deadline_or_the_timeout_given_and_its_own_waits_on_top() -> None:
    assert deadlines.seconds_for("status", {"gpus": True}, None) == deadlines.QUICK_S
    assert deadlines.seconds_for("launch", {}, None) == deadlines.LONG_S
    assert deadlines.seconds_for("doctor", {"dry_load": True}, None) == deadlines.DRY_LOAD_S
    assert deadlines.seconds_for("kill", {"grace": 10.0}, None) == deadlines.QUICK_S + 10
    assert deadlines.seconds_for("free_gpus", {"timeout": 15.0, "grace": 5.0}, 2) == 22
    assert deadlines.seconds_for("doctor", {"dry_load": True}, 5) == 5  # --timeout: every call, long ones too


@given(st.floats(min_value=0.001, max_value=1e9, allow_nan=False))
def test_timeout_takes_any_positive_number_of_seconds(value: float) -> None:
    ns = grammar.build_parser(grammar.GRAMMARS).parse_args(["--timeout", repr(value), "gpu1", "status"])
    assert ns.timeout_s == value


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "soon"])
def test_timeout_refuses_what_is_no_time_to_answer(text: str) -> None:
    with pytest.raises(config.UsageError):
        grammar.build_parser(grammar.GRAMMARS).parse_args(["--timeout", text, "gpu1", "status"])


def test_timeout_in_config_toml_applies_to_its_host_and_the_flag_wins(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[hosts.x]\naddress = "local"\ntimeout = 2\n')
    settings = config.load(path)
    parse = grammar.build_parser(grammar.GRAMMARS).parse_args
    ns = parse(["x", "status"])
    config.apply_settings(ns, settings)
    assert ns.timeout_s == 2
    ns = parse(["--timeout", "7", "x", "free-gpus", "--timeout", "3"])  # free-gpus' own wait is another option
    config.apply_settings(ns, settings)
    assert (ns.timeout_s, ns.timeout) == (7, 3)
    path.write_text("[hosts.x]\ntimeout = 0\n")
    with pytest.raises(config.ConfigError, match="timeout must be a number of seconds above 0"):
        config.load(path)


class ReplyAsCancelled(Transport):
    """An agent whose one reply arrives in the same turn of the event loop as the caller's cancellation: what a
    console's log follow meets when the person moves to another run just as its log comes."""

    description = "stub"

    def __init__(self) -> None:
        self.sent: asyncio.Queue[bytes] = asyncio.Queue()
        self.caller: asyncio.Task[object] | None = None

    async def open(self) -> None:
        pass

    async def send(self, line: bytes) -> None:
        self.sent.put_nowait(line)

    async def receive(self) -> bytes:
        request = json.loads(await self.sent.get())
        assert self.caller is not None
        asyncio.get_running_loop().call_soon(self.caller.cancel)  # before the reply's callbacks run
        return protocol.encode(protocol.ok_reply(request["id"], {"runs": []}))

    async def close(self) -> None:
        pass

    def last_words(self) -> str:
        return ""


async def test_a_call_cancelled_as_its_reply_comes_is_cancelled_not_answered() -> None:
    """Python 3.11's asyncio.wait_for returned such a reply and dropped the cancel: the console's follow of a run
    no longer selected went on, writing that run's end into the selected run's log."""
    transport = ReplyAsCancelled()
    client = AgentClient(transport)
    reader = asyncio.create_task(client._read_loop())
    transport.caller = asyncio.create_task(client.request("list_runs"))
    with pytest.raises(asyncio.CancelledError):
        await transport.caller
    reader.cancel()
