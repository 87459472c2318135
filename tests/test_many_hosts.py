"""Several hosts in one command (`console.cli.many_hosts`, issue 13 item 1's CLI): `status`, `watch` and
`free-gpus --dry-run` over `a,b` or a [groups] name of config.toml.

Real: two OpenSSH servers on 127.0.0.1 standing for two hosts (`tests/sshd.py`), each with its own run store,
the CLI in its own process as a user runs it, the agents on the "hosts", runs and signals. A host going down is
its sshd killed with every session it serves.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from console.cli import config
from tests.conftest import REPO, ctrl_c_reaches_it, free_port, kill_runs_of
from tests.sshd import SSHD, Sshd, home_for, start_sshd
from tests.tmux import Tmux
from tests.train_fixtures import job_words, worker_of

SLEEPER = "import time\ntime.sleep(600)"


@dataclass
class Client:
    """A user's machine: its HOME (ssh config, known_hosts, config.toml) and runtime folder (multiplexers)."""

    home: Path
    runtime: Path

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        return {**env, "HOME": str(self.home), "XDG_RUNTIME_DIR": str(self.runtime), "XDG_CONFIG_HOME": ""}

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "console", *args]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args), cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=120, check=False
        )


@dataclass
class Laptop(Client):
    """A user's machine that knows two hosts, `a` and `b` (and the group `lab` of both)."""

    servers: dict[str, Sshd]

    def launch(self, host: str) -> str:
        done = self.cli(host, "launch", "command", "--", "python3", "-c", SLEEPER)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def bring_up(self, host: str) -> None:
        """The host's sshd again, on its port with its keys (the host is back)."""
        server = self.servers[host]
        config = Path(server.home).parent / "server" / "sshd_config"
        server.process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL)

    def take_down(self, host: str) -> None:
        """The host's sshd and every session it serves, gone (a host powered off, as its clients see it)."""
        master = self.servers[host].process.pid
        doomed = {master}
        grew = True
        while grew:
            grew = False
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit() and int(entry.name) not in doomed:
                    try:
                        ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    except (OSError, IndexError, ValueError):
                        continue
                    if ppid in doomed:
                        doomed.add(int(entry.name))
                        grew = True
        for pid in doomed - {master}:
            with contextlib.suppress(ProcessLookupError):  # a session that ended between the scan and now
                os.kill(pid, signal.SIGKILL)
        self.servers[host].process.kill()
        self.servers[host].process.wait()


@pytest.fixture
def laptop(tmp_path: Path) -> Iterator[Laptop]:
    if not SSHD.is_file():
        pytest.skip(f"{SSHD} is missing: `make test` installs openssh-server")
    servers = {name: start_sshd(tmp_path / f"sshd-{name}") for name in ("a", "b")}
    home = home_for(tmp_path / "laptop", {f"gpu-{name}": server for name, server in servers.items()})
    settings = home / ".config" / "eagle3-console" / "config.toml"
    settings.parent.mkdir(parents=True)
    settings.write_text(
        "".join(f'[hosts.{n}]\naddress = "gpu-{n}"\nworkdir = "{tmp_path / n}"\n' for n in servers)
        + '[groups]\nlab = ["a", "b"]\nsolo = ["a"]\n'
    )
    runtime = Path(tempfile.mkdtemp(prefix="e3m", dir="/tmp"))  # short: socket paths must fit in 108 bytes
    yield Laptop(home, runtime, servers)
    kill_runs_of(*(tmp_path / name for name in servers))  # the hosts' runs go with the test, as a workdir's do
    subprocess.run(["pkill", "-TERM", "-f", f"console.link.multiplexer --socket {runtime}"], check=False)
    for server in servers.values():
        if server.process.poll() is None:
            server.stop()
    subprocess.run(["rm", "-rf", str(runtime)], check=True)


