"""Every failure says why, everywhere (issue 22): one rule gives a failed run's reason in one line (a recognised
cause, else the last exception line, else the last `error:` line, else the last line), recorded by the supervisor
when the run ends, and `status`, `status RUN`, `watch`, the end of `--follow`, the console's detail panel and its
notification all say that same line with the exit code or the signal.

Real: every process, the supervisor, the signals (a child's own SIGKILL and SIGSEGV), SGLang 0.5.23's own argument
parser (the real tier's `sglang serve` console script and `python -m sglang.launch_server`, which exit 2 on a typo
flag), our trainer's and our extraction's CLIs. Stand-in: the out-of-memory run, a `python -c` that prints what
PyTorch prints when CUDA runs out of memory (there is no GPU here) and exits 1.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from backends import serving
from backends.runs import failure_reason
from console.fleet.hosts import Fleet
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.tui.app import ConsoleApp
from console.tui.panels import RunDetail, RunsTable, detail_text
from tests.conftest import CLI, Notes, launch, until, wait_state

# ----- the rule, over any output -----


def reason_of(
    data: bytes, argv: list[str] | None = None, env: dict[str, str] | None = None, watched: bool = True
) -> str:
    """The reason the supervisor records for a run that printed `data`: read by the watch's reader as it came
    (`watched`), or, for a run that had no watch, from the output's tail alone."""
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "output.log"
        output.write_bytes(data)
        reader = serving.DEFAULT.output_reader() if watched else None
        if reader is not None:
            reader.feed(data)
        return failure_reason.reason(output, reader, argv or [], env or {})


noise = st.lists(st.from_regex(r"[a-z][a-z ,.=0-9]{0,40}", fullmatch=True), max_size=4)
message = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp")), max_size=60)
frames = st.lists(
    st.builds(lambda n: f'  File "/opt/x.py", line {n}, in f\n    f()', st.integers(1, 9999)), min_size=1, max_size=3
)
exception_name = st.from_regex(r"([a-z_]{1,8}\.){0,2}[A-Z][a-z]{1,10}(Error|Exception)?", fullmatch=True)
program = st.from_regex(r"[a-z]{1,10}( serve)?", fullmatch=True)
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"


@given(
    before=noise,
    traceback=st.none() | st.tuples(frames, exception_name, message),
    error=st.none() | st.tuples(program, message),
    error_first=st.booleans(),
    oom=st.booleans(),
    after=noise,
    watched=st.booleans(),
)
def test_the_reason_is_the_cause_else_the_exception_else_the_error_line_else_the_last_line(
    before: list[str],
    traceback: tuple[list[str], str, str] | None,
    error: tuple[str, str] | None,
    error_first: bool,
    oom: bool,
    after: list[str],
    watched: bool,
) -> None:
    exception = error_line = None
    parts: list[list[str]] = []
    if traceback is not None:
        found, name, text = traceback
        exception = f"{name}: {text}".strip() if text.strip() else name
        parts.append(["Traceback (most recent call last):", *found, exception])
    if error is not None:
        error_line = f"{error[0]}: error: {error[1]}".strip()
        parts.insert(0 if error_first else len(parts), [error_line])
    lines = [*before, *(line for part in parts for line in part), *([OOM] if oom else []), *after]
    found_reason = reason_of(("\n".join(lines) + "\n").encode(), watched=watched)
    if oom:
        assert found_reason == "cuda-oom: a GPU ran out of memory"
    elif exception is not None:
        assert found_reason == exception
    elif error_line is not None:
        assert found_reason == error_line
    elif lines:
        assert found_reason == f"its last line: {lines[-1].strip()}"
    else:
        assert found_reason == "it printed nothing"


@given(st.binary(max_size=4096) | st.text(max_size=2000).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_output_gives_one_short_line_without_escapes(data: bytes) -> None:
    found = reason_of(data)
    assert found and len(found) <= failure_reason.MAX_CHARS
    assert "\n" not in found and "\r" not in found and "\x1b" not in found
    assert reason_of(data, watched=False)  # without a watch, from the tail alone


def test_a_huge_line_binary_junk_escapes_and_secrets_are_each_made_one_honest_line() -> None:
    huge = reason_of(b"x" * (2 * 1024 * 1024))  # 2 MB without a newline: the tail's end, cut
    assert huge == "its last line: …" + "x" * (failure_reason.MAX_CHARS - len("its last line: …") - 1) + "…"
    assert reason_of(b"step 1\n" + bytes(range(256)) * 8) == failure_reason.NOT_TEXT
    assert reason_of(b"\x1b[31merror: the loss became nan by step 5\x1b[0m\n") == (
        "error: the loss became nan by step 5"
    )
    leaked = b"prog: error: argument --api-key: bad value s3cr3t-key (HF_TOKEN=hf_abcdefgh)\n"
    masked = reason_of(leaked, argv=["prog", "--api-key", "s3cr3t-key"], env={"HF_TOKEN": "hf_abcdefgh"})
    assert "s3cr3t-key" not in masked and "hf_abcdefgh" not in masked and masked.startswith("prog: error: argument")
    # A scheduler's own exception is the reason, not the launcher's line that only says the scheduler died.
    launcher = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in f\nAssertionError: Attempted to load weight\n'
        'Traceback (most recent call last):\n  File "y.py", line 2, in g\n'
        "RuntimeError: Rank 0 scheduler died during initialization (exit code: 1).\n"
    )
    assert reason_of(launcher.encode()) == "AssertionError: Attempted to load weight"


