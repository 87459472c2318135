"""A server launched as `sglang serve ...`, seen in the console as a person sees it: the real console in tmux over
the test sshd (tests/test_tui_tmux.py says what is real there), its run started as SGLang's own CLI is typed.

The `sglang` program is a console script whose `#!` line names the real-SGLang tier's interpreter
(EAGLE3_SGLANG_PYTHON), as pip writes one: the pre-launch gate finds that interpreter from it and asks SGLang
0.5.23's real parser, whose real deprecation warning of `--disable-cuda-graph` the detail panel shows, and the
relaunch dialog offers the presets spelled for 0.5.23. What the script runs is the stand-in
(tests/sglang_standin.py: SGLang's startup lines, /health, /metrics), since the real server needs a GPU.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.sshd import Sshd
from tests.test_tui_tmux import RUN_ID, console, host_python, launch

__all__ = ["host_python"]  # the fixture, used by name

STANDIN = """#!{python}
# sglang serve FLAGS: the stand-in server gets FLAGS, as SGLang's cli/serve.py hands them to its server.
import sys
from tests.sglang_standin import main
if __name__ == "__main__":
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    sys.exit(main())
"""
DEPRECATED = "--disable-cuda-graph' is deprecated"
PRESET_0523 = "--cuda-graph-backend-decode=disabled --cuda-graph-backend-prefill=disabled"


@pytest.fixture
def sglang_script(tmp_path: Path, sglang_python: Path) -> Path:
    script = tmp_path / "bin" / "sglang"
    script.parent.mkdir()
    script.write_text(STANDIN.format(python=sglang_python))
    script.chmod(0o755)
    return script


def complete(port: int) -> None:
    """One streamed completion, as a client sends it: the server's gauges move (its /metrics then has figures)."""
    body = json.dumps({"model": "target", "prompt": "hi", "max_tokens": 16, "stream": True}).encode()
    url = f"http://127.0.0.1:{port}/v1/completions"
    asked = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(asked, timeout=30) as answer:
        answer.read()


def selected(shown: str, other_than: str) -> str:
    """The run the detail panel shows, when it is not `other_than` ("" otherwise)."""
    found = re.search(rf"({RUN_ID})  srv  \(serve\)", shown)
    return found[1] if found and found[1] != other_than else ""


@pytest.mark.parametrize("size", [(160, 48), (100, 30)], ids=["160x48", "100x30"])
def test_a_sglang_serve_run_shows_its_parser_warning_health_metrics_and_relaunches_with_presets(
    sshd: Sshd, workdir: Path, host_python: Path, sglang_script: Path, tmp_path: Path, size: tuple[int, int]
) -> None:
    port = free_port()
    argv = [str(sglang_script), "serve", "--model-path", str(tmp_path), "--port", str(port)]
    argv += ["--enable-metrics", "--disable-cuda-graph"]
    run_id = launch(workdir, "serve", "--name", "srv", "--", *argv)
    with console(sshd, workdir, host_python, size) as term:
        # Health polled: the server is ready by its /health; SGLang's parser warning shown in the detail.
        term.wait_for(lambda shown: re.search(r"srv +serve +ready", shown), timeout=90, what="the server ready")
        term.wait_text("health ok", timeout=30)
        term.wait_text(DEPRECATED, timeout=30)  # in the detail panel, wrapped to its width
        # /metrics scraped: once the server decodes, its figures are charted under SGLang's own names (the stand-in
        # prints no decode line: every figure charted came from /metrics).
        complete(port)
        term.wait_for(
            lambda shown: re.search(r"━ (gen_throughput|accept_len) [\d.]+", shown),
            timeout=60,
            what="the server's /metrics charted",
        )
        term.send("r")
        term.wait_text(f"Relaunch run {run_id}", timeout=30)
        term.wait_text(PRESET_0523.split()[0], timeout=30)  # the preset spelled for 0.5.23
        term.write(PRESET_0523 + " -disable-cuda-graph")
        term.send("Enter")
        term.wait_text(f"would stop run {run_id} and start:", timeout=60)
        term.send("y")
        # The cursor follows the relaunch: the detail is the new run's (the news of it wraps at 100 columns).
        child = term.wait_for(lambda shown: selected(shown, run_id), timeout=60, what="the relaunched run selected")
        term.wait_for(lambda shown: re.search(r"srv +serve +ready", shown), timeout=90, what="the new server ready")
        assert re.search(rf"{run_id[-8:]} +srv +serve +killed", term.screen()), term.screen()
        assert child != run_id
