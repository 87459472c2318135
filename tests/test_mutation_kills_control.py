"""What benchmarks/mutation.sh found no test of in runs/control.py: what a relaunch answers of the run it
replaced, which run free-gpus attributes a GPU process to, the spec a launch's arguments make, the refusals of a
launch (its code and line: arguments that make no sense, a stage's missing Python, the agent's files changed since
it started, a disk that fills as the launch is recorded), a kill refused for processes that became another
user's, stack dumps of an ended run, and a GPU process attributed to its run by process group. The real run engine
(launch, its supervisor, kill), real processes."""

from __future__ import annotations

import copy
import errno
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from backends import PACKAGE_ROOT, shipped
from backends.host import procinfo
from backends.protocol import OPS
from backends.runs import control as runctl
from backends.runs.store import RunDir, RunSpec, RunStore, StoreError
from tests.conftest import wait_for
from tests.draft_fixtures import HIDDEN, good_draft, write_target
from tests.test_faults_processes import CLEANUP_ON_TERM, fill

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def launched(store: RunStore, argv: list[str]) -> RunDir:
    return store.get(runctl.launch(store, RunSpec(kind="command", argv=argv))["run"])


def test_a_relaunch_names_the_run_it_replaced_and_what_stopping_it_did(workdir: Path) -> None:
    store = RunStore(workdir)
    parent = launched(store, SLEEP)
    child = wait_for(parent.child, 20, "the parent's child")
    result = runctl.relaunch(store, parent.id, [], [], grace=10)
    assert result["parent"] == parent.id and result["run"] != parent.id
    assert result["stopped_parent"] is not None and result["stopped_parent"]["run"] == parent.id
    assert not procinfo.is_alive(child)
    assert store.get(result["run"]).spec().parent == parent.id


def test_gpu_processes_are_attributed_to_the_live_runs_only(workdir: Path) -> None:
    store = RunStore(workdir)
    ended = launched(store, [sys.executable, "-c", "pass"])
    wait_for(ended.exit, 20, "the first run's exit")
    live = launched(store, SLEEP)
    child = wait_for(live.child, 20, "the live run's child")
    assert runctl.owner_lookup(store) == {child.pid: live.id}


def test_kill_records_its_signal_as_kills_and_an_ended_run_is_refused_as_not_running(workdir: Path) -> None:
    store = RunStore(workdir)
    run = launched(store, SLEEP)
    wait_for(run.child, 20, "the child")
    runctl.kill(run, "TERM", 10)
    signals = [e for e in run.events() if e["type"] == "signal"]
    assert [(e["signal"], e["by"]) for e in signals] == [("TERM", "kill")]
    wait_for(run.exit, 20, "exit.json")
    with pytest.raises(runctl.OpError) as refused:
        runctl.kill(run, "TERM", 10)
    assert refused.value.code == "not_running"
    assert refused.value.message == f"run {run.id} has no live process (state killed); nothing to kill"


def launch_args(**given: Any) -> dict[str, Any]:
    """A launch request's arguments as the agent receives them, less `force`: the protocol's defaults, then
    `given`."""
    base = {name: copy.deepcopy(default) for name, (_, _, default) in OPS["launch"].items() if name != "force"}
    return {**base, "kind": "command", "argv": ["true"], **given}


def test_a_launch_of_our_stage_records_its_interpreter_folder_name_and_our_package_on_its_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/site/of/the/agent")
    spec = runctl.checked_spec(
        "/home/u", **launch_args(kind="train", module="backends.train", argv=["--steps", "1"], gpus=[0, 1], nproc=2)
    )
    assert spec.argv == [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "-m", "backends.train", "--steps", "1",
    ]  # fmt: skip
    assert spec.env == {"PYTHONPATH": f"{PACKAGE_ROOT}{os.pathsep}/site/of/the/agent"}
    assert (spec.name, spec.cwd, spec.gpus, spec.kind) == ("train", "/home/u", [0, 1], "train")
    # The launch's own PYTHONPATH comes after our package, in place of the agent's.
    own = runctl.checked_spec(
        None, **launch_args(kind="extract", module="backends.extract", python="/opt/py", env={"PYTHONPATH": "/mine"})
    )
    assert own.argv[:3] == ["/opt/py", "-m", "backends.extract"]
    assert own.env == {"PYTHONPATH": f"{PACKAGE_ROOT}{os.pathsep}/mine"}
    monkeypatch.delenv("PYTHONPATH")
    assert runctl.checked_spec(None, **launch_args(kind="train", module="backends.train")).env == {
        "PYTHONPATH": str(PACKAGE_ROOT)
    }


