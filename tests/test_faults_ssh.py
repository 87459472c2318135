"""Attacks on, and damage to, the agent's code on an SSH host, against a real OpenSSH server.

The "host" is this machine through sshd on 127.0.0.1, so the test edits the uploaded copy in
WORKDIR/agent/<version>/ as someone on the host would, and the next connection must run exactly
this console's agent again, saying what it put right.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import posixpath
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.shipped import PARTIAL
from console.link.agent_upload import (
    CACHE,
    EMPTY,
    GO,
    Repair,
    backends_version,
    launch_command,
    manifest,
    plan,
    sources,
)
from tests.conftest import REPO, Notes, until
from tests.sshd import ALIAS, Sshd
from tests.test_ssh import console


def uploaded(sshd: Sshd, workdir: Path) -> Path:
    """Connect once, so the agent's copy is on the host; its version folder."""
    done = console(sshd, ALIAS, workdir, "status")
    assert done.returncode == 0, done.stderr
    return workdir / "agent" / backends_version()


def assert_whole(top: Path) -> None:
    """The host's copy holds exactly this console's sources, as plain files."""
    held = {
        p.relative_to(top).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in top.rglob("*")
        if p.is_file() and CACHE not in p.parts
    }
    assert held == manifest()
    assert not any(p.is_symlink() for p in top.rglob("*"))


def status_works(sshd: Sshd, workdir: Path) -> str:
    """A command over SSH succeeds; what it said on stderr."""
    done = console(sshd, ALIAS, workdir, "status")
    assert done.returncode == 0, done.stderr
    assert "no runs yet" in done.stdout
    return done.stderr


def test_an_edited_agent_module_is_restored_before_the_agent_runs(sshd: Sshd, tmp_path: Path) -> None:
    top = uploaded(sshd, tmp_path / "work")
    marker = tmp_path / "the-edit-ran"
    agent = top / "backends" / "agent.py"
    agent.write_text(agent.read_text().replace("\ndef main(", f"\nopen({str(marker)!r}, 'w').close()\ndef main(", 1))
    said = status_works(sshd, tmp_path / "work")
    assert not marker.exists()  # the edited code never ran
    assert_whole(top)
    assert said.count("\n") == 1 and "altered" in said and "changed: backends/agent.py" in said
    assert status_works(sshd, tmp_path / "work") == ""  # whole again: nothing more to say


def test_a_deleted_agent_module_is_restored(sshd: Sshd, tmp_path: Path) -> None:
    top = uploaded(sshd, tmp_path / "work")
    (top / "backends" / "runs" / "store.py").unlink()
    said = status_works(sshd, tmp_path / "work")
    assert_whole(top)
    assert "missing: backends/runs/store.py" in said


def test_an_emptied_agent_py_is_restored(sshd: Sshd, tmp_path: Path) -> None:
    top = uploaded(sshd, tmp_path / "work")
    (top / "backends" / "agent.py").write_bytes(b"")
    said = status_works(sshd, tmp_path / "work")
    assert_whole(top)
    assert "changed: backends/agent.py" in said


def test_modules_planted_in_the_agent_copy_are_removed(sshd: Sshd, tmp_path: Path) -> None:
    top = uploaded(sshd, tmp_path / "work")
    marker = tmp_path / "planted-code-ran"
    plant = f"open({str(marker)!r}, 'w').close()\n"
    (top / "sitecustomize.py").write_text(plant)  # on the agent's PYTHONPATH: Python runs it at start-up
    (top / "backends" / "evil.py").write_text(plant)
    (top / "backends" / "train" / "hook").mkdir()
    (top / "backends" / "train" / "hook" / "__init__.py").write_text(plant)
    said = status_works(sshd, tmp_path / "work")
    assert not marker.exists()
    assert_whole(top)
    assert not (top / "sitecustomize.py").exists() and not (top / "backends" / "train" / "hook").exists()
    assert "removed: backends/evil.py, backends/train/hook, sitecustomize.py" in said


def test_a_module_replaced_by_a_link_is_a_plain_file_again(sshd: Sshd, tmp_path: Path) -> None:
    top = uploaded(sshd, tmp_path / "work")
    module = top / "backends" / "host" / "gpus.py"
    elsewhere = tmp_path / "gpus.py"  # same bytes today, anything tomorrow
    elsewhere.write_bytes(module.read_bytes())
    module.unlink()
    module.symlink_to(elsewhere)
    said = status_works(sshd, tmp_path / "work")
    assert not module.is_symlink()
    assert_whole(top)
    assert "changed: backends/host/gpus.py" in said


