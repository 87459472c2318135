"""The streaming shard writer writes exactly what safetensors writes, and the extraction loop's shards (states
copied batch by batch into reused host blocks, samples out of order) are the files write_shard makes of them."""

from __future__ import annotations

import hashlib
import itertools
import random
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save, save_file

from backends.eagle3_contract import SAFETENSORS_DTYPES, ContractError, read_shard, write_safetensors, write_shard
from backends.extract.capture import Captured
from backends.extract.output import ShardRecord, save_shard
from backends.extract.pipeline import HostShard, ShardJob, run_pipeline
from backends.extract.template import TokenizedChat

DTYPES = [getattr(torch, name) for name in SAFETENSORS_DTYPES]
STATE_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def random_tensor(shape: list[int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-100, 100, shape, generator=gen).to(dtype)


def split(tensor: torch.Tensor, cuts: list[int]) -> list[torch.Tensor]:
    """`tensor` in pieces along its first dimension, at `cuts` (possibly empty pieces)."""
    edges = [0, *sorted(c % (tensor.shape[0] + 1) for c in cuts), tensor.shape[0]]
    return [tensor[a:b] for a, b in itertools.pairwise(edges)]


tensor_specs = st.dictionaries(
    st.text("abcxyz_.0123456789", min_size=1, max_size=6),
    st.tuples(
        st.sampled_from(DTYPES),
        st.lists(st.integers(0, 5), max_size=3),
        st.lists(st.integers(0, 10), max_size=3),
        st.integers(0, 2**31),
    ),
    max_size=6,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=tensor_specs)
def test_the_writer_writes_what_safetensors_writes(
    tmp_path: Path, specs: dict[str, tuple[torch.dtype, list[int], list[int], int]]
) -> None:
    tensors = {name: random_tensor(shape, dtype, seed) for name, (dtype, shape, _, seed) in specs.items()}
    pieces = {
        name: split(tensors[name], cuts) if tensors[name].dim() else [tensors[name]]
        for name, (_, _, cuts, _) in specs.items()
    }
    path = tmp_path / "t.safetensors"
    size, sha256 = write_safetensors(path, pieces)
    raw = path.read_bytes()
    assert raw == save(tensors)
    assert (size, sha256) == (len(raw), hashlib.sha256(raw).hexdigest())
    loaded = load_file(str(path))
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].shape == tensor.shape
        assert torch.equal(loaded[name], tensor)


def random_samples(lengths: list[int], hidden: int, dtype: torch.dtype, seed: int) -> list[dict[str, torch.Tensor]]:
    return [
        {
            "input_ids": random_tensor([n], torch.int64, seed + i),
            "loss_mask": random_tensor([n], torch.int8, seed - i).clamp(0, 1),
            "hidden_state": random_tensor([n, hidden], dtype, seed * 3 + i),
            "aux_hidden_states": random_tensor([n, 3 * hidden], dtype, seed * 5 + i),
        }
        for i, n in enumerate(lengths)
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    hidden=st.integers(1, 16),
    dtype=st.sampled_from(STATE_DTYPES),
    seed=st.integers(0, 2**20),
)
def test_a_shard_is_the_file_the_safetensors_library_made_of_it(
    tmp_path: Path, lengths: list[int], hidden: int, dtype: torch.dtype, seed: int
) -> None:
    samples = random_samples(lengths, hidden, dtype, seed)
    info = write_shard(tmp_path / "shard.safetensors", samples)
    assert (info.file, info.samples, info.tokens) == ("shard.safetensors", len(lengths), sum(lengths))
    # What write_shard wrote before it streamed: the tensors concatenated, saved by the library.
    names = ("input_ids", "loss_mask", "hidden_state", "aux_hidden_states")
    before = {name: torch.cat([s[name] for s in samples]) for name in names}
    before["sample_offsets"] = torch.tensor([0, *itertools.accumulate(lengths)])
    save_file(before, str(tmp_path / "before.safetensors"))
    assert (tmp_path / "shard.safetensors").read_bytes() == (tmp_path / "before.safetensors").read_bytes()
    for read, sample in zip(read_shard(tmp_path / "shard.safetensors"), samples, strict=True):
        assert all(torch.equal(read[name], sample[name]) for name in names)


