"""Connection reuse for the CLI over SSH (`console.link.reuse`, `console.link.multiplexer`), against a real sshd.

Real: sshd on 127.0.0.1 (`tests/sshd.py`), the CLI in its own process as a user runs it, the multiplexer it
starts in the background, the agent on the "host" (this machine through sshd), runs and signals. Each test
has its own $XDG_RUNTIME_DIR, so its multiplexers are its own; they are stopped at its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from console.cli import quick
from console.link import reuse
from console.link.local import LocalTransport
from console.link.reuse_transport import ReusingTransport
from tests.conftest import REPO, ctrl_c_reaches_it, wait_for
from tests.sshd import ALIAS, Sshd, keygen

SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(600)"
TICKER = "import time\nfor i in range(6000):\n    print('tick', i, flush=True)\n    time.sleep(0.1)"


@dataclass
class Place:
    """A user's machine for these tests: the sshd's client HOME, a runtime folder, and the host's run store."""

    sshd: Sshd
    runtime: Path
    workdir: Path
    idle_s: float = 120
    home: Path | None = None  # the client's HOME; None: the sshd's own

    @property
    def folder(self) -> Path:
        return self.runtime / "eagle3-console"

    def env(self) -> dict[str, str]:
        return {**self.sshd.env(self.home), "XDG_RUNTIME_DIR": str(self.runtime), reuse.IDLE_ENV: str(self.idle_s)}

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "console", "--workdir", str(self.workdir), ALIAS, *args]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args), cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=120, check=False
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        """A command left running (a follow), in its own process group as a shell runs a foreground job."""
        return subprocess.Popen(
            self.argv(*args), cwd=REPO, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, preexec_fn=ctrl_c_reaches_it,
        )  # fmt: skip

    def sockets(self) -> list[Path]:
        return sorted(self.folder.glob("*.sock")) if self.folder.is_dir() else []

    def multiplexers(self) -> list[int]:
        """The pids of the live multiplexers serving this test's folder."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"console.link.multiplexer" in argv and any(str(self.folder).encode() in a for a in argv):
                    found.append(int(entry.name))
        return found

    def greeter(self) -> int | None:
        """The pid of the multiplexer that answers on this test's socket, as it greets; None if none answers."""
        for path in self.sockets():
            with socket.socket(socket.AF_UNIX) as sock, contextlib.suppress(OSError):
                sock.settimeout(1)
                sock.connect(str(path))
                return int(json.loads(sock.makefile().readline())["multiplexer"]["pid"])
        return None

    def serving(self) -> int:
        """Wait until a multiplexer serves; its pid."""
        pid: int = wait_for(self.greeter, timeout=60, what="a multiplexer to serve")
        return pid

    def agents(self) -> list[int]:
        """The agents running on the host for this run store."""
        found = subprocess.run(["pgrep", "-f", f"backends.agent.* --workdir {self.workdir}"], capture_output=True)
        return sorted(int(pid) for pid in found.stdout.split())

    def log(self) -> str:
        return (self.folder / reuse.LOG_NAME).read_text()


@pytest.fixture
def place(sshd: Sshd, tmp_path: Path) -> Iterator[Place]:
    # Short: a socket's path must fit in 108 bytes, which pytest's tmp_path names can overrun.
    runtime = Path(tempfile.mkdtemp(prefix="e3r", dir="/tmp"))
    here = Place(sshd, runtime, tmp_path / "work")
    yield here
    for pid in here.multiplexers():
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not here.multiplexers(), what="the multiplexers to exit")
    subprocess.run(["rm", "-rf", str(runtime)], check=True)


