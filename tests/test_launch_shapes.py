"""Every way people launch SGLang, read as one: its server flags, interpreter, health and metrics URLs, served draft.

Pure reading (no process runs), except the `#!` line of a console script written into tmp_path; the real-SGLang
tier's checks of the same shapes are in tests/test_sglang_real_launch_shapes.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends import serving
from backends.argv_edit import edit_argv, flag_value
from backends.runs.store import RunDir
from backends.sglang import launch
from backends.sglang.flags import unchecked_why
from console import render
from console.tui.panels import RunFacts, detail_text
from console.tui.timeline import timeline
from tests.conftest import CLI, run_info, wait_for
from tests.conftest import launch as launch_run

FLAGS = [
    "--model-path",
    "/m/target",
    "--speculative-draft-model-path",
    "/m/draft",
    "--port",
    "8123",
    "--enable-metrics",
]
HEALTH = "http://127.0.0.1:8123/health"
METRICS = "http://127.0.0.1:8123/metrics"


def console_script(folder: Path, python: str = "/opt/venv/bin/python3") -> Path:
    """A pip-written `sglang` console script: its `#!` line names the interpreter."""
    script = folder / "bin" / "sglang"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"#!{python}\nimport sys\nfrom sglang.cli.main import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return script


def shapes(sglang: str) -> dict[str, tuple[list[str], str | None]]:
    """Each shape's command line and the interpreter it is known to run (None: not known from the host)."""
    module = ["python3", "-m", "sglang.launch_server", *FLAGS]
    serve = [sglang, "serve", *FLAGS]
    return {
        "python -m": (module, "python3"),
        "sglang serve": (serve, "/opt/venv/bin/python3"),
        "sglang serve MODEL": ([sglang, "serve", "/m/target", *FLAGS[2:]], "/opt/venv/bin/python3"),
        "env": (["env", "CUDA_VISIBLE_DEVICES=0", "SGLANG_X=1", *serve], "/opt/venv/bin/python3"),
        "bash -c": (["bash", "-c", f"cd /tmp && exec {shlex.join(module)} > log 2>&1"], "python3"),
        "sh -c $@": (["sh", "-c", 'exec python3 -m sglang.launch_server "$@"', "sh", *FLAGS], "python3"),
        "numactl": (["numactl", "--cpunodebind=0", "-m", "0", *module], "python3"),
        "taskset": (["taskset", "-c", "0-7", *serve], "/opt/venv/bin/python3"),
        "nice": (["nice", "-n", "5", *module], "python3"),
        "wrapper -m": (["/opt/bin/with-cuda.sh", "-m", "sglang.launch_server", *FLAGS], None),
        # An environment manager's Python is its environment's: not known from the host.
        "uv run": (["uv", "run", "--with", "sglang[all]", "--", "python", "-m", "sglang.launch_server", *FLAGS], None),
        "conda run": (["conda", "run", "-n", "serve", "--no-capture-output", *serve], None),
        "pixi run": (["pixi", "run", "-e", "cuda", *module], None),
        "docker run": (
            [
                "docker",
                "run",
                "--rm",
                "-it",
                "--gpus",
                "all",
                "-p",
                "8123:8123",
                "-v",
                "/m:/m",
                "lmsysorg/sglang",
                "python3",
                "-m",
                "sglang.launch_server",
                *FLAGS,
            ],
            None,
        ),
        "podman run": (
            ["podman", "run", "--network=host", "-e", "HF_TOKEN=x", "-v", "/m:/m", "img", "sglang", "serve", *FLAGS],
            None,
        ),
    }


@pytest.mark.parametrize("shape", list(shapes("sglang")))
def test_each_shape_gives_the_flags_interpreter_health_metrics_and_draft(shape: str, tmp_path: Path) -> None:
    script = console_script(tmp_path)
    argv, python = shapes(str(script))[shape]
    found = launch.read(argv)
    assert found is not None, argv
    assert list(found.flags or ()) == FLAGS
    assert found.python == python
    assert serving.health_url(argv) == HEALTH
    metrics = serving.server_metrics(argv, HEALTH)
    assert metrics is not None and metrics[0] == METRICS
    served = serving.served_draft(argv, None, {})
    assert served is not None and served.draft == Path("/m/draft")
    assert served.python == python
    assert (served.unknown_python is None) == (python is not None)


