"""A run's identity cannot leak into another run nor be erased by the run (issue 23, item 1).

Real processes, real signals, the real run engine (agent, supervisor, CLI) and the real `setproctitle`
package, the one SGLang 0.5.23 calls to rename its schedulers (it clears /proc/PID/environ). Nothing here
is a stand-in.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from backends.host import procinfo
from backends.protocol import CHILD_ONLY_ENV, ENV_RUN_ID
from backends.runs import control as runctl
from backends.runs.store import RunDir, RunSpec, RunStore
from console.link import local as local_link
from console.link.client import AgentClient
from console.link.local import LocalTransport
from tests.conftest import CLI, wait_for
from tests.sshd import ALIAS, Sshd


def environ(pid: int) -> dict[str, str]:
    """The environment pid started with, as /proc shows it (what run membership is proven by)."""
    entries = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    return dict(entry.decode(errors="replace").partition("=")[::2] for entry in entries if entry)


def markers(pid: int) -> dict[str, str]:
    return {name: value for name, value in environ(pid).items() if name in CHILD_ONLY_ENV}


def python(script: str, *args: str) -> list[str]:
    return [sys.executable, "-c", script, *args]


def launched(cli: CLI, *argv: str) -> str:
    done = cli("launch", "command", "--json", "--", *argv)
    assert done.returncode == 0, done.stderr.decode()
    return str(json.loads(done.stdout)["run"])


def ended(run: RunDir, timeout: float = 20) -> str:
    return str(wait_for(lambda: run.exit() is not None and run.state(), timeout, f"run {run.id} to end"))


def alive(pid: int) -> bool:
    stat = procinfo.read_stat(pid)
    return stat is not None and stat.state != "Z"


def output_lines(run: RunDir, count: int) -> list[str]:
    def enough() -> list[str] | None:
        lines = run.file("output.log").read_text().splitlines()
        return lines if len(lines) >= count else None

    return list(wait_for(enough, 20, f"{count} lines from run {run.id}"))


# --- a run launched from inside a run is its own -------------------------------------------------------

# The outer run's child launches the inner run through the real CLI, from inside the outer run: with the
# outer run's marker in its environment, as a pipeline step or a notebook terminal on the host would.
OUTER = """
import json, subprocess, sys, time
done = subprocess.run(
    [sys.executable, "-m", "console", "--workdir", sys.argv[1], "local", "launch", "command", "--json",
     "--name", "inner", "--", sys.executable, "-c", "import time; time.sleep(300)"],
    capture_output=True, check=True,
)
print("inner", json.loads(done.stdout)["run"], flush=True)
time.sleep(300)
"""


def test_a_run_launched_from_inside_a_run_is_its_own_and_killing_either_spares_the_other(
    cli: CLI, workdir: Path
) -> None:
    store = RunStore(workdir)
    outer = store.get(launched(cli, *python(OUTER, str(workdir))))
    inner = store.get(output_lines(outer, 1)[0].removeprefix("inner "))
    wait_for(lambda: inner.state() == "running", 20, "the inner run running")
    inner_supervisor, inner_child = inner.supervisor(), inner.child()
    assert inner_supervisor is not None and inner_child is not None
    assert markers(inner_supervisor.pid) == {}
    assert markers(inner_child.pid)[ENV_RUN_ID] == inner.id

    done = cli("kill", outer.id, "--grace", "5", "--json")
    assert done.returncode == 0, done.stderr.decode()
    signalled = {p["pid"] for p in json.loads(done.stdout)["processes"]}
    assert not signalled & {inner_supervisor.pid, inner_child.pid}
    assert outer.state() == "killed"
    assert inner.state() == "running"
    assert procinfo.is_alive(inner_supervisor) and procinfo.is_alive(inner_child)

    done = cli("kill", inner.id, "--grace", "5")
    assert done.returncode == 0, done.stderr.decode()
    assert ended(inner) == "killed"
    assert [outer.state(), inner.state()] == ["killed", "killed"]  # neither `lost`


# --- nothing but a run's child carries a run's marker ----------------------------------------------------


def outer_run_env(tmp_path: Path) -> dict[str, str]:
    """What a process inside a run has: the run's marker and where its run and metrics lie."""
    return {
        "EAGLE3_RUN_ID": "20260101-000000-000-0a1b",
        "EAGLE3_RUN_DIR": str(tmp_path / "outer"),
        "EAGLE3_METRICS_FILE": str(tmp_path / "outer" / "metrics.jsonl"),
    }


