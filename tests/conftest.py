"""Shared fixtures: a run store, the CLI as a real subprocess, and a live agent client."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import settings
from textual.message import Message
from textual.notifications import Notification, Notify

from console.link.client import AgentClient
from console.link.local import LocalTransport
from tests.fake_nvml import gpu, write_state

REPO = Path(__file__).resolve().parent.parent

# CI gets one try per change, so property tests there draw the same examples every run;
# `HYPOTHESIS_PROFILE=explore make test` draws fresh ones, to look for new failures. No per-example deadline:
# on a loaded 2-core machine an example of a test that reads a real log took 395 ms against the default 200 ms
# and failed as "flaky"; how fast a parser is is the benchmarks' to say.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test (and every agent it starts) keeps its caches to itself."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """The real-SGLang tier's interpreter (SGLang 0.5.23 importable on CPU), named by EAGLE3_SGLANG_PYTHON.

    `make test` always installs it and names it, so in CI this never skips; a name that is not an
    interpreter fails rather than skips."""
    named = os.environ.get("EAGLE3_SGLANG_PYTHON")
    if not named:
        pytest.skip("EAGLE3_SGLANG_PYTHON is not set: `make test` installs the real-SGLang tier and sets it")
    path = Path(named)
    if not os.access(path, os.X_OK):
        pytest.fail(f"EAGLE3_SGLANG_PYTHON={named} is not an interpreter: run `make .sglang-real/.installed`")
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """The run store of one test; whatever runs it started are killed afterwards, even when the test failed."""
    path = tmp_path / "work"
    yield path
    kill_runs_of(path)


def kill_runs_of(*stores: Path) -> None:
    """Kill whatever runs of these run stores still live (a test's teardown, even when the test failed)."""
    from backends.host import procinfo
    from backends.protocol import ENV_RUN_ID
    from backends.runs import control as runctl
    from backends.runs.store import RunStore

    present = [path for path in stores if (path / "runs").is_dir()]
    if not present:
        return
    # A run with no child recorded has live processes only if one carries its id in its environment: one read
    # of each process's environment here, not one per run (a store of 600 runs took 20 s to look over).
    marked = {procinfo.environ_value(stat.pid, ENV_RUN_ID) for stat in procinfo.live_stats()}
    for path in present:
        for run in RunStore(path).all():
            if (run.child() is not None or run.id in marked) and runctl.has_live_processes(run):
                try:
                    runctl.kill(run, "KILL", 0)
                except runctl.OpError as error:
                    # The run may end between the look and the kill (a CI teardown raced a one-line child).
                    if error.code != "not_running":
                        raise


@contextlib.contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's `1m`, `2m`) at `mount`, the test's own, to fill; unmounted afterwards."""
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of the test's own, to fill (an agent's files take about 3 MB)."""
    with tmpfs(tmp_path / "small", "1m") as mount:
        yield mount


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real OpenSSH server on 127.0.0.1 (installed by `make test`), and a client HOME that trusts it."""
    from tests.sshd import SSHD, start_sshd

    if not SSHD.is_file():
        pytest.skip(f"{SSHD} is missing: `make test` installs openssh-server")
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def nvml_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Route every agent started by this test to the NVML double, with one idle GPU."""
    path = write_state(tmp_path / "nvml.json", [gpu(power_w=70.0)])
    monkeypatch.setenv("EAGLE3_NVML_MODULE", "tests.fake_nvml")
    monkeypatch.setenv("FAKE_NVML_STATE", str(path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return path


CLI = Callable[..., subprocess.CompletedProcess[bytes]]


@pytest.fixture
def cli(workdir: Path, nvml_state: Path) -> CLI:
    """Run `eagle3-console --workdir W local ARGS...` as a real process."""

    def run(*args: str, timeout: float = 60, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "console", "--workdir", str(workdir), "local", *args],
            capture_output=True,
            timeout=timeout,
            input=input,
            check=False,
        )

    run.workdir = workdir  # type: ignore[attr-defined]  # wait_state looks at the store before asking the CLI
    return run


@pytest.fixture
async def client(workdir: Path, nvml_state: Path) -> AsyncIterator[AgentClient]:
    agent = AgentClient(LocalTransport(workdir))
    await agent.start()
    try:
        yield agent
    finally:
        await agent.close()


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """The predicate's first true value, asked every 50 ms; a costly predicate (a CLI and its agent: ~0.4 s of CPU)
    waits as long as it took between asks, so that a wait keeps at most half a core busy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        asked = time.monotonic()
        value = predicate()
        if value:
            return value
        time.sleep(max(0.05, time.monotonic() - asked))
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def remove_live_folder(folder: Path, timeout: float = 10.0) -> None:
    """Removes a run folder whose supervisor may still rename a record into it meanwhile: one `rmtree` can list
    a temp file that is renamed away before it is unlinked, and fail."""

    def removed() -> bool:
        shutil.rmtree(folder, ignore_errors=True)
        return not folder.exists()

    wait_for(removed, timeout, f"{folder} removed")


def run_state(workdir: Path, run_id: str) -> str:
    from backends.runs.store import RunStore

    return RunStore(workdir).get(run_id).state()


SLEEPER = "import time; time.sleep(60)"
Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start child processes (a sleeping python by default); each is killed when the test ends."""
    children: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str] | None = None, **popen: Any) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(argv or [sys.executable, "-c", SLEEPER], **popen)
        children.append(child)
        return child

    try:
        yield start
    finally:
        for child in children:
            child.kill()
            child.wait()


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Ops this small gain nothing from intra-op threads, and spinning threads stall badly on a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo target (tiny, random, built locally), shared by the extraction tests."""
    from backends import demo_target

    return demo_target.write_demo_target(tmp_path_factory.mktemp("demo") / "target")


@pytest.fixture(scope="session")
def model(target: Path) -> Any:
    """The demo target loaded with transformers, for direct hidden-state computations."""
    from transformers import AutoModelForCausalLM

    loaded: Any = AutoModelForCausalLM.from_pretrained(target)
    return loaded.eval()


def launch(cli: CLI, *args: str) -> str:
    result = cli("launch", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.decode().strip()


def status(cli: CLI) -> dict:  # type: ignore[type-arg]
    result = cli("status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def run_info(cli: CLI, run_id: str) -> dict:  # type: ignore[type-arg]
    return next(r for r in status(cli)["runs"] if r["id"] == run_id)


def wait_state(cli: CLI, run_id: str, states: set[str], timeout: float = 20) -> dict:  # type: ignore[type-arg]
    """The run's `status --json` entry once the CLI says one of `states`. Where the CLI's store is known, the store
    is looked at first (in this process, a millisecond) and the CLI asked once it agrees: a CLI and its agent every
    50 ms would keep a core busy for the whole wait."""
    workdir: Path | None = getattr(cli, "workdir", None)

    def store_says() -> str | None:
        try:
            return run_state(workdir, run_id) if workdir is not None else None
        except Exception:  # a run removed, a record torn: the CLI says what it makes of it
            return None

    def said() -> dict | Literal[False]:  # type: ignore[type-arg]
        if (seen := store_says()) is not None and seen not in states:
            return False
        return (info := run_info(cli, run_id))["state"] in states and info

    return wait_for(said, timeout, f"state {states}")  # type: ignore[no-any-return]


class Notes(list[Notification]):
    """The console's notifications, as they are posted: pass the object as run_test's `message_hook`."""

    def __call__(self, message: Message) -> None:
        if isinstance(message, Notify):
            self.append(message.notification)


async def until(pilot: Any, predicate: Callable[[], Any], timeout: float = 20, what: str = "") -> Any:
    for _ in range(int(timeout / 0.1)):
        value = predicate()
        if value:
            return value
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def ctrl_c_reaches_it() -> None:
    """preexec_fn of a child that a test stops with Ctrl-C (SIGINT): SIGINT at its default, as in a terminal's
    foreground job. A shell ignores SIGINT in its background jobs and everything they start, so a suite run
    with `&` would otherwise start children that Ctrl-C cannot stop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_port() -> int:
    """A loopback port nobody listens on right now (for a stand-in server, or a host that does not answer)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
