"""The command line around the commands: help on every option, shell completion in a real bash, the settings file
(config.toml) and `hosts`.

Real: the console as a process, bash (in tmux) completing with argcomplete's own hook, OpenSSH's sshd on 127.0.0.1
(tests/sshd.py) for a host named in config.toml, files on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from console.cli import config
from console.cli.grammar import GRAMMARS, build_parser
from tests.conftest import REPO
from tests.sshd import ALIAS, Sshd
from tests.tmux import Tmux


def eagle3(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "console", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def settings_env(tmp_path: Path, toml: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose config.toml says `toml`."""
    folder = tmp_path / "xdg" / "eagle3-console"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text(toml)
    return {**(base or os.environ), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def test_every_option_and_argument_of_every_command_says_what_it_is() -> None:
    silent: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and action.help in (None, "", argparse.SUPPRESS):
                silent.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(GRAMMARS, completing=True), "eagle3-console")
    assert silent == []


def test_bash_completes_hosts_commands_and_a_stages_own_options(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host gpu-west *.lab\n  HostName 10.0.0.7\n")
    env = settings_env(tmp_path, '[hosts.gpu-east]\naddress = "alice@10.0.0.8"\n')
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}:{env['PATH']}", PS1="$ ", TERM="xterm")
    console = shutil.which("eagle3-console", path=env["PATH"])
    assert console is not None, "the editable install puts eagle3-console beside this Python"
    term = Tmux(["bash", "--norc", "--noprofile", "-i"], width=160, height=30, env=env, cwd=tmp_path)
    try:
        term.write('eval "$(eagle3-console --completion bash)"\n')
        term.write("eagle3-console gpu-")
        term.send("Tab", "Tab")
        term.wait_text("gpu-east", timeout=20)
        assert "gpu-west" in term.screen()
        term.send("C-u")
        term.write("eagle3-console local tra")
        term.send("Tab")
        term.wait_text("eagle3-console local train", timeout=20)  # tmux shows no trailing blank
        term.write("--batch-s")
        term.send("Tab")
        term.wait_text("eagle3-console local train --batch-size", timeout=20)
    finally:
        term.close()


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_each_shells_hook_is_printed_and_names_the_program(shell: str) -> None:
    done = eagle3("--completion", shell, env=dict(os.environ))
    assert done.returncode == 0 and "eagle3-console" in done.stdout and "_ARGCOMPLETE" in done.stdout


def test_a_hosts_settings_apply_and_flags_win_over_them_over_a_real_sshd(sshd: Sshd, tmp_path: Path) -> None:
    named, flagged = tmp_path / "named-store", tmp_path / "flag-store"
    toml = (
        f'[defaults]\nstall_after = 45\n\n[hosts.box]\naddress = "{ALIAS}"\n'
        f'remote_python = "{sys.executable}"\nworkdir = "{named}"\n'
    )
    env = settings_env(tmp_path, toml, sshd.env())
    launched = eagle3("--no-reuse", "box", "launch", "command", "--name", "s", "--", "sleep", "30", env=env)
    assert launched.returncode == 0, launched.stderr
    run_id = launched.stdout.strip()
    assert (named / "runs" / run_id).is_dir()  # the host's workdir, over SSH with the host's Python
    spec = json.loads((named / "runs" / run_id / "spec.json").read_text())
    assert spec["stall_after"] == 45  # [defaults]
    assert eagle3("--no-reuse", "box", "kill", run_id, "--grace", "1", env=env).returncode == 0
    other = eagle3("--no-reuse", "--workdir", str(flagged), "box", "launch", "command", "--", "true", env=env)
    assert other.returncode == 0, other.stderr
    assert (flagged / "runs" / other.stdout.strip()).is_dir()  # the flag won