def test_a_launch_behind_an_environment_manager_says_which_python_to_name() -> None:
    found = launch.read(["conda", "run", "-n", "serve", "python", "-m", "sglang.launch_server", *FLAGS])
    assert found is not None and found.describe() == "python -m sglang.launch_server via conda run"
    assert unchecked_why(found) == (
        "the Python that runs SGLang is not known: conda run runs SGLang with its environment's Python",
        "give --sglang-python PATH, that environment's Python (`python -c 'import sys; print(sys.executable)'` run "
        "by conda run prints it)",
    )
    # `conda list` is no launch; an option the reader does not know leaves a command it cannot read
    assert launch.read(["conda", "list", "python"]) is None
    assert launch.read(["uv", "run", "--unknown-option", "value", "python", "-m", "sglang.launch_server"]) is None


def test_a_console_script_found_on_path_gives_its_interpreter(tmp_path: Path) -> None:
    script = console_script(tmp_path, "/usr/bin/env python3.11")
    found = launch.read(["sglang", "serve", *FLAGS], {"PATH": str(script.parent)})
    assert found is not None and found.python == "python3.11" and found.python_from == f"the #! line of {script}"
    long_path = console_script(tmp_path / "long")
    long_path.write_text("#!/bin/sh\n'''exec' \"/very/long/venv/bin/python3\" \"$0\" \"$@\"\n' '''\n")
    found = launch.read([str(long_path), "serve", *FLAGS])
    assert found is not None and found.python == "/very/long/venv/bin/python3"


def test_sglang_python_names_the_interpreter_of_any_shape() -> None:
    for argv, _ in shapes("sglang").values():
        found = launch.read(argv, sglang_python="/srv/py")
        assert found is not None and found.python == "/srv/py" and found.python_from == "--sglang-python"
    wrapper = serving.serve_launch(["./start-server.sh"], {}, "/srv/py")[1]
    assert wrapper.flags is None and wrapper.python == "/srv/py" and wrapper.shape == launch.WRAPPER


def test_a_container_is_reached_through_its_published_port_and_mounts() -> None:
    inner = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/t", "--host", "0.0.0.0"]
    mapped = ["docker", "run", "-d", "-p", "127.0.0.1:9000:30000", "-v", "/data/models:/models", "img", *inner]
    found = launch.read([*mapped, "--speculative-draft-model-path", "/models/d"])
    assert found is not None and found.container is not None
    assert launch.health_url(found) == "http://127.0.0.1:9000/health"
    assert found.path("/models/d") == "/data/models/d" and found.path("/elsewhere/d") is None
    unpublished = launch.read(["docker", "run", "img", *inner])
    assert unpublished is not None and launch.health_url(unpublished) is None
    assert serving.draft_unseen(["docker", "run", "img", *inner, "--speculative-draft-model-path", "/x/d"], {})
    assert launch.read(["docker", "run", "--rm", "lmsysorg/sglang"]) is not None  # the image's own command
    assert launch.read(["docker", "run", "--rm", "postgres"]) is None


def test_shell_variables_expand_from_the_launch_environment_or_are_named() -> None:
    argv = ["bash", "-c", "python3 -m sglang.launch_server --port $PORT --model-path ${MODEL}"]
    found = launch.read(argv, {"PORT": "9001"})
    assert found is not None and found.flags == ("--port", "9001", "--model-path", "${MODEL}")
    assert found.unexpanded == ("${MODEL}",)


@pytest.mark.parametrize("shape", list(shapes("sglang")))
def test_a_relaunch_edits_the_flags_where_they_are_written(shape: str) -> None:
    argv, _ = shapes("sglang")[shape]
    sets, unsets = ["--disable-cuda-graph", "--port=9999"], ["--enable-metrics"]
    # As a relaunch does: in place, else (flags given to a shell string's "$@") on the command line's own words.
    edited = serving.edited(argv, sets, unsets, {}) or edit_argv(argv, sets, unsets)
    found = launch.read(edited)
    assert found is not None and found.shape == launch.read(argv).shape  # type: ignore[union-attr]
    assert found.flag("--port") == "9999" and "--disable-cuda-graph" in (found.flags or ())
    assert "--enable-metrics" not in (found.flags or ())
    assert edited[0] == argv[0]


words = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=10)


@given(st.lists(words, max_size=12))
def test_reading_never_raises_whatever_the_command(argv: list[str]) -> None:
    for prefix in ([], ["bash", "-c"], ["docker", "run"], ["env"], ["sglang", "serve"], ["numactl"]):
        launch.read([*prefix, *argv])


@given(st.lists(words.filter(lambda w: w not in ("$@", "$*") and "$" not in w), max_size=8))
def test_the_flags_read_are_the_flags_written_in_every_shape(flags: list[str]) -> None:
    flags = ["--port", "8000", *flags]
    for argv in (
        ["python", "-m", "sglang.launch_server", *flags],
        ["env", "A=1", "nice", "python3", "-m", "sglang.launch_server", *flags],
        ["bash", "-c", shlex.join(["exec", "python", "-m", "sglang.launch_server", *flags])],
        ["docker", "run", "-p", "1:8000", "img", "python", "-m", "sglang.launch_server", *flags],
    ):
        found = launch.read(argv)
        assert found is not None and list(found.flags or ()) == flags, argv
        assert flag_value(["", *(found.flags or ())], ("--port",)) == found.flag("--port")


# ----- what the console says of a launch it cannot watch or check -----


def test_a_serve_run_whose_health_cannot_be_polled_says_so_once_in_follow_and_detail(
    cli: CLI, workdir: Path, tmp_path: Path
) -> None:
    """Real: the CLI, the agent, the supervisor and its watch writing the run's events; the wrapper a shell script."""
    wrapper = tmp_path / "start-server.sh"
    wrapper.write_text("#!/bin/sh\necho starting; sleep 30\n")
    wrapper.chmod(0o755)
    run_id = launch_run(cli, "serve", "--", str(wrapper), "--port", "8123")
    events = wait_for(
        lambda: [e for e in RunDir(workdir / "runs" / run_id).events() if e["type"] == "unwatched"], what="unwatched"
    )
    cli("kill", run_id, "--grace", "1")
    [said] = events  # once
    assert "no health poll for wrapper script" in said["message"] and "--health-url URL" in said["message"]
    followed = render.startup_event(said)
    assert followed is not None and followed.endswith(said["message"])
    all_events = RunDir(workdir / "runs" / run_id).events()
    info = {**run_info(cli, run_id), "state": "running"}
    shown = detail_text(info, RunFacts(line=timeline(all_events)), width=200).plain
    assert said["message"] in shown
    # The parser could not be asked either, and why.
    assert "info: flags not checked: the command is wrapper script: SGLang's flags are not on its command" in shown


def test_the_launch_reply_says_what_makes_an_unchecked_launch_checkable(cli: CLI) -> None:
    argv = ["docker", "run", "-p", "30000:30000", "lmsysorg/sglang", "sglang", "serve", "--model-path", "/m"]
    result = cli("launch", "serve", "--", *argv)
    assert result.returncode == 0, result.stderr
    cli("kill", result.stdout.decode().strip(), "--grace", "1")
    said = result.stderr.decode()
    assert "info: flags not checked: the Python that runs SGLang is not known: SGLang runs inside the container" in said
    assert "\n  fix: give --sglang-python PATH, a host Python with the image's SGLang" in said


def test_sglang_python_on_a_run_that_serves_nothing_is_a_usage_error(cli: CLI, workdir: Path) -> None:
    result = cli("launch", "train", "--sglang-python", "/srv/py", "--", "python3", "train.py")
    assert result.returncode == 2
    assert result.stderr.decode().strip().splitlines() == [
        "eagle3-console: --sglang-python names the Python of SGLang's server: it goes with launch serve, not train"
    ]
    assert not (workdir / "runs").exists() or not any((workdir / "runs").iterdir())
