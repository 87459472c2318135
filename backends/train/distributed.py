"""One process per GPU under `torchrun`: process group, device, DDP or FSDP wrapping.

Without torchrun (no WORLD_SIZE, or 1) everything here is a no-op on one device.
Checkpoints go through torch.distributed.checkpoint's state-dict helpers, which
gather full (unsharded, unprefixed) state dicts from a plain module, DDP or FSDP.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

# Above this many trainable parameters FSDP shards them (and the optimizer state);
# below it DDP's replicas fit easily and communicate less.
FSDP_AUTO_PARAMS = 2_000_000_000


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def init() -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    return Dist(rank=rank, world=world, local_rank=local_rank, device=device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def use_fsdp(mode: str, world: int, trainable_params: int) -> bool:
    if mode == "on":
        return True
    return mode == "auto" and world > 1 and trainable_params > FSDP_AUTO_PARAMS


def wrap(draft: nn.Module, ctx: Dist, fsdp: bool, compute_dtype: torch.dtype) -> nn.Module:
    """The module to call for training: the draft itself, DDP(draft), or the draft sharded in place."""
    if fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        # Units: the frozen embedding, the layer, then the rest (fc, norm, lm_head) at the root.
        fully_shard(draft.get_submodule("embed_tokens"), mp_policy=policy)
        fully_shard(draft.get_submodule("midlayer"), mp_policy=policy)
        fully_shard(draft, mp_policy=policy)
        return draft
    if ctx.world > 1:
        ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(draft, device_ids=ids)
    return draft


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Backward passes within reduce their gradients across processes only when `enabled` (the last
    micro-batch of a step): DDP's no_sync, FSDP's requires_gradient_sync; a plain module has nothing to sync."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, nn.parallel.DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
        return
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
    yield


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
