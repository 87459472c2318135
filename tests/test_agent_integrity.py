"""No foreign code, ever: the agent's copy on an SSH host runs only as this console wrote it, for its own user.

Real: OpenSSH's sshd on 127.0.0.1 (tests/sshd.py), logged in to as the user running the tests (root in CI and
here), the host's /usr/bin/python3, a second local user made with `useradd` for the folders another user
controls, .pyc files compiled by the host's Python with a header that matches the checked source (its mtime
and size, as the import system compares them), and a 1 MiB tmpfs for the full disk (mounted as root; where
mounting is not allowed that test is skipped, saying why).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.shipped import PARTIAL
from console.link.agent_upload import CACHE, backends_version, launch_command, sources
from console.link.client import AgentClient
from console.link.ssh import SSHTransport
from console.link.transport import AgentError
from tests.sshd import ALIAS, Sshd
from tests.test_ssh import console

HOST_PYTHON = "/usr/bin/python3"
ME = f"user {pwd.getpwuid(os.geteuid()).pw_name}"  # as the launcher names whoever runs it
# Compiles PAYLOAD into the .pyc the import system would take for SOURCE: same magic number (the host's
# Python), and the source's mtime and size in its header. A placeholder file in the way goes first.
PLANT = """
import importlib.util, os, sys
from importlib._bootstrap_external import _code_to_timestamp_pyc
source, payload = sys.argv[1], sys.argv[2]
st = os.stat(source)
pyc = importlib.util.cache_from_source(source)
if os.path.isfile(os.path.dirname(pyc)):
    os.remove(os.path.dirname(pyc))
os.makedirs(os.path.dirname(pyc), exist_ok=True)
with open(pyc, 'wb') as f:
    f.write(_code_to_timestamp_pyc(compile(payload, source, 'exec'), st.st_mtime, st.st_size))
"""


def plant_pyc(source: Path, marker: Path) -> None:
    """A .pyc for `source` whose code creates `marker`: what an attacker leaves beside a checked module."""
    payload = f"open({str(marker)!r}, 'w').close()\n"
    subprocess.run([HOST_PYTHON, "-c", PLANT, str(source), payload], check=True, timeout=60)


def copy_of_the_agent(top: Path) -> None:
    """The version folder, as the console uploads it (anyone holding this console can make one)."""
    for path, source in sources().items():
        (top / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, top / path)


@pytest.fixture(scope="module")
def other_user() -> Iterator[str]:
    """A second local user, made for these tests and removed after them."""
    name = f"e3c-{uuid.uuid4().hex[:10]}"
    subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def chown_tree(path: Path, user: str) -> None:
    subprocess.run(["chown", "-R", f"{user}:", str(path)], check=True)


@pytest.mark.parametrize("theirs", ["above", "workdir", "inside"])
def test_root_never_runs_code_from_folders_another_user_controls(
    sshd: Sshd, tmp_path: Path, other_user: str, theirs: str
) -> None:
    """The attack: --workdir in a folder of another user's, who laid out the version folder there with a .pyc
    matching backends/__init__.py. Before, root imported it (the marker appeared) before any owner check.
    `inside`: root's own copy, with their __pycache__ in it (a folder once open to them)."""
    assert os.geteuid() == 0, "this attack is root's: the suite runs as root in CI"
    theirs_folder = tmp_path / "shared"
    workdir = theirs_folder / "work"
    top = workdir / "agent" / backends_version()
    if theirs == "inside":
        assert console(sshd, ALIAS, workdir, "status").returncode == 0
    else:
        copy_of_the_agent(top)
    marker = tmp_path / "their-code-ran-as-root"
    plant_pyc(top / "backends" / "__init__.py", marker)
    named = {"above": theirs_folder, "workdir": workdir, "inside": top / "backends" / CACHE}[theirs]
    chown_tree(named, other_user)
    done = console(sshd, ALIAS, workdir, "status")
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"refused to start the agent: {named} belongs to user {other_user}" in done.stderr
    assert "--workdir" in done.stderr  # what to do
    assert not marker.exists()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.one_of(st.sampled_from([0o775, 0o757, 0o1777, 0o755]), st.integers(0, 0o1777)))
