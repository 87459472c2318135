"""How many shards the extraction keeps in pinned host memory: 8 writers by default, fewer where a quarter of
the host's available memory cannot hold them, and said in the extraction's output."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.extract.args import DEFAULT_WRITERS
from backends.extract.cli import WRITER_MEMORY_SHARE, choose_writers
from backends.extract.cli import main as extract_main
from backends.host.memory import available_bytes

GB = 10**9


def test_writers_default_to_eight_on_a_roomy_host_and_fewer_on_a_tight_one() -> None:
    assert choose_writers(None, 2 * GB, 512 * GB)[0] == DEFAULT_WRITERS
    # A 70B target's shard of 64 chats x 2048 tokens is 8.6 GB: a quarter of 256 GB holds 7 of them.
    writers, why = choose_writers(None, int(8.6 * GB), 256 * GB)
    assert writers == 6 and "8.6 GB" in why and "256 GB available" in why
    assert choose_writers(None, 40 * GB, 64 * GB)[0] == 1  # never none
    assert choose_writers(3, 40 * GB, 64 * GB) == (
        3,
        "3 writer(s) (--writers), each shard up to 40.0 GB of pinned memory",
    )
    assert choose_writers(None, 2 * GB, None)[0] == DEFAULT_WRITERS  # the kernel does not say: the default


@given(shard=st.integers(1, 10**12), available=st.integers(0, 10**13))
def test_the_shards_in_flight_fit_the_memory_share_whenever_one_writer_does(shard: int, available: int) -> None:
    writers, _ = choose_writers(None, shard, available)
    assert 1 <= writers <= DEFAULT_WRITERS
    if writers > 1:
        assert (writers + 1) * shard <= available * WRITER_MEMORY_SHARE


def test_available_memory_is_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:   65536000 kB\n")
    assert available_bytes(meminfo) == 65536000 * 1024
    meminfo.write_text("MemTotal:       131072000 kB\n")
    assert available_bytes(meminfo) is None
    assert available_bytes(tmp_path / "missing") is None
    here = available_bytes()
    assert here is not None and here > 0  # this Linux machine's own


def test_the_extraction_says_how_many_writers_it_chose(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--target", str(target), "--data", "demo", "--limit", "4", "--device", "cpu", "--out", str(tmp_path / "a")]
    assert extract_main(argv) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("shards: "))
    assert "writer" in line and "GB of pinned memory" in line and "available" in line
    assert extract_main([*argv[:-1], str(tmp_path / "b"), "--writers", "2"]) == 0
    assert "shards: 2 writer(s) (--writers)" in capsys.readouterr().out
