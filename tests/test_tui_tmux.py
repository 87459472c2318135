"""The console's face, end to end: the real console in a tmux terminal, over a real OpenSSH sshd on 127.0.0.1, with
the real agent it uploads there, reading runs that are real processes in the same run store. Only NVML is a double:
the host's Python (--remote-python) is a wrapper that names it, since sshd gives a session a fresh environment.
Everything asserted is screen text, as `tmux capture-pane` gives it: a training whose evals keep its curves whole,
a relaunch the cursor follows with its parent's curves drawn beside its own, a stall with its frames."""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.sshd import ALIAS, Sshd
from tests.tmux import Tmux

STEPS = 300
EVAL_EVERY = 50
# A training as the console sees one: a loss row per step, an eval row (val_loss) every EVAL_EVERY steps after
# that step's own row, accuracies per position, a log line per row, a few rows per 0.1 s; then it stays alive.
# The last values are round, to be read in the legend: loss 1.25 and val_loss 1.75 at the last step.
TRAINER = f"""
import json, os, sys, time
with open(os.environ["EAGLE3_METRICS_FILE"], "a") as metrics:
    for step in range(1, {STEPS} + 1):
        row = {{"step": step, "loss": 1.25 + ({STEPS} - step) / 100}}
        row.update({{f"acc_{{k}}": round(step / {STEPS} * (1 - k / 5), 4) for k in range(3)}})
        metrics.write(json.dumps(row) + "\\n")
        if step % {EVAL_EVERY} == 0:
            metrics.write(json.dumps({{"step": step, "val_loss": 1.75 + ({STEPS} - step) / 100}}) + "\\n")
        metrics.flush()
        print(f"step {{step}} loss {{row['loss']:.2f}}", flush=True)
        if step % 5 == 0:
            time.sleep(0.1)
print("trained", {STEPS}, "steps; seed", sys.argv[-1], flush=True)
time.sleep(600)
"""
# Says a few lines, then waits forever in a named function, idle: what a rank stuck in a collective looks like.
HANGER = """
import time
def wait_for_allreduce():
    time.sleep(600)
for step in range(3):
    print(f"step {step}", flush=True)
wait_for_allreduce()
"""
STALL_AFTER_S = 12  # well above the 5 s the console waits before it counts a silence: the counter shows first
CONNECT_S = 60  # the first connection uploads the agent; CI has two slow cores
RUN_ID = r"\d{8}-\d{6}-\d{3}-[0-9a-f]{4}"
BRAILLE = re.compile("[\u2801-\u28ff]")  # a cell of a plotted curve (U+2800 is an empty one)