def test_a_folder_above_the_workdir_others_can_write_is_refused_unless_sticky(tmp_path: Path, mode: int) -> None:
    """The launcher as the host runs it (a shell, its HOME), no sshd needed: as sshd's StrictModes, but a sticky
    folder (as /tmp is) lets no one else rename or remove what is ours in it."""
    above = tmp_path / uuid.uuid4().hex
    above.mkdir()
    above.chmod(mode)
    done = subprocess.run(
        ["sh", "-c", launch_command(sys.executable, str(above / "work"), backends_version())],
        input=b"",  # no GO: the launcher lists and leaves
        capture_output=True,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    if mode & 0o022 and not mode & 0o1000:
        assert done.returncode == 1
        said = f'"refused": "{above} is writable by others ({ME}, mode {mode:o})'
        assert said in done.stdout.decode() and f"chmod go-w {above}" in done.stdout.decode()
    else:
        assert done.returncode == 0 and b'"found": "missing"' in done.stdout, done.stderr


def test_a_pyc_planted_by_the_same_user_is_never_imported_and_is_removed(sshd: Sshd, tmp_path: Path) -> None:
    """Before, a .pyc matching the source passed the tamper check (compiled copies of unchanged modules were
    kept) and was imported. Now every folder's __pycache__ is an empty file: Python neither reads nor writes
    bytecode there, and anything else in its place is removed and said."""
    workdir = tmp_path / "work"
    assert console(sshd, ALIAS, workdir, "status").returncode == 0
    top = workdir / "agent" / backends_version()
    assert (top / "backends" / CACHE).is_file() and (top / "backends" / CACHE).stat().st_size == 0
    assert not list(top.rglob("*.pyc"))  # the agent that ran wrote no bytecode into its copy
    marker = tmp_path / "planted-pyc-ran"
    plant_pyc(top / "backends" / "__init__.py", marker)
    plant_pyc(top / "backends" / "agent.py", marker)
    done = console(sshd, ALIAS, workdir, "status")
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    assert done.stderr.count("\n") == 1 and "removed: backends/__pycache__" in done.stderr
    assert (top / "backends" / CACHE).is_file() and not list(top.rglob("*.pyc"))


@pytest.mark.parametrize("tamper", ["edit", "pyc"])
async def test_agent_files_changed_while_it_runs_are_never_run_by_a_new_supervisor(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tamper: str
) -> None:
    """An agent that stays up (a multiplexer's, the terminal console's) was checked only when it connected; an
    edit of a module since, or a .pyc planted beside it, would run in the next supervisor. The launch is refused
    in one line naming the file, nothing starts, and once a new connection has restored the copy it launches."""
    monkeypatch.setenv("HOME", str(sshd.home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    workdir = tmp_path / "work"
    client = AgentClient(SSHTransport(ALIAS, workdir))
    await client.start()
    try:
        top = workdir / "agent" / backends_version()
        marker = tmp_path / "tampered-code-ran"
        supervise = top / "backends" / "runs" / "supervise.py"
        if tamper == "edit":
            # Moved but not changed: same bytes, a new mtime; and a console's repair under way beside it. The
            # stats differ, the SHA-256 does not, and a partial file cannot be imported: the launch goes ahead.
            os.utime(supervise)
            (supervise.parent / f"{PARTIAL}supervise.py.0123abcd").write_text("")
            touched = await client.launch("command", [HOST_PYTHON, "-c", "print('hello')"], name="touched")
            assert touched["run"]
            (supervise.parent / f"{PARTIAL}supervise.py.0123abcd").unlink()
            supervise.write_text(f"open({str(marker)!r}, 'w').close()\n" + supervise.read_text())
            named = "backends/runs/supervise.py changed"
        else:
            plant_pyc(supervise, marker)
            named = f"backends/runs/{CACHE}"
        with pytest.raises(AgentError) as refused:
            await client.launch("command", [HOST_PYTHON, "-c", "print('hello')"], name="after-tamper")
        assert refused.value.code == "agent_altered" and "\n" not in refused.value.message
        assert named in refused.value.message and "--no-reuse" in refused.value.message
        started = [run["name"] for run in (await client.status(gpus=False))["runs"]]
        assert "after-tamper" not in started  # nothing was started
        assert not marker.exists()
        restored = console(sshd, ALIAS, workdir, "status")  # a new connection puts the copy right
        assert restored.returncode == 0 and "restored them" in restored.stderr
        launched = await client.launch("command", [HOST_PYTHON, "-c", "print('hello')"], name="after-repair")
        assert launched["run"] and not marker.exists()
        assert not list(top.rglob("*.pyc"))  # its supervisor wrote no bytecode into the copy either
    finally:
        await client.close()


def test_a_first_upload_onto_a_full_disk_says_so_in_one_line(sshd: Sshd, small_disk: Path) -> None:
    """OpenSSH's SFTP server answers a write on a full disk with 'Failure' and nothing more; the console asks
    the host's disk (statvfs) and says what happened and what to do. The half-made copy is not left behind."""
    workdir = small_disk / "work"
    done = console(sshd, ALIAS, workdir, "status")
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    said = done.stderr
    assert f"no space left on the host's disk holding {workdir}: the agent's files need " in said
    assert " MB are free; free some space there, or choose another --workdir" in said
    assert not [p for p in (workdir / "agent").iterdir() if p.name.startswith(".upload-")]