async def test_an_agent_started_with_a_runs_marker_sheds_it_and_so_do_its_supervisors(
    workdir: Path, nvml_state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in outer_run_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    # An agent given the marker (started by hand inside a run, or by a console that passed it on).
    monkeypatch.setattr(local_link, "CHILD_ONLY_ENV", ())
    local = LocalTransport(workdir)
    agent = AgentClient(local)
    await agent.start()
    try:
        run = RunStore(workdir).get(
            (await agent.request("launch", kind="command", argv=python("import time; time.sleep(30)")))["run"]
        )
        assert local._proc is not None
        assert markers(local._proc.pid) == {}
        supervisor, child = run.supervisor(), wait_for(run.child, 10, "the child recorded")
        assert supervisor is not None
        assert markers(supervisor.pid) == {}
        assert markers(child.pid) == {
            ENV_RUN_ID: run.id,
            "EAGLE3_RUN_DIR": str(run.path),
            "EAGLE3_METRICS_FILE": str(run.file("metrics.jsonl")),
        }
        assert environ(child.pid).get("PATH") == os.environ["PATH"]  # the rest of the environment is passed on
    finally:
        await agent.close()


def test_a_console_started_inside_a_run_starts_supervisors_without_its_marker(
    cli: CLI, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in outer_run_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    run = RunStore(workdir).get(launched(cli, *python("import time; time.sleep(30)")))
    supervisor, child = run.supervisor(), wait_for(run.child, 10, "the child recorded")
    assert supervisor is not None
    assert markers(supervisor.pid) == {}
    assert markers(child.pid)[ENV_RUN_ID] == run.id


def test_an_agent_over_ssh_whose_login_hands_it_a_runs_marker_sheds_it(
    sshd: Sshd, workdir: Path, tmp_path: Path
) -> None:
    """The host's login gives the agent the marker (a shell profile, or sshd's SetEnv, of a session inside a run):
    the agent, started as the console starts it over SSH, runs again without it before its first supervisor."""
    handed = tmp_path / "handed"
    python_in_a_run = tmp_path / "python-in-a-run"
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in outer_run_env(tmp_path).items())
    python_in_a_run.write_text(f'#!/bin/sh\necho "$@" >> {handed}\nexport {exports}\nexec {sys.executable} "$@"\n')
    python_in_a_run.chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-m", "console", "--no-reuse", "--workdir", str(workdir), "--remote-python",
         str(python_in_a_run), ALIAS, "launch", "command", "--", sys.executable, "-c", "import time; time.sleep(30)"],
        env=sshd.env(), capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert "backends.agent" in handed.read_text()  # the agent itself was started with the marker
    run = RunStore(workdir).get(done.stdout.decode().strip())
    supervisor, child = run.supervisor(), wait_for(run.child, 10, "the child recorded")
    assert supervisor is not None
    assert markers(supervisor.pid) == {}
    assert markers(child.pid)[ENV_RUN_ID] == run.id


# --- membership that the run cannot erase -------------------------------------------------------------

# SGLang's shape: the launcher starts schedulers that rename themselves, then the launcher dies.
SCHEDULERS = """
import pathlib, subprocess, sys, time
scheduler = (
    "import pathlib, setproctitle, sys, time\\n"
    "setproctitle.setproctitle('sglang::scheduler_TP' + sys.argv[1])\\n"
    "pathlib.Path(sys.argv[2]).touch()\\n"
    "time.sleep(300)\\n"
)
ready = pathlib.Path(sys.argv[1])
for rank in range(2):
    print(subprocess.Popen([sys.executable, "-c", scheduler, str(rank), str(ready / str(rank))]).pid, flush=True)
while len(list(ready.iterdir())) < 2:
    time.sleep(0.02)
"""


