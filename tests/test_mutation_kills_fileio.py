"""What benchmarks/mutation.sh found no test of in fileio.py: the folder a run store keeps private, the records
that must hold no NaN (nor a number too big to be finite), rows nested too deep to send on, a line longer than a
read, a torn last line measured and ended, the room reserved for a run's exit on a full disk, the folder swap (never
skipped on what the swap itself raises), the error a line cut short by a full disk raises and the one a file without
inodes left raises, and a file of another user's that cannot be narrowed. Real files, a real tmpfs to fill."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
from pathlib import Path

import pytest

from backends.fileio import (
    Reserved,
    append_jsonl,
    atomic_write_json,
    exchange,
    open_private,
    parse_record,
    private_dir,
    read_jsonl,
)
from tests.conftest import tmpfs
from tests.ordinary_user import ordinary_folder, run_as_ordinary_user
from tests.test_faults_processes import fill


def test_a_folder_open_to_others_is_made_private_and_one_its_owner_made_read_only_stays_so(tmp_path: Path) -> None:
    opened = tmp_path / "opened"
    opened.mkdir(mode=0o777)
    os.chmod(opened, 0o775)
    private_dir(opened)
    assert opened.stat().st_mode & 0o777 == 0o700
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    os.chmod(read_only, 0o555)
    private_dir(read_only)
    assert read_only.stat().st_mode & 0o777 == 0o500
    made = tmp_path / "new" / "deeper"
    old_umask = os.umask(0)
    try:
        private_dir(made)
    finally:
        os.umask(old_umask)
    assert made.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_a_record_of_pids_and_times_holding_nan_or_infinity_is_refused(constant: bytes) -> None:
    record = b'{"pid": 12, "started": ' + constant + b"}"
    with pytest.raises(ValueError):
        parse_record(record, finite=True)
    assert parse_record(b'{"pid": 12, "started": 1.5}', finite=True) == {"pid": 12, "started": 1.5}
    assert parse_record(record) is not None  # a metric row may hold one


def test_a_row_nested_too_deep_in_lists_or_objects_is_skipped_not_sent_on(tmp_path: Path) -> None:
    rows = tmp_path / "metrics.jsonl"
    deep_list: object = 1
    deep_object: object = 1
    for _ in range(40):
        deep_list = [deep_list]
        deep_object = {"a": deep_object}
    lines = [{"step": 1}, {"nested": deep_list}, {"nested": deep_object}, {"step": 2, "loss": [[1.0]]}]
    rows.write_text("".join(json.dumps(line) + "\n" for line in lines))
    read, skipped, _ = read_jsonl(rows)
    assert read == [{"step": 1}, {"step": 2, "loss": [[1.0]]}]
    assert skipped == 2


def test_a_reserved_slot_becomes_the_record_and_a_record_too_big_for_it_is_still_written(tmp_path: Path) -> None:
    slot = tmp_path / ".exit.slot"
    reserved = Reserved(slot)
    reserved.make()
    assert slot.stat().st_size == Reserved.SIZE
    reserved.commit(tmp_path / "exit.json", {"code": 3, "signal": None})
    assert json.loads((tmp_path / "exit.json").read_bytes()) == {"code": 3, "signal": None}
    assert not slot.exists()  # the slot was renamed onto the record
    # No slot left (used, or never made), or a record bigger than it: written the ordinary way.
    reserved.commit(tmp_path / "again.json", {"code": 4})
    assert json.loads((tmp_path / "again.json").read_bytes()) == {"code": 4}
    big = {"note": "x" * (2 * Reserved.SIZE)}
    Reserved(tmp_path / ".other.slot").commit(tmp_path / "big.json", big)
    assert json.loads((tmp_path / "big.json").read_bytes()) == big


def test_exchange_swaps_two_folders_whole(tmp_path: Path) -> None:
    old, new = tmp_path / "step-2", tmp_path / ".step-2.new"
    old.mkdir()
    new.mkdir()
    (old / "weights").write_text("old")
    (new / "weights").write_text("new")
    # Skipped only where the C library has no swap at all, never on what the swap itself raises: a bug there would
    # read as a system that cannot.
    if not hasattr(ctypes.CDLL(None), "renameat2"):
        pytest.skip("this C library has no renameat2")
    exchange(new, old)
    assert (old / "weights").read_text() == "new" and (new / "weights").read_text() == "old"
    # Each failure says its own errno, the C library's of that very call.
    for errno_, a in ((errno.ENOENT, tmp_path / "absent"), (errno.ENOTDIR, old / "weights" / "x")):
        with pytest.raises(OSError) as refused:
            exchange(a, old)
        assert str(refused.value) == f"[Errno {errno_}] {os.strerror(errno_)}: '{a}' -> '{old}'"


def test_exchange_swaps_folders_named_from_the_working_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not hasattr(ctypes.CDLL(None), "renameat2"):
        pytest.skip("this C library has no renameat2")
    monkeypatch.chdir(tmp_path)
    Path("out").mkdir()
    Path(".out.new").mkdir()
    Path(".out.new", "weights").write_text("new")
    exchange(Path(".out.new"), Path("out"))
    assert Path("out", "weights").read_text() == "new" and not any(Path(".out.new").iterdir())


def test_a_line_the_full_disk_cut_short_is_taken_back_and_said_as_no_space(small_disk: Path) -> None:
    filler = small_disk / "filler"
    with filler.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    os.truncate(filler, filler.stat().st_size - 4096)  # one page of room: a longer line is cut short
    events = small_disk / "events.jsonl"
    with pytest.raises(OSError) as full:
        append_jsonl(events, {"event": "x" * 3 * 4096})
    assert full.value.errno == errno.ENOSPC  # what the supervisor waits on, to write it again once room returns
    assert str(full.value) == f"[Errno {errno.ENOSPC}] No space left on device: '{events}'"
    assert events.read_bytes() == b""


def test_records_of_pids_and_times_refuse_a_number_too_big_to_be_finite_and_say_why() -> None:
    with pytest.raises(ValueError) as refused:
        parse_record(b'{"pid": 12, "started": 1e999}', finite=True)
    assert str(refused.value) == "1e999 is not a number a record of a run holds"
    with pytest.raises(ValueError) as nan:
        parse_record(b'{"started": NaN}', finite=True)
    assert str(nan.value) == "NaN is not a number a record of a run holds"
    with pytest.raises(ValueError) as deep:
        parse_record(b"[" * 100_000 + b"]" * 100_000)
    assert str(deep.value) == "nested too deeply to be a record"


def test_a_line_longer_than_a_whole_read_is_skipped_and_the_read_goes_on_after_it(tmp_path: Path) -> None:
    rows = tmp_path / "metrics.jsonl"
    rows.write_bytes(b'{"long": "' + b"x" * 100 + b'"}\n{"step": 1}\n')
    assert read_jsonl(rows, max_bytes=50) == ([], 1, 50)
    assert read_jsonl(rows, 50, max_bytes=50) == ([], 1, 100)
    assert read_jsonl(rows, 100) == ([{"step": 1}], 1, len(rows.read_bytes()))  # the long line's end: garbage


@pytest.mark.parametrize(
    ("before", "torn"),
    [(b"xyz", 3), (b'{"a":1}\n{"b":2}\nxy', 2), (b'{"a":1}\nx', 1), (b'{"a":1}\n', 0)],
    ids=["only-a-torn-line", "after-two-lines", "one-byte", "none"],
)
def test_a_torn_last_line_is_measured_ended_and_told_before_the_next(tmp_path: Path, before: bytes, torn: int) -> None:
    events = tmp_path / "events.jsonl"
    events.write_bytes(before)
    told: list[int] = []

    def torn_row(size: int) -> dict[str, int]:
        told.append(size)
        return {"torn": size}

    append_jsonl(events, {"type": "next"}, torn_row)
    assert told == ([torn] if torn else [])
    ended = before + (b"\n" + json.dumps({"torn": torn}, separators=(",", ":")).encode() + b"\n" if torn else b"")
    assert events.read_bytes() == ended + b'{"type":"next"}\n'


def test_an_older_file_or_folder_open_to_others_is_narrowed_to_its_owner(tmp_path: Path) -> None:
    older = tmp_path / "events.jsonl"
    older.write_text("")
    older.chmod(0o644)
    os.close(open_private(older, os.O_WRONLY))
    assert older.stat().st_mode & 0o777 == 0o600
    group_only = tmp_path / "runs"
    group_only.mkdir()
    group_only.chmod(0o070)
    private_dir(group_only)
    assert group_only.stat().st_mode & 0o777 == 0o000


def test_a_write_refused_for_want_of_inodes_says_no_space(tmp_path: Path) -> None:
    """A real tmpfs of a few inodes: the record's temp file cannot even be made, and what is raised is the full
    disk's error, which the supervisor waits on, not the cleanup's."""
    with tmpfs(tmp_path / "few-inodes", "1m,nr_inodes=8") as disk:
        with contextlib.suppress(OSError):
            for n in range(100):
                (disk / f"f{n}").touch()
        with pytest.raises(OSError) as full:
            atomic_write_json(disk / "exit.json", {"code": 0})
        assert full.value.errno == errno.ENOSPC


def test_a_record_the_size_of_its_slot_is_written_through_it_on_a_full_disk(small_disk: Path) -> None:
    slot = Reserved(small_disk / ".exit.slot")
    slot.make()
    record = {"note": ""}
    record["note"] = "x" * (Reserved.SIZE - len(json.dumps(record, indent=1)) - 1)
    assert len(json.dumps(record, indent=1)) + 1 == Reserved.SIZE
    fill(small_disk)
    slot.commit(small_disk / "exit.json", record)
    assert json.loads((small_disk / "exit.json").read_bytes()) == record
    assert (small_disk / "exit.json").stat().st_size == Reserved.SIZE


def open_anothers_file(folder: Path) -> None:
    with pytest.raises(PermissionError) as refused:
        open_private(folder / "theirs.jsonl", os.O_WRONLY)
    assert refused.value.errno == errno.EPERM  # narrowing it is its owner's to do


def test_a_file_of_another_users_that_cannot_be_made_private_says_so(tmp_path: Path) -> None:
    """Root's file open to all, in a folder of nobody's, opened by nobody: it may write it but not narrow it."""
    if os.geteuid() != 0:
        pytest.skip("a file of another user's is made by root; CI runs as root")
    folder = ordinary_folder(tmp_path)
    theirs = folder / "theirs.jsonl"
    theirs.write_text("")
    theirs.chmod(0o666)
    run_as_ordinary_user(open_anothers_file, folder)
    assert theirs.stat().st_mode & 0o777 == 0o666