def test_a_users_command_keeps_what_it_was_given_and_is_named_for_its_program() -> None:
    given = launch_args(
        argv=["/opt/tools/run.sh", "--fast"],
        env={"A": "1"},
        cwd="/srv",
        gpus=[2],
        health_url="http://127.0.0.1:1/health",
        metrics_url="http://127.0.0.1:1/metrics",
        stall_after=30.0,
        launch_id="L1",
    )
    spec = runctl.checked_spec("/home/u", **given)
    assert (spec.argv, spec.env, spec.name, spec.cwd, spec.gpus) == (
        ["/opt/tools/run.sh", "--fast"], {"A": "1"}, "run.sh", "/srv", [2],
    )  # fmt: skip
    assert (spec.health_url, spec.metrics_url, spec.stall_after, spec.launch_id) == (
        "http://127.0.0.1:1/health", "http://127.0.0.1:1/metrics", 30.0, "L1",
    )  # fmt: skip
    assert runctl.checked_spec(None, **{**given, "name": "mine"}).name == "mine"
    assert runctl.checked_spec(None, **launch_args(kind="serve", argv=["sglang"])).name == "serve"


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"argv": []}, "argv must be a non-empty list of strings"),
        ({"gpus": ["x"]}, "gpus must be a list of GPU indices"),
        ({"nproc": 2}, "nproc, python and rendezvous go with one of our modules (extract, train)"),
        ({"python": "/opt/py"}, "nproc, python and rendezvous go with one of our modules (extract, train)"),
        (
            {"module": "backends.nothing"},
            "module 'backends.nothing' is not one of ours: backends.extract, backends.train",
        ),
        (
            {"module": "backends.train", "job": "j", "node_rank": 0, "nnodes": 2},
            "a node of a job of our stages meets the others at a rendezvous: give HOST:PORT",
        ),
    ],
)
def test_a_launch_that_makes_no_sense_is_refused_as_bad_arguments_in_one_line(given: dict[str, Any], said: str) -> None:
    with pytest.raises(runctl.OpError) as refused:
        runctl.checked_spec(None, **launch_args(**given))
    assert (refused.value.code, refused.value.message) == ("bad_args", said)


def test_a_stage_whose_python_is_missing_is_refused_unless_forced(tmp_path: Path) -> None:
    missing = str(tmp_path / "python9")
    spec = RunSpec(kind="train", argv=[missing, "-m", "backends.train", "--steps", "1"])
    with pytest.raises(runctl.OpError) as refused:
        runctl.gate(spec, force=False)
    assert refused.value.code == "python_unfit"
    assert refused.value.message == (
        f"{missing} is not a Python on the host: give --python PATH, the host's Python that has torch "
        "(pip install 'eagle3-console[train]' into it)"
    )
    assert runctl.gate(spec, force=True) == {"flags": None, "doctor": None}