def test_status_over_a_group_shows_each_host_and_its_json_marks_every_run(laptop: Laptop) -> None:
    runs = {host: laptop.launch(host) for host in ("a", "b")}
    text = laptop.cli("lab", "status")
    assert text.returncode == 0, text.stderr
    a, b = text.stdout.split("\n\n== b\n")
    assert a.startswith("== a\n") and runs["a"] in a and runs["b"] not in a
    assert runs["b"] in b and runs["a"] not in b
    alone = json.loads(laptop.cli("solo", "status", "--json").stdout)  # a group of one: the same shape
    assert [(h["host"], [r["id"] for r in h["result"]["runs"]]) for h in alone["hosts"]] == [("a", [runs["a"]])]
    listed = laptop.cli("a,b", "status", "--json")
    hosts = json.loads(listed.stdout)["hosts"]
    assert [(h["host"], h["ok"]) for h in hosts] == [("a", True), ("b", True)]
    for host in hosts:
        assert [(r["id"], r["host"]) for r in host["result"]["runs"]] == [(runs[host["host"]], host["host"])]


def test_a_host_that_cannot_be_reached_fails_the_exit_code_and_hides_no_other(laptop: Laptop) -> None:
    run = laptop.launch("a")
    laptop.take_down("b")
    text = laptop.cli("lab", "status")
    assert text.returncode == 1
    assert run in text.stdout and "== b: cannot be reached:" in text.stdout
    hosts = json.loads(laptop.cli("lab", "status", "--json").stdout)["hosts"]
    assert hosts[0]["ok"] and not hosts[1]["ok"] and hosts[1]["error"]
    plans = laptop.cli("lab", "free-gpus", "--dry-run")
    assert plans.returncode == 1 and "== a\nno GPUs found" in plans.stdout and "== b: cannot be reached" in plans.stdout


def test_a_job_with_a_node_on_a_host_out_of_reach_is_unknown_never_running(laptop: Laptop) -> None:
    done = laptop.cli("a", "launch", "command", "--job", "j1", "--node-rank", "0", "--nnodes", "2", "--", "true")
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 60
    while json.loads(laptop.cli("a", "status", "--json").stdout)["runs"][0]["state"] != "exited":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    laptop.take_down("b")
    text = laptop.cli("lab", "status")
    assert text.returncode == 1
    line = text.stdout.splitlines()[1]
    assert line.startswith("job j1  unknown (b unreachable since ") and line.endswith("; last seen: exited)  1/2 nodes")
    [job] = json.loads(laptop.cli("lab", "status", "--json").stdout)["jobs"]
    assert job["state"] == "unknown" and job["detail"].endswith("; last seen: exited"), job


