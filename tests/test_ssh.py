"""The SSH transport against a real OpenSSH server: the same commands as `local`, the upload, and refusals.

The "GPU host" is this machine reached through sshd on 127.0.0.1, so a run
launched over SSH is a real process whose files the test can read.
"""

from __future__ import annotations

import ast
import asyncio
import getpass
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import asyncssh
import pytest
from hypothesis import given
from hypothesis import strategies as st

from console.fleet.hosts import Fleet
from console.link.agent_upload import backends_version
from console.link.ssh import parse_host
from console.link.transport import TransportError
from tests.conftest import REPO, free_port, until, wait_for
from tests.sshd import ALIAS, Sshd, keygen

PRINTER = "import sys\nprint('hello from the host')\nsys.stdout.write('progress 50%\\r')\nraise SystemExit(3)"


def console(
    sshd: Sshd, host: str, workdir: Path, *args: str, home: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it; output decoded with its carriage returns kept (logs are byte-exact). Each
    command connects afresh (--no-reuse): these tests are about what one connection does; reuse has its own."""
    done = subprocess.run(
        [sys.executable, "-m", "console", "--no-reuse", "--workdir", str(workdir), host, *args],
        cwd=REPO,
        env=sshd.env(home),
        capture_output=True,
        timeout=120,
        check=False,
    )
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


@given(
    user=st.one_of(st.none(), st.from_regex(r"[a-z_][a-z0-9_.-]{0,15}", fullmatch=True)),
    host=st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,30}[a-z0-9])?", fullmatch=True),
    port=st.one_of(st.none(), st.integers(1, 65535)),
)
def test_a_host_spec_is_read_back_whole(user: str | None, host: str, port: int | None) -> None:
    spec = (f"{user}@" if user else "") + host + (f":{port}" if port else "")
    assert parse_host(spec) == (user, host, port)


@pytest.mark.parametrize("spec", ["", "a@b@c", "host:99999", "host:port", "user@", "two words"])
def test_a_malformed_host_is_a_usage_error(spec: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        parse_host(spec)
    done = subprocess.run(
        [sys.executable, "-m", "console", spec, "status"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize("host", ["local", ALIAS])
def test_the_same_commands_work_over_ssh_as_locally(sshd: Sshd, host: str, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    launched = console(sshd, host, workdir, "launch", "command", "--name", "printer", "--", "python3", "-c", PRINTER)
    assert launched.returncode == 0, launched.stderr
    run_id = launched.stdout.strip()

    def ended() -> dict[str, object] | None:
        status = json.loads(console(sshd, host, workdir, "status", "--json").stdout)
        run = next(r for r in status["runs"] if r["id"] == run_id)
        return run if run["state"] == "failed" else None

    run = wait_for(ended, timeout=30, what="the run to end")
    assert run["exit_code"] == 3 and run["name"] == "printer"
    logs = console(sshd, host, workdir, "logs", "printer")
    assert logs.returncode == 0
    assert logs.stdout == (workdir / "runs" / run_id / "output.log").read_bytes().decode()
    assert "hello from the host" in logs.stdout and "progress 50%\r" in logs.stdout
    follow = console(sshd, host, workdir, "logs", "printer", "--follow")
    assert follow.returncode == 0 and follow.stdout == logs.stdout


def test_the_agent_is_uploaded_once_per_version_and_then_reused(sshd: Sshd, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    assert console(sshd, ALIAS, workdir, "status").returncode == 0
    agent = workdir / "agent" / backends_version() / "backends"
    uploaded = {p.relative_to(agent): p.stat().st_mtime_ns for p in agent.rglob("*.py")}
    local = {
        p.relative_to(REPO / "backends") for p in (REPO / "backends").rglob("*.py") if "__pycache__" not in p.parts
    }
    assert set(uploaded) == local
    assert console(sshd, ALIAS, workdir, "status").returncode == 0
    assert {p.relative_to(agent): p.stat().st_mtime_ns for p in agent.rglob("*.py")} == uploaded
    # No staging left behind; bin/ holds the py-spy uploaded for this host, which has none of its own.
    assert sorted(p.name for p in (workdir / "agent").iterdir()) == sorted([backends_version(), "bin"])


def fingerprint(public_key: str) -> str:
    return asyncssh.import_public_key(public_key).get_fingerprint()


def recorded(sshd: Sshd) -> str:
    """The known_hosts line that trusts the test host: its name and key, as `ssh` writes it."""
    return f"[127.0.0.1]:{sshd.port} {' '.join(sshd.host_public_key.split()[:2])}\n"


def test_an_unknown_host_key_is_refused_with_its_fingerprint_and_what_to_do(sshd: Sshd, tmp_path: Path) -> None:
    home = sshd.client_home(tmp_path / "home", known_hosts="")
    done = console(sshd, ALIAS, tmp_path / "work", "status", home=home)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert fingerprint(sshd.host_public_key) in done.stderr and f"[127.0.0.1]:{sshd.port}" in done.stderr
    assert "--accept-new-host-key" in done.stderr and f"ssh {ALIAS}" in done.stderr
    assert (home / ".ssh" / "known_hosts").read_text() == ""  # nothing trusted behind the user's back
    assert not (tmp_path / "work").exists()  # nothing was uploaded or started


def test_a_new_host_key_is_trusted_when_asked_to_and_then_known(sshd: Sshd, tmp_path: Path) -> None:
    other = "other.example ssh-ed25519 " + keygen(tmp_path / "other").split()[1]
    home = sshd.client_home(tmp_path / "home", known_hosts=other)  # no newline at the end
    done = console(sshd, ALIAS, tmp_path / "work", "--accept-new-host-key", "status", home=home)
    assert done.returncode == 0, done.stderr
    assert fingerprint(sshd.host_public_key) in done.stderr and "trusted and added to" in done.stderr
    known = home / ".ssh" / "known_hosts"
    assert known.read_text() == other + "\n" + recorded(sshd)  # what was there is kept
    again = console(sshd, ALIAS, tmp_path / "work", "status", home=home)
    assert again.returncode == 0 and again.stderr == ""


def test_a_changed_host_key_is_refused_even_when_new_keys_are_accepted(sshd: Sshd, tmp_path: Path) -> None:
    impostor = keygen(tmp_path / "impostor")
    trusted = f"[127.0.0.1]:{sshd.port} {impostor}\n"
    home = sshd.client_home(tmp_path / "home", known_hosts=trusted)
    done = console(sshd, ALIAS, tmp_path / "work", "--accept-new-host-key", "status", home=home)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "CHANGED" in done.stderr and fingerprint(sshd.host_public_key) in done.stderr
    assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}'" in done.stderr
    assert (home / ".ssh" / "known_hosts").read_text() == trusted


@pytest.mark.parametrize("refusal", ["unknown host key", "no key accepted"])
def test_a_hint_names_the_port_as_ssh_takes_it(sshd: Sshd, tmp_path: Path, refusal: str) -> None:
    # ssh reads host:PORT as a host name: the command to try must say -p PORT.
    user = getpass.getuser()
    known = "" if refusal == "unknown host key" else None
    home = sshd.client_home(tmp_path / "home", known_hosts=known)  # and no key for 127.0.0.1 itself
    done = console(sshd, f"{user}@127.0.0.1:{sshd.port}", tmp_path / "work", "status", home=home)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert f"`ssh -p {sshd.port} {user}@127.0.0.1`" in done.stderr
    assert f"ssh {user}@127.0.0.1:{sshd.port}" not in done.stderr


def rsa_only_known_hosts(sshd: Sshd, folder: Path) -> str:
    """known_hosts that trusts an RSA key for the test host, which offers only its ed25519 key."""
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(folder / "rsa")], check=True)
    algorithm, key = (folder / "rsa.pub").read_text().split()[:2]
    return f"[127.0.0.1]:{sshd.port} {algorithm} {key}\n"


def test_a_known_hosts_trusting_only_another_key_type_is_refused_with_what_to_do(sshd: Sshd, tmp_path: Path) -> None:
    trusted = rsa_only_known_hosts(sshd, tmp_path)
    home = sshd.client_home(tmp_path / "home", known_hosts=trusted)
    done = console(sshd, ALIAS, tmp_path / "work", "--accept-new-host-key", "status", home=home)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "Connection lost" not in done.stderr and "cannot reach" not in done.stderr
    assert "trusts only ssh-rsa key(s)" in done.stderr and "offers the ssh-ed25519 key" in done.stderr
    assert fingerprint(sshd.host_public_key) in done.stderr
    assert f"`ssh-keyscan -p {sshd.port} 127.0.0.1`" in done.stderr and f"`ssh {ALIAS}`" in done.stderr
    assert (home / ".ssh" / "known_hosts").read_text() == trusted  # nothing trusted behind the user's back


async def test_a_known_hosts_trusting_only_another_key_type_is_not_retried(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from console.link.client import AgentClient
    from console.link.ssh import SSHTransport

    monkeypatch.setenv(
        "HOME", str(sshd.client_home(tmp_path / "home", known_hosts=rsa_only_known_hosts(sshd, tmp_path)))
    )
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    client = AgentClient(SSHTransport(ALIAS, tmp_path / "work"))
    retried: list[TransportError] = []
    with pytest.raises(TransportError) as refused:
        await asyncio.wait_for(client.reconnect_until_back(retried.append), timeout=30)
    await client.close()
    assert not refused.value.transient and retried == []


@pytest.mark.parametrize(("answer", "code"), [("yes", 0), ("no", 1)])
def test_at_a_terminal_the_person_is_asked_as_ssh_asks(sshd: Sshd, tmp_path: Path, answer: str, code: int) -> None:
    home = sshd.client_home(tmp_path / "home", known_hosts="")
    controller, terminal = pty.openpty()
    command = [sys.executable, "-m", "console", "--workdir", str(tmp_path / "work"), ALIAS, "status"]
    child = subprocess.Popen(command, cwd=REPO, env=sshd.env(home), stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    seen = b""
    while b"(yes/no/[fingerprint])?" not in seen:
        seen += os.read(controller, 4096)
    os.write(controller, answer.encode() + b"\n")
    assert child.wait(timeout=60) == code
    os.close(controller)
    assert fingerprint(sshd.host_public_key).encode() in seen
    known = (home / ".ssh" / "known_hosts").read_text()
    assert known == (recorded(sshd) if answer == "yes" else "")


def test_a_key_the_host_does_not_accept_is_permission_denied(sshd: Sshd, tmp_path: Path) -> None:
    keygen(tmp_path / "other_key")
    home = sshd.client_home(tmp_path / "home", key=tmp_path / "other_key")
    done = console(sshd, ALIAS, tmp_path / "work", "status", home=home)
    assert done.returncode == 1 and "permission denied" in done.stderr and done.stderr.count("\n") == 1


def test_a_host_that_does_not_answer_is_reported_in_one_line(sshd: Sshd, tmp_path: Path) -> None:
    done = console(sshd, f"127.0.0.1:{free_port()}", tmp_path / "work", "status")
    assert done.returncode == 1
    assert done.stderr.startswith("eagle3-console: cannot reach 127.0.0.1:") and done.stderr.count("\n") == 1


def test_the_agent_runs_on_the_python_named_for_the_host(sshd: Sshd, tmp_path: Path) -> None:
    done = console(sshd, ALIAS, tmp_path / "work", "--remote-python", sys.executable, "status")
    assert done.returncode == 0 and "no runs yet" in done.stdout
    assert console(sshd, "local", tmp_path / "work", "--remote-python", sys.executable, "status").returncode == 2


def test_a_host_without_that_python_says_so_and_what_to_do(sshd: Sshd, tmp_path: Path) -> None:
    done = console(sshd, ALIAS, tmp_path / "work", "--remote-python", "/opt/none/bin/python3", "status")
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "no Python at /opt/none/bin/python3 on gpu-test" in done.stderr and "--remote-python PATH" in done.stderr


def test_an_old_python_on_the_host_is_told_apart_before_it_reads_newer_syntax() -> None:
    # backends/__init__.py is what an old interpreter compiles first: it must parse as Python 3.6
    # so that its version check can speak, where any newer module would stop at a SyntaxError.
    source = (REPO / "backends" / "__init__.py").read_text()
    ast.parse(source, feature_version=(3, 6))
    assert "sys.version_info < (3, 10)" in source and "--remote-python" in source


COUNTER = "import time\nfor i in range(60):\n    print(f'line {i}', flush=True)\n    time.sleep(0.1)"


@pytest.mark.parametrize("host", ["local", ALIAS])
def test_a_follow_survives_a_lost_agent_and_prints_every_line_exactly_once(
    sshd: Sshd, host: str, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    run_id = console(sshd, host, workdir, "launch", "command", "--", "python3", "-c", COUNTER).stdout.strip()
    follower = subprocess.Popen(
        [sys.executable, "-m", "console", "--workdir", str(workdir), host, "logs", run_id, "--follow"],
        cwd=REPO,
        env=sshd.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    agent = f"backends.agent.* --workdir {workdir}"  # the agent, not the follower (`console --workdir ...`)
    # Some lines are through: the follower's agent streams (a fixed 1.5 s could end after the run on a busy machine,
    # its agent gone before the kill). Read from the pipe itself: communicate reads the rest from there.
    assert follower.stdout is not None
    deadline, first = time.monotonic() + 60, b""
    while b"\n" not in first:
        left = deadline - time.monotonic()
        assert left > 0 and select.select([follower.stdout], [], [], left)[0], f"no line from the follow: {first!r}"
        chunk = os.read(follower.stdout.fileno(), 65536)
        assert chunk, f"the follow ended before a line: {first!r}"
        first += chunk
    subprocess.run(["pkill", "-KILL", "-f", agent], check=True)  # the link is gone mid-stream
    out, err = follower.communicate(timeout=90)
    out = first + out
    assert follower.returncode == 0, err
    assert out == (workdir / "runs" / run_id / "output.log").read_bytes()
    assert out.decode().splitlines() == [f"line {i}" for i in range(60)]
    assert b"connection lost" in err and b"reconnected after" in err


async def test_the_console_leaves_with_the_reason_when_the_host_key_is_refused(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from console.link.ssh import SSHTransport
    from console.tui.app import ConsoleApp

    monkeypatch.setenv("HOME", str(sshd.client_home(tmp_path / "home", known_hosts="")))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    app = ConsoleApp(Fleet.one(SSHTransport(ALIAS, tmp_path / "work")))
    async with app.run_test() as pilot:
        await until(pilot, lambda: app.return_code == 1, what="the console to leave")
    assert app.return_code == 1
    assert not (tmp_path / "work").exists()


async def test_the_console_asks_before_it_trusts_a_new_host_key(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from console.link.ssh import SSHTransport
    from console.tui.app import ConsoleApp
    from console.tui.dialogs import ConfirmScreen

    home = sshd.client_home(tmp_path / "home", known_hosts="")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    transport = SSHTransport(ALIAS, tmp_path / "work")
    app = ConsoleApp(Fleet.one(transport))
    transport.trust_new_key = app.trust_new_key
    async with app.run_test(size=(160, 50)) as pilot:
        # The dialog takes its focus once mounted, a frame after it is the screen.
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.focused, what="the question")
        assert fingerprint(sshd.host_public_key) in str(app.screen.query_one("#details").render())
        assert app.focused is not None and app.focused.id == "cancel"
        await pilot.press("y")
        await until(pilot, lambda: app.connected.is_set(), what="the connection")
        await pilot.press("q")
    assert (home / ".ssh" / "known_hosts").read_text() == recorded(sshd)


async def test_the_console_over_ssh_shows_the_hosts_runs(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from console.link.ssh import SSHTransport
    from console.tui.app import ConsoleApp
    from console.tui.panels import RunsTable

    workdir = tmp_path / "work"
    launched = console(sshd, "local", workdir, "launch", "command", "--name", "on-host", "--", "sleep", "60")
    run_id = launched.stdout.strip()
    monkeypatch.setenv("HOME", str(sshd.home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    app = ConsoleApp(Fleet.one(SSHTransport(ALIAS, workdir)))
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.query_one(RunsTable).selected_run() == run_id, what="the host's run")
        assert app.sub_title.startswith(f"{ALIAS}  ·  ") and app.runs[run_id]["name"] == "on-host"
        await pilot.press("q")
    console(sshd, "local", workdir, "kill", run_id, "--grace", "1")