def test_a_launch_after_the_agents_files_changed_starts_nothing_and_says_how_to_restore_them(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record of a verified upload (what the launcher hands the agent) adopted for real, of a folder whose
    one file is then removed."""
    monkeypatch.setattr(shipped, "_verified", None)
    top = tmp_path / "agent"
    top.mkdir()
    (top / "mod.py").write_text("")
    st = (top / "mod.py").stat()
    facts = [st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    record = tmp_path / "verified.json"
    record.write_text(json.dumps({"top": str(top), "entries": {"mod.py": ["0" * 64, *facts]}}))
    shipped.adopt(os.open(record, os.O_RDONLY))
    (top / "mod.py").unlink()
    store = RunStore(workdir)
    with pytest.raises(runctl.OpError) as refused:
        runctl.launch(store, RunSpec(kind="command", argv=SLEEP))
    assert refused.value.code == "agent_altered"
    assert refused.value.message == (
        "the agent's files on the host changed since it started (mod.py is missing); nothing was launched: connect "
        "again and the console restores them (from the command line: --no-reuse)"
    )
    assert store.all() == []


TURNS_NOBODY_ON_TERM = """
import os, signal, time
def turn_nobody(*_):
    os.setgid(65534)
    os.setuid(65534)
signal.signal(signal.SIGTERM, turn_nobody)
os.fork()
print(os.getpid(), flush=True)
while True:
    time.sleep(1)
"""


def test_processes_that_became_another_users_during_the_grace_are_each_reported_refused_once(workdir: Path) -> None:
    """Two processes of the run that turn into nobody's when told to stop (root's daemons drop privileges so): the
    KILL after the grace is refused for each, since they are ours no more, and the kill says so of each, once."""
    if os.geteuid() != 0:
        pytest.skip("turning into another user needs root; CI runs as root")
    store = RunStore(workdir)
    run = launched(store, [sys.executable, "-c", TURNS_NOBODY_ON_TERM])

    def both() -> list[int] | None:
        printed = sorted(map(int, run.file("output.log").read_text().split()))
        return printed if len(printed) == 2 else None

    pids: list[int] = wait_for(both, 20, "both processes")
    try:
        killed = runctl.kill(run, "TERM", 1)
        assert killed["escalated"]
        assert sorted((r["pid"], r["reason"]) for r in killed["refused"]) == [
            (pid, "belongs to user nobody") for pid in pids
        ]
        assert [(p["pid"], p["signals"], p["died"]) for p in killed["processes"]] == [
            (pid, ["TERM"], False) for pid in pids
        ]
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)


def test_a_launch_whose_first_record_the_full_disk_refuses_starts_nothing_and_leaves_no_run(small_disk: Path) -> None:
    """A real tmpfs with room for exactly one run folder as the store makes it: the run is made, and the disk is
    full when its launch is recorded."""
    store = RunStore(small_disk / "work")

    def free() -> int:
        return os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize

    before = free()
    made = store.create(RunSpec(kind="command", argv=SLEEP))
    room = before - free()
    shutil.rmtree(made.path)
    filler = fill(small_disk)
    os.truncate(filler, filler.stat().st_size - room)
    with pytest.raises(StoreError) as refused:
        runctl.launch(store, RunSpec(kind="command", argv=SLEEP))
    said = str(refused.value)
    assert said.startswith(f"no space left on tmpfs at {small_disk} (")
    assert said.endswith(" bytes free): the run was not launched; free some space or choose another --workdir")
    assert store.ids() == []


def test_stacks_of_an_ended_run_show_its_last_dump_and_a_fresh_one_is_refused_as_no_stacks(workdir: Path) -> None:
    store = RunStore(workdir)
    run = launched(store, SLEEP)
    wait_for(run.child, 20, "the child")
    dumped = runctl.stacks(run, now=True)
    assert [e["by"] for e in run.events() if e["type"] == "stacks"] == ["request"]
    runctl.kill(run, "KILL", 0)
    wait_for(run.exit, 20, "exit.json")
    assert runctl.stacks(run, now=False) == dumped
    with pytest.raises(runctl.OpError) as refused:
        runctl.stacks(run, now=True)
    assert (refused.value.code, refused.value.message) == ("no_stacks", f"run {run.id} has no live process to dump now")
    never = launched(store, [sys.executable, "-c", "pass"])
    wait_for(never.exit, 20, "the second run's exit")
    with pytest.raises(runctl.OpError) as nothing:
        runctl.stacks(never, now=False)
    assert (nothing.value.code, nothing.value.message) == (
        "no_stacks",
        f"run {never.id} has no live process and no stack dump",
    )


def test_a_gpu_process_is_the_runs_by_its_process_group_once_its_parent_is_gone_and_a_strangers_is_nobodys(
    workdir: Path,
) -> None:
    """A launcher that left a process in its group and exited: no parent chain leads to the run any more."""
    run = launched(RunStore(workdir), ["sh", "-c", "sleep 60 & echo $!"])
    left = int(wait_for(lambda: run.file("output.log").read_text().strip(), 20, "the pid it left"))
    child = wait_for(run.child, 20, "the child")
    wait_for(run.exit, 20, "the launcher's exit")
    owners = {child.pid: run.id}
    assert runctl.owner_of(left, owners) == run.id
    assert runctl.owner_of(os.getpid(), owners) is None
    runctl.kill(run, "KILL", 0)


def test_gpu_processes_are_attributed_only_to_the_runs_named_and_never_to_a_lost_or_unstarted_run(
    workdir: Path,
) -> None:
    store = RunStore(workdir)
    first, second = launched(store, SLEEP), launched(store, SLEEP)
    first_child, second_child = (wait_for(run.child, 20, "a child") for run in (first, second))
    assert runctl.owner_lookup(store, [first]) == {first_child.pid: first.id}  # the runs a look found live
    # Lost: its supervisor and child killed at once, so no exit was ever written. Unstarted: no child yet.
    supervisor = second.supervisor()
    assert supervisor is not None
    for pid in (supervisor.pid, second_child.pid):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not procinfo.is_alive(second_child), 20, "the lost run's child to die")
    unstarted = store.create(RunSpec(kind="command", argv=SLEEP))
    assert second.exit() is None and unstarted.child() is None
    assert runctl.owner_lookup(store) == {first_child.pid: first.id}


def test_a_kill_looks_again_soon_then_every_poll_never_faster() -> None:
    """How a kill (and the wait for an exit record) paces its looks at processes about to end: a busy loop would
    spend a core for the whole grace."""
    waits = list(itertools.islice(runctl.pauses(), 8))
    assert waits == [0.001, 0.002, 0.004, 0.008, 0.01, 0.01, 0.01, 0.01]
    assert (runctl.FIRST_POLL_S, runctl.POLL_S) == (0.001, 0.01)


def test_a_draft_doctor_finds_errors_in_refuses_the_launch_naming_them(tmp_path: Path) -> None:
    """doctor on a real draft whose fc was trained on one layer's features (tests.draft_fixtures)."""
    target = write_target(tmp_path / "target")
    draft = good_draft(tmp_path / "draft", fc_in=HIDDEN)
    server = [sys.executable, "-c", "pass", "--model-path", str(target)]
    spec = RunSpec(kind="serve", argv=[*server, "--speculative-draft-model-path", str(draft)])
    with pytest.raises(runctl.OpError) as refused:
        runctl.gate(spec, force=False)
    assert refused.value.code == "doctor_refused"
    assert refused.value.message == (
        "doctor found 2 error(s) in the draft (fc-width); fix them, or launch with --force to start anyway"
    )
    assert runctl.gate(spec, force=True)["doctor"] == refused.value.details