def lines_of(stream: IO[str]) -> queue.Queue[str]:
    """The stream's lines as they come, read in a thread (a test waits for one with a timeout, never forever)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def next_line(lines: queue.Queue[str], wanted: str, timeout: float = 60) -> str:
    """The next line that holds `wanted` (those before it are passed over)."""
    while True:
        line = lines.get(timeout=timeout)
        if wanted in line:
            return line


def test_watch_over_two_hosts_goes_on_while_one_is_down_and_picks_it_up_again(laptop: Laptop) -> None:
    runs = {host: laptop.launch(host) for host in ("a", "b")}
    watch = subprocess.Popen(
        laptop.argv("lab", "watch", "--interval", "0.3", "--json"), cwd=REPO, env=laptop.env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=ctrl_c_reaches_it,
    )  # fmt: skip
    assert watch.stdout is not None and watch.stderr is not None
    changes, said = lines_of(watch.stdout), lines_of(watch.stderr)
    try:
        first = [json.loads(changes.get(timeout=60)) for _ in runs]  # every run once, marked first
        assert sorted((line["run"]["host"], line["run"]["id"]) for line in first) == sorted(runs.items())
        laptop.take_down("b")
        next_line(said, "b: connection lost")
        assert laptop.cli("a", "kill", runs["a"]).returncode == 0
        change = json.loads(changes.get(timeout=60))  # while b is down, a's changes come
        assert (change["run"]["host"], change["run"]["id"], change["to"]) == ("a", runs["a"], "killed")
        laptop.bring_up("b")
        next_line(said, "b: reconnected after")
        assert laptop.cli("b", "kill", runs["b"]).returncode == 0
        change = json.loads(changes.get(timeout=60))
        assert (change["run"]["host"], change["run"]["id"], change["to"]) == ("b", runs["b"], "killed")
    finally:
        os.killpg(watch.pid, signal.SIGINT)
        watch.wait(timeout=30)


def test_commands_of_one_host_refuse_several_in_one_line(laptop: Laptop) -> None:
    for words, said in (
        (["lab", "logs", "r1"], "logs works on one host"),
        (["a,b", "free-gpus", "--yes"], "free-gpus kills on one host at a time"),
        (["a,b", "status", "r1"], "status RUN names a run of one host"),
        (["a,,b", "status"], "empty host name"),
        (["a,a", "status"], "names a twice"),
    ):
        done = laptop.cli(*words)
        assert (done.returncode, done.stdout) == (2, ""), words
        assert said in done.stderr and len(done.stderr.splitlines()) == 1


NAMES = st.text(alphabet="ab,-.@:", max_size=12)


@given(NAMES)
def test_a_host_list_is_its_names_each_once_or_refused(text: str) -> None:
    try:
        hosts = config.Config(Path("config.toml")).expand(text)
    except config.ConfigError as exc:
        assert "," in text and str(exc)
        return
    assert hosts == ([text] if "," not in text else text.split(","))
    assert all(hosts) or hosts == [""]
    assert len(set(hosts)) == len(hosts)


def test_a_group_must_be_a_list_of_distinct_hosts(tmp_path: Path) -> None:
    for table, said in (
        ('lab = "a"', "must be a list of hosts"),
        ('lab = ["a", "a"]', "each once"),
        ("lab = []", "must be a list of hosts"),
        ('local = ["a"]', "cannot name a group"),
    ):
        path = tmp_path / "config.toml"
        path.write_text(f"[groups]\n{table}\n")
        with pytest.raises(config.ConfigError, match=said):
            config.load(path)
    path.write_text('[groups]\nlab = ["a", "b"]\n')
    assert config.load(path).expand("lab") == ["a", "b"]


def test_hosts_lists_the_groups_after_the_hosts(laptop: Laptop) -> None:
    listed = {host["name"]: host for host in json.loads(laptop.cli("hosts", "--json").stdout)}
    assert (listed["lab"]["address"], listed["lab"]["source"]) == ("a,b", "group")
    assert list(listed)[-2:] == ["lab", "solo"] and "lab" in laptop.cli("hosts").stdout


def metric_rows(laptop: Laptop, host: str, run: str) -> list[dict[str, Any]]:
    done = laptop.cli(host, "metrics", run, "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def job_of(laptop: Laptop, job: str) -> dict[str, Any]:
    listed = json.loads(laptop.cli("lab", "status", "--json").stdout)["jobs"]
    return next(found for found in listed if found["id"] == job)


def test_a_two_node_training_job_trains_on_both_hosts_checkpoints_and_shows_as_one_job(
    laptop: Laptop, tmp_path: Path
) -> None:
    words = job_words(tmp_path, "--steps", "4", "--log-every", "1", "--eval-every", "4", "--save-every", "2")
    done = laptop.cli("lab", "train", "--nodes", "2", "--follow", *words)
    assert done.returncode == 0, done.stderr[-3000:]
    job = done.stdout.splitlines()[0]
    assert "a: node 0: run " in done.stderr and "b: node 1: run " in done.stderr
    # --follow follows node 0 to its end; node 1 ends on its own a moment later.
    deadline = time.monotonic() + 30
    while (found := job_of(laptop, job))["state"] == "running":
        assert time.monotonic() < deadline, found
        time.sleep(0.2)
    rows = metric_rows(laptop, "a", found["nodes"][0]["run"])  # global rank 0 is node 0's: it writes the rows
    assert [row["step"] for row in rows if "loss" in row] == [1, 2, 3, 4]
    assert metric_rows(laptop, "b", found["nodes"][1]["run"]) == []
    assert sorted(p.name for p in (tmp_path / "draft").iterdir()) == ["final", "step-2", "step-4"]
    assert (tmp_path / "draft" / "final" / "model.safetensors").is_file()
    assert (found["state"], found["nnodes"]) == ("exited", 2)
    assert [(n["node_rank"], n["host"], n["state"]) for n in found["nodes"]] == [(0, "a", "exited"), (1, "b", "exited")]
    text = laptop.cli("lab", "status").stdout
    assert text.startswith(f"== jobs\njob {job}  exited  2/2 nodes\n  node 0  a  ")
    b_run = found["nodes"][1]["run"]
    argv = json.loads(laptop.cli("b", "status", b_run, "--json").stdout)["argv"]
    assert "--node-rank=1" in argv and "--nnodes=2" in argv  # node ranks in host order: b is node 1


def test_a_job_needs_a_host_per_node_and_every_host_up_before_anything_starts(laptop: Laptop, tmp_path: Path) -> None:
    words = job_words(tmp_path, "--steps", "2")
    one = laptop.cli("a", "train", "--nodes", "2", *words)
    assert one.returncode == 2 and "give 2 hosts" in one.stderr and len(one.stderr.splitlines()) == 1
    bare = laptop.cli("lab", "train", *words)
    assert bare.returncode == 2 and "is a job: give --nodes N" in bare.stderr
    laptop.take_down("b")
    down = laptop.cli("lab", "train", "--nodes", "2", *words)
    assert down.returncode == 1 and "nothing launched" in down.stderr
    assert json.loads(laptop.cli("a", "status", "--json").stdout)["runs"] == []


def test_a_job_with_a_frozen_rank_is_stalled_as_a_job_naming_it_and_one_kill_stops_every_node(
    laptop: Laptop, tmp_path: Path
) -> None:
    words = job_words(tmp_path, "--steps", "1000000", "--log-every", "1", "--save-every", "0", "--eval-every", "0")
    done = laptop.cli("lab", "train", "--nodes", "2", "--stall-after", "5", *words)
    assert done.returncode == 0, done.stderr[-3000:]
    job = done.stdout.splitlines()[0]
    deadline = time.monotonic() + 120
    while len(metric_rows(laptop, "a", job_of(laptop, job)["nodes"][0]["run"])) < 3:  # both nodes training
        assert time.monotonic() < deadline, laptop.cli("lab", "status").stdout
        time.sleep(0.5)
    found = job_of(laptop, job)
    assert found["state"] == "running", found
    frozen = worker_of(found["nodes"][1]["run"], rank=1)
    os.kill(frozen, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        # Each host's watch calls its own node stalled, node 0 (waiting on the frozen rank) often first: within a
        # few seconds of the job being stalled, its story leads with the stopped rank.
        while not (
            (found := job_of(laptop, job))["state"] == "stalled"
            and found["detail"].startswith("node 1 (b): rank 1 stopped")
        ):
            assert time.monotonic() - stopped_at < 60, found
            time.sleep(0.5)
        took = time.monotonic() - stopped_at
        print(f"frozen rank named in the job's stall after {took:.1f} s (window 5 s)")
        assert "node 0 (a): rank 0 " in found["detail"]
        text = laptop.cli("lab", "status").stdout
        assert f"job {job}  stalled  2/2 nodes  node 1 (b): rank 1 stopped" in text
        killed = laptop.cli("lab", "kill", job, "--grace", "2")
        assert killed.returncode == 0, killed.stderr
        assert "== a\nrun " in killed.stdout and "== b\nrun " in killed.stdout
        assert [n["state"] for n in job_of(laptop, job)["nodes"]] == ["killed", "killed"]
        assert job_of(laptop, job)["state"] == "killed"
        again = laptop.cli("lab", "kill", job)
        assert again.returncode == 1 and f"no live run of job {job}" in again.stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(frozen, signal.SIGKILL)


def test_a_two_node_serve_meets_at_node_0_is_ready_when_node_0_is_and_one_kill_ends_both(
    laptop: Laptop, tmp_path: Path
) -> None:
    """SGLang's own multi-node over two hosts; the server is the stand-in (tests/sglang_standin.py: node 0 waits at
    --dist-init-addr for the other node, which serves no HTTP and ignores SIGTERM, as 0.5.23's followers do)."""
    from tests.draft_fixtures import good_draft
    from tests.draft_fixtures import write_target as draft_target

    target, draft = draft_target(tmp_path / "target"), good_draft(tmp_path / "draft")
    env = f"PYTHONPATH={REPO / 'tests' / 'fake_sglang'}:{REPO}"
    words = [str(target), str(draft), "--port", str(free_port()), "--python", sys.executable, "--env", env]
    done = laptop.cli("lab", "serve", *words, "--nodes", "2", "--follow")
    assert done.returncode == 0, done.stderr[-3000:]
    job = done.stdout.splitlines()[0]
    assert done.stdout.splitlines()[-1].endswith("state ready") and "SGLang's --dist-init-addr" in done.stderr
    found = job_of(laptop, job)
    assert (found["state"], [n["host"] for n in found["nodes"]]) == ("ready", ["a", "b"])
    infos = [json.loads(laptop.cli(n["host"], "status", n["run"], "--json").stdout) for n in found["nodes"]]
    for rank, info in enumerate(infos):
        at = info["argv"].index("--nnodes")
        assert info["argv"][at : at + 5] == ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr"]
    assert infos[0]["health"] == "ok" and infos[1]["health"] is None  # node 0 alone serves HTTP
    killed = laptop.cli("lab", "kill", job, "--grace", "3")
    assert killed.returncode == 0, killed.stderr
    assert job_of(laptop, job)["state"] in ("killed", "exited")
    assert all(n["state"] in ("killed", "exited") for n in job_of(laptop, job)["nodes"])


