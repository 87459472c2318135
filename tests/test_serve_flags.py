"""Serve flags checked by SGLang's own argument parser before a launch or relaunch, as a user meets it.

The parser is SGLang 0.5.23's, installed by `make test` without its runtime into
EAGLE3_SGLANG_PARSER_PATH and reached through the launch's PYTHONPATH, as a serve
command's own environment would reach it on a host.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.protocol import Finding
from backends.runs.store import RunDir
from backends.sglang import flags as serve_flags
from backends.sglang import launch
from console.link.client import AgentClient
from tests.conftest import CLI, wait_state

PARSER_PATH = os.environ.get("EAGLE3_SGLANG_PARSER_PATH")
needs_parser = pytest.mark.skipif(PARSER_PATH is None, reason="EAGLE3_SGLANG_PARSER_PATH unset: run `make test`")
SERVER = [sys.executable, "-m", "sglang.launch_server"]


def check(argv: list[str], env: dict[str, str] | None = None) -> Finding | None:
    """SGLang's verdict on a serve command line, read as the gate reads it."""
    found = launch.read(argv, env)
    assert found is not None, argv
    return serve_flags.check(found, env)


def parser_env() -> list[str]:
    return ["--env", f"PYTHONPATH={PARSER_PATH}"]


def runs(workdir: Path) -> list[str]:
    folder = workdir / "runs"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


flag_text = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)


@given(
    python=st.sampled_from(["python", "python3", "/opt/venv/bin/python3.11"]),
    options=st.lists(st.sampled_from([["-u"], ["-O"], ["-B"], ["-X", "dev"], ["-W", "ignore"]]), max_size=3),
    flags=st.lists(flag_text, max_size=6),
)
def test_a_server_command_is_recognised_and_its_flags_are_exactly_what_follows_the_module(
    python: str, options: list[list[str]], flags: list[str]
) -> None:
    found = launch.read(
        [python, *(word for option in options for word in option), "-m", "sglang.launch_server", *flags]
    )
    assert found is not None and (found.python, list(found.flags or ())) == (python, flags)


@given(st.lists(flag_text, max_size=6))
def test_other_commands_are_not_server_commands(flags: list[str]) -> None:
    assert launch.read(["python", "-m", "vllm.entrypoints.openai.api_server", *flags]) is None
    assert launch.read(["python", "serve.py", "-m", "sglang.launch_server", *flags]) is None
    assert launch.read(["sglang.launch_server", *flags]) is None


@needs_parser
def test_sglangs_parser_refuses_ambiguous_unknown_and_malformed_flags_with_its_own_words() -> None:
    env = {"PYTHONPATH": str(PARSER_PATH)}
    verdicts = {
        "--cuda-graph-max-bs": "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode",
        "--tp-size=two": "argument --tp-size/--tensor-parallel-size: invalid int value: 'two'",
    }
    for flag, words in verdicts.items():
        finding = check([*SERVER, "--model-path", "m", flag, *(["8"] if "max-bs" in flag else [])], env)
        assert finding is not None and finding["severity"] == "error" and finding["code"] == "launch-flags"
        assert words in finding["message"]


@needs_parser
def test_each_node_of_a_multi_node_serve_passes_sglangs_own_parser_and_node_0_alone_is_health_polled() -> None:
    from backends import serving
    from backends.protocol import ServeNode

    env = {"PYTHONPATH": str(PARSER_PATH)}
    for rank in (0, 1):
        node = ServeNode(rank, 2, "10.0.0.1:5000")
        argv = serving.DEFAULT.serve_command(sys.executable, "T", "D", port=30000, gpus=8, extra=[], node=node)
        assert argv[argv.index("--nnodes") :][:6] == [
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--dist-init-addr",
            node.dist_init_addr,
        ]
        assert argv[argv.index("--tp-size") + 1] == "16"  # tensor parallelism over both nodes' GPUs
        assert check(argv, env) is None, argv
        assert (serving.health_url(argv) is not None) == (rank == 0)


def test_an_interpreter_without_sglang_or_no_interpreter_at_all_is_refused_with_what_to_do(tmp_path: Path) -> None:
    finding = check([*SERVER, "--anything"], {"PYTHONPATH": str(tmp_path)})
    assert finding is not None and finding["severity"] == "error" and finding["code"] == "launch-python"
    assert finding["message"] == f"{sys.executable} has no SGLang (No module named 'sglang')"
    assert finding["fix"] is not None and "--python PATH" in finding["fix"]
    missing = check([str(tmp_path / "python3"), "-m", "sglang.launch_server"])
    assert (
        missing is not None and missing["severity"] == "error" and "is not a Python on the host" in missing["message"]
    )