def test_a_failed_write_leaves_the_previous_file_and_no_temporary_one(tmp_path: Path) -> None:
    path = tmp_path / "shard.safetensors"
    write_shard(path, random_samples([3, 5], 4, torch.bfloat16, 1))
    before = path.read_bytes()
    # A meta tensor has a size, so the header is written, but no bytes to write after it.
    unreadable = {"a": [torch.zeros(4)], "b": [torch.empty(3, device="meta")]}
    with pytest.raises(NotImplementedError):
        write_safetensors(path, unreadable)
    with pytest.raises(ContractError, match="pieces differ"):
        write_safetensors(path, {"a": [torch.zeros(2, 3), torch.zeros(2, 4)]})
    with pytest.raises(ContractError, match="do not hold"):
        write_safetensors(path, {"a": [torch.zeros(2, dtype=torch.complex64)]})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["shard.safetensors"]


HIDDEN = 8


def states_of(ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Made-up states that depend on the token and its position, so that a misplaced row shows."""
    t = torch.tensor(ids, dtype=torch.float32)[:, None] + torch.arange(len(ids), dtype=torch.float32)[:, None] / 64
    hidden = (t * torch.arange(1, HIDDEN + 1)).to(torch.bfloat16)
    return hidden, torch.cat([hidden, -hidden, hidden * 2], dim=-1)


class PaddedCapturer:
    """Returns each sample's states as views of a right-padded batch, as the hf backend does."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def capture(self, batch: list[list[int]]) -> list[Captured]:
        self.batches.append([len(ids) for ids in batch])
        width = max(len(ids) for ids in batch)
        hidden = torch.full((len(batch), width, HIDDEN), float("nan"), dtype=torch.bfloat16)
        aux = torch.full((len(batch), width, 3 * HIDDEN), float("nan"), dtype=torch.bfloat16)
        for row, ids in enumerate(batch):
            hidden[row, : len(ids)], aux[row, : len(ids)] = states_of(ids)
        return [Captured(hidden[row, : len(ids)], aux[row, : len(ids)]) for row, ids in enumerate(batch)]


def test_the_loop_writes_each_shard_as_write_shard_would(tmp_path: Path) -> None:
    rng = random.Random(3)
    sizes = [5, 0, 7, 2, 9, 1]  # chats per shard; one shard with every chat dropped
    jobs = []
    for index, size in enumerate(sizes):
        chats = []
        for _ in range(size):
            n = rng.randint(1, 60)
            chats.append(TokenizedChat([rng.randrange(1000) for _ in range(n)], [rng.randint(0, 1) for _ in range(n)]))
        jobs.append(ShardJob(index, index * 10, index * 10 + 10, chats, {"too long": 10 - size}))
    capturer = PaddedCapturer()
    out = tmp_path / "out"
    out.mkdir()

    def save(job: ShardJob, shard: HostShard | None) -> ShardRecord:
        record = ShardRecord(job.index, None, job.first_chat, job.end_chat, len(job.samples), 0)
        return save_shard(out, record, shard.tensors if shard else None)

    recorded: list[ShardRecord] = []
    run_pipeline(capturer, jobs, 100, save, recorded.append, writers=3)

    # Several batches per shard, longest first: the states reach the host out of the samples' order.
    assert any(len(b) > 1 for b in capturer.batches) and len(capturer.batches) > len(sizes)
    assert [r.index for r in recorded] == list(range(len(sizes)))
    assert [r.file for r in recorded if r.file is None] == [None]
    expected = tmp_path / "expected"
    expected.mkdir()
    for job, record in zip(jobs, recorded, strict=True):
        if not job.samples:
            continue
        assert record.file is not None
        rows = []
        for chat in job.samples:
            hidden, aux = states_of(chat.input_ids)
            rows.append(
                {
                    "input_ids": torch.tensor(chat.input_ids),
                    "loss_mask": torch.tensor(chat.loss_mask, dtype=torch.int8),
                    "hidden_state": hidden,
                    "aux_hidden_states": aux,
                }
            )
        write_shard(expected / record.file, rows)
        raw = (out / record.file).read_bytes()
        assert raw == (expected / record.file).read_bytes()
        assert (record.bytes, record.sha256) == (len(raw), hashlib.sha256(raw).hexdigest())
    assert sorted(p.name for p in out.iterdir()) == sorted(r.file for r in recorded if r.file)
