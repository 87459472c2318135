"""Read safetensors headers, never tensor bytes, and validate them as the loader would.

A safetensors file is an 8-byte little-endian header length, a JSON header
`{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}`, then
the data. The safetensors library refuses a file whose offsets do not tile the
data exactly, so a header that passes here loads there. Sharded checkpoints list
their files in `model.safetensors.index.json`. A 1 TB checkpoint costs a few
small reads per file.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# The safetensors library's own cap on the header size.
MAX_HEADER_BYTES = 100_000_000

DTYPE_BYTES: Mapping[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}
INTEGER_DTYPES = frozenset({"U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64"})


class HeaderError(ValueError):
    """A safetensors file or index that a loader would refuse; the message names the file and the fault."""


class TensorInfo(NamedTuple):
    """One tensor's header entry (a tuple: a 100k-tensor checkpoint builds 100k of them)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    offset: int  # absolute byte offset of the data in `file`
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors of one safetensors file, validated against the file's size."""
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise HeaderError(f"{path}: {size} bytes is too short for a safetensors file (truncated?)")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise HeaderError(f"{path}: header length {length} exceeds the {MAX_HEADER_BYTES}-byte limit")
            if 8 + length > size:
                raise HeaderError(f"{path}: header claims {length} bytes but the file has {size - 8} (truncated?)")
            raw = fh.read(length)
    except OSError as exc:
        raise HeaderError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_header(path, raw, size - 8 - length, data_start=8 + length)


def parse_header(path: Path, raw: bytes, data_size: int, *, data_start: int) -> dict[str, TensorInfo]:
    """Validate a header's JSON against a data section of `data_size` bytes."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HeaderError(f"{path}: header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise HeaderError(f"{path}: __metadata__ must map strings to strings")
    tensors = [_tensor(path, name, entry, data_start) for name, entry in header.items()]
    # The loader requires the tensors to tile the data section exactly, in offset order.
    expected = 0
    for info in sorted(tensors, key=lambda t: (t.offset, t.nbytes)):
        begin = info.offset - data_start
        if begin != expected:
            what = "overlaps the previous tensor" if begin < expected else f"leaves a gap at byte {expected}"
            raise HeaderError(f"{path}: tensor {info.name!r} starts at data byte {begin} and {what}")
        expected = begin + info.nbytes
    if expected != data_size:
        problem = "lie outside the file" if expected > data_size else "leave trailing bytes"
        raise HeaderError(
            f"{path}: tensor data offsets {problem}: they end at byte {expected}, "
            f"the data section has {data_size} bytes (truncated or corrupt file?)"
        )
    return {t.name: t for t in tensors}


def _tensor(path: Path, name: str, entry: object, data_start: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise HeaderError(f"{path}: entry {name!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise HeaderError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
    itemsize = DTYPE_BYTES[dtype]
    if not isinstance(shape, list) or not _counts(shape):
        raise HeaderError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and _counts(offsets)):
        raise HeaderError(f"{path}: tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    nbytes = math.prod(shape) * itemsize
    if end - begin != nbytes:
        raise HeaderError(
            f"{path}: tensor {name!r} ({dtype} {shape}) needs {nbytes} bytes but its offsets span {end - begin}"
        )
    return TensorInfo(name, dtype, tuple(shape), path, data_start + begin, nbytes)


def _counts(values: list[object]) -> bool:
    """All non-negative ints (bool is not one here). A plain loop: this runs per tensor."""
    for v in values:  # noqa: SIM110 (a plain loop is faster, and this runs per tensor)
        if type(v) is not int or v < 0:
            return False
    return True


def read_index(index: Path) -> dict[str, str]:
    """weight_map of a `model.safetensors.index.json`: tensor name -> shard file name."""
    try:
        data = json.loads(index.read_bytes())
    except OSError as exc:
        raise HeaderError(f"{index}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HeaderError(f"{index}: not JSON: {exc}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise HeaderError(f"{index}: needs a 'weight_map' object of tensor name -> file name")
    for shard in set(weight_map.values()):
        if Path(shard).is_absolute() or ".." in Path(shard).parts:
            raise HeaderError(f"{index}: shard {shard!r} points outside the checkpoint folder")
    return weight_map


def read_checkpoint(path: Path) -> dict[str, TensorInfo]:
    """All tensors of a checkpoint: a .safetensors file, or a folder with an index or .safetensors files."""
    if path.is_file():
        return read_header(path)
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = read_index(index)
        tensors: dict[str, TensorInfo] = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = path / shard
            if not shard_path.is_file():
                raise HeaderError(f"{index}: lists {shard}, which does not exist")
            tensors.update(read_header(shard_path))
        missing = sorted(name for name, shard in weight_map.items() if tensors.get(name) is None)
        if missing:
            raise HeaderError(f"{index}: lists tensors its shards lack: {', '.join(missing[:5])}")
        shard_names = {s: Path(s).name for s in set(weight_map.values())}
        wrong = sorted(n for n, s in weight_map.items() if tensors[n].file.name != shard_names[s])
        if wrong:
            raise HeaderError(f"{index}: maps {wrong[0]!r} to {weight_map[wrong[0]]}, but it is in another shard")
        return tensors
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise HeaderError(f"{path}: no .safetensors files and no {INDEX_FILE}")
    tensors = {}
    for file in files:
        for name, info in read_header(file).items():
            if name in tensors:
                raise HeaderError(f"{path}: tensor {name!r} is in both {tensors[name].file.name} and {file.name}")
            tensors[name] = info
    return tensors