def test_a_kill_by_default_terms_the_run_and_reports_the_cleanup_it_left_to_its_grace_unsignalled(
    workdir: Path, tmp_path: Path
) -> None:
    """test_faults_processes' launcher that starts a cleanup (1.5 s) when told to stop, killed with kill's defaults."""
    run = launched(RunStore(workdir), [sys.executable, "-c", CLEANUP_ON_TERM, str(tmp_path), "1.5"])
    wait_for(lambda: run.file("output.log").read_text() == "up\n", 20, "the child up")
    report = runctl.kill(run)
    assert not report["escalated"] and (tmp_path / "cleanup-done").exists()
    assert sorted((p["signals"], p["died"]) for p in report["processes"]) == [([], True), (["TERM"], True)]


def test_a_launch_answers_with_its_running_child_and_records_what_was_launched_masked(
    workdir: Path, tmp_path: Path
) -> None:
    store = RunStore(workdir)
    spec = RunSpec(kind="command", argv=[*SLEEP, "--api-key", "sk-live-1"], name="nap", cwd=str(tmp_path), gpus=[1])
    spec.env = {"HF_TOKEN": "hf_secret"}
    reply = runctl.launch(store, spec)
    run = store.get(reply["run"])
    child = run.child()
    assert child is not None and (reply["state"], reply["pid"]) == ("running", child.pid)  # not "starting"
    [launch] = [{k: v for k, v in e.items() if k != "t"} for e in run.events() if e["type"] == "launch"]
    assert launch == {
        "type": "launch",
        "kind": "command",
        "name": "nap",
        "argv": [*SLEEP, "--api-key", "***"],
        "env": {"HF_TOKEN": "***"},
        "cwd": str(tmp_path),
        "gpus": [1],
        "parent": None,
    }


# --- relaunch: what it edits, where, and what it refuses -------------------------------------------------------


def test_a_relaunch_with_flags_that_are_not_flags_is_refused_in_one_line_and_starts_nothing(workdir: Path) -> None:
    store = RunStore(workdir)
    parent = launched(store, [sys.executable, "-c", "pass"])
    for sets, said in (
        ([3], "flags to set or unset must be strings"),
        (["disable-cuda-graph"], "'disable-cuda-graph' is not a flag; write it like --disable-cuda-graph"),
    ):
        with pytest.raises(runctl.OpError) as refused:
            runctl.relaunch(store, parent.id, sets, [], grace=0)  # type: ignore[arg-type]  # as a client may send
        assert (refused.value.code, refused.value.message) == ("bad_args", said)
    assert store.ids() == [parent.id]