@pytest.mark.parametrize("host", ["local", ALIAS])
def test_kill_ends_schedulers_that_renamed_themselves_after_their_launcher_exited(
    host: str, sshd: Sshd, workdir: Path, tmp_path: Path
) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "console", "--no-reuse", "--workdir", str(workdir), host, *args]
        return subprocess.run(command, env=sshd.env(), capture_output=True, timeout=120, check=False)

    ready = tmp_path / "ready"
    ready.mkdir()
    run = RunStore(workdir).get(launched(cli, *python(SCHEDULERS, str(ready))))
    schedulers = [int(line) for line in output_lines(run, 2)]
    assert ended(run) == "exited"  # the launcher is gone, and reaped as far as anyone but the kernel knows
    for pid in schedulers:
        assert alive(pid)
        assert Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sglang::scheduler_TP")
        assert markers(pid) == {}, "setproctitle should have cleared the marker: the attack is not reproduced"
    supervisor = run.supervisor()
    assert supervisor is not None and procinfo.is_alive(supervisor)  # it keeps the launcher's pid for the run
    outlived = wait_for(lambda: [e for e in run.events() if e["type"] == "outlived"], 10, "the outlived event")
    assert sorted(outlived[0]["pids"]) == sorted(schedulers)

    done = cli("kill", run.id, "--grace", "5")
    assert done.returncode == 0, done.stderr.decode()
    said = done.stdout.decode()
    for pid in schedulers:
        assert f"pid {pid}: sent TERM, died" in said
        assert not alive(pid)
    assert run.state() == "exited"  # its fate was the launcher's; what outlived it was cleaned up
    wait_for(lambda: not procinfo.is_alive(supervisor), 10, "the supervisor to reap the launcher and go")
    again = cli("kill", run.id)
    assert again.returncode == 1 and b"nothing to kill" in again.stderr


# A daemon: double fork and setsid leave the run's session. One keeps its environment, one renames itself.
DAEMONS = """
import os, sys, time
def daemon(rename):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            if rename:
                import setproctitle
                setproctitle.setproctitle("renamed-daemon")
            print("renamed" if rename else "plain", os.getpid(), flush=True)
            time.sleep(300)
        os._exit(0)
    os.wait()
daemon(False)
daemon(True)
"""


def test_a_daemon_that_kept_its_environment_is_killed_one_that_also_renamed_itself_is_named_not_signalled(
    cli: CLI, workdir: Path
) -> None:
    store = RunStore(workdir)
    run = store.get(runctl.launch(store, RunSpec(kind="command", argv=python(DAEMONS)))["run"])
    daemons = dict(line.split() for line in output_lines(run, 2))
    plain, renamed = int(daemons["plain"]), int(daemons["renamed"])
    try:
        assert ended(run) == "exited"
        child = run.child()
        assert child is not None
        for pid in (plain, renamed):
            stat = procinfo.read_stat(pid)
            assert stat is not None and stat.sid != child.pid and stat.ppid != child.pid  # left, re-parented
        report = runctl.kill(run, "TERM", 5)
        # Provable by its marker: killed. Out of the session with its environment cleared, once its parent is
        # gone nothing proves it the run's: never signalled on a guess, but named, as it writes to the run's log.
        assert [(p["pid"], p["died"]) for p in report["processes"]] == [(plain, True)]
        assert [r["pid"] for r in report["refused"]] == [renamed]
        assert "cannot be proven the run's" in report["refused"][0]["reason"]
        assert alive(renamed)
        done = cli("kill", run.id)
        assert done.returncode == 1 and alive(renamed)
        said = done.stderr.decode()
        assert said.count("\n") == 1 and "nothing to kill" in said
        assert f"pid {renamed} writes to the run's output.log" in said and "kill it yourself" in said
    finally:
        for pid in (plain, renamed):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