def test_local_takes_the_defaults_but_not_a_remote_python(tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = settings_env(tmp_path, f'[defaults]\nworkdir = "{store}"\nremote_python = "/opt/py/bin/python"\n')
    done = eagle3("local", "launch", "command", "--", "true", env=env)
    assert done.returncode == 0, done.stderr
    assert (store / "runs" / done.stdout.strip()).is_dir()


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ("[defaults]\nremote_pyhton = 'x'\n", "[defaults] has an unknown setting 'remote_pyhton'; known: "),
        ("[hosts.a]\nstall_after = -3\n", "[hosts.a] stall_after must be a number of seconds above 0, not -3.0"),
        ("[hosts.a]\nreadonly = 'yes'\n", "[hosts.a] readonly must be true or false, not 'yes'"),
        ("[hosts.local]\nworkdir = '/x'\n", "[hosts.local]: 'local' cannot name a host here; choose another name"),
        ("[host.a]\n", "unknown table 'host'; it knows [defaults], [hosts.NAME], [groups] and [keys]"),
        ("[hosts.a\n", "not valid TOML"),
    ],
)
def test_a_settings_file_that_cannot_be_used_is_a_usage_error_naming_the_file_and_the_key(
    tmp_path: Path, toml: str, said: str
) -> None:
    env = settings_env(tmp_path, toml)
    done = eagle3("local", "status", env=env)
    assert done.returncode == 2
    path = tmp_path / "xdg" / "eagle3-console" / "config.toml"
    assert done.stderr.startswith(f"eagle3-console: {path}: ") and said in done.stderr
    assert done.stderr.count("\n") == 1


TOO_DEEP = "nested too deeply to be settings; fix or remove it"


def make_fifo(path: Path) -> None:
    os.mkfifo(path)


def write_huge(path: Path) -> None:
    with path.open("wb") as fh:  # 2 MiB of comments: valid TOML, and far more than any settings file
        fh.write(b"# padding padding padding padding padding padding padding padding padding padding\n" * 26_000)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (make_fifo, "cannot be read (not a regular file but a FIFO); fix or remove it"),
        (os.mkdir, "cannot be read (not a regular file but a folder); fix or remove it"),
        (write_huge, "cannot be read (larger than 1024 KiB, more than any settings file needs); fix or remove it"),
        (lambda path: path.write_text("a = " + "[" * 5000 + "]" * 5000), TOO_DEEP),
        (lambda path: path.write_text("a = " + "{b = " * 5000 + "1" + "}" * 5000), TOO_DEEP),
    ],
    ids=["fifo", "folder", "2MiB", "nested-arrays", "nested-tables"],
)
def test_a_settings_file_no_command_could_read_in_time_is_a_usage_error_at_once(
    tmp_path: Path, make: Callable[[Path], object], said: str
) -> None:
    env = settings_env(tmp_path, "")
    path = tmp_path / "xdg" / "eagle3-console" / "config.toml"
    path.unlink()
    make(path)
    done = eagle3("local", "status", env=env, timeout=30)  # a FIFO used to block here for good
    assert done.returncode == 2
    assert done.stderr == f"eagle3-console: {path}: {said}\n"


def test_hosts_passes_over_an_ssh_config_that_is_a_fifo(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    os.mkfifo(home / ".ssh" / "config")
    done = eagle3("hosts", env={**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}, timeout=30)
    assert done.returncode == 0, done.stderr


@given(st.text(max_size=200))
def test_no_settings_text_makes_the_loader_fail_but_with_a_config_error(text: str) -> None:
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"eagle3-config-fuzz-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    path = folder / "config.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        config.load(path)
    except config.ConfigError as exc:
        assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc).rstrip()


def test_hosts_lists_the_settings_files_hosts_then_ssh_configs_with_included_files(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "Include conf.d/*.conf\nHost *\n  ServerAliveInterval 30\nHost build box\n  HostName 10.0.0.9\n  User bob\n"
    )
    (home / ".ssh" / "conf.d" / "lab.conf").write_text("Host h200\n  HostName h200.lab\n  Port 2222\n")
    env = settings_env(tmp_path, '[hosts.box]\naddress = "alice@box.lab"\ndescription = "8x H200"\n')
    env["HOME"] = str(home)
    listed = eagle3("hosts", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    hosts = {h["name"]: (h["address"], h["source"]) for h in json.loads(listed.stdout)}
    assert hosts == {
        "box": ("alice@box.lab", "config.toml"),  # named in both: config.toml's
        "h200": ("h200.lab:2222", "ssh config"),
        "build": ("bob@10.0.0.9", "ssh config"),
    }
    table = eagle3("hosts", env=env).stdout.splitlines()
    assert table[0].split() == ["HOST", "ADDRESS", "FROM", "SETTINGS", "DESCRIPTION"]
    assert table[1].split()[:2] == ["box", "alice@box.lab"] and table[1].endswith("8x H200")