SERVER = "exec python3 -m sglang.launch_server --model-path /m --port 30000 > server.log 2>&1"


def test_a_relaunch_edits_a_servers_flags_inside_its_shell_string_and_a_commands_on_its_own_words(
    workdir: Path,
) -> None:
    """Dry runs: the copy's command line as it would start (the gate forced: no SGLang here)."""
    store = RunStore(workdir)
    serve = store.get(runctl.launch(store, RunSpec(kind="serve", argv=["sh", "-c", SERVER]))["run"])
    preview = runctl.relaunch(store, serve.id, ["--port=30001"], [], grace=0, force=True, dry_run=True)
    assert preview["argv"] == ["sh", "-c", SERVER.replace("30000", "30001")]
    assert set(preview) == {"parent", "would_stop", "argv", "flags", "doctor"} and preview["doctor"] is None
    command = launched(store, [sys.executable, "-c", "pass", "--port", "1"])
    preview = runctl.relaunch(store, command.id, ["--port=2"], [], grace=0, dry_run=True)
    assert preview["argv"] == [sys.executable, "-c", "pass", "--port", "2"]


def test_a_relaunch_is_a_new_launch_of_its_own_and_checked_as_one(workdir: Path, tmp_path: Path) -> None:
    """Its own time and launch id; and the pre-launch gate refuses it unless forced, as it would a launch (doctor on
    a real draft whose fc was trained on one layer's features)."""
    store = RunStore(workdir)
    parent = launched(store, [sys.executable, "-c", "pass"])
    wait_for(parent.exit, 20, "the parent's exit")
    copy_ = store.get(runctl.relaunch(store, parent.id, [], [], grace=0, launch_id="L-7")["run"])
    assert copy_.spec().launch_id == "L-7" and copy_.spec().created_at > parent.spec().created_at
    target = write_target(tmp_path / "target")
    draft = good_draft(tmp_path / "draft", fc_in=HIDDEN)
    argv = [sys.executable, "-c", "pass", "--model-path", str(target), "--speculative-draft-model-path", str(draft)]
    serve = store.get(
        runctl.launch(store, RunSpec(kind="serve", argv=argv), runctl.gate(RunSpec("serve", argv), True))["run"]
    )
    with pytest.raises(runctl.OpError) as refused:
        runctl.relaunch(store, serve.id, [], [], grace=0)
    assert refused.value.code == "doctor_refused"
    preview = runctl.relaunch(store, serve.id, [], [], grace=0, force=True, dry_run=True)
    assert preview["doctor"] == refused.value.details
    # Forced, the copy starts, and its reply and events keep what doctor found.
    wait_for(serve.exit, 20, "the served command's exit")
    forced = runctl.relaunch(store, serve.id, [], [], grace=0, force=True)
    assert forced["doctor"] == refused.value.details
    events = store.get(forced["run"]).events()
    [doctor] = [e for e in events if e["type"] == "doctor"]
    assert {k: doctor[k] for k in ("errors", "warnings", "findings")} == {
        k: refused.value.details[k] for k in ("errors", "warnings", "findings")
    }
    assert [e["parent"] for e in events if e["type"] == "launch"] == [serve.id]


def test_a_relaunch_stops_its_parent_within_the_grace_it_was_given(workdir: Path) -> None:
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    store = RunStore(workdir)
    parent = launched(store, [sys.executable, "-c", deaf])
    wait_for(lambda: parent.file("output.log").read_text() == "up\n", 20, "the parent up")
    started = time.monotonic()
    relaunched = runctl.relaunch(store, parent.id, [], [], grace=0.5)
    stopped = relaunched["stopped_parent"]
    assert stopped is not None and stopped["escalated"] and time.monotonic() - started < 8  # not kill's 10 s
    runctl.kill(store.get(relaunched["run"]), "KILL", 0)


