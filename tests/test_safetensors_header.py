"""The header reader must accept exactly what the safetensors library loads, name the fault
in everything else, and never read tensor data (a 1 TB checkpoint is headers only)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.safetensors_header import HeaderError, read_checkpoint, read_header
from tests.draft_fixtures import safetensors_bytes, write_sparse_shards


def write(tmp_path: Path, data: bytes, name: str = "model.safetensors") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_reads_what_safetensors_writes(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {"a": torch.zeros(3, 4, dtype=torch.bfloat16), "b": torch.arange(5), "c": torch.zeros(0)}
    save_file(tensors, str(tmp_path / "m.safetensors"), metadata={"format": "pt"})
    infos = read_header(tmp_path / "m.safetensors")
    assert {n: (i.dtype, i.shape) for n, i in infos.items()} == {
        "a": ("BF16", (3, 4)),
        "b": ("I64", (5,)),
        "c": ("F32", (0,)),
    }
    raw = (tmp_path / "m.safetensors").read_bytes()
    b = infos["b"]
    assert struct.unpack("<5q", raw[b.offset : b.offset + b.nbytes]) == (0, 1, 2, 3, 4)


def test_truncated_header_is_named(tmp_path: Path) -> None:
    data = safetensors_bytes({"x": ("F32", (2,), None)})
    path = write(tmp_path, data[:20])
    with pytest.raises(HeaderError, match="truncated"):
        read_header(path)
    with pytest.raises(HeaderError, match="too short"):
        read_header(write(tmp_path, b"\x01\x02"))


def test_offsets_outside_the_file(tmp_path: Path) -> None:
    data = safetensors_bytes({"x": ("F32", (4,), None)})
    with pytest.raises(HeaderError, match="lie outside the file"):
        read_header(write(tmp_path, data[:-4]))


@pytest.mark.parametrize(
    ("entry", "fault"),
    [
        ({"dtype": "F17", "shape": [1], "data_offsets": [0, 4]}, "unknown dtype"),
        ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "invalid shape"),
        ({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}, "needs 8 bytes"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [4]}, "invalid data_offsets"),
        ([1, 2], "not an object"),
    ],
)
def test_bad_entries(tmp_path: Path, entry: object, fault: str) -> None:
    raw = json.dumps({"x": entry}).encode()
    with pytest.raises(HeaderError, match=fault):
        read_header(write(tmp_path, struct.pack("<Q", len(raw)) + raw + b"\0" * 4))


def test_gaps_and_overlaps_are_refused(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
        "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]},
    }
    raw = json.dumps(header).encode()
    with pytest.raises(HeaderError, match="overlaps"):
        read_header(write(tmp_path, struct.pack("<Q", len(raw)) + raw + b"\0" * 6))
    header["b"]["data_offsets"] = [6, 10]
    raw = json.dumps(header).encode()
    with pytest.raises(HeaderError, match="gap"):
        read_header(write(tmp_path, struct.pack("<Q", len(raw)) + raw + b"\0" * 10))


def test_not_json_and_not_object(tmp_path: Path) -> None:
    for raw, fault in ((b"{nope", "not JSON"), (b"[1]", "not a JSON object"), (b"\xff\xfe", "not JSON")):
        with pytest.raises(HeaderError, match=fault):
            read_header(write(tmp_path, struct.pack("<Q", len(raw)) + raw))


def test_sharded_index(tmp_path: Path) -> None:
    names = {f"t{i}": ("BF16", (1024, 1024)) for i in range(6)}
    write_sparse_shards(tmp_path, names, 3)
    tensors = read_checkpoint(tmp_path)
    assert sorted(tensors) == sorted(names)
    assert all(t.nbytes == 2 * 1024 * 1024 for t in tensors.values())
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["ghost"] = "model-00001-of-00003.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(HeaderError, match="lists tensors its shards lack: ghost"):
        read_checkpoint(tmp_path)
    index["weight_map"] = {"t0": "../elsewhere.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(HeaderError, match="outside"):
        read_checkpoint(tmp_path)
    index["weight_map"] = {"t0": "missing.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(HeaderError, match="does not exist"):
        read_checkpoint(tmp_path)


def test_duplicate_tensor_across_unindexed_files(tmp_path: Path) -> None:
    write(tmp_path, safetensors_bytes({"x": ("U8", (1,), None)}), "a.safetensors")
    write(tmp_path, safetensors_bytes({"x": ("U8", (1,), None)}), "b.safetensors")
    with pytest.raises(HeaderError, match="in both"):
        read_checkpoint(tmp_path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200))
def test_random_bytes_give_a_header_error_or_tensors(tmp_path: Path, data: bytes) -> None:
    path = write(tmp_path, data)
    try:
        read_header(path)
    except HeaderError as exc:
        assert str(exc).startswith(str(path))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 1 << 20) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
entries = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["F32", "BF16", "I64", "U8", "BOOL", "F4", 3]),
        "shape": st.lists(st.integers(-1, 4), max_size=3),
        "data_offsets": st.lists(st.integers(-1, 64), min_size=0, max_size=3),
    }
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.dictionaries(st.text(max_size=4), entries | json_values, max_size=4), tail=st.integers(0, 80))
def test_random_headers_are_validated_not_crashed_on(tmp_path: Path, header: dict[str, object], tail: int) -> None:
    raw = json.dumps(header).encode()
    path = write(tmp_path, struct.pack("<Q", len(raw)) + raw + b"\0" * tail)
    try:
        tensors = read_header(path)
    except HeaderError:
        return
    # Accepted: the tensors tile the data section exactly, as the loader requires.
    assert sum(t.nbytes for t in tensors.values()) == tail
