"""Shell strings as the real shell reads them: backends.shellwords against /bin/sh (dash here, as on Debian and
Ubuntu hosts) printing the words it got, and what a relaunch and the pre-launch gate make of `bash -c` launch
commands that pass flags in a variable, quote a `$`, or redirect after a number (the real SGLang's parser)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends import serving, shellwords
from backends.argv_edit import ArgvEditError, edit_argv
from backends.runs import control as runctl
from backends.runs.store import RunSpec
from backends.sglang import launch
from tests.conftest import CLI, wait_for
from tests.conftest import launch as launch_run

ENV = {"FLAGS": "--tp 2  --port\t9000", "EMPTY": "", "NAME": "a b"}


def shell_words(text: str, env: dict[str, str] | None = None) -> list[str]:
    """The words /bin/sh gives a command whose arguments are `text`."""
    done = subprocess.run(
        ["sh", "-c", f"printf '%s\\0' {text}"],
        capture_output=True,
        env={"PATH": os.environ["PATH"], **(env or {})},
        check=True,
    )
    return done.stdout.decode().split("\0")[:-1]


# Pieces of words as users write them: plain, single- and double-quoted, escaped, parameters of ENV.
plain = st.text(st.sampled_from("abz-_=./:,0189@%+"), min_size=1, max_size=6)
quoted = st.text(st.characters(codec="utf-8", exclude_characters="\0'"), max_size=6).map(lambda t: f"'{t}'")
double = st.text(st.characters(codec="utf-8", exclude_characters='\0"\\$`'), max_size=6).map(lambda t: f'"{t}"')
escaped = st.sampled_from(["\\ ", "\\$", "\\'", '\\"', "\\\\", "\\;", "\\>"])
parameter = st.sampled_from(["$FLAGS", "${NAME}", '"$NAME"', '"${FLAGS}"', "'$FLAGS'", '"$EMPTY"'])
word = st.lists(st.one_of(plain, quoted, double, escaped), min_size=1, max_size=4).map("".join)
text = st.lists(st.one_of(word, parameter), min_size=1, max_size=6).map(" ".join)


@settings(max_examples=150, deadline=None)
@given(text)
def test_the_words_read_are_the_words_the_shell_passes(written: str) -> None:
    words = shellwords.split(written)
    expanded = [w for word in words for w in launch._expand_one(word, ENV)[0]]
    assert expanded == shell_words(written, ENV)


@settings(max_examples=150, deadline=None)
@given(text, st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=8), max_size=4))
def test_words_written_back_mean_what_they_meant_and_new_words_are_taken_literally(
    written: str, new: list[str]
) -> None:
    """A relaunch's value (`$(rm -rf ~)`, `;`, a quote) is a word the shell passes as it is, never runs."""
    words = shellwords.split(written)
    assert shell_words(shellwords.join(words), ENV) == shell_words(written, ENV)
    assert shell_words(shellwords.join([*words, *new]), ENV) == [*shell_words(written, ENV), *new]


def test_operators_redirections_and_comments_are_read_as_the_shell_reads_them(tmp_path: Path) -> None:
    written = "cd /srv && A='x;y' exec cmd --tp 2 > log 2>&1 # the rest\nnext ';' '>'"
    words = shellwords.split(written)
    assert [w.raw for w in words if shellwords.is_operator(w)] == ["&&", "\n"]
    assert [w.raw for w in words if shellwords.is_redirect(w)] == [">", ">&"]
    assert [str(w) for w in words][-2:] == [";", ">"]  # quoted: words, not an operator and a redirection
    assert shellwords.join(words) == written.replace(" # the rest\n", " \n ")
    # `2>&1` stays one redirection written back; `2 > log` keeps its 2 an argument.
    script = "printf '%s\\n' --tp 2 > out 2>&1"
    rebuilt = shellwords.join(shellwords.split(script))
    subprocess.run(["sh", "-c", rebuilt], cwd=tmp_path, check=True)
    assert (tmp_path / "out").read_text() == "--tp\n2\n"


@pytest.mark.parametrize(
    "broken", ["a 'open", 'a "open', "a \\", "a $(open", "a `open", "a ${open"], ids=lambda b: b.split()[1][:2]
)
def test_a_string_the_shell_cannot_read_is_refused(broken: str) -> None:
    with pytest.raises(ValueError):
        shellwords.split(broken)
    assert launch.read(["bash", "-c", f"python -m sglang.launch_server {broken}"]) is None


SERVE = "exec {python} -m sglang.launch_server"