def test_a_gpu_process_that_left_the_runs_group_is_still_the_runs_by_its_parent_chain(workdir: Path) -> None:
    starter = (
        "import subprocess; p = subprocess.Popen(['sleep', '60'], start_new_session=True); "
        "print(p.pid, flush=True); p.wait()"
    )
    run = launched(RunStore(workdir), [sys.executable, "-c", starter])
    own = int(wait_for(lambda: run.file("output.log").read_text().strip(), 20, "the pid it started"))
    child = wait_for(run.child, 20, "the child")
    assert procinfo.read_stat(own).pgid != child.pid  # type: ignore[union-attr]  # only its parents lead to the run
    assert runctl.owner_of(own, {child.pid: run.id}) == run.id
    os.kill(own, signal.SIGKILL)


def test_stacks_on_request_are_recorded_with_their_file_and_processes_and_a_dump_is_read_whatever_its_bytes(
    workdir: Path,
) -> None:
    store = RunStore(workdir)
    run = launched(store, SLEEP)
    child = wait_for(run.child, 20, "the child")
    dumped = runctl.stacks(run, now=True)
    [event] = [e for e in run.events() if e["type"] == "stacks"]
    assert (event["file"], event["pids"]) == (dumped["file"], [child.pid])
    runctl.kill(run, "KILL", 0)
    wait_for(run.exit, 20, "exit.json")
    # A dump of bytes that are no UTF-8 (a frame's string of a binary's): shown with replacement characters.
    older = run.file(dumped["file"])
    newer = older.with_name("zz-later.txt")
    newer.write_bytes(b"Thread 1 \xff\xfe frame\n")
    os.utime(newer, (1_700_000_000, 1_700_000_000))
    assert runctl.stacks(run, now=False) == {
        "file": "stacks/zz-later.txt",
        "text": "Thread 1 \ufffd\ufffd frame\n",
        "taken_at": 1_700_000_000.0,
    }


# --- what a kill reports ----------------------------------------------------------------------------------------


def test_a_kill_reports_the_runs_final_state_as_its_supervisor_records_it(workdir: Path) -> None:
    """The supervisor writes exit.json a moment after its child dies: the report waits for it, or it would say
    the run is still running."""
    store = RunStore(workdir)
    for signal_name in ("TERM", "KILL", "INT"):
        run = launched(store, SLEEP)
        wait_for(run.child, 20, "the child")
        report = runctl.kill(run, signal_name, 10)
        assert report["state"] == "killed" and run.exit() is not None, signal_name