def test_an_sglang_whose_parser_cannot_be_imported_is_reported_as_unchecked_not_refused(tmp_path: Path) -> None:
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")  # SGLang, but not one with server arguments
    finding = check([*SERVER, "--anything"], {"PYTHONPATH": str(tmp_path)})
    assert finding is not None and finding["severity"] == "info" and finding["code"] == "launch-flags-unchecked"
    assert "cannot import SGLang's server arguments" in finding["message"]


def test_a_serve_launch_with_a_python_lacking_sglang_starts_nothing_and_says_what_to_do(
    cli: CLI, workdir: Path, tmp_path: Path
) -> None:
    refused = cli("serve", "/models/target", "/models/draft", "--python", sys.executable)
    assert refused.returncode == 1
    assert refused.stderr.decode().splitlines(keepends=True)[-1] == (
        f"eagle3-console: {sys.executable} has no SGLang (No module named 'sglang'); "
        "name the host's Python that has SGLang in the command (serve --python PATH), or launch with --force\n"
    )
    assert runs(workdir) == []


def sglang_parser_file(site: Path) -> Path:
    """An SGLang package under `site` (its `sglang` and `sglang.srt` packages), and where its parser module goes."""
    parser_file = site / "sglang" / "srt" / "server_args.py"
    parser_file.parent.mkdir(parents=True)
    for package in (parser_file.parent.parent, parser_file.parent):
        (package / "__init__.py").write_text("")
    return parser_file


