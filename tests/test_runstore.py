"""The run store is the whole truth about runs: ids, specs, append-only logs and
the state derived from them plus a liveness check of the recorded processes."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import json
import math
import os
import string
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.fileio import append_jsonl, atomic_write_bytes, atomic_write_json, read_json, read_jsonl
from backends.host import procinfo
from backends.runs import store as runstore
from backends.runs.store import (
    EVENTS,
    EXIT,
    METRICS,
    OUTPUT,
    PROC,
    RUN_ID_RE,
    SPEC,
    SUPERVISOR_LOG,
    CorruptFile,
    RunDir,
    RunSpec,
    RunStore,
    SpecError,
    StoreError,
    derive_state,
    new_run_id,
    progress_of,
)
from tests.ordinary_user import ordinary_folder, run_as_ordinary_user

Y2000 = 946_684_800.0
Y2100 = 4_102_444_800.0
TS_PREFIX = 19  # "YYYYMMDD-HHMMSS-mmm"


def train_spec(name: str = "", **kwargs: Any) -> RunSpec:
    return RunSpec(kind="train", argv=["python", "train.py", "--lr", "1e-4"], name=name, **kwargs)


def make_run(store: RunStore, run_id: str, spec: dict[str, Any] | None = None) -> RunDir:
    """A run folder written by hand, with a chosen id (so that order is known)."""
    path = store.runs / run_id
    path.mkdir(parents=True)
    if spec is not None:
        atomic_write_json(path / SPEC, spec)
    (path / OUTPUT).touch()
    return RunDir(path)


# --- run ids ------------------------------------------------------------------------------------


def test_run_id_names_the_utc_launch_time() -> None:
    run_id = new_run_id(1_700_000_000.123)
    assert run_id.startswith("20231114-221320-123-")
    assert RUN_ID_RE.match(run_id)
    assert new_run_id(0.0).startswith("19700101-000000-000-")


def test_run_id_defaults_to_now() -> None:
    before = new_run_id(time.time())[:15]
    now = new_run_id()
    after = new_run_id(time.time())[:15]
    assert before <= now[:15] <= after


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=Y2000, max_value=Y2100))
def test_run_id_matches_the_pattern_and_is_filename_safe(t: float) -> None:
    run_id = new_run_id(t)
    assert RUN_ID_RE.match(run_id)
    assert set(run_id) <= set(string.digits + "abcdef-")
    assert len(run_id) == 24
    assert time.strftime("%Y%m%d-%H%M%S", time.gmtime(t)) == run_id[:15]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=Y2000, max_value=Y2100), min_size=2, max_size=20))
def test_run_ids_sort_by_time(times: list[float]) -> None:
    times.sort()
    ids = [new_run_id(t) for t in times]
    stamps = [i[:TS_PREFIX] for i in ids]
    assert stamps == sorted(stamps)
    # Runs launched in different milliseconds list in launch order.
    for (ta, a), (tb, b) in itertools.pairwise(zip(times, ids, strict=True)):
        if math.floor(ta * 1000) < math.floor(tb * 1000):
            assert a < b, (ta, tb, a, b)


# --- create / get ------------------------------------------------------------------------------


def test_create_writes_spec_and_an_empty_log(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "wd")
    spec = train_spec("first", env={"HF_TOKEN": "hf_x"}, gpus=[0, 1], stall_after=120.0)
    run = store.create(spec)
    assert run.path.parent == tmp_path / "wd" / "runs"
    assert RUN_ID_RE.match(run.id)
    made = sorted(p.name for p in run.path.iterdir())
    assert made == sorted([OUTPUT, SPEC, EVENTS, METRICS, SUPERVISOR_LOG, ".proc.json.reserved", ".exit.json.reserved"])
    assert (run.path / OUTPUT).read_bytes() == b""
    assert json.loads((run.path / SPEC).read_bytes()) == spec.to_json()
    assert run.spec() == spec
    assert store.ids() == [run.id]


def test_create_gives_distinct_runs(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    runs = [store.create(train_spec(f"r{i}")) for i in range(30)]
    assert len({r.id for r in runs}) == 30
    assert sorted(r.spec().name for r in store.all()) == sorted(f"r{i}" for i in range(30))


def test_create_rejects_an_invalid_spec_without_making_a_run(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    with pytest.raises(SpecError, match="unknown run kind"):
        store.create(RunSpec(kind="bake", argv=["x"]))
    with pytest.raises(SpecError, match="argv"):
        store.create(RunSpec(kind="train", argv=[]))
    assert store.ids() == []


def test_workdir_tilde_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    store = RunStore(Path("~/.eagle3-console"))
    run = store.create(train_spec())
    assert run.path.parent == tmp_path / ".eagle3-console" / "runs"


A = "20240101-000000-000-aaaa"
B = "20240101-000001-000-bbbb"
C = "20240102-120000-500-cccc"


@pytest.fixture
def store3(tmp_path: Path) -> RunStore:
    store = RunStore(tmp_path)
    make_run(store, A, train_spec("tune").to_json())
    make_run(store, B, train_spec("tune").to_json())
    make_run(store, C, train_spec("serve-it").to_json())
    # Things in runs/ that are not runs are ignored.
    (store.runs / "notes.txt").write_text("x")
    (store.runs / ".20240103-000000-000-dddd.tmp").mkdir()
    return store


def test_ids_list_only_runs_in_time_order(store3: RunStore) -> None:
    assert store3.ids() == [A, B, C]
    assert [r.id for r in store3.all()] == [A, B, C]


def test_get_by_exact_id_prefix_and_name(store3: RunStore) -> None:
    assert store3.get(A).id == A
    assert store3.get("20240102").id == C
    assert store3.get("20240101-000001").id == B
    # By name: the newest run with that name wins.
    assert store3.get("tune").id == B
    assert store3.get("serve-it").id == C


def test_get_by_name_skips_runs_with_a_broken_spec(store3: RunStore) -> None:
    make_run(store3, "20240105-000000-000-eeee")  # no spec.json
    (store3.runs / "20240106-000000-000-ffff").mkdir()
    (store3.runs / "20240106-000000-000-ffff" / SPEC).write_text("{half")
    assert store3.get("tune").id == B


def test_get_ambiguous_prefix_says_to_give_more(store3: RunStore) -> None:
    with pytest.raises(StoreError) as info:
        store3.get("20240101")
    message = str(info.value)
    assert "ambiguous" in message and "give more of the id" in message
    assert A in message and B in message and C not in message


def test_get_unknown_ref_says_where_to_look(store3: RunStore) -> None:
    with pytest.raises(StoreError) as info:
        store3.get("nope")
    message = str(info.value)
    assert "'nope'" in message and "'status' lists the runs" in message and str(store3.runs) in message


def test_get_in_an_empty_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="status"):
        RunStore(tmp_path / "missing").get("tune")


def test_get_empty_ref_is_an_error(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    make_run(store, A, train_spec().to_json())
    with pytest.raises(StoreError):
        store.get("")


# --- broken specs ------------------------------------------------------------------------------

BROKEN_ID = "20240301-000000-000-abcd"


def _assert_corrupt_spec_names_run(run: RunDir) -> None:
    with pytest.raises(CorruptFile) as error:
        run.spec()
    assert BROKEN_ID in str(error.value) and error.value.file == SPEC
    info = run.info()
    assert info["state"] == run.state() == "corrupt"
    assert info["corrupt"] is not None and info["corrupt"]["file"] == SPEC and info["corrupt"]["reason"]


def test_missing_spec_makes_the_run_corrupt(tmp_path: Path) -> None:
    run = make_run(RunStore(tmp_path), BROKEN_ID)
    _assert_corrupt_spec_names_run(run)


@pytest.mark.parametrize(
    "content", [b"", b"{not json", b'{"kind": "train", "argv": ["py', b"\xff\xfe\x00", b"null", b"[" * 100_000]
)
def test_a_corrupt_spec_makes_the_run_corrupt(tmp_path: Path, content: bytes) -> None:
    run = make_run(RunStore(tmp_path), BROKEN_ID)
    (run.path / SPEC).write_bytes(content)
    _assert_corrupt_spec_names_run(run)


GOOD = {"kind": "train", "argv": ["python", "train.py"]}


@pytest.mark.parametrize(
    "spec",
    [
        [],
        "train",
        {"argv": ["x"]},
        {**GOOD, "kind": "bake"},
        {**GOOD, "kind": None},
        {**GOOD, "argv": []},
        {**GOOD, "argv": None},
        {**GOOD, "argv": ["python", 3]},
        {**GOOD, "env": {"A": 1}},
        {**GOOD, "gpus": [-1]},
        {**GOOD, "gpus": [True]},
        {**GOOD, "gpus": ["0"]},
        {**GOOD, "stall_after": 0},
        {**GOOD, "unexpected": 1},
    ],
)
def test_spec_with_wrong_fields_makes_the_run_corrupt(tmp_path: Path, spec: object) -> None:
    run = make_run(RunStore(tmp_path), BROKEN_ID, spec)  # type: ignore[arg-type]
    _assert_corrupt_spec_names_run(run)


@pytest.mark.parametrize(
    "spec",
    [
        {**GOOD, "argv": "python train.py"},
        {**GOOD, "env": ["A=1"]},
        {**GOOD, "env": None},
        {**GOOD, "gpus": 0},
        {**GOOD, "gpus": None},
        {**GOOD, "stall_after": "10"},
        {**GOOD, "created_at": "yesterday"},
        {**GOOD, "name": 5},
    ],
)
def test_spec_with_wrong_field_types_makes_the_run_corrupt(tmp_path: Path, spec: dict[str, Any]) -> None:
    run = make_run(RunStore(tmp_path), BROKEN_ID, spec)
    _assert_corrupt_spec_names_run(run)


# --- jsonl -------------------------------------------------------------------------------------


def test_read_jsonl_skips_and_counts_garbage(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(
        b'{"step": 1, "loss": 2.5}\n'
        b"Traceback (most recent call last):\n"
        b"\n"
        b"   \n"
        b'{"step": 2, "loss": NaN}\n'
        b'{"step": 3, "note": "\xff\xfe"}\n'  # invalid UTF-8
        b'{"step": 4\n'
        b'{"step": 5}\r\n'
    )
    rows, skipped, offset = read_jsonl(path)
    assert [r["step"] for r in rows] == [1, 2, 5]
    assert math.isnan(rows[1]["loss"])
    assert skipped == 3  # blank lines are not garbage
    assert offset == path.stat().st_size


def test_read_jsonl_leaves_a_half_written_line_for_later(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    first = b'{"step": 1}\n'
    path.write_bytes(first + b'{"step": 2, "lo')
    rows, skipped, offset = read_jsonl(path)
    assert (rows, skipped, offset) == ([{"step": 1}], 0, len(first))
    # Nothing new yet: the same answer, nothing counted as garbage.
    assert read_jsonl(path, offset) == ([], 0, offset)
    with open(path, "ab") as fh:
        fh.write(b'ss": 0.5}\n{"step": 3')
    rows, skipped, offset2 = read_jsonl(path, offset)
    assert (rows, skipped) == ([{"step": 2, "loss": 0.5}], 0)
    assert offset2 == path.stat().st_size - len(b'{"step": 3')
    with open(path, "ab") as fh:
        fh.write(b"}\n")
    assert read_jsonl(path, offset2) == ([{"step": 3}], 0, path.stat().st_size)


def test_read_jsonl_of_a_missing_file(tmp_path: Path) -> None:
    assert read_jsonl(tmp_path / "none.jsonl", 17) == ([], 0, 17)


def test_read_jsonl_in_small_chunks_makes_progress(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    for i in range(50):
        append_jsonl(path, {"step": i})
    got: list[Any] = []
    offset = 0
    for _ in range(100):
        rows, _, offset = read_jsonl(path, offset, max_bytes=40)
        got.extend(rows)
        if offset == path.stat().st_size:
            break
    assert got == [{"step": i} for i in range(50)]


json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
json_value = st.recursive(
    json_leaf,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
    max_leaves=8,
)
rows_st = st.dictionaries(st.text(max_size=6), json_value, max_size=4)


def _is_garbage(line: bytes) -> bool:
    if not line.strip():
        return False
    try:
        json.loads(line)
    except ValueError:
        return True
    return False


garbage_st = (
    st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b""))
    | st.text(max_size=20).map(lambda s: s.replace("\n", "").replace("\r", "").encode())
    | st.sampled_from([b"{", b"Traceback (most recent call last):", b"nan", b'{"a": 1', b"[1,", b"\xff"])
).filter(_is_garbage)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    items=st.lists(st.tuples(st.booleans(), rows_st, garbage_st), max_size=15),
    split=st.floats(min_value=0, max_value=1),
)
def test_read_jsonl_returns_exactly_the_rows_in_one_or_two_reads(
    tmp_path: Path, items: list[tuple[bool, dict[str, Any], bytes]], split: float
) -> None:
    lines = [json.dumps(row).encode() if is_row else junk for is_row, row, junk in items]
    rows = [row for is_row, row, _ in items if is_row]
    garbage = sum(1 for is_row, _, _ in items if not is_row)
    data = b"".join(line + b"\n" for line in lines)
    path = tmp_path / "h.jsonl"

    path.write_bytes(data)
    assert read_jsonl(path) == (rows, garbage, len(data))

    cut = int(split * len(data))
    path.write_bytes(data[:cut])
    rows1, skipped1, offset1 = read_jsonl(path)
    assert offset1 <= cut
    with open(path, "ab") as fh:
        fh.write(data[cut:])
    rows2, skipped2, offset2 = read_jsonl(path, offset1)
    assert rows1 + rows2 == rows
    assert skipped1 + skipped2 == garbage
    assert offset2 == len(data)


def test_append_jsonl_from_many_threads_keeps_lines_intact(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    n_threads, per_thread = 8, 150
    barrier = threading.Barrier(n_threads)

    def writer(t: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            append_jsonl(path, {"thread": t, "i": i, "pad": "x" * (100 + 37 * ((t * i) % 97))})

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rows, skipped, offset = read_jsonl(path)
    assert skipped == 0
    assert offset == path.stat().st_size
    assert sorted((r["thread"], r["i"]) for r in rows) == [(t, i) for t in range(n_threads) for i in range(per_thread)]
    # Each thread's own lines stay in its order.
    for t in range(n_threads):
        assert [r["i"] for r in rows if r["thread"] == t] == list(range(per_thread))


def test_atomic_write_json_replaces_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "proc.json"
    atomic_write_json(path, {"big": "x" * 10_000, "n": list(range(100))})
    atomic_write_json(path, {"small": 1})
    assert read_json(path) == {"small": 1}
    assert json.loads(path.read_bytes()) == {"small": 1}
    assert os.listdir(tmp_path) == ["proc.json"]


def test_atomic_write_failure_keeps_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "exit.json"
    atomic_write_json(path, {"code": 0})

    def no_space(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OSError):
        atomic_write_bytes(path, b'{"code": 1}\n')
    monkeypatch.undo()
    assert read_json(path) == {"code": 0}
    assert os.listdir(tmp_path) == ["exit.json"]


def test_readers_never_see_a_partial_atomic_write(tmp_path: Path) -> None:
    path = tmp_path / "proc.json"
    a = {"which": "a", "pad": "a" * 50_000}
    b = {"which": "b", "pad": "b" * 10}
    atomic_write_json(path, a)
    stop = threading.Event()
    seen: list[object] = []

    def reader() -> None:
        while not stop.is_set():
            seen.append(read_json(path))

    th = threading.Thread(target=reader)
    th.start()
    try:
        for i in range(100):
            atomic_write_json(path, a if i % 2 else b)
    finally:
        stop.set()
        th.join()
    assert seen and all(s in (a, b) for s in seen)


# --- a blocked run store -----------------------------------------------------------------------


def test_create_in_a_blocked_store_says_to_choose_another_workdir(tmp_path: Path) -> None:
    workdir = tmp_path / "wd"
    workdir.mkdir()
    (workdir / "runs").write_bytes(b"not a folder")
    with pytest.raises(StoreError) as info:
        RunStore(workdir).create(train_spec())
    message = str(info.value)
    assert "--workdir" in message and str(workdir / "runs") in message
    assert (workdir / "runs").read_bytes() == b"not a folder"
    assert os.listdir(workdir) == ["runs"]


def test_create_failure_keeps_existing_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(tmp_path)
    old = store.create(train_spec("old"))
    before = {p.name: p.read_bytes() for p in old.path.iterdir()}

    def no_space(path: Path, obj: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runstore, "atomic_write_json", no_space)
    with pytest.raises(StoreError, match="--workdir") as info:
        store.create(train_spec("new"))
    assert "no space left on " in str(info.value) and "bytes free" in str(info.value)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in old.path.iterdir()} == before
    assert store.get("old").id == old.id


def test_create_failure_leaves_no_half_made_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(tmp_path)

    def no_space(path: Path, obj: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runstore, "atomic_write_json", no_space)
    with pytest.raises(StoreError):
        store.create(train_spec("new"))
    assert store.ids() == []


def refuses_a_read_only_workdir(folder: Path) -> None:
    workdir = folder / "wd"
    workdir.mkdir()
    workdir.chmod(0o500)  # its owner's choice: the store keeps it, and says what the system refused
    try:
        with pytest.raises(StoreError) as info:
            RunStore(workdir).create(train_spec())
        said = str(info.value)
        assert f"{workdir}: Permission denied;" in said and "--workdir" in said, said
        assert workdir.stat().st_mode & 0o777 == 0o500
    finally:
        workdir.chmod(0o700)
    assert os.listdir(workdir) == []


def test_create_in_a_read_only_workdir_says_what_was_refused_and_keeps_it_read_only(tmp_path: Path) -> None:
    run_as_ordinary_user(refuses_a_read_only_workdir, ordinary_folder(tmp_path))


def refuses_a_read_only_runs_folder(folder: Path) -> None:
    store = RunStore(folder / "wd")
    old = store.create(train_spec("old"))
    store.runs.chmod(0o500)
    try:
        with pytest.raises(StoreError) as info:
            store.create(train_spec("new"))
        said = str(info.value)
        assert f"{store.runs}: Permission denied;" in said and "--workdir" in said, said
        assert store.ids() == [old.id]
        assert store.get("old").spec().name == "old"
    finally:
        store.runs.chmod(0o700)


def test_create_in_a_read_only_runs_folder_keeps_other_runs(tmp_path: Path) -> None:
    run_as_ordinary_user(refuses_a_read_only_runs_folder, ordinary_folder(tmp_path))


# --- derive_state with real processes ----------------------------------------------------------


@pytest.fixture
def sleeper() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def _start() -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = subprocess.Popen(["sleep", "30"])
        procs.append(proc)
        return proc

    yield _start
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=10)


def ident_json(pid: int) -> dict[str, object]:
    ident = procinfo.identify(pid)
    assert ident is not None
    return ident.to_json()


def dead_ident_json(start: Callable[[], subprocess.Popen[bytes]]) -> dict[str, object]:
    proc = start()
    ident = ident_json(proc.pid)
    proc.kill()
    proc.wait(timeout=5)
    return ident


def state_run(
    tmp_path: Path,
    *,
    created_at: float | None = None,
    proc: dict[str, Any] | None = None,
    exit: dict[str, Any] | None = None,
    events: list[dict[str, Any]] | None = None,
) -> RunDir:
    spec = train_spec("s", created_at=time.time() if created_at is None else created_at)
    run = make_run(RunStore(tmp_path), "20240401-000000-000-0000", spec.to_json())
    if proc is not None:
        atomic_write_json(run.file(PROC), proc)
    for row in events or []:
        append_jsonl(run.file(EVENTS), row)
    if exit is not None:
        atomic_write_json(run.file(EXIT), exit)
    return run


AN_HOUR_AGO = time.time() - 3600


def test_state_running_with_a_live_child(tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]]) -> None:
    supervisor, child = sleeper(), sleeper()
    run = state_run(
        tmp_path,
        created_at=AN_HOUR_AGO,
        proc={"supervisor": ident_json(supervisor.pid), "child": ident_json(child.pid), "child_started_at": 123.5},
    )
    assert derive_state(run) == "running"
    info = run.info()
    assert info["state"] == "running"
    assert info["pid"] == child.pid
    assert info["started_at"] == 123.5
    assert info["exit_code"] is None


def test_state_running_while_the_child_lives_even_if_the_supervisor_died(
    tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    child = sleeper()
    proc = {"supervisor": dead_ident_json(sleeper), "child": ident_json(child.pid), "child_started_at": 1.0}
    assert derive_state(state_run(tmp_path, created_at=AN_HOUR_AGO, proc=proc)) == "running"


def test_state_exited_failed_killed_from_exit_json(
    tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    proc = {"supervisor": dead_ident_json(sleeper), "child": dead_ident_json(sleeper), "child_started_at": 1.0}
    cases: list[tuple[dict[str, Any], list[dict[str, Any]], str]] = [
        ({"code": 0, "ended_at": 9.0}, [], "exited"),
        ({"code": 3, "ended_at": 9.0}, [], "failed"),
        ({"code": None, "signal": "KILL"}, [], "failed"),  # killed by someone else (OOM killer)
        ({"error": "cannot exec python: No such file or directory"}, [], "failed"),
        ({"code": -15, "signal": "TERM"}, [{"t": 5.0, "type": "signal", "signal": "TERM"}], "killed"),
    ]
    for i, (ended, events, expected) in enumerate(cases):
        run = state_run(tmp_path / str(i), created_at=AN_HOUR_AGO, proc=proc, exit=ended, events=events)
        assert derive_state(run) == expected, ended
        info = run.info()
        assert info["state"] == expected
        assert info["exit_code"] == ended.get("code")
        assert info["error"] == ended.get("error")


def test_state_lost_when_supervisor_and_child_died_without_exit_json(
    tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    proc = {"supervisor": dead_ident_json(sleeper), "child": dead_ident_json(sleeper), "child_started_at": 1.0}
    # Even a run launched just now: its processes are known and gone.
    assert derive_state(state_run(tmp_path, proc=proc)) == "lost"


def test_state_starting_until_the_supervisor_records_itself(tmp_path: Path) -> None:
    assert derive_state(state_run(tmp_path / "new")) == "starting"
    assert derive_state(state_run(tmp_path / "old", created_at=AN_HOUR_AGO)) == "lost"


def test_state_starting_while_the_supervisor_lives_without_a_child(
    tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    supervisor = sleeper()
    run = state_run(tmp_path, created_at=AN_HOUR_AGO, proc={"supervisor": ident_json(supervisor.pid)})
    assert derive_state(run) == "starting"
    assert run.info()["pid"] is None


def test_a_reused_pid_is_not_taken_for_the_run(tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]]) -> None:
    stranger = sleeper()  # alive, holding the pid the run recorded, but started at another time
    ident = procinfo.identify(stranger.pid)
    assert ident is not None
    reused = dataclasses.replace(ident, start_ticks=ident.start_ticks - 1).to_json()
    proc = {"supervisor": reused, "child": reused, "child_started_at": 1.0}
    assert derive_state(state_run(tmp_path / "a", created_at=AN_HOUR_AGO, proc=proc)) == "lost"
    assert derive_state(state_run(tmp_path / "b", created_at=AN_HOUR_AGO, proc={"supervisor": reused})) == "lost"
    assert stranger.poll() is None


def test_state_is_not_lost_when_exit_json_lands_during_the_check(
    tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = {"supervisor": dead_ident_json(sleeper), "child": dead_ident_json(sleeper), "child_started_at": 1.0}
    run = state_run(tmp_path, created_at=AN_HOUR_AGO, proc=proc)
    real_is_alive = procinfo.is_alive

    def is_alive_while_supervisor_finishes(ident: procinfo.ProcIdentity) -> bool:
        # The supervisor writes exit.json and exits exactly while we look at the processes.
        if not run.file(EXIT).exists():
            atomic_write_json(run.file(EXIT), {"code": 0, "ended_at": time.time()})
        return real_is_alive(ident)

    monkeypatch.setattr(procinfo, "is_alive", is_alive_while_supervisor_finishes)
    assert derive_state(run) == "exited"


# --- progress: how far a training got, for the status of every run ---------------------------------


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.integers(min_value=1, max_value=3000),
    eval_every=st.integers(min_value=1, max_value=500),
    torn=st.booleans(),
)
def test_a_runs_progress_is_its_last_step_however_long_its_metrics(
    tmp_path: Path, steps: int, eval_every: int, torn: bool
) -> None:
    run = make_run(RunStore(tmp_path / f"{steps}-{eval_every}-{torn}"), new_run_id(), train_spec().to_json())
    with open(run.file(METRICS), "w") as rows:
        for step in range(1, steps + 1):
            rows.write(json.dumps({"step": step, "loss": 1.0, "acc_0": 0.5, "acc_1": 0.4}) + "\n")
            if step % eval_every == 0:
                rows.write(json.dumps({"step": step, "val_loss": 2.0}) + "\n")
        if torn:  # a row being written as the status is read
            rows.write('{"step": 99999, "lo')
    assert progress_of(run.last_metrics()) == {"step": steps}
    assert run.info()["progress"] == {"step": steps}


def test_an_extractions_progress_names_its_shard_and_its_own_eta(tmp_path: Path) -> None:
    spec = RunSpec(kind="extract", argv=["python", "-m", "backends.extract"]).to_json()
    run = make_run(RunStore(tmp_path), new_run_id(), spec)
    assert run.info()["progress"] is None  # no row yet
    append_jsonl(run.file(METRICS), {"shard": 2, "samples": 512, "eta_s": 40.5})
    append_jsonl(run.file(METRICS), ["not", "a", "row"])
    assert run.info()["progress"] == {"shard": 2, "eta_s": 40.5}


def test_a_command_run_has_no_progress_even_with_rows(tmp_path: Path) -> None:
    spec = RunSpec(kind="command", argv=["python", "job.py"]).to_json()
    run = make_run(RunStore(tmp_path), new_run_id(), spec)
    append_jsonl(run.file(METRICS), {"step": 3})
    assert run.info()["progress"] is None


# A power cut leaves the last line cut short: a JSON prefix, or the zeros of blocks allocated but never written.
TORN_LINES = [b'{"t": 1717000000.5, "type": "sig', b"\x00" * 37]


@pytest.mark.parametrize("torn", TORN_LINES, ids=["json-prefix", "zeros"])
def test_an_append_after_a_torn_line_is_a_line_of_its_own(tmp_path: Path, torn: bytes) -> None:
    path = tmp_path / METRICS
    path.write_bytes(b'{"step": 1}\n' + torn)
    append_jsonl(path, {"step": 2})
    rows, skipped, offset = read_jsonl(path)
    assert rows == [{"step": 1}, {"step": 2}]
    assert skipped == 1  # the torn line is kept, and counted as garbage
    assert offset == path.stat().st_size
    assert torn in path.read_bytes()


@pytest.mark.parametrize("torn", TORN_LINES, ids=["json-prefix", "zeros"])
def test_a_lost_run_keeps_its_fate_after_a_power_cut_tore_its_last_event(
    tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]], torn: bytes
) -> None:
    proc = {"supervisor": dead_ident_json(sleeper), "child": dead_ident_json(sleeper), "child_started_at": 1.0}
    run = state_run(tmp_path, created_at=AN_HOUR_AGO, proc=proc, events=[{"t": 2.0, "type": "launched"}])
    with run.file(EVENTS).open("ab") as fh:
        fh.write(torn)
    for _ in range(2):  # the agent that finds it lost records it, once; the next look reads it back
        assert run.info()["state"] == "lost"
        assert run.info()["corrupt"] is None
        runstore.record_lost(run)
    events = run.events()
    assert [e["type"] for e in events] == ["launched", "torn", "state"]
    assert events[1]["bytes"] == len(torn) and events[2]["state"] == "lost"


def test_a_garbage_event_line_not_found_torn_still_makes_the_run_corrupt(tmp_path: Path) -> None:
    run = state_run(tmp_path, created_at=AN_HOUR_AGO, events=[{"t": 2.0, "type": "launched"}])
    with run.file(EVENTS).open("ab") as fh:
        fh.write(b"garbage\n")
    run.append_event("state", state="lost")  # the garbage ended in its newline: nothing was torn
    with pytest.raises(CorruptFile, match="line 2 is not valid JSON"):
        run.events()
    assert run.info()["state"] == "corrupt"