def test_relaunch_of_a_job_stops_every_node_then_starts_each_with_the_same_edit(laptop: Laptop, tmp_path: Path) -> None:
    words = job_words(tmp_path, "--steps", "1000000", "--log-every", "1", "--save-every", "0", "--eval-every", "0")
    done = laptop.cli("lab", "train", "--nodes", "2", *words)
    assert done.returncode == 0, done.stderr[-3000:]
    job = done.stdout.splitlines()[0]
    old = [node["run"] for node in job_of(laptop, job)["nodes"]]
    preview = laptop.cli("lab", "relaunch", job, "--set", "--lr=0.01", "--dry-run")
    assert preview.returncode == 0, preview.stderr
    assert preview.stdout.count("--lr 0.01") == 2 and "== a: node 0\n" in preview.stdout
    assert [n["run"] for n in job_of(laptop, job)["nodes"]] == old  # a preview stops and starts nothing
    again = laptop.cli("lab", "relaunch", job, "--set", "--lr=0.01", "--grace", "2")
    assert again.returncode == 0, again.stderr
    assert "a: node 0: run " in again.stderr and f"(from {old[1]})" in again.stderr
    found = job_of(laptop, job)
    new = [node["run"] for node in found["nodes"]]
    assert set(new).isdisjoint(old) and found["state"] in ("starting", "running")
    deadline = time.monotonic() + 120
    while len(metric_rows(laptop, "a", new[0])) < 2:  # the new nodes met and train
        assert time.monotonic() < deadline, laptop.cli("lab", "status").stdout
        time.sleep(0.5)
    for host, run, parent in zip("ab", new, old, strict=True):
        argv = json.loads(laptop.cli(host, "status", run, "--json").stdout)["argv"]
        assert argv[argv.index("--lr") + 1] == "0.01"
        assert json.loads(laptop.cli(host, "status", parent, "--json").stdout)["state"] == "killed"
    assert laptop.cli("lab", "kill", job, "--grace", "2").returncode == 0