def test_a_verdict_is_reused_until_sglangs_parser_changes(tmp_path: Path) -> None:
    # An SGLang whose parser knows one flag, and an interpreter that notes each time it runs.
    parser_file = sglang_parser_file(tmp_path / "site")
    known = 'class ServerArgs:\n    @staticmethod\n    def add_cli_args(p):\n        p.add_argument("--model-path")\n'
    parser_file.write_text(known)
    runs_log = tmp_path / "runs.log"
    python = tmp_path / "python-noting"
    python.write_text(f'#!/bin/sh\necho ran >> {runs_log}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    env = {"PYTHONPATH": str(tmp_path / "site")}
    command = [str(python), "-m", "sglang.launch_server", "--model-path", "m", "--tp", "2"]

    def ran() -> int:
        return len(runs_log.read_text().splitlines()) if runs_log.exists() else 0

    first = check(command, env)
    assert first is not None and "unrecognized arguments: --tp 2" in first["message"] and ran() == 1
    assert check(command, env) == first and ran() == 1  # the same flags: not parsed again
    # Other flags are parsed again, by the interpreter already warm for this env (no new start)...
    assert check(command[:-2], env) is None and ran() == 1
    assert check(command, {**env, "SGLANG_X": "1"}) == first and ran() == 2  # ... another env needs its own
    parser_file.write_text(known + '        p.add_argument("--tp")\n')  # SGLang upgraded: a fresh import
    assert check(command, env) is None and ran() == 3
    assert check(command, env) is None and ran() == 3
    without = {"PYTHONPATH": str(tmp_path)}
    for expected_runs in (4, 5):  # no verdict to keep: asked again each time
        assert check(command, without) is not None and ran() == expected_runs


def test_a_refusal_quoting_a_secret_is_kept_masked(tmp_path: Path) -> None:
    parser_file = sglang_parser_file(tmp_path)
    parser_file.write_text("class ServerArgs:\n    @staticmethod\n    def add_cli_args(p):\n        pass\n")
    finding = check([*SERVER, "--my-api-key", "sk-live-42"], {"PYTHONPATH": str(tmp_path)})
    assert finding is not None and "sk-live-42" not in finding["message"] and "--my-api-key ***" in finding["message"]
    assert "sk-live-42" not in serve_flags.cache_file().read_text()


@needs_parser
def test_a_launch_with_a_flag_sglang_refuses_starts_nothing_unless_forced(cli: CLI, workdir: Path) -> None:
    bad = [*SERVER, "--model-path", "/nowhere", "--disable-cuda-graphs"]
    refused = cli("launch", "serve", *parser_env(), "--", *bad)
    assert refused.returncode == 1
    assert refused.stderr.decode() == (
        "eagle3-console: SGLang's argument parser refuses this command line: sglang serve: error: "
        "unrecognized arguments: --disable-cuda-graphs; correct the flag (SGLang would exit at once); "
        "launch with --force to start anyway\n"
    )
    assert runs(workdir) == []
    forced = cli("launch", "serve", "--force", *parser_env(), "--", *bad)
    assert forced.returncode == 0, forced.stderr
    assert b"error: SGLang's argument parser refuses" in forced.stderr
    run_id = forced.stdout.decode().strip()
    events = RunDir(workdir / "runs" / run_id).events()
    assert any(e["type"] == "flags" and e["code"] == "launch-flags" for e in events)
    cli("kill", run_id, "--grace", "1")


@needs_parser
def test_a_relaunch_onto_a_flag_sglang_refuses_is_refused_and_a_valid_one_goes_ahead(cli: CLI, workdir: Path) -> None:
    # The real server module dies at once here (no GPU runtime installed): the parent is a finished run.
    parent = cli("launch", "serve", *parser_env(), "--", *SERVER, "--model-path", "/nowhere").stdout.decode().strip()
    assert runs(workdir) == [parent]
    refused = cli("relaunch", parent, "--set", "--cuda-graph-max-bs=8")
    assert refused.returncode == 1
    assert b"ambiguous option: --cuda-graph-max-bs could match" in refused.stderr
    assert runs(workdir) == [parent]
    forced = cli("relaunch", parent, "--set", "--cuda-graph-max-bs=8", "--force", "--json")  # overruled: it starts
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["argv"][-2:] == ["--cuda-graph-max-bs", "8"]
    cli("kill", json.loads(forced.stdout)["run"], "--grace", "1")
    accepted = cli("relaunch", parent, "--set", "--skip-server-warmup", "--json")
    assert accepted.returncode == 0, accepted.stderr
    reply = json.loads(accepted.stdout)
    assert reply["parent"] == parent and reply["flags"] is None and reply["argv"][-1] == "--skip-server-warmup"
    cli("kill", reply["run"], "--grace", "1")


async def test_the_console_can_ask_sglangs_verdict_before_launching(client: AgentClient, tmp_path: Path) -> None:
    argv = [*SERVER, "--model-path", "m", "--disable-cuda-graphs"]
    without = await client.request("preflight", kind="serve", argv=argv, env={"PYTHONPATH": str(tmp_path)})
    assert without["flags"]["code"] == "launch-python" and without["doctor"] is None
    assert await client.request("preflight", kind="train", argv=argv) == {"flags": None, "doctor": None}


@needs_parser
def test_a_dry_run_relaunch_shows_the_new_command_and_its_checks_and_stops_nothing(cli: CLI, workdir: Path) -> None:
    parent = cli("launch", "serve", *parser_env(), "--", *SERVER, "--model-path", "/nowhere").stdout.decode().strip()
    # No model there: the server is gone, nothing is left to stop. SGLang's imports alone take 20 s at a load of 10.
    wait_state(cli, parent, {"failed"}, timeout=90)
    preview = cli("relaunch", parent, "--set", "--disable-cuda-graph", "--dry-run")
    assert preview.returncode == 0, preview.stderr
    text = preview.stdout.decode()
    assert f"run {parent} has no live process to stop; would start:" in text
    assert "--model-path /nowhere --disable-cuda-graph" in text
    assert f"warning: SGLang 0.5.23's argument parser accepts this command line but warns: {DEPRECATED}\n" in text
    assert f"  fix: write {NEW_SPELLING} instead of --disable-cuda-graph\n" in text
    decode, prefill = NEW_SPELLING.split()
    spelled = cli("relaunch", parent, "--set", decode, "--set", prefill, "--dry-run").stdout.decode()
    assert "SGLang's parser: accepted" in spelled and "warn" not in spelled
    assert runs(workdir) == [parent]  # nothing started


# SGLang 0.5.23's parser's own words for --disable-cuda-graph (captured from it, colours removed).
DEPRECATED = (
    "'--disable-cuda-graph' is deprecated and will be removed in a future release. "
    "Use '--cuda-graph-backend-{decode,prefill}=disabled' instead."
)
NEW_SPELLING = "--cuda-graph-backend-decode=disabled --cuda-graph-backend-prefill=disabled"


@needs_parser
def test_a_deprecated_flag_is_accepted_with_sglangs_warning_and_the_spelling_to_use(tmp_path: Path) -> None:
    runs_log = tmp_path / "runs.log"
    python = tmp_path / "python-noting"
    python.write_text(f'#!/bin/sh\necho ran >> {runs_log}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    command = [str(python), "-m", "sglang.launch_server", "--model-path", "m", "--disable-cuda-graph"]
    env = {"PYTHONPATH": str(PARSER_PATH)}
    finding = check(command, env)
    assert finding == {
        "code": "launch-flags-warned",
        "severity": "warning",
        "message": f"SGLang 0.5.23's argument parser accepts this command line but warns: {DEPRECATED}",
        "fix": f"write {NEW_SPELLING} instead of --disable-cuda-graph",
    }
    assert check(command, env) == finding  # the cache keeps the warning with the verdict
    assert runs_log.read_text().count("ran") == 1
    assert check([*command[:-1], *NEW_SPELLING.split()], env) is None
    # A refusal says the warnings too.
    refused = check([*command, "--tp-size", "two"], env)
    assert refused is not None and refused["severity"] == "error"
    assert refused["message"].endswith(f"invalid int value: 'two' (it also warns: {DEPRECATED})")


def test_a_verdict_cached_without_its_warnings_is_asked_again(tmp_path: Path) -> None:
    # An SGLang whose parser warns of a deprecated flag through its logger, as 0.5.23's does.
    parser_file = sglang_parser_file(tmp_path / "site")
    parser_file.write_text(
        "import argparse, logging\n"
        "class Old(argparse.Action):\n"
        "    def __call__(self, parser, namespace, values, option_string=None):\n"
        "        logging.getLogger(__name__).warning(f'\\033[1;33m{option_string!r} is deprecated\\033[0m')\n"
        "class ServerArgs:\n"
        "    @staticmethod\n"
        "    def add_cli_args(p):\n"
        "        p.add_argument('--old', nargs=0, action=Old)\n"
    )
    command = [*SERVER, "--old"]
    env = {"PYTHONPATH": str(tmp_path / "site")}
    first = check(command, env)
    assert first is not None and first["message"].endswith("but warns: '--old' is deprecated")
    cache = json.loads(serve_flags.cache_file().read_text())
    for entry in cache.values():  # as an older eagle3-console kept it: the verdict alone
        entry["verdict"] = {"ok": True, "parser": entry["verdict"]["parser"]}
    serve_flags.cache_file().write_text(json.dumps(cache))
    assert check(command, env) == first


@needs_parser
def test_a_launch_and_a_relaunch_with_a_deprecated_flag_show_sglangs_warning(cli: CLI, workdir: Path) -> None:
    launched = cli("launch", "serve", *parser_env(), "--", *SERVER, "--model-path", "/nowhere", "--disable-cuda-graph")
    assert launched.returncode == 0, launched.stderr
    assert launched.stderr.decode() == (
        f"warning: SGLang 0.5.23's argument parser accepts this command line but warns: {DEPRECATED}\n"
        f"  fix: write {NEW_SPELLING} instead of --disable-cuda-graph\n"
    )
    parent = launched.stdout.decode().strip()
    events = RunDir(workdir / "runs" / parent).events()
    assert any(e["type"] == "flags" and e["code"] == "launch-flags-warned" for e in events)
    wait_state(cli, parent, {"failed"}, timeout=90)
    reply = json.loads(cli("relaunch", parent, "--set", "--dp-size=1", "--dry-run", "--json").stdout)
    assert reply["flags"]["code"] == "launch-flags-warned" and DEPRECATED in reply["flags"]["message"]


@needs_parser
def test_relaunch_presets_are_spelled_for_the_runs_sglang() -> None:
    env = {"PYTHONPATH": str(PARSER_PATH)}
    assert serve_flags.relaunch_presets(launch.read([*SERVER, "--model-path", "m"]), env) == {
        "version": "0.5.23",
        "presets": [NEW_SPELLING, "--disable-custom-all-reduce", "--mem-fraction-static=0.8"],
    }
    assert serve_flags.relaunch_presets(launch.read(["python", "serve.py"])) == {
        "version": None,
        "presets": ["--disable-cuda-graph", "--disable-custom-all-reduce", "--mem-fraction-static=0.8"],
    }


@needs_parser
def test_the_parsers_refusal_shows_no_secret_value() -> None:
    env = {"PYTHONPATH": str(PARSER_PATH)}
    finding = check([*SERVER, "--model-path", "m", "--my-api-key", "sk-live-123"], env)
    assert finding is not None and finding["code"] == "launch-flags"
    assert "sk-live-123" not in finding["message"] and "--my-api-key ***" in finding["message"]
