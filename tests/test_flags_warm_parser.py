"""A warm SGLang parser answers every flag check after the first for an interpreter, environment and cwd, with the
verdicts the one-shot interpreter gives, and is gone once closed, idle, or left by its agent.

The parser is SGLang 0.5.23's (EAGLE3_SGLANG_PARSER_PATH, through the launch's PYTHONPATH); the interpreter is
wrapped in a script that notes each start, so a test counts the imports paid.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.protocol import Finding
from backends.sglang import flags as serve_flags
from backends.sglang import launch, warm_parser
from tests.test_serve_flags import DEPRECATED, sglang_parser_file

PARSER_PATH = os.environ.get("EAGLE3_SGLANG_PARSER_PATH")
pytestmark = pytest.mark.skipif(PARSER_PATH is None, reason="EAGLE3_SGLANG_PARSER_PATH unset: run `make test`")
MODEL = ["--model-path", "m"]
REFUSED = ["--tp-size", "two"]


@pytest.fixture(autouse=True)
def no_warm_parser_outlives_a_test() -> Iterator[None]:
    yield
    warm_parser.close_all()


class Noting:
    """An interpreter that notes each start: each one pays SGLang's import."""

    def __init__(self, folder: Path) -> None:
        self.log = folder / "starts.log"
        self.path = folder / "python-noting"
        self.path.write_text(f'#!/bin/sh\necho started >> {self.log}\nexec {sys.executable} "$@"\n')
        self.path.chmod(0o755)

    def starts(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0

    def check(self, flags: list[str], env: dict[str, str] | None = None) -> Finding | None:
        return check([str(self.path), "-m", "sglang.launch_server", *MODEL, *flags], env or parser_env())


def parser_env() -> dict[str, str]:
    return {"PYTHONPATH": str(PARSER_PATH)}


def check(argv: list[str], env: dict[str, str]) -> Finding | None:
    found = launch.read(argv, env)
    assert found is not None, argv
    return serve_flags.check(found, env)


def one_shot(flags: list[str]) -> dict[str, Any]:
    """The verdict of an interpreter started for this parse alone, as every check was answered before."""
    return serve_flags._one_shot_verdict(sys.executable, ["sglang serve", *MODEL, *flags], parser_env(), None)


def warm(flags: list[str]) -> dict[str, Any] | None:
    env = {**os.environ, **parser_env()}
    argv = ["sglang serve", *MODEL, *flags]
    return warm_parser.ask(sys.executable, serve_flags._PARSE, env, None, argv, serve_flags.CHECK_TIMEOUT_S)


def the_warm_process() -> subprocess.Popen[bytes]:
    (proc,) = warm_parser.running()
    return proc


def gone(pid: int) -> bool:
    """No such process, or only its zombie (it exited; its parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def test_one_warm_parser_refuses_accepts_and_warns_at_once_without_a_new_interpreter(tmp_path: Path) -> None:
    python = Noting(tmp_path)
    refused = python.check(REFUSED)
    assert refused is not None and refused["code"] == "launch-flags"
    assert python.check(["--port", "1"]) is None
    pid = the_warm_process().pid
    for port in ("2", "3"):  # each parse hears its own deprecation warning
        began = time.monotonic()
        warned = python.check(["--port", port, "--disable-cuda-graph"])
        took = time.monotonic() - began
        assert warned is not None and warned["code"] == "launch-flags-warned"
        assert warned["message"].endswith(DEPRECATED)
        assert took < 1.0  # no import paid: it takes seconds
    assert python.starts() == 1 and the_warm_process().pid == pid


def test_the_warm_parser_gives_the_one_shot_verdicts_refusal_warning_and_acceptance() -> None:
    refused, warned, accepted = REFUSED, ["--port", "2", "--disable-cuda-graph"], ["--port", "1"]
    verdicts = {tuple(flags): one_shot(flags) for flags in (refused, warned, accepted)}
    assert "invalid int value: 'two'" in str(verdicts[tuple(refused)]["refused"])
    assert verdicts[tuple(warned)]["warnings"] == [DEPRECATED] and verdicts[tuple(warned)]["ok"] is True
    assert verdicts[tuple(accepted)]["ok"] is True and verdicts[tuple(accepted)]["warnings"] == []
    for flags, verdict in verdicts.items():
        assert warm(list(flags)) == verdict, flags


def test_a_parser_that_warns_once_per_process_warns_at_every_check(tmp_path: Path) -> None:
    # 0.5.23's parser keeps nothing between parses that a verdict shows; a release whose deprecation warning is
    # said once per process (transformers' warning_once, an lru_cache) would, were the parses not forked.
    parser_file = sglang_parser_file(tmp_path / "site")
    parser_file.write_text(
        "import argparse, functools, logging\n"
        "@functools.lru_cache(None)\n"
        "def warn_once(text):\n"
        "    logging.getLogger(__name__).warning(text)\n"
        "class Old(argparse.Action):\n"
        "    def __call__(self, parser, namespace, values, option_string=None):\n"
        "        warn_once(f'{option_string} is deprecated')\n"
        "class ServerArgs:\n"
        "    @staticmethod\n"
        "    def add_cli_args(p):\n"
        "        p.add_argument('--old', nargs=0, action=Old)\n"
        "        p.add_argument('--port')\n"
    )
    python = Noting(tmp_path)
    env = {"PYTHONPATH": str(tmp_path / "site")}
    for port in ("1", "2"):
        finding = check([str(python.path), "-m", "sglang.launch_server", "--old", "--port", port], env)
        assert finding is not None and finding["message"].endswith("but warns: --old is deprecated"), port
    assert python.starts() == 1


def test_a_warm_parser_that_died_is_replaced_by_the_one_shot_check_then_a_new_warm_one(tmp_path: Path) -> None:
    python = Noting(tmp_path)
    assert python.check(["--port", "1"]) is None
    killed = the_warm_process()
    killed.kill()
    killed.wait()
    refused = python.check(REFUSED)
    assert refused is not None and "invalid int value: 'two'" in refused["message"]
    assert warm_parser.running() == [] and python.starts() == 2  # the one-shot interpreter answered
    assert python.check(["--port", "2"]) is None
    assert python.starts() == 3 and the_warm_process().pid != killed.pid
    assert python.check(["--port", "3"]) is None and python.starts() == 3


def test_a_warm_parser_is_gone_once_closed_or_idle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = Noting(tmp_path)
    assert python.check(["--port", "1"]) is None
    closed = the_warm_process()
    warm_parser.close_all()
    assert closed.poll() is not None and warm_parser.running() == []
    monkeypatch.setattr(warm_parser, "IDLE_CLOSE_S", 0.5)
    assert python.check(["--port", "2"]) is None
    idle = the_warm_process()
    assert idle.poll() is None
    deadline = time.monotonic() + 10
    while idle.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert idle.poll() is not None and warm_parser.running() == []


def test_a_warm_parser_exits_by_itself_when_its_agent_is_gone(tmp_path: Path) -> None:
    agent_like = (
        "import sys\n"
        "from backends.sglang import flags, launch, warm_parser\n"
        f"env = {parser_env()!r}\n"
        "flags.check(launch.read([sys.executable, '-m', 'sglang.launch_server', '--port', '1'], env), env)\n"
        "print(warm_parser.running()[0].pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    agent = subprocess.Popen(
        [sys.executable, "-c", agent_like], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert agent.stdout is not None
        pid = int(agent.stdout.readline())
        assert not gone(pid)
    finally:
        agent.kill()  # no atexit, no close: only the warm process's stdin tells it
        agent.wait()
    deadline = time.monotonic() + 10
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(pid)


def test_an_interpreter_without_sglang_is_refused_as_before_and_keeps_no_process(tmp_path: Path) -> None:
    python = Noting(tmp_path)
    for flags, starts in ((["--port", "1"], 1), (["--port", "2"], 2)):  # one interpreter a check, as before
        finding = python.check(flags, {"PYTHONPATH": str(tmp_path)})
        assert finding is not None and finding["code"] == "launch-python"
        assert finding["message"] == f"{python.path} has no SGLang (No module named 'sglang')"
        assert python.starts() == starts and warm_parser.running() == []
