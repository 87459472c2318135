"""The shard loop: chats through the target in batches of similar length, shards written in the background.

`run_pipeline` keeps the target busy in the calling thread. Each batch's states
are copied to host memory on a side CUDA stream while the next batch runs,
straight to where the shard's file holds them (samples in order, no padding),
so a finished shard is its file's tensors in one block of memory. `writers`
threads write those blocks to disk as they are (eagle3_contract's
write_safetensors: large sequential writes, hashed on the way), and the
calling thread records each written shard in order. Blocks are pinned once
and reused (`HostBuffers`): at most `writers` + 1 shards are in host memory.
The benchmark (`benchmarks.extract_throughput`) times this same loop.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from backends.extract import capture
from backends.extract.template import TokenizedChat

if TYPE_CHECKING:
    import torch

Saved = TypeVar("Saved")
# A host block is this much larger than the shard that first needs it, so that later, slightly longer
# shards reuse it instead of pinning a new one.
HEADROOM = 1.25


@dataclass
class ShardJob:
    """One shard to extract: the chats [first_chat, end_chat) less those dropped, by reason."""

    index: int
    first_chat: int
    end_chat: int
    samples: list[TokenizedChat]
    dropped: dict[str, int]


@dataclass
class HostShard:
    """One shard in host memory: its file's tensors by name (SHARD_TENSORS), each one contiguous tensor.

    The states may still be on their way from the GPU: `wait` before reading them.
    """

    tensors: dict[str, torch.Tensor]
    block: torch.Tensor
    copied: list[torch.cuda.Event] = field(default_factory=list)

    def wait(self) -> None:
        for event in self.copied:
            event.synchronize()


class HostBuffers:
    """Host memory blocks, reused from shard to shard, pinned (registered with CUDA) for copies from a GPU.

    Pinning costs about as much as the copies it speeds up, so blocks are kept; when none that is free is
    large enough, one free block is dropped before a larger one is made, so that there are never more blocks
    than shards in flight.
    """

    def __init__(self) -> None:
        self._free: list[torch.Tensor] = []
        self._pinned: set[int] = set()
        self._lock = threading.Lock()

    def take(self, nbytes: int, pinned: bool) -> torch.Tensor:
        import torch

        with self._lock:
            fits = [b for b in self._free if b.numel() >= nbytes and (b.data_ptr() in self._pinned or not pinned)]
            if fits:
                block = min(fits, key=lambda b: b.numel())
                self._remove(block)
                return block
            if self._free:
                self._drop(max(self._free, key=lambda b: b.numel()))
        block = torch.empty(int(nbytes * HEADROOM), dtype=torch.uint8)
        if pinned and block.numel():
            # cudaHostRegisterPortable: pinned for every GPU, for targets spread over several.
            error = _cudart().cudaHostRegister(block.data_ptr(), block.numel(), 1)
            if int(error) != 0:
                raise RuntimeError(f"cannot pin {block.numel():,} bytes of host memory (CUDA error {int(error)})")
            with self._lock:
                self._pinned.add(block.data_ptr())
        return block

    def give_back(self, block: torch.Tensor) -> None:
        with self._lock:
            self._free.append(block)

    def close(self) -> None:
        """Unpin and drop the free blocks (all of them once every shard is written)."""
        with self._lock:
            while self._free:
                self._drop(self._free[-1])

    def _remove(self, block: torch.Tensor) -> None:
        # By identity: `list.remove` would compare tensors element by element.
        self._free = [b for b in self._free if b is not block]

    def _drop(self, block: torch.Tensor) -> None:
        self._remove(block)
        if block.data_ptr() in self._pinned:
            self._pinned.remove(block.data_ptr())
            _cudart().cudaHostUnregister(block.data_ptr())


def _cudart() -> Any:
    import torch

    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


class ShardExtractor:
    """Runs shards through a capturer into host blocks, copying on one side stream per GPU."""

    def __init__(self, capturer: capture.Capturer, batch_tokens: int, buffers: HostBuffers) -> None:
        self.capturer = capturer
        self.batch_tokens = batch_tokens
        self.buffers = buffers
        self.streams: dict[torch.device, torch.cuda.Stream] = {}

    def extract(self, samples: list[TokenizedChat]) -> HostShard:
        """The shard of `samples` (at least one), in their order; its states may still be arriving (`wait`)."""
        import torch

        lengths = [len(s.input_ids) for s in samples]
        starts = list(itertools.accumulate(lengths, initial=0))
        tensors: dict[str, torch.Tensor] = {}
        block: torch.Tensor | None = None
        used: set[torch.device] = set()
        try:
            for batch in length_batches(lengths, self.batch_tokens):
                states = self.capturer.capture([samples[i].input_ids for i in batch])
                if block is None:
                    block = self._layout(tensors, states[0], starts[-1])
                pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
                for index, state in zip(batch, states, strict=True):
                    rows = slice(starts[index], starts[index + 1])
                    pairs += [
                        (tensors["aux_hidden_states"][rows], state.aux_hidden_states),
                        (tensors["hidden_state"][rows], state.hidden_state),
                    ]
                used |= self._copy(pairs)
        except BaseException:
            if block is not None:
                # Copies already queued must land before the block is reused or freed.
                for stream in self.streams.values():
                    stream.synchronize()
                self.buffers.give_back(block)
            raise
        assert block is not None  # at least one sample, so at least one batch
        tensors["input_ids"] = torch.tensor(
            list(itertools.chain.from_iterable(s.input_ids for s in samples)), dtype=torch.int64
        )
        tensors["loss_mask"] = torch.tensor(
            list(itertools.chain.from_iterable(s.loss_mask for s in samples)), dtype=torch.int8
        )
        tensors["sample_offsets"] = torch.tensor(starts, dtype=torch.int64)
        copied = [self.streams[device].record_event() for device in used]
        return HostShard(tensors, block, copied)

    def _layout(self, tensors: dict[str, torch.Tensor], first: capture.Captured, tokens: int) -> torch.Tensor:
        """Take a block for `tokens` tokens of states shaped as `first`'s and lay the shard's states out in it."""
        shapes = {"aux_hidden_states": first.aux_hidden_states, "hidden_state": first.hidden_state}
        sizes = {name: tokens * t.shape[-1] * t.element_size() for name, t in shapes.items()}
        # Each tensor starts 8-byte aligned, as a view of another dtype needs.
        spans = [-(-size // 8) * 8 for size in sizes.values()]
        on_gpu = any(t.device.type == "cuda" for t in shapes.values())
        block = self.buffers.take(sum(spans), pinned=on_gpu)
        offset = 0
        for (name, t), span in zip(shapes.items(), spans, strict=True):
            raw = block[offset : offset + sizes[name]]
            tensors[name] = raw.view(t.dtype).view(tokens, t.shape[-1])
            offset += span
        return block

    def _copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> set[torch.device]:
        """Copy each (host destination, source); from a GPU on its side stream, after the work queued so far,
        without waiting. The GPUs copied from."""
        import torch

        used: set[torch.device] = set()
        # Captured states may be inference tensors: marking them as used by the side stream counts as a
        # write to them.
        with torch.inference_mode():
            for dest, source in pairs:
                if source.device.type != "cuda":
                    dest.copy_(source)
                    continue
                stream = self.streams.get(source.device)
                if stream is None:
                    stream = self.streams[source.device] = torch.cuda.Stream(source.device)  # type: ignore[no-untyped-call]
                if source.device not in used:
                    stream.wait_stream(torch.cuda.current_stream(source.device))
                    used.add(source.device)
                with torch.cuda.stream(stream):
                    dest.copy_(source, non_blocking=True)
                # The allocator must not reuse the states' memory before this stream has read it.
                source.record_stream(stream)
        return used


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped longest first so that each padded batch holds at most `batch_tokens` (or one sample)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for index in order:
        # Longest first: a batch's width is the length of its first sample.
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


def run_pipeline(
    capturer: capture.Capturer,
    jobs: Iterable[ShardJob],
    batch_tokens: int,
    save: Callable[[ShardJob, HostShard | None], Saved],
    record: Callable[[Saved], None],
    writers: int = 1,
) -> None:
    """Extract every job's shard, `save` it in a writer thread (None for a job whose chats were all dropped),
    and `record` what `save` returned, in job order.

    An error stops the loop and is raised, after the shards already being saved are recorded (so that a
    restart skips them).
    """
    buffers = HostBuffers()
    extractor = ShardExtractor(capturer, batch_tokens, buffers)

    def write(job: ShardJob, shard: HostShard | None) -> Saved:
        if shard is None:
            return save(job, None)
        try:
            shard.wait()
            return save(job, shard)
        finally:
            buffers.give_back(shard.block)

    pending: deque[Future[Saved]] = deque()
    try:
        with ThreadPoolExecutor(max_workers=writers, thread_name_prefix="shard-writer") as pool:
            try:
                for job in jobs:
                    shard = extractor.extract(job.samples) if job.samples else None
                    if len(pending) == writers:
                        record(pending.popleft().result())
                    pending.append(pool.submit(write, job, shard))
            finally:
                while pending:
                    record(pending.popleft().result())
    finally:
        buffers.close()
