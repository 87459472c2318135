"""What the console ships with the agent to an SSH host beyond its code: py-spy and the pure-Python dependencies.

Real: OpenSSH's sshd on 127.0.0.1 (tests/sshd.py), the host's own /usr/bin/python3 (on the sshd session's
PATH, with no py-spy beside it or on that PATH, and no httpx), a fresh venv without packages, py-spy from
.venv (the pinned release make test installs), a sleeping Python run and py-spy's dump of it, and
`setarch i686`, which makes the host's Python see a machine py-spy publishes no build for.
"""

from __future__ import annotations

import asyncio
import hashlib
import platform
import shlex
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from console.link import agent_upload, py_spy
from console.link.agent_upload import backends_version
from console.link.ssh import SSHTransport
from tests.conftest import wait_for
from tests.sshd import ALIAS, Sshd
from tests.test_ssh import console

HOST_PYTHON = "/usr/bin/python3"
SLEEPER = "import time\n\ndef nap_forever():\n    print('asleep', flush=True)\n    time.sleep(600)\n\nnap_forever()\n"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pinned() -> str:
    wheel = py_spy.wheel_for(platform.machine())
    assert wheel is not None, "these tests run on a machine py-spy publishes a build for"
    return wheel.binary_sha256


def uploaded_py_spy(workdir: Path) -> Path:
    return workdir / "agent" / "bin" / "py-spy"


def host_says(sshd: Sshd, *argv: str) -> str:
    """A command run on the host through the real sshd (its session's PATH, not ours)."""
    ssh = ["ssh", "-F", str(sshd.home / ".ssh" / "config"), "-o", "BatchMode=yes"]
    ssh += ["-o", f"UserKnownHostsFile={sshd.home / '.ssh' / 'known_hosts'}", ALIAS, shlex.join(argv)]
    done = subprocess.run(ssh, env=sshd.env(), capture_output=True, text=True, timeout=60, check=False)
    return done.stdout + done.stderr


def test_a_host_without_py_spy_gets_the_pinned_one_and_stacks_show_python_frames(sshd: Sshd, tmp_path: Path) -> None:
    assert "no py-spy" in host_says(sshd, "sh", "-c", "command -v py-spy || echo no py-spy")  # the premise
    workdir = tmp_path / "work"
    launched = console(sshd, ALIAS, workdir, "launch", "command", "--name", "sleeper", "--", HOST_PYTHON, "-c", SLEEPER)
    assert launched.returncode == 0, launched.stderr
    assert launched.stderr == ""  # a routine upload is not news
    binary = uploaded_py_spy(workdir)
    assert sha256(binary) == pinned()
    assert stat.S_IMODE(binary.stat().st_mode) == 0o700
    run_id = launched.stdout.strip()
    output = workdir / "runs" / run_id / "output.log"
    wait_for(lambda: output.exists() and "asleep" in output.read_text(), timeout=30, what="the run asleep")
    try:
        dumped = console(sshd, ALIAS, workdir, "stacks", "sleeper", "--now")
        assert dumped.returncode == 0, dumped.stderr
        assert "nap_forever" in dumped.stdout and "<module>" in dumped.stdout  # Python frames, from py-spy
        assert "py-spy is not installed" not in dumped.stdout
    finally:
        console(sshd, ALIAS, workdir, "kill", "sleeper", "--signal", "KILL", "--grace", "0")


def test_a_tampered_py_spy_on_the_host_is_replaced_and_said(sshd: Sshd, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    assert console(sshd, ALIAS, workdir, "status").returncode == 0
    binary = uploaded_py_spy(workdir)
    binary.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(tmp_path / 'planted-ran'))}\n")
    done = console(sshd, ALIAS, workdir, "status")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("\n") == 1 and "not the pinned py-spy; replaced it" in done.stderr
    assert sha256(binary) == pinned() and stat.S_IMODE(binary.stat().st_mode) == 0o700
    assert not [p for p in binary.parent.iterdir() if p.name != "py-spy"]  # no partial file left behind
    assert console(sshd, ALIAS, workdir, "status").stderr == ""  # right again: nothing more to say


