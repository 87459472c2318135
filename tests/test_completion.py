"""Shell completion of RUN (issue 26): the host's run ids and names, asked of a real agent.

Real: the console as a process answering argcomplete as a shell's hook asks it (_ARGCOMPLETE, COMP_LINE,
COMP_POINT, the answer in the file argcomplete is told of), the local agent it starts over a temp run store with
real runs, the cache on disk, and for a host that never answers a TCP listener that never greets.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import CLI, SLEEPER, launch

# Appends a line to $AGENT_STARTS each time a Python starts the agent: how a test counts the hosts asked.
COUNTER = """import os, sys
if "backends.agent" in sys.orig_argv and os.environ.get("AGENT_STARTS"):
    with open(os.environ["AGENT_STARTS"], "a") as starts:
        starts.write("agent\\n")
"""


# How long a person waits on TAB at most: the 2.5 s deadline, and a loaded machine's start of the process.
PATIENCE_S = 6.0


@dataclass
class Completed:
    words: dict[str, str]  # each completion and what it is (zsh's description)
    stderr: str
    seconds: float


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: CLI) -> Path:
    """A shell's environment: its own HOME and config, and every agent start counted in the returned file."""
    counter = tmp_path / "counter"
    counter.mkdir()
    (counter / "sitecustomize.py").write_text(COUNTER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(counter), os.environ["PYTHONPATH"]]))
    monkeypatch.setenv("AGENT_STARTS", str(tmp_path / "agent-starts"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path / "agent-starts"


def agents_started(starts: Path) -> int:
    return len(starts.read_text().splitlines()) if starts.exists() else 0


def complete(line: str, tmp_path: Path) -> Completed:
    """What the console offers for TAB at the end of `line`, as zsh's hook asks it."""
    answer = tmp_path / "completions"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_SHELL": "zsh",
        "_ARGCOMPLETE_IFS": "\n",
        "_ARGCOMPLETE_SUPPRESS_SPACE": "1",  # as bash's hook sets it: a lone completion gets no trailing blank
        "_ARGCOMPLETE_STDOUT_FILENAME": str(answer),
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "console"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    pairs = (word.partition(":") for word in answer.read_text().split("\n") if word)
    return Completed({word: said for word, _, said in pairs}, done.stderr, seconds)


def two_runs(cli: CLI) -> tuple[str, str]:
    alpha = launch(cli, "train", "--name", "alpha", "--", sys.executable, "-c", SLEEPER)
    beta = launch(cli, "train", "--name", "beta", "--", sys.executable, "-c", SLEEPER)
    return alpha, beta


def cache_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "eagle3-console" / "completion").glob("runs-*.json"))


def test_logs_tab_offers_each_runs_id_and_name_and_a_prefix_narrows_them(
    cli: CLI, workdir: Path, shell: Path, tmp_path: Path
) -> None:
    alpha, beta = two_runs(cli)
    offered = complete(f"eagle3-console --workdir {workdir} local logs ", tmp_path)
    assert {alpha, beta, "alpha", "beta"} <= offered.words.keys()
    assert offered.words[alpha].startswith("alpha") and offered.words["beta"].startswith(beta)
    assert offered.stderr == ""
    by_name = complete(f"eagle3-console --workdir {workdir} local kill al", tmp_path)
    assert by_name.words.keys() == {"alpha"}
    by_id = complete(f"eagle3-console --workdir {workdir} local metrics {beta[:-2]}", tmp_path)
    assert by_id.words.keys() == {beta}


def test_a_command_without_host_completes_the_default_hosts_runs(
    cli: CLI, workdir: Path, shell: Path, tmp_path: Path
) -> None:
    alpha, _ = two_runs(cli)
    settings = tmp_path / "xdg" / "eagle3-console"
    settings.mkdir(parents=True)
    (settings / "config.toml").write_text('[defaults]\ndefault_host = "local"\n')
    assert {alpha, "alpha"} <= complete(f"eagle3-console --workdir {workdir} stacks ", tmp_path).words.keys()


def test_a_job_over_several_hosts_completes_its_id_for_kill(
    cli: CLI, workdir: Path, shell: Path, tmp_path: Path
) -> None:
    node = ["--job", "job-7", "--node-rank", "0", "--nnodes", "2"]
    launch(cli, "train", "--name", "node0", *node, "--", sys.executable, "-c", SLEEPER)
    # The first host is asked: a job's id is the same on each of its nodes.
    offered = complete(f"eagle3-console --workdir {workdir} local,nobody@127.0.0.1:1 kill jo", tmp_path)
    assert offered.words == {"job-7": "job of 2 nodes"}


def test_a_second_tab_within_the_cache_time_starts_no_agent(
    cli: CLI, workdir: Path, shell: Path, tmp_path: Path
) -> None:
    alpha, _ = two_runs(cli)
    line = f"eagle3-console --workdir {workdir} local logs "
    launched = agents_started(shell)  # each launch had an agent of its own
    assert alpha in complete(line, tmp_path).words
    assert agents_started(shell) == launched + 1
    assert alpha in complete(line, tmp_path).words
    assert agents_started(shell) == launched + 1
    [cached] = cache_files(tmp_path)
    assert stat.S_IMODE(cached.stat().st_mode) == 0o600
    assert stat.S_IMODE(cached.parent.stat().st_mode) == 0o700
    # Once the answer is older than the cache time, TAB asks the host again.
    aged = time.time() - 60
    os.utime(cached, (aged, aged))
    assert alpha in complete(line, tmp_path).words
    assert agents_started(shell) == launched + 2


@pytest.fixture
def silent_host() -> Iterator[int]:
    """A port that takes connections and never says a word (an SSH server that hangs before its banner)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def test_a_host_that_does_not_answer_completes_nothing_within_the_deadline(
    cli: CLI, silent_host: int, shell: Path, tmp_path: Path
) -> None:
    offered = complete(f"eagle3-console nobody@127.0.0.1:{silent_host} logs ", tmp_path)
    assert offered.seconds < PATIENCE_S
    assert [word for word in offered.words if not word.startswith("-")] == []
    assert offered.stderr == ""
    assert cache_files(tmp_path) == []