def test_the_agent_copy_is_private_to_its_owner(sshd: Sshd, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    top = uploaded(sshd, workdir)
    for folder in (workdir / "agent", top):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        folder.chmod(0o777)  # opened up (or made so by an older console)
    assert status_works(sshd, workdir) == ""
    assert stat.S_IMODE((workdir / "agent").stat().st_mode) == 0o700
    assert stat.S_IMODE(top.stat().st_mode) == 0o700


def test_two_consoles_repairing_at_once_both_start_and_leave_one_whole_copy(sshd: Sshd, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    top = uploaded(sshd, workdir)
    (top / "backends" / "agent.py").write_bytes(b"raise SystemExit('damaged')\n")
    (top / "backends" / "protocol.py").unlink()
    (top / "backends" / "evil.py").write_text("")
    command = [sys.executable, "-m", "console", "--workdir", str(workdir), ALIAS, "status"]
    consoles = [
        subprocess.Popen(command, cwd=REPO, env=sshd.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    for each in consoles:
        out, err = each.communicate(timeout=120)
        assert each.returncode == 0, err
        assert b"no runs yet" in out
    assert_whole(top)
    assert not [p for p in top.rglob("*") if p.name.startswith(PARTIAL)]  # no half-written file left behind
    assert sorted(p.name for p in (workdir / "agent").iterdir()) == sorted([backends_version(), "bin"])


def test_the_console_says_when_it_repaired_the_agent_copy(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from console.__main__ import open_console
    from console.cli import config, grammar, output
    from console.tui.app import ConsoleApp

    workdir = tmp_path / "work"
    (uploaded(sshd, workdir) / "backends" / "evil.py").write_text("")
    monkeypatch.setenv("HOME", str(sshd.home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    notes = Notes()

    async def shown(app: ConsoleApp) -> None:  # the app as open_console made it, in a test terminal
        async with app.run_test(size=(160, 50), message_hook=notes) as pilot:
            await until(pilot, lambda: notes, what="the notice")
            await pilot.press("q")

    monkeypatch.setattr(ConsoleApp, "run", lambda app: asyncio.run(shown(app)))
    ns = grammar.build_parser(grammar.GRAMMARS).parse_args(["--workdir", str(workdir), ALIAS])
    assert open_console(ns, [ALIAS], config.Config(workdir / "config.toml"), named=False) == output.EXIT_OK
    [note] = notes
    assert note.severity == "warning" and "removed: backends/evil.py" in note.message


def test_a_remote_python_that_is_not_python_is_said_in_one_line(sshd: Sshd, tmp_path: Path) -> None:
    done = console(sshd, ALIAS, tmp_path / "work", "--remote-python", "/bin/false", "status")
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "with /bin/false" in done.stderr and "--remote-python PATH" in done.stderr


def test_nothing_in_the_remote_home_shadows_the_checked_agent(tmp_path: Path) -> None:
    """The launcher, run as the host runs it (a shell, its HOME): a `backends` package or a `json.py` in
    the home folder, where `python -m` would look first, is never imported by the agent."""
    home, workdir = tmp_path / "home", tmp_path / "work"
    marker = tmp_path / "shadow-ran"
    plant = f"open({str(marker)!r}, 'w').close()\n"
    (home / "backends").mkdir(parents=True)
    for module in ("backends/__init__.py", "backends/agent.py", "json.py", "asyncio.py"):
        (home / module).write_text(plant)
    top = workdir / "agent" / backends_version()
    for path, source in sources().items():
        (top / path).parent.mkdir(parents=True, exist_ok=True)
        (top / path).write_bytes(source.read_bytes())
    hello = b'{"v": 1, "id": 1, "op": "hello", "args": {}}\n'
    done = subprocess.run(
        ["sh", "-c", launch_command(sys.executable, str(workdir), backends_version())],
        input=GO + hello,
        capture_output=True,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    checked, ready, reply = done.stdout.splitlines()[:3]
    assert json.loads(checked)["found"] == "dir" and json.loads(ready)["ready"] > len(sources())
    assert json.loads(reply)["result"]["workdir"] == str(workdir)
    assert not marker.exists()


# --- the plan, on its own: whatever the host holds, carrying it out leaves exactly the manifest ---

FILES = {"backends/__init__.py": "a" * 64, "backends/agent.py": "b" * 64, "backends/train/loop.py": "c" * 64}
FOLDERS = {"backends", "backends/train"}
KINDS = st.sampled_from(["dir", "link", "other", "unreadable", "unlistable", "d" * 64, "a" * 64, EMPTY])
NAMES = st.sampled_from(
    [
        *FILES,
        *FOLDERS,
        "sitecustomize.py",
        "backends/evil.py",
        "backends/train/hook",
        "backends/train/hook/__init__.py",
        CACHE,
        f"backends/{CACHE}",
        f"backends/train/{CACHE}",
        f"backends/{CACHE}/agent.cpython-311.pyc",
        f"backends/{CACHE}/protocol.cpython-311.pyc",
        f"backends/train/{CACHE}/loop.cpython-312.pyc",
        f"backends/{PARTIAL}agent.py.1234",
    ]
)


def carried_out(tree: dict[str, str], repair: Repair) -> dict[str, str]:
    """What the host holds after the repair: removals (a folder with its contents), folders, writes."""
    held = dict(tree)
    for path, is_folder in repair.remove:
        assert path in held
        held = {p: k for p, k in held.items() if p != path and not (is_folder and p.startswith(f"{path}/"))}
    for folder in repair.folders:
        assert posixpath.dirname(folder) in ("", *held) and folder not in held
        held[folder] = "dir"
    for path in repair.write:
        assert posixpath.dirname(path) in held and held.get(path, "") != "dir"
        held[path] = FILES[path]
    return held


@given(st.dictionaries(NAMES, KINDS, max_size=12), st.booleans())
def test_carrying_out_the_plan_leaves_exactly_the_manifest(tree: dict[str, str], whole: bool) -> None:
    if whole:  # a damaged copy, not an arbitrary one: what the walk can report (parents listed with children)
        tree = {**{f: "dir" for f in FOLDERS}, **FILES, **tree}
    tree = {p: k for p, k in tree.items() if all(tree.get(parent) == "dir" for parent in _parents(p))}
    repair = plan(FILES, tree)
    held = carried_out(tree, repair)
    kept = {p: k for p, k in held.items() if posixpath.basename(p) != CACHE and PARTIAL not in p}
    assert kept == {**FILES, **{f: "dir" for f in FOLDERS}}
    # No bytecode is left: a folder's __pycache__ stays only as the launcher's empty file, where it belongs.
    placeholders = {p: k for p, k in held.items() if posixpath.basename(p) == CACHE}
    assert all(k == EMPTY and posixpath.dirname(p) in ("", *FOLDERS) for p, k in placeholders.items())
    assert repair.needed == (held != tree)


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