def test_a_kill_of_a_lost_run_never_waits_for_a_record_no_one_will_write(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its supervisor killed at once: its child lives on, and nobody will write exit.json."""
    monkeypatch.setattr(runctl, "EXIT_RECORD_WAIT_S", 60.0)
    run = launched(RunStore(workdir), SLEEP)
    wait_for(run.child, 20, "the child")
    supervisor = run.supervisor()
    assert supervisor is not None
    os.kill(supervisor.pid, signal.SIGKILL)
    wait_for(lambda: not procinfo.is_alive(supervisor), 20, "the supervisor gone")
    started = time.monotonic()
    report = runctl.kill(run, "KILL", 0)
    assert time.monotonic() - started < 30  # not the 60 s a record would be waited for
    assert [p["died"] for p in report["processes"]] == [True] and run.exit() is None


def test_a_process_older_than_the_run_is_never_told_as_a_writer_of_its_log(workdir: Path, tmp_path: Path) -> None:
    """A process started before the run, whose output goes to the file the run's output.log now is (a hard link
    put in its place): the run cannot have started it, so a kill says nothing of it."""
    elsewhere = tmp_path / "elsewhere.log"
    with elsewhere.open("ab") as out:
        older = subprocess.Popen(["sleep", "60"], stdout=out)
    try:
        run = launched(RunStore(workdir), SLEEP)
        wait_for(run.child, 20, "the child")
        os.link(elsewhere, tmp_path / "linked.log")
        os.replace(tmp_path / "linked.log", run.file("output.log"))
        assert runctl.kill(run, "KILL", 0)["refused"] == []
    finally:
        older.kill()
        older.wait()


def test_a_kill_with_a_signal_it_does_not_send_is_refused_in_one_line_and_signals_nothing(workdir: Path) -> None:
    run = launched(RunStore(workdir), SLEEP)
    child = wait_for(run.child, 20, "the child")
    with pytest.raises(runctl.OpError) as refused:
        runctl.kill(run, "HUP", 10)
    assert (refused.value.code, refused.value.message) == ("bad_args", "signal must be one of TERM, INT, KILL")
    assert procinfo.is_alive(child) and not [e for e in run.events() if e["type"] == "signal"]
    runctl.kill(run, "KILL", 0)


def test_a_job_of_one_node_of_our_stage_needs_no_rendezvous_and_gets_no_torchrun_node_options() -> None:
    spec = runctl.checked_spec(
        None, **launch_args(argv=["--steps", "1"], module="backends.train", job="j", node_rank=0, nnodes=1)
    )
    assert spec.job == {"id": "j", "node_rank": 0, "nnodes": 1}
    assert not [arg for arg in spec.argv if arg.startswith(("--rdzv", "--nnodes", "--node-rank"))]


def test_a_kill_records_the_pids_it_signals_and_says_it_did_not_escalate(workdir: Path) -> None:
    run = launched(RunStore(workdir), ["sh", "-c", "sleep 60 & wait"])
    wait_for(lambda: len(run.processes()) == 2, 20, "the shell and its sleep")
    pids = sorted(run.processes())
    report = runctl.kill(run, "TERM", 10)
    assert report["escalated"] is False
    [signalled] = [e for e in run.events() if e["type"] == "signal"]
    assert signalled["pids"] == pids


def test_a_process_that_ends_on_its_own_just_before_its_signal_is_reported_dead_not_refused(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's child exits (here: is killed by the test and reaped by its supervisor) between the kill's look and
    its signal: the signal is not sent (the process is gone), and nothing was refused."""
    run = launched(RunStore(workdir), SLEEP)
    child = wait_for(run.child, 20, "the child")
    real = procinfo.signal_if_ours

    def gone_first(ident: procinfo.ProcIdentity, sig: signal.Signals, proof: Any = None) -> str | None:
        os.kill(ident.pid, signal.SIGKILL)
        wait_for(lambda: not procinfo.is_alive(ident), 20, "the child gone")
        return real(ident, sig, proof)

    monkeypatch.setattr(procinfo, "signal_if_ours", gone_first)
    report = runctl.kill(run, "TERM", 10)
    assert report["refused"] == [] and report["processes"] == [{"pid": child.pid, "signals": [], "died": True}]


FORKS_CLEANUP_ON_TERM = """
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def on_term(*_):
    if os.fork() == 0:
        time.sleep(1.0)
        out.joinpath("cleanup-done").touch()
        os._exit(0)
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
print("up", flush=True)
time.sleep(300)
"""


def test_a_cleanup_forked_as_its_launcher_exits_is_waited_for_though_the_launcher_is_gone_at_once(
    workdir: Path, tmp_path: Path
) -> None:
    """The processes known at the signal are all gone by the next look: the look for newcomers still happens."""
    run = launched(RunStore(workdir), [sys.executable, "-c", FORKS_CLEANUP_ON_TERM, str(tmp_path)])
    wait_for(lambda: run.file("output.log").read_text() == "up\n", 20, "the child up")
    report = runctl.kill(run, "TERM", 10)
    assert (tmp_path / "cleanup-done").exists() and not report["escalated"]
    assert sorted((p["signals"], p["died"]) for p in report["processes"]) == [([], True), (["TERM"], True)]


def test_a_launch_keeps_the_serving_python_and_the_metrics_source_it_was_given() -> None:
    spec = runctl.checked_spec(
        None, **launch_args(kind="train", argv=["train.py"], sglang_python="/srv/py", metrics_from="specforge")
    )
    assert (spec.sglang_python, spec.metrics_from) == ("/srv/py", "specforge")


def test_the_gate_reads_a_draft_named_relative_to_the_runs_folder(tmp_path: Path) -> None:
    """doctor on a real draft whose fc was trained on one layer's features, named as the run sees it."""
    write_target(tmp_path / "target")
    good_draft(tmp_path / "draft", fc_in=HIDDEN)
    argv = [sys.executable, "-c", "pass", "--model-path", "target", "--speculative-draft-model-path", "draft"]
    with pytest.raises(runctl.OpError) as refused:
        runctl.gate(RunSpec(kind="serve", argv=argv, cwd=str(tmp_path)), force=False)
    assert refused.value.message == (
        "doctor found 2 error(s) in the draft (fc-width); fix them, or launch with --force to start anyway"
    )