def test_the_failure_line_says_how_the_run_ended() -> None:
    line = failure_reason.failure_line
    assert line({"code": 2, "signal": None, "error": None, "reason": "p: error: x"}) == "p: error: x (exit code 2)"
    assert line({"code": None, "signal": "SEGV", "error": None, "reason": "r"}) == "r (signal SIGSEGV)"
    assert line({"code": None, "signal": None, "error": "cannot start 'nope': No such file"}) == (
        "cannot start 'nope': No such file"
    )
    assert line({"code": 1, "signal": None, "error": None}) is None  # recorded before reasons were


# ----- real runs through the real supervisor, in every view -----


def printed_until(process: subprocess.Popen[bytes], texts: list[str], timeout: float) -> str:
    """What `process` printed on its stdout until every one of `texts` (or `timeout` seconds, or its end)."""
    assert process.stdout is not None
    fd, out = process.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while (
        not all(text.encode() in out for text in texts)
        and (left := deadline - time.monotonic()) > 0
        and select.select([fd], [], [], left)[0]
    ):
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
    return out.decode()


def watching(workdir: Path) -> subprocess.Popen[bytes]:
    """`watch`, started and past its first look (a change before it would be its starting point)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "console", "--workdir", str(workdir), "local", "watch", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None and select.select([process.stderr], [], [], 60)[0], "the watch never started"
    assert b"watching" in process.stderr.readline()
    return process


def test_each_failure_shape_says_why_in_status_watch_logs_follow_and_the_detail_panel(
    cli: CLI, workdir: Path, tmp_path: Path, sglang_python: Path
) -> None:
    watch = watching(workdir)
    try:
        missing = tmp_path / "none"
        shapes = {
            launch(cli, "command", "--", *PYTHON_RAISES): "ValueError: draft config has no vocab (exit code 1)",
            # SGLang 0.5.23's own `sglang serve` (the real tier's console script) on a typo flag: its argparse exit.
            launch(cli, "serve", "--force", "--", str(sglang_python.parent / "sglang"), *typo_serve(tmp_path)): (
                "sglang serve: error: unrecognized arguments: --mem-fraction-statik 0.8 (exit code 2)"
            ),
            # Our own trainer's CLI, refusing what it was given: its `error: ...` line.
            launch(cli, "train", "--", *trainer(missing, tmp_path)): (
                f"error: {missing}/manifest.json does not exist: is {missing} an extraction output folder? "
                "(exit code 2)"
            ),
            launch(cli, "extract", "--", sys.executable, "-c", die_by(11)): "its last line: loading (signal SIGSEGV)",
            launch(cli, "command", "--", sys.executable, "-c", die_by(9)): "its last line: loading (signal SIGKILL)",
            launch(cli, "train", "--", sys.executable, "-c", PRINTS_OOM): (
                "cuda-oom: a GPU ran out of memory (exit code 1)"
            ),
        }
        infos = {run_id: wait_state(cli, run_id, {"failed"}, timeout=120) for run_id in shapes}
        said = {run_id: f"failed: {why}" for run_id, why in shapes.items()}
        watched = printed_until(watch, list(said.values()), timeout=30)
    finally:
        watch.terminate()
    watched += watch.communicate(timeout=10)[0].decode()
    status = cli("status").stdout.decode()
    for run_id, why in shapes.items():
        assert infos[run_id]["failure"] == why
        assert f"run {run_id} failed: {why}" in status
        assert f"run {run_id} failed: {why}" in cli("status", run_id).stdout.decode()
        assert any(run_id in line and line.endswith(said[run_id]) for line in watched.splitlines()), watched
        assert watched.count(said[run_id]) == 1  # said once: not again as a note under the change
        assert why in detail_text(infos[run_id]).plain
        ended = cli("logs", run_id, "--follow")
        assert ended.stderr.decode().endswith(f"run {run_id} failed: {why}\n")
    signalled = [d for run_id in list(shapes)[3:5] for d in infos[run_id]["diagnoses"]]
    assert [d["code"] for d in signalled] == ["crashed", "crashed"]
    assert "native code" in signalled[0]["hint"] and "out-of-memory killer" in signalled[1]["hint"]


PYTHON_RAISES = [sys.executable, "-c", "raise ValueError('draft config has no vocab')"]


def typo_serve(target: Path) -> list[str]:
    return ["serve", "--model-path", str(target), "--mem-fraction-statik", "0.8"]


def trainer(data: Path, target: Path) -> list[str]:
    return [sys.executable, "-m", "backends.train", "--data", str(data), "--target", str(target), "--out", str(target)]


def die_by(signal_number: int) -> str:
    return f"import os, time\nprint('loading', flush=True)\ntime.sleep(0.5)\nos.kill(os.getpid(), {signal_number})"


PRINTS_OOM = (
    "import sys\nprint('Traceback (most recent call last):')\nprint('  File \"train.py\", line 9, in step')\n"
    f"print({OOM!r})\nsys.exit(1)"
)


def test_train_extract_and_serve_follow_end_with_why(
    cli: CLI, workdir: Path, tmp_path: Path, sglang_python: Path
) -> None:
    serving_follow = subprocess.Popen(
        [
            sys.executable, "-m", "console", "--workdir", str(workdir), "local", "serve", str(tmp_path), str(tmp_path),
            "--python", str(sglang_python), "--port", "1", "--force", "--follow", "--", "--mem-fraction-statik", "0.8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        trained = cli(
            "train",
            "--follow",
            "--data",
            str(tmp_path / "none"),
            "--target",
            str(tmp_path),
            "--out",
            str(tmp_path / "o"),
        )
        extracted = cli(
            "extract", "--follow", "--target", str(tmp_path / "none"), "--data", "demo", "--out", str(tmp_path / "o")
        )
        served_out, served_err = serving_follow.communicate(timeout=180)
    finally:
        serving_follow.kill()
    assert trained.returncode == 1 and extracted.returncode == 1 and serving_follow.returncode == 1
    run = trained.stdout.decode().split()[0]
    assert trained.stderr.decode().endswith(
        f"run {run} failed: error: {tmp_path / 'none'}/manifest.json does not exist: is {tmp_path / 'none'} an "
        "extraction output folder? (exit code 2)\n"
    )
    run = extracted.stdout.decode().split()[0]
    assert extracted.stderr.decode().endswith(
        f"run {run} failed: error: --target {tmp_path / 'none'}: no such folder (exit code 2)\n"
    )
    run = served_out.decode().splitlines()[0]
    assert served_err.decode().endswith(
        f"run {run} failed before it was ready: sglang serve: error: unrecognized arguments: "
        f"--mem-fraction-statik 0.8 (exit code 2); see `logs {run}`\n"
    )


async def test_the_consoles_notification_and_detail_panel_say_why(workdir: Path, nvml_state: Path) -> None:
    notes = Notes()

    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(160, 50), message_hook=notes) as pilot:
        await until(pilot, lambda: app.states is not None, what="the first poll")
        script = "import sys, time\ntime.sleep(3)\nsys.exit('error: the loss became nan by step 5: lower --lr')"
        async with AgentClient(LocalTransport(workdir)) as client:
            failing = (await client.launch("train", [sys.executable, "-c", script], name="trainer"))["run"]
        await until(pilot, lambda: bool(notes), timeout=30, what="the notification")
        table = app.query_one(RunsTable)
        table.move_cursor(row=table.get_row_index(failing))
        why = "error: the loss became nan by step 5: lower --lr (exit code 1)"
        await until(pilot, lambda: why in str(app.query_one(RunDetail).render()), what="the detail")
        await pilot.press("q")
    [note] = notes
    assert note.severity == "error" and note.message.endswith(f"({failing}): running → failed: {why}")


def test_an_exit_record_without_a_reason_reads_as_before(cli: CLI, workdir: Path) -> None:
    """A run that ended under an older supervisor has no reason: its views say its exit code, nothing invented."""
    run_id = launch(cli, "command", "--", sys.executable, "-c", "raise SystemExit(3)")
    wait_state(cli, run_id, {"failed"})
    record = workdir / "runs" / run_id / "exit.json"
    ended: dict[str, Any] = json.loads(record.read_text())
    assert ended.pop("reason") == "it printed nothing"
    record.write_text(json.dumps(ended))
    info = wait_state(cli, run_id, {"failed"})
    assert "failure" not in info and info["exit_code"] == 3
    assert "exit code 3" in detail_text(info).plain
