"""What benchmarks/mutation.sh found no test of in fileio.py: the folder a run store keeps private, the records
that must hold no NaN, rows nested too deep to send on, the room reserved for a run's exit on a full disk, the
folder swap, and the error a line cut short by a full disk raises. Real files, a real tmpfs to fill."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from backends.fileio import Reserved, append_jsonl, exchange, parse_record, private_dir, read_jsonl


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
    try:
        exchange(new, old)
    except OSError as exc:
        if exc.errno in {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}:
            pytest.skip(f"this system cannot swap folders: {exc}")
        raise
    assert (old / "weights").read_text() == "new" and (new / "weights").read_text() == "old"
    with pytest.raises(OSError) as missing:
        exchange(tmp_path / "absent", old)
    assert missing.value.errno == errno.ENOENT


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
    assert events.read_bytes() == b""