def test_the_gate_asks_the_python_named_for_a_wrapper_about_its_flags(sglang_python: Path, tmp_path: Path) -> None:
    """The real SGLang 0.5.23's parser, in the interpreter --sglang-python names for a wrapper in Python's place;
    the refusal carries what doctor found in the draft too (a real draft whose fc was trained on one layer)."""
    target, draft = write_target(tmp_path / "target"), good_draft(tmp_path / "draft", fc_in=HIDDEN)
    argv = ["/opt/bin/with-cuda.sh", "-m", "sglang.launch_server", "--model-path", str(target), "--no-such-flag"]
    argv += ["--speculative-draft-model-path", str(draft)]
    with pytest.raises(runctl.OpError) as refused:
        runctl.gate(RunSpec(kind="serve", argv=argv, sglang_python=str(sglang_python)), force=False)
    assert refused.value.code == "flags_refused" and "unrecognized arguments: --no-such-flag" in refused.value.message
    assert refused.value.details is not None and refused.value.details["draft"] == str(draft)


def test_a_doctor_refusal_names_every_kind_of_error_it_found(sglang_python: Path, tmp_path: Path) -> None:
    """The real SGLang 0.5.23's loader dry-loads the draft whose fc was trained on one layer: three errors of
    three codes, named in order."""
    target, draft = write_target(tmp_path / "target"), good_draft(tmp_path / "draft", fc_in=HIDDEN)
    argv = ["/opt/bin/with-cuda.sh", "-m", "sglang.launch_server", "--model-path", str(target)]
    argv += ["--speculative-draft-model-path", str(draft)]
    with pytest.raises(runctl.OpError) as refused:
        runctl.gate(RunSpec(kind="serve", argv=argv, sglang_python=str(sglang_python)), force=False)
    assert refused.value.message == (
        "doctor found 3 error(s) in the draft (dry-load-failed, dry-load-unwritten, fc-width); fix them, or launch "
        "with --force to start anyway"
    )


def test_a_launch_answers_once_its_child_runs_or_its_start_failed_not_at_the_end_of_its_window(
    workdir: Path,
) -> None:
    """Its reply waits for the child to run (or its start to fail, said in one line), up to 5 s: not for both."""
    store = RunStore(workdir)
    started = time.monotonic()
    replies = [runctl.launch(store, RunSpec(kind="command", argv=argv)) for argv in (SLEEP, SLEEP, ["/no/such/prog"])]
    assert time.monotonic() - started < 12  # three windows would be 15 s
    assert [r["state"] for r in replies] == ["running", "running", "failed"]
    assert replies[2]["error"] == (
        "cannot start '/no/such/prog': No such file or directory (check the program name and PATH, or the --cwd)"
    )
    for reply in replies[:2]:
        runctl.kill(store.get(reply["run"]), "KILL", 0)


def test_a_launch_whose_first_record_fails_otherwise_says_the_systems_words_and_leaves_no_run(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error (a failing disk, an NFS hiccup), not a full disk: the system's own words, in one line."""

    def broken(self: RunDir, event_type: str, /, **fields: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    store = RunStore(workdir)
    monkeypatch.setattr(RunDir, "append_event", broken)
    with pytest.raises(StoreError) as refused:
        runctl.launch(store, RunSpec(kind="command", argv=SLEEP))
    assert str(refused.value) == (
        "Input/output error: the run was not launched; free some space or choose another --workdir"
    )
    assert store.ids() == []


def test_a_run_whose_exit_record_is_corrupt_counts_as_ended_for_gpu_attribution(workdir: Path) -> None:
    """A damaged exit.json is still an exit record: waiting will not mend it, and no GPU process is put on it."""
    store = RunStore(workdir)
    run = launched(store, SLEEP)
    child = wait_for(run.child, 20, "the child")
    assert runctl.owner_lookup(store) == {child.pid: run.id}
    run.file("exit.json").write_text("{not json")
    assert runctl.owner_lookup(store) == {}
    os.kill(child.pid, signal.SIGKILL)


def test_a_supervisor_that_cannot_start_is_told_with_its_own_last_line(tmp_path: Path) -> None:
    folder = tmp_path / "not-a-run"
    folder.mkdir()
    with pytest.raises(runctl.OpError) as refused:
        runctl.start_supervisor(RunDir(folder))
    assert (refused.value.code, refused.value.message) == (
        "launch_failed",
        f"the run supervisor did not start: supervise: {folder} is not a run folder (no spec.json)",
    )