def tcp_links(port: int, pids: list[int]) -> int:
    """Established TCP connections to `port` held by the processes `pids` (other tests' multiplexers may hold
    links to the same sshd meanwhile)."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    lines = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return sum(1 for f in lines if f[2].endswith(f":{port:04X}") and f[3] == "01" and f[9] in inodes)


def launch_sleeper(place: Place) -> str:
    done = place.cli("launch", "command", "--", "python3", "-c", SLEEPER)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def first_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline()


def test_a_second_command_goes_through_the_first_ones_connection_and_agent(place: Place) -> None:
    assert place.cli("status").returncode == 0  # direct: it starts the multiplexer for what follows
    mux = place.serving()
    agent = wait_for(lambda: place.agents() if len(place.agents()) == 1 else None, what="one agent")
    run_id = launch_sleeper(place)
    follower = place.start("logs", run_id, "--follow")
    assert first_line(follower) == "started\n"
    # While a follow streams, the host still runs one agent, over one TCP connection: the multiplexer's.
    assert place.agents() == agent and tcp_links(place.sshd.port, [mux, follower.pid]) == 1
    killed = place.cli("kill", run_id, "--json")
    assert killed.returncode == 0, killed.stderr
    assert all(p["died"] for p in json.loads(killed.stdout)["processes"])
    assert follower.wait(timeout=60) == 0  # the follow saw the run end
    assert place.serving() == mux and place.multiplexers() == [mux] and place.agents() == agent


def without_an_event_loop(place: Place, *args: str) -> subprocess.CompletedProcess[str]:
    """The command as `eagle3-console` runs it, in a Python where importing asyncio fails."""
    script = "import sys\nsys.modules['asyncio'] = None\nfrom console.__main__ import main\nsys.exit(main())"
    argv = [sys.executable, "-c", script, "--workdir", str(place.workdir), ALIAS, *args]
    return subprocess.run(argv, cwd=REPO, env=place.env(), capture_output=True, text=True, timeout=60, check=False)


def test_status_and_kill_through_a_running_multiplexer_need_no_event_loop(place: Place) -> None:
    assert place.cli("status").returncode == 0  # direct (asyncio): it starts the multiplexer
    mux = place.serving()
    run_id = launch_sleeper(place)
    status = without_an_event_loop(place, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert [r["state"] for r in json.loads(status.stdout)["runs"] if r["id"] == run_id] == ["running"]
    killed = without_an_event_loop(place, "kill", run_id)
    assert killed.returncode == 0, killed.stderr
    assert "sent TERM, died" in killed.stdout and place.cli("status", run_id, "--json").stdout.count('"killed"')
    # The agent's refusal is the same one line, and exit code, as the CLI's way gives.
    refused = without_an_event_loop(place, "kill", "no-such-run")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("eagle3-console: ") and len(refused.stderr.splitlines()) == 1
    assert place.multiplexers() == [mux]


def test_no_reuse_makes_its_own_connection_beside_the_shared_one(place: Place) -> None:
    place.cli("status")
    mux = place.serving()
    shared = wait_for(lambda: place.agents() if len(place.agents()) == 1 else None, what="one agent")
    run_id = launch_sleeper(place)
    follower = place.start("--no-reuse", "logs", run_id, "--follow")
    assert first_line(follower) == "started\n"
    own = [pid for pid in place.agents() if pid not in shared]
    assert len(own) == 1 and tcp_links(place.sshd.port, [mux, follower.pid]) == 2  # its own, over its own link
    assert place.cli("kill", run_id).returncode == 0
    assert follower.wait(timeout=60) == 0
    assert place.multiplexers() == [mux]


def test_the_socket_and_its_folder_are_the_users_alone(place: Place) -> None:
    place.cli("status")
    place.serving()
    (sock,) = place.sockets()
    for path, mode in ((place.folder, 0o700), (sock, 0o600), (sock.with_suffix(".lock"), 0o600)):
        st = os.lstat(path)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (mode, os.getuid()), path
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)


@pytest.mark.skipif(os.getuid() != 0 or not Path("/usr/bin/python3").exists(), reason="needs root to be another user")
def test_another_user_cannot_reach_the_socket(place: Place) -> None:
    place.cli("status")
    place.serving()
    probe = f"import socket; socket.socket(socket.AF_UNIX).connect({str(place.sockets()[0])!r})"
    other = subprocess.run(["/usr/bin/python3", "-c", probe], user="nobody", capture_output=True, text=True)
    assert other.returncode != 0 and "PermissionError" in other.stderr  # the folder keeps them out


def test_a_folder_another_user_owns_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, place: Place
) -> None:
    squatted = place.runtime / "eagle3-console"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, 65534, 65534)  # nobody's, made before ours could be
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(place.runtime))
    monkeypatch.setenv("HOME", str(tmp_path))
    chosen = reuse.private_dir()
    assert chosen != squatted
    st = os.lstat(chosen)
    assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700


def test_a_changed_host_key_is_refused_though_a_multiplexer_serves(place: Place, tmp_path: Path) -> None:
    place.home = place.sshd.client_home(tmp_path / "home")
    assert place.cli("status").returncode == 0
    mux = place.serving()
    impostor = keygen(tmp_path / "impostor")  # known_hosts now trusts another key for the host
    (place.home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{place.sshd.port} {impostor}\n")
    done = place.cli("status")
    assert done.returncode == 1 and "CHANGED" in done.stderr  # checked afresh, not answered by the old link
    assert place.multiplexers() == [mux]


def test_a_stale_socket_is_replaced_by_a_new_multiplexer(place: Place) -> None:
    place.cli("status")
    gone = place.serving()
    os.kill(gone, signal.SIGKILL)  # its socket stays behind, nobody listening
    wait_for(lambda: gone not in place.multiplexers(), what="the multiplexer to die")
    assert len(place.sockets()) == 1
    done = place.cli("status")
    assert done.returncode == 0 and done.stderr == ""  # connected directly, without a word
    assert "stale" in place.log()
    new = wait_for(lambda: place.greeter() not in (None, gone) and place.greeter(), timeout=60, what="a new one")
    assert place.multiplexers() == [new]
    again = place.cli("status")
    assert again.returncode == 0 and place.multiplexers() == [new]


def test_a_multiplexer_exits_after_its_idle_time(place: Place) -> None:
    place.idle_s = 1
    assert place.cli("status").returncode == 0
    wait_for(lambda: "exited after 1 s without commands" in place.log(), timeout=60, what="the idle exit")
    assert "serves" in place.log() and not place.sockets()
    wait_for(lambda: not place.multiplexers(), what="its process to end")
    wait_for(lambda: not place.agents(), what="its agent to end with the connection")


def test_a_hung_multiplexer_is_passed_over_and_a_killed_one_mid_follow_is_survived(place: Place) -> None:
    place.cli("status")
    mux = place.serving()
    os.kill(mux, signal.SIGSTOP)  # hung: it takes connections but never greets
    try:
        done = place.cli("status")
        assert done.returncode == 0 and done.stderr == ""
        assert "did not greet" in place.log()
    finally:
        os.kill(mux, signal.SIGCONT)
    done = place.cli("launch", "command", "--", "python3", "-c", TICKER)
    run_id = done.stdout.strip()
    output = place.workdir / "runs" / run_id / "output.log"
    follower = place.start("logs", run_id, "--follow")
    seen = [first_line(follower)]
    written = len(output.read_text().splitlines())
    while int(seen[-1].split()[1]) <= written:  # until a line only the subscription can have brought
        seen.append(first_line(follower))
    os.kill(mux, signal.SIGKILL)  # mid-stream
    assert place.cli("kill", run_id).returncode == 0
    rest, err = follower.communicate(timeout=90)
    assert follower.returncode == 0, err  # it reconnected and saw the run end
    assert "connection lost" in err and f"multiplexer pid {mux}" in err and "reconnected after" in err
    assert "".join(seen) + rest == output.read_text()  # every line once, none lost across the fall-back


def test_a_ctrl_c_of_a_command_leaves_the_multiplexer_serving(place: Place) -> None:
    place.cli("status")
    mux = place.serving()
    run_id = launch_sleeper(place)
    follower = place.start("logs", run_id, "--follow")
    assert first_line(follower) == "started\n"
    os.killpg(follower.pid, signal.SIGINT)  # what the terminal sends to the foreground job
    assert follower.wait(timeout=30) == 0
    assert place.multiplexers() == [mux]
    assert place.cli("kill", run_id).returncode == 0 and place.multiplexers() == [mux]


def test_two_commands_at_once_each_get_their_own_stream(place: Place) -> None:
    place.cli("status")
    place.serving()
    printer = "import time, sys\nfor i in range(40):\n    print(sys.argv[1], i, flush=True)\n    time.sleep(0.05)"
    runs = []
    for word in ("alpha", "beta"):
        done = place.cli("launch", "command", "--", "python3", "-c", printer, word)
        runs.append(done.stdout.strip())
    followers = [place.start("logs", run_id, "--follow") for run_id in runs]
    outputs = [f.communicate(timeout=90) for f in followers]
    for (out, err), word, follower in zip(outputs, ("alpha", "beta"), followers, strict=True):
        assert follower.returncode == 0, err
        assert out.splitlines() == [f"{word} {i}" for i in range(40)]
    assert len(place.multiplexers()) == 1


def test_first_commands_at_once_start_one_multiplexer(place: Place) -> None:
    """Four commands to a host at once, no multiplexer yet: one takes the key's lock, connects directly and starts
    the multiplexer (which inherits the lock); the others wait for it to serve rather than start their own."""
    commands = [
        subprocess.Popen(place.argv("status"), cwd=REPO, env=place.env(), stdout=subprocess.DEVNULL) for _ in range(4)
    ]
    assert [c.wait(timeout=120) for c in commands] == [0, 0, 0, 0]
    mux = place.serving()
    assert place.log().count("started multiplexer") == 1
    assert place.multiplexers() == [mux]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(place.sockets()[0]))
        assert json.loads(sock.makefile().readline()) == {"multiplexer": {"pid": mux}}
    lock = place.sockets()[0].with_suffix(".lock")
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600


def test_another_workdir_is_another_connection(place: Place, tmp_path: Path) -> None:
    place.cli("status")
    first = place.serving()
    other = Place(place.sshd, place.runtime, tmp_path / "other")
    other.cli("status")
    wait_for(lambda: len(place.sockets()) == 2, timeout=60, what="a second multiplexer")
    assert first in place.multiplexers() and len(place.multiplexers()) == 2


def test_a_hung_multiplexer_found_by_the_quick_way_is_waited_for_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quick way (`console.cli.quick`) and then the CLI's way run in one process: the second takes the first's
    finding rather than wait for the same greeting again. Real: the socket, the agent of `local`'s transport."""
    runtime = Path(tempfile.mkdtemp(prefix="e3q", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(reuse, "GREETING_TIMEOUT_S", 0.2)
    monkeypatch.setattr(reuse, "passed_over", {})
    workdir = tmp_path / "work"
    target = reuse.Target("gpu-host", str(workdir), None)
    with socket.socket(socket.AF_UNIX) as hung:
        hung.bind(str(reuse.socket_path(target)))
        hung.listen(8)  # it takes connections and never greets, as a stopped multiplexer does
        assert quick.answer(["--workdir", str(workdir), "gpu-host", "status"]) is None

        async def connect() -> None:
            transport = ReusingTransport(target, lambda: LocalTransport(workdir))
            await transport.open()
            await transport.close()

        asyncio.run(connect())
        hung.settimeout(0.5)
        hung.accept()[0].close()  # the quick way's connection
        with pytest.raises(TimeoutError):
            hung.accept()  # and no other
    subprocess.run(["rm", "-rf", str(runtime)], check=True)
