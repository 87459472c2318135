"""What a start imports (issue 28's instant CLI): `--version` and `--help` alone import next to nothing, `--help`
is argparse's own text whether made now or kept from before, and the agent that every command starts answers
`status` without SGLang's, doctor's or bench's modules. Not timed (CI has no steady clock): how long each start
takes is benchmarks/cli_start.py's to say.

Real: the console's and the agent's processes, each module they import as `python -X importtime` reports it, the
cache file, argparse's help built in this process, a failed run in the store made by another agent, and an agent
uploaded over OpenSSH's sshd on 127.0.0.1 (tests/sshd.py) whose copy is edited while it runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import backends
from backends import protocol
from console.cli import grammar
from console.link import reuse
from console.link.agent_upload import backends_version
from console.link.client import AgentClient
from console.link.ssh import SSHTransport
from console.link.transport import AgentError
from tests.conftest import run_state, wait_for
from tests.sshd import ALIAS, Sshd

REPO = Path(__file__).resolve().parents[1]


def imported(stderr: str) -> set[str]:
    """The modules `-X importtime` reported as imported."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def console(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-X", "importtime", "-m", "console", *args]
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=60)


def argparse_help(columns: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    return grammar.build_parser(grammar.GRAMMARS).format_help()


def test_version_imports_neither_the_grammar_nor_its_settings_nor_argparse() -> None:
    done = console("--version")
    assert (done.returncode, done.stdout) == (0, f"eagle3-console {backends.__version__}\n")
    # Each of these was imported by --version before (the grammar, its settings and argparse: ~100 ms).
    heavy = {"argparse", "dataclasses", "typing", "tomllib", "console.cli.grammar", "console.cli.config"}
    heavy |= {"console.cli.quick", "console.render", "console.link.reuse", "backends.protocol"}
    assert not heavy & imported(done.stderr), sorted(heavy & imported(done.stderr))


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_alone_is_argparses_text_made_once_then_kept(flag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for columns in (100, 61):
        env = {**os.environ, "COLUMNS": str(columns)}
        first, again = console(flag, env=env), console(flag, env=env)
        expected = argparse_help(columns, monkeypatch)
        assert (first.returncode, first.stdout) == (0, expected)
        assert (again.returncode, again.stdout) == (0, expected)
        assert "argparse" in imported(first.stderr)  # made with argparse, then kept...
        assert not {"argparse", "console.cli.grammar"} & imported(again.stderr)  # ...and read back without it


def test_a_grammar_changed_since_the_help_was_kept_shows_its_new_help(tmp_path: Path) -> None:
    """As after an upgrade: the kept text is made afresh when the grammar's source is not the one it was made of."""
    tree = tmp_path / "tree"
    for package in ("console", "backends", "themes"):
        shutil.copytree(REPO / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "COLUMNS": "100"}
    before = console("--help", cwd=tree, env=env)
    assert before.returncode == 0 and "runs and GPUs; with RUN" in before.stdout
    source = tree / "console" / "cli" / "grammar.py"
    source.write_text(source.read_text().replace("runs and GPUs; with RUN", "runs, GPUs; with RUN"))
    after = console("--help", cwd=tree, env=env)
    assert after.returncode == 0 and "runs, GPUs; with RUN" in after.stdout, after.stdout


def test_a_kept_help_whose_key_is_not_this_ones_is_not_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, "COLUMNS": "100"}
    console("--help", env=env)
    [kept] = (Path(os.environ["XDG_CACHE_HOME"]) / "eagle3-console").glob("help-*.txt")
    key, _, _ = kept.read_text().partition("\n")
    kept.write_text(f"{key.replace('columns=100', 'columns=99')}\nnot the help\n")
    shown = console("--help", env=env)
    assert shown.stdout == argparse_help(100, monkeypatch)


def greets(folder: Path) -> bool:
    """Whether a multiplexer answers on a socket of `folder`."""
    for path in folder.glob("*.sock"):
        with socket.socket(socket.AF_UNIX) as sock, contextlib.suppress(OSError):
            sock.settimeout(1)
            sock.connect(str(path))
            return sock.recv(64).startswith(reuse.GREETING)
    return False


def test_a_status_through_the_hosts_multiplexer_imports_no_event_loop_shutil_socket_or_hashlib(
    sshd: Sshd, tmp_path: Path
) -> None:
    """The second `status` of a host, answered through the multiplexer the first one left running, imports no event
    loop, no shutil (argparse's width, with bz2 and lzma: asked of `width.columns` instead), no socket.py (its
    enums of every constant) and no hashlib (OpenSSL's library, for the socket's name)."""
    runtime = Path(tempfile.mkdtemp(prefix="e3l", dir="/tmp"))  # a socket's path must fit in 108 bytes
    env = {**sshd.env(), "XDG_RUNTIME_DIR": str(runtime), reuse.IDLE_ENV: "60"}
    words = ("--workdir", str(tmp_path / "work"), ALIAS, "status")
    try:
        assert console(*words, env=env).returncode == 0
        wait_for(lambda: greets(runtime / "eagle3-console"), what="the multiplexer to serve")
        done = console(*words, env=env)
        assert done.returncode == 0 and "no runs yet" in done.stdout, done.stderr
        heavy = {"asyncio", "asyncssh", "shutil", "bz2", "lzma", "socket", "hashlib"} & imported(done.stderr)
        assert not heavy, sorted(heavy)
    finally:
        for lock in (runtime / "eagle3-console").glob("*.lock"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(lock.read_text().split()[0]), signal.SIGTERM)
        shutil.rmtree(runtime, ignore_errors=True)


def test_an_agent_answering_status_imports_no_serving_doctor_or_bench(workdir: Path) -> None:
    """Its status lists a failed run (its reason read from the store) and samples the GPUs; what only a launch,
    doctor, bench, convert or free-gpus needs is imported by that op's first request, in another agent here."""
    agent = [sys.executable, "-m", "backends.agent", "--workdir", str(workdir)]
    launch = protocol.request_line(1, "launch", {"kind": "command", "argv": [sys.executable, "-c", "exit(3)"]})
    launched = subprocess.run(agent, input=launch, capture_output=True, check=True, timeout=120)
    run_id = json.loads(launched.stdout)["result"]["run"]
    wait_for(lambda: run_state(workdir, run_id) == "failed", what="the run to fail")

    asks = protocol.request_line(1, "hello", {}) + protocol.request_line(2, "status", {"gpus": True})
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *agent[1:]], input=asks, capture_output=True, check=True, timeout=60
    )
    hello, status = (json.loads(line) for line in done.stdout.splitlines())
    assert hello["ok"] and status["ok"], status
    [run] = status["result"]["runs"]
    assert (run["id"], run["state"]) == (run_id, "failed")
    # Each was imported by an agent answering status before (serving SGLang: its engine, flags and log facts).
    heavy = {"backends.serving", "backends.sglang.engine", "backends.doctor", "backends.bench", "backends.runs.watch"}
    heavy |= {"backends.host.freegpus", "backends.runs.preflight"}
    assert not heavy & imported(done.stderr.decode()), sorted(heavy & imported(done.stderr.decode()))


async def test_what_an_op_imports_at_its_first_request_is_checked_unchanged_first(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uploaded agent imports doctor's modules at its first doctor request, long after the launcher verified its
    copy: one edited since is refused in one line naming it, as a launch is before a supervisor imports the copy
    anew, and its code never runs."""
    monkeypatch.setenv("HOME", str(sshd.home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    client = AgentClient(SSHTransport(ALIAS, tmp_path / "work"))
    await client.start()
    try:
        marker = tmp_path / "tampered-code-ran"
        full = tmp_path / "work" / "agent" / backends_version() / "backends" / "doctor" / "full.py"
        full.write_text(f"open({str(marker)!r}, 'w').close()\n" + full.read_text())
        with pytest.raises(AgentError) as refused:
            await client.doctor(str(tmp_path))
        assert refused.value.code == "agent_altered" and "\n" not in refused.value.message
        assert "backends/doctor/full.py changed" in refused.value.message
        assert not marker.exists()
    finally:
        await client.close()