def test_a_host_of_an_architecture_without_py_spy_is_told_once(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    i686 = tmp_path / "python-i686"  # the host's Python, seeing an i686 machine (uname -m)
    i686.write_text(f'#!/bin/sh\nexec setarch i686 {HOST_PYTHON} "$@"\n')
    i686.chmod(0o755)
    assert host_says(sshd, str(i686), "-c", "import platform; print(platform.machine())").strip() == "i686"
    monkeypatch.setenv("HOME", str(sshd.home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    workdir = tmp_path / "work"
    transport = SSHTransport(ALIAS, workdir, str(i686))
    said: list[str] = []
    transport.say = said.append

    async def connect_twice() -> None:  # a reconnection of the same console
        for _ in range(2):
            await transport.open()
            await transport.close()

    asyncio.run(connect_twice())
    [notice] = said
    assert "\n" not in notice and "no py-spy" in notice and "'i686'" in notice and "kernel-side" in notice
    assert not uploaded_py_spy(workdir).exists()
    done = console(sshd, ALIAS, workdir, "--remote-python", str(i686), "status")  # the CLI says it too, one line
    assert done.returncode == 0 and done.stderr.count("\n") == 1 and "'i686'" in done.stderr


def test_an_interpreter_without_httpx_runs_the_agent_with_the_shipped_copies(sshd: Sshd, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([HOST_PYTHON, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    lacking = subprocess.run([python, "-c", "import httpx"], capture_output=True, text=True, check=False)
    assert "No module named 'httpx'" in lacking.stderr  # the premise
    workdir = tmp_path / "work"
    launched = console(
        sshd, ALIAS, workdir, "--remote-python", python, "launch", "command", "--name", "quick", "--", "true"
    )
    assert launched.returncode == 0, launched.stderr
    top = workdir / "agent" / backends_version()
    # A copy of httpx the host's user put on PYTHONPATH (another version): ours must still be the one imported.
    theirs = tmp_path / "theirs" / "httpx"
    theirs.mkdir(parents=True)
    (theirs / "__init__.py").write_text(f"open({str(tmp_path / 'their-httpx-ran')!r}, 'w').close()\n")
    # As a run's supervisor imports them: `-m` in the agent's folder, the run engine first.
    probe = "import backends.runs, httpx, prometheus_client; print(httpx.__file__); print(prometheus_client.__file__)"
    in_top = f"cd {shlex.quote(str(top))} && PYTHONPATH={shlex.quote(str(theirs.parent))} exec"
    command = f"{in_top} {shlex.quote(python)} -c {shlex.quote(probe)}"
    assert host_says(sshd, "sh", "-c", command).splitlines() == [
        str(top / "vendor" / "httpx" / "__init__.py"),
        str(top / "vendor" / "prometheus_client" / "__init__.py"),
    ]
    assert not (tmp_path / "their-httpx-ran").exists()


def test_an_altered_shipped_dependency_is_restored_before_the_agent_runs(sshd: Sshd, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    assert console(sshd, ALIAS, workdir, "status").returncode == 0
    [top] = [p for p in (workdir / "agent").iterdir() if p.name != "bin"]
    module = top / "vendor" / "httpx" / "_client.py"
    shipped = module.read_bytes()
    module.write_text("raise SystemExit('altered')\n")
    done = console(sshd, ALIAS, workdir, "status")
    assert done.returncode == 0, done.stderr
    assert "changed: vendor/httpx/_client.py" in done.stderr and done.stderr.count("\n") == 1
    assert module.read_bytes() == shipped


def test_a_compiled_dependency_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """markupsafe, as installed here, carries a C extension (real): it cannot go to a host of another Python."""
    monkeypatch.setattr(agent_upload, "DEPENDENCIES", ("markupsafe",))
    agent_upload.vendor_files.cache_clear()
    try:
        with pytest.raises(agent_upload.VendorError, match="compiled") as refused:
            agent_upload.vendor_files()
    finally:
        agent_upload.vendor_files.cache_clear()
    assert "\n" not in str(refused.value) and "MarkupSafe" in str(refused.value)


def test_a_failed_download_of_py_spy_is_one_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No index answers (nothing listens on its port of 127.0.0.1), so the aarch64 wheel cannot be had."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple/")
    for proxy in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setattr(py_spy, "_found", {})
    for _ in range(2):  # a second connection hears the same answer
        with pytest.raises(py_spy.NoPySpy, match=f"cannot fetch py-spy .* from http://127.0.0.1:{port}/") as failed:
            asyncio.run(py_spy.binary("aarch64"))
        assert "\n" not in str(failed.value)
    assert list((tmp_path / "cache" / "eagle3-console").iterdir()) == []