def test_flags_in_a_variable_are_read_split_and_stay_a_variable_through_a_relaunch() -> None:
    argv = ["bash", "-c", "python3 -m sglang.launch_server $FLAGS --api-key 'pa$$w' \"$NAME\""]
    found = launch.read(argv, ENV)
    assert found is not None
    assert found.flags == ("--tp", "2", "--port", "9000", "--api-key", "pa$$w", "a b")
    assert found.unexpanded == ()  # a single-quoted `$` is a character, not a variable
    edited = serving.edited(argv, ["--port=9001", "--served-model-name=$(touch x)"], [], ENV)
    assert edited == [
        "bash",
        "-c",
        "python3 -m sglang.launch_server $FLAGS --api-key 'pa$$w' \"$NAME\" --port 9001 "
        "--served-model-name '$(touch x)'",
    ]


def test_a_flag_a_variable_gives_cannot_be_unset_and_says_where_it_is() -> None:
    argv = ["bash", "-c", "python3 -m sglang.launch_server --model-path /m $FLAGS"]
    with pytest.raises(ArgvEditError) as said:
        serving.edited(argv, [], ["--tp"], ENV)
    assert str(said.value) == (
        "--tp is given by $FLAGS in the command line, which cannot be edited here; remove it there, or launch the "
        "server anew"
    )
    assert serving.edited(argv, [], ["--model-path"], ENV) == ["bash", "-c", "python3 -m sglang.launch_server $FLAGS"]


def test_the_gate_passes_flags_given_in_a_variable_or_before_a_redirection(sglang_python: Path) -> None:
    """The real SGLang 0.5.23 parser: `$FLAGS` once reached it as one word and `--tp 2 > log` as `--tp`."""
    server = SERVE.format(python=shlex.quote(str(sglang_python)))
    for argv, env in (
        (["sh", "-c", f"{server} $FLAGS --model-path /m"], {"FLAGS": "--tp-size 2 --port 30001"}),
        (["sh", "-c", f"{server} --model-path /m --tp 2 > /tmp/server.log 2>&1"], {}),
    ):
        checked = runctl.gate(RunSpec(kind="serve", argv=argv, env=env), force=False)
        assert checked["flags"] is None, checked
    refused = ["sh", "-c", f"{server} $FLAGS"]  # the variable holds no --model-path: SGLang's own refusal
    with pytest.raises(runctl.OpError) as said:
        runctl.gate(RunSpec(kind="serve", argv=refused, env={"FLAGS": "--tp-size 2"}), force=False)
    assert "the following arguments are required: --model-path" in said.value.message


def test_a_relaunch_of_a_shell_string_command_edits_the_command_that_takes_the_flags(cli: CLI, tmp_path: Path) -> None:
    """Real: the CLI, the agent, the supervisor, sh. A relaunch's flags once went after the string, as the
    shell's $0 and $1, and the relaunched command ran unchanged."""
    show = "import sys; print(*sys.argv[1:])"
    python = f"{shlex.quote(sys.executable)} -c {shlex.quote(show)}"
    string = f"cd {shlex.quote(str(tmp_path))} && {python} --lr 1 > out; echo done"
    parent = launch_run(cli, "command", "--name", "sweep", "--", "sh", "-c", string)
    wait_for(lambda: (tmp_path / "out").read_text() == "--lr 1\n", what="the first run's flags")
    done = cli("relaunch", "sweep", "--set", "--lr=2", "--set", "--note=$(touch pwned)", "--json")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: (tmp_path / "out").read_text() == "--lr 2 --note $(touch pwned)\n", what="the copy's flags")
    assert not (tmp_path / "pwned").exists() and json.loads(done.stdout)["parent"] == parent


@pytest.mark.parametrize(
    ("argv", "sets", "edited"),
    [
        pytest.param(
            ["bash", "-lc", "python t.py --lr 1; echo done"],
            ["--x"],
            ["bash", "-lc", "python t.py --lr 1 --x ; echo done"],
            id="new-flag-to-the-command-not-the-chore",
        ),
        pytest.param(
            ["sh", "-c", "echo start; python a.py --lr 1; python b.py"],
            ["--lr=2"],
            ["sh", "-c", "echo start; python a.py --lr 2 ; python b.py"],
            id="the-command-with-the-flag",
        ),
        pytest.param(
            ["sh", "-c", 'exec python t.py "$@"', "sh", "--lr", "1"],
            ["--lr=2"],
            ["sh", "-c", 'exec python t.py "$@"', "sh", "--lr", "2"],
            id="the-words-handed-on",
        ),
    ],
)
def test_a_shell_strings_flags_are_edited_on_the_command_that_takes_them(
    argv: list[str], sets: list[str], edited: list[str]
) -> None:
    assert edit_argv(argv, sets, []) == edited


def test_a_shell_string_that_cannot_be_read_cannot_be_edited_and_says_so() -> None:
    with pytest.raises(ArgvEditError) as said:
        edit_argv(["sh", "-c", "python t.py 'open"], ["--lr=2"], [])
    assert str(said.value) == "the command's shell string cannot be read (no closing quotation); edit it by hand"