def launch_node(laptop: Laptop, host: str, job: str, rank: int) -> str:
    """A node of a job of the user's own command (a sleeper), on `host`."""
    node = ["--job", job, "--node-rank", str(rank), "--nnodes", "2"]
    done = laptop.cli(host, "launch", "command", "--name", f"node{rank}", *node, "--", "python3", "-c", SLEEPER)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("size", [(100, 30), (160, 48)])
def test_the_console_over_two_hosts_keeps_one_while_the_other_is_down_and_relaunches_and_kills_a_job_whole(
    laptop: Laptop, size: tuple[int, int]
) -> None:
    """The real console in tmux over two real sshd hosts: a HOST column, one host's link down said in a banner
    while the other's runs stay, the job's state in the detail, `r` on a node relaunching the job on both hosts
    and `k` on a node killing it on both."""
    nodes = {host: launch_node(laptop, host, "sweep-1", rank) for rank, host in enumerate("ab")}
    with Tmux(laptop.argv("lab"), width=size[0], height=size[1], env=laptop.env(), cwd=REPO) as term:

        def table(screen: str) -> list[list[str]]:  # the runs table's rows: left of the detail panel
            return [line.split("│")[0].split() for line in screen.splitlines() if "│" in line]

        def node_rows(screen: str) -> list[list[str]]:  # the nodes' runs shown under the job's line
            return [row for row in table(screen) if "└" in row]

        line = term.wait_for(lambda s: next((row for row in table(s) if row[:1] == ["a,b"]), []), 60, "the job's line")
        assert "running" in line and not node_rows(term.screen())  # one line for the job, folded
        assert table(term.screen())[0][0] == "HOST"
        term.send("Enter")
        rows = term.wait_for(lambda s: node_rows(s) if len(node_rows(s)) == 2 else [], 30, "the job's nodes")
        assert [row[0] for row in rows] == ["a", "b"]  # each node's run under its host
        job_said = "job sweep-1: node 0 of 2 · running"  # the job's line shows node 0's run
        term.wait_for(lambda s: job_said in s, 30, "the job's state in the detail")
        laptop.take_down("b")
        term.wait_for(lambda s: "b: cannot reach" in s and "reconnecting on its" in s, 60, "b's link said to be down")
        shown = node_rows(term.screen())
        assert [(row[0], row[1] == "(down)") for row in shown] == [("a", False), ("b", True)]  # b's as last seen
        laptop.bring_up("b")
        term.wait_for(lambda s: "reconnecting on its" not in s, 90, "b back")
        term.send("r")  # a node of a job: the whole job relaunches, every node with the same edit
        term.wait_for(lambda s: "Relaunch run" in s, 30, "the relaunch dialog")
        term.write("--again=1")
        term.send("Enter")
        term.wait_for(lambda s: "Relaunch job sweep-1 on every node?" in s, 60, "the job's preview")
        term.send("y")
        deadline = time.monotonic() + 60
        while set(relaunched := [n["run"] for n in job_of(laptop, "sweep-1")["nodes"]]) & set(nodes.values()):
            assert time.monotonic() < deadline, (relaunched, term.screen())
            time.sleep(0.5)
        assert [json.loads(laptop.cli(h, "status", r, "--json").stdout)["state"] for h, r in nodes.items()] == [
            "killed",
            "killed",
        ]
        tails = [run[-4:] for run in relaunched]  # the RUN column keeps the end of the id

        def new_nodes_running(screen: str) -> bool:  # not the killed ones, however recently they said running
            rows = [" ".join(row) for row in node_rows(screen)]
            return all(any(tail in row and "running" in row for row in rows) for tail in tails)

        term.wait_for(new_nodes_running, 60, "the new nodes in view")
        term.send("k")
        term.wait_for(lambda s: "Send SIGTERM to job sweep-1: its 2 live node runs (a, b)?" in s, 30, "the job dialog")
        term.send("y")
        deadline = time.monotonic() + 60
        while (found := job_of(laptop, "sweep-1"))["state"] != "killed":
            assert time.monotonic() < deadline, (found, term.screen())
            time.sleep(0.5)
    assert [(n["host"], n["run"], n["state"]) for n in found["nodes"]] == [
        ("a", relaunched[0], "killed"),
        ("b", relaunched[1], "killed"),
    ]