@pytest.fixture
def host_python(tmp_path: Path, nvml_state: Path) -> Path:
    """The host's Python for the agent: this interpreter, with the NVML double (and this test's caches) named."""
    names = ("EAGLE3_NVML_MODULE", "FAKE_NVML_STATE", "PYTHONPATH", "XDG_CACHE_HOME")
    exports = "".join(f"export {name}={shlex.quote(os.environ[name])}\n" for name in names)
    wrapper = tmp_path / "host-python"
    wrapper.write_text(f'#!/bin/sh\n{exports}exec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@contextlib.contextmanager
def console(sshd: Sshd, workdir: Path, python: Path, size: tuple[int, int]) -> Iterator[Tmux]:
    """The console on the test host as a person opens it, in a terminal of `size`, once it shows the host's GPU."""
    argv = [sys.executable, "-m", "console", "--workdir", str(workdir), "--remote-python", str(python), ALIAS]
    with Tmux(argv, width=size[0], height=size[1], env=sshd.env(), cwd=REPO) as term:
        term.wait_text("GPU0 H200", timeout=CONNECT_S)  # the double's GPU: the agent answered over SSH
        yield term


def launch(workdir: Path, *args: str) -> str:
    """A run started in the host's run store (this machine's, the one the console's agent reads)."""
    done = subprocess.run(
        [sys.executable, "-m", "console", "--workdir", str(workdir), "local", "launch", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def chart(screen: str, legend: str) -> tuple[list[str], str, str] | None:
    """The chart whose legend starts with `legend`, cut out of the screen: its plot rows, x axis and x labels,
    each from the chart's left edge (the legend's first column); None while it is not drawn whole."""
    lines = screen.splitlines()
    top = next((i for i, line in enumerate(lines) if legend in line), None)
    if top is None:
        return None
    left = lines[top].index(legend)
    below = [line[left:] for line in lines[top + 1 :]]
    axis = next((i for i, line in enumerate(below) if "└" in line), len(below))
    return (below[:axis], below[axis], below[axis + 1]) if axis + 1 < len(below) else None


def x_reach(axis: str, labels: str) -> float:
    """The step at the right end of an x axis that starts at step 1, read from its last labelled tick: a chart
    of every training point reaches the last step whichever ticks its width leaves room for."""
    corner = axis.index("└")
    ticks = axis[corner + 1 :].rstrip()
    columns = [i for i, glyph in enumerate(ticks) if glyph == "┬"]
    values = [int(label) for label in re.findall(r"\d+", labels[corner + 1 :])]
    if not columns or columns[-1] == 0 or len(columns) != len(values):
        return math.nan  # no tick, or only one at the axis's start: a chart of one step
    return 1 + (values[-1] - 1) * (len(ticks) - 1) / columns[-1]


def whole_loss_curve(screen: str) -> bool:
    """Whether the loss chart's x axis reaches the last step and its first column holds a point (step 1)."""
    drawn = chart(screen, "━ loss ")
    if drawn is None:
        return False
    rows, axis, labels = drawn
    corner = axis.index("└")
    starts = any(len(row) > corner + 1 and BRAILLE.match(row[corner + 1]) for row in rows)
    return starts and abs(x_reach(axis, labels) - STEPS) <= STEPS * 0.05


FOOTER = ("k kill", "r relaunch", "f free GPUs", "s stacks", "t theme", "w wrap", "c chart", "? help", "q quit")
FOOTER_FINDER = "^p find run"


def started(shown: str) -> str:
    """The run a relaunch's notification says it started ("" while none shows)."""
    found = re.search(rf"run ({RUN_ID}) started, replacing", shown)
    return found[1] if found else ""


def silence(shown: str) -> int:
    """The seconds of silence the detail counts while the run `hang` is still called running (0: none shown)."""
    found = re.search(r"silent for (?:over )?(\d+) s", shown)
    return int(found[1]) if found and "hang  (train)  running" in shown else 0


@pytest.mark.parametrize(("size", "one_chart"), [((160, 48), False), ((100, 30), True)], ids=["160x48", "100x30"])
def test_a_training_keeps_every_training_point_across_its_evals(
    sshd: Sshd, workdir: Path, host_python: Path, tmp_path: Path, size: tuple[int, int], one_chart: bool
) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    with console(sshd, workdir, host_python, size) as term:
        launch(workdir, "train", "--name", "draft", "--", sys.executable, str(script), "--seed", "1")
        term.wait_text(f"trained {STEPS} steps", timeout=60)
        # Every key the footer shows fits on its line, quit and the run finder too (at 100 columns quit was cut).
        term.wait_for(
            lambda shown: all(key in shown.splitlines()[-1] for key in (*FOOTER, FOOTER_FINDER)), 10, "the whole footer"
        )
        # The last training row, then the last eval: both curves end on their last values, and the loss curve
        # still runs from the first step to the last (an eval row once cut it to a one-point val_loss curve).
        term.wait_for(
            lambda shown: "━ loss 1.25  ━ val_loss 1.75" in shown and whole_loss_curve(shown),
            timeout=20,
            what="the loss chart over every step, ending on the last values",
        )
        if one_chart:  # no room for the second chart: the one shown is made to show the accuracies (c)
            term.send("c")
            term.wait_text("What the chart shows", timeout=20)
            term.write("acc_*")
            term.send("Enter")
        term.wait_text("━ acc_0 1  ━ acc_1 0.8  ━ acc_2 0.6", timeout=20)


def test_a_relaunch_moves_the_cursor_to_the_new_run_and_draws_its_parents_curves(
    sshd: Sshd, workdir: Path, host_python: Path, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    parent = launch(workdir, "train", "--name", "draft", "--", sys.executable, str(script), "--seed", "1")
    with console(sshd, workdir, host_python, (160, 48)) as term:
        term.wait_text(f"trained {STEPS} steps; seed 1", timeout=60)
        term.wait_text("━ loss 1.25 ", timeout=20)
        term.send("r")
        term.wait_text(f"Relaunch run {parent}", timeout=20)
        term.write("--seed=2")
        term.send("Enter")
        term.wait_text(f"would stop run {parent} and start:", timeout=30)
        term.send("y")  # the preview's focus is on Cancel: Enter alone would change nothing
        child = term.wait_for(started, timeout=30, what="news of its start")
        assert child != parent
        # The detail panel is the selected run's: the cursor followed the relaunch to the new run.
        screen = term.wait_text(f"relaunch of {parent}: --seed 1→2", timeout=30)
        assert f"{child}  draft  (train)  running" in screen, screen
        term.wait_for(
            # Its own curves are named first, then its parent's (drawn dimmer, beneath).
            lambda shown: re.search(r"━ loss [\d.]+  ━ val_loss [\d.]+  ━ loss \(parent\) 1\.25", shown),
            timeout=20,
            what="its own curves, then the parent's",
        )
        term.wait_text(f"trained {STEPS} steps; seed 2", timeout=60)  # its own log, followed


def test_a_silent_run_counts_its_silence_then_shows_its_stall_with_its_frames(
    sshd: Sshd, workdir: Path, host_python: Path, tmp_path: Path
) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANGER)
    with console(sshd, workdir, host_python, (160, 48)) as term:
        stall_after = str(STALL_AFTER_S)
        launch(workdir, "train", "--name", "hang", "--stall-after", stall_after, "--", sys.executable, str(script))
        term.wait_text("step 2", timeout=30)

        counted = term.wait_for(silence, timeout=30, what="the silence counter")
        term.wait_for(lambda shown: silence(shown) > counted, timeout=10, what="the counter to count")
        screen = term.wait_for(
            lambda shown: shown if "  at wait_for_allreduce" in shown and "  try: " in shown else "",
            timeout=60,
            what="the stall's frames",
        )
        assert re.search(rf"{RUN_ID}  hang  \(train\)  stalled", screen), screen
        assert "1 stalled" in screen, screen  # the header's count
