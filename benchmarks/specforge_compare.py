"""Our trainer's step against SpecForge's, on identical inputs, in one process.

    PYTHONPATH=/tmp/site:. python -m benchmarks.specforge_compare          # on the H200
    PYTHONPATH=/tmp/site:. python -m benchmarks.specforge_compare --tiny   # CPU smoke run

SpecForge is its PyPI release, installed apart from this repository and never
copied into it: its wheel downloaded into the git-ignored .whl/ (`.venv/bin/python -m pip
download --no-deps specforge==0.2.0 -d .whl`), carried to the GPU host (which has no network)
and installed there with `pip install --no-index --no-deps --target /tmp/site .whl/*.whl`.
Its draft model, loss and training step need nothing beyond torch, transformers
and triton (no sglang, no yunchang), which the GPU host has.

Both trainers get the same tensors: one synthetic batch (benchmarks.train_throughput's:
Llama-3.1-8B shapes, draft vocabulary 32,000 of 128,256, the teacher's argmax in the
draft vocabulary 95% of the time), the same target lm_head and embedding, the same
draft vocabulary and the same initial draft weights. Ours runs `Trainer.train_step`
(teacher, TTT unroll, loss, backward, clip, AdamW, schedule), compiled or not
(ours-plain: no torch.compile; the attention is the Triton TTT kernel either way). SpecForge runs its own training
core as its trainer assembles it for one GPU: `LlamaForCausalLMEagle3` in bf16 with
its attention backend (flex_attention or sdpa), `OnlineEagle3Model` (TTT 7),
`TargetHead`, `Eagle3TrainStrategy`, `FSDPTrainingBackend` (FSDP, one process,
SHARD_GRAD_OP) with its `BF16Optimizer` (fp32 master weights), one
`TrainerCore.train_step` per step, its loss its Triton kernel.

Nothing of SpecForge is replaced on the GPU. On the CPU (--tiny only), where FSDP
and Triton do not run, its model goes unwrapped and its Triton loss kernel
(`LogSoftmaxLoss`, CUDA only) is stood in for by its own reference formula
(`specforge.core.loss._compute_loss`), and only its sdpa backend runs (PyTorch
has no flex-attention backward on the CPU).

Peak memory is torch's max_memory_allocated over the variant's build and steps,
less what earlier variants left allocated (SpecForge's FSDP run leaves about 10
GiB), the shared batch included; tokens/s counts the batch's real tokens (not its padding).

Shapes (--shapes): 8 x 2048 with every sample's first 16 tokens outside the loss (94% of the
(position, step) rows in it), one sample of 2048, and a batch of 8 chats of 128 to 2,048 tokens (the
first 2,048, the rest random; right-padded; 16 prompt tokens each). --profile groups each variant's
kernels of one more step (benchmarks.kernel_groups) and writes every kernel to OUT.

Measured on one H200 (2026-12-04; torch 2.11, triton 3.6, transformers 5.17, SpecForge 0.2.0; 4 timed
steps after 2; x: ours / SpecForge's tokens/s, goal 1.5 compiled and 1.3 plain, at no more memory):

    shape             trainer          before (a378213)          after (fused passes)
                                       tok/s   GiB   x           tok/s   GiB   x     GiB/SF
    8 x 2048          ours, compiled   34,761  31.3  1.42        37,179  35.3  1.48  0.55
    8 x 2048          ours, plain      31,522  36.3  1.28        34,552  37.9  1.37  0.59
    8 x 2048          SpecForge flex   24,539  64.3              25,152  64.3
    1 x 2048          ours, compiled   30,752  11.5  2.10        31,897  11.5  2.18  0.87
    1 x 2048          ours, plain      26,646  12.3  1.82        27,501  11.9  1.88  0.90
    1 x 2048          SpecForge flex   14,620  13.2              14,646  13.2
    8 chats 128..2048 ours, compiled   32,166  21.8  2.28        34,041  23.0  2.42  0.36
    8 chats 128..2048 ours, plain      28,949  24.6  2.06        31,408  24.3  2.23  0.38
    8 chats 128..2048 SpecForge flex   14,082  64.3              14,069  64.3

(before and after on two machines, each beside its own SpecForge run.) Every goal is met but 8 x 2048
compiled: 1.48x, and 1.46x in a third sitting (ours 37,159, SpecForge 25,490; the lm_head in one chunk
of 128K rows: 37,190 tokens/s, in chunks of 64K 36,932, of 32K 36,633; expandable segments 37,096).

One step's kernels at 8 x 2048, ms (benchmarks.kernel_groups; the optimizer's group holds the loss's
0.8 ms multi-tensor scaling after; the teacher's reductions were in "other" and "copies" before):

    group                 compiled before -> after   plain before -> after   SpecForge
    matrix products            353.5 -> 345.5            345.6 -> 349.4        367.3
    attention bwd               21.6 -> 21.8              21.5 -> 22.0          39.0
    attention fwd                7.1 -> 7.0                6.8 -> 7.3           17.6
    gathers, scatters           12.4 -> 10.4              14.2 -> 12.6          23.9
    norms                        8.8 -> 8.6               13.2 -> 13.0           4.6
    soft cross-entropy          10.5 -> 8.4               10.4 -> 8.3            7.6
    SiLU and multiply           10.2 -> 6.2               10.6 -> 6.2            4.3
    optimizer and clipping       5.2 -> 6.0                4.9 -> 5.9            8.2
    copies and casts             9.9 -> 4.0               28.7 -> 20.0          71.8
    teacher's row statistics       - -> 1.8                  - -> 2.0              -
    other elementwise           11.6 -> 1.5               46.5 -> 25.4          71.0
    all kernels                450.7 -> 421.1            502.3 -> 472.0        615.4

What stops 8 x 2048 compiled short of 1.5x (a 434 ms step against SpecForge's 25,152; ours is 441 ms)
is no physical floor. The floors, kernel group by group: the matrix products are ~260 TFLOP (the
trainer's rows, the teacher's 17 TFLOP with them), 329 ms at 790 TFLOP/s, run at 752; the attention,
6.8 TFLOP, ~14 ms at FlashAttention-3's rates, 29 ms now (the backward 22); SiLU at its bandwidth
floor (6.2 ms for 5.8); the soft cross-entropy 8.4 ms for 6.5 (four passes over 109K x 32,000 bf16
at 4.3 TB/s); AdamW and clipping 6.0 for 4.0 (28 bytes a parameter, 425M parameters); the norms 8.6
for ~3.5. Together ~367 ms, 1.75x SpecForge. The step's 441 ms hold 421 of kernels, 4 of idle gaps
between them and 16 outside them (the compiled step syncs with the host 3 times, the plain one twice
and shows no such time). Any 7 ms of: the attention backward at FlashAttention-3's rate, that 16 ms,
the q/k/v row scatters (10 ms) or the norms at their floor, would close it.

Those 16 ms were not idle time: steps run back to back under the profiler (benchmarks.step_timeline)
show the device idle 4.5 ms a step and busy 446.5 (a single step's profile, after a wait for the device,
reads its kernels faster). Then (same date, three more H200s): the TTT kernel's diagonal steps before
its causal loop (k=6 at 8 x 2048, one machine: backward 3.47 -> 2.86 ms, forward 1.03 -> 0.89), the
loss's gradients left unscaled where training backpropagates it alone (1 ms), and the host's work that
needs no count queued before each sync (idle 4.5 -> 3.7 ms a step):

    shape             trainer          tok/s   GiB   x     GiB/SF
    8 x 2048          ours, compiled   37,022  35.3  1.47  0.55
    8 x 2048          ours, plain      34,197  37.9  1.36  0.59
    8 x 2048          SpecForge flex   25,226  64.3
    1 x 2048          ours, compiled   32,200  11.5  2.12  0.87
    1 x 2048          ours, plain      28,581  11.9  1.88  0.90
    1 x 2048          SpecForge flex   15,211  13.2
    8 chats 128..2048 ours, compiled   34,006  23.0  2.38  0.36
    8 chats 128..2048 ours, plain      31,263  24.3  2.19  0.38
    8 chats 128..2048 SpecForge flex   14,290  64.3

On one machine, 8 x 2048 compiled: 36,858 tokens/s before, 36,946 and 37,111 after, SpecForge 25,333
(1.455x, then 1.46x): a gain within two runs' spread (those two with a dQ kernel that read q and dO again
at each diagonal step, 0.1 ms a step slower alone and not kept). The 1.48x above came from a machine whose matrix
products ran 2.5% faster (345.5 ms a step against 354.4 here); ours is 83% matrix products, SpecForge's
step 60%, so such a machine favours us. One step's kernels after, ms (before in the table above):
matrix products 354.4, attention bwd 20.6, fwd 6.8, gathers and scatters 10.7, norms 8.8, soft
cross-entropy 8.6, SiLU 6.2, optimizer and clipping 5.0, copies 4.0, teacher's statistics 1.9, other
1.6: 428.5, SpecForge 622.6. 1.5x needs a 433 ms step at SpecForge's 25,226 (ours 442.5): 9.5 ms. What
bounds it, group by group: the matrix products at cuBLAS's ~735 TFLOP/s here (329 ms at 790; the
lm_head's weight gradient, K = 107K rows, at 650: 43 ms, no layout or fp32 output of it faster);
attention 27.4 ms against ~14 at FlashAttention-3's rates (the key-gradient kernel 1.5 ms at every k,
the query gradients 1.1 + 0.14 a diagonal step, still spilling 640 B a thread at k=6); norms 8.8 for
~3.5; the q/k/v scatters and gathers 10.7; the device idle 3.7 ms a step after the two host syncs (the
teacher's row count, step_rows' counts) while the host queues the next kernels.

Then (same date, two more H200s) the norms as Triton kernels (backends/train/rmsnorm.py: the post-attention
norm with its residual add, each backward with its weight's gradient). On one machine, 8 x 2048: compiled
36,452 tokens/s before, 36,565 after, SpecForge 24,550 (1.485x -> 1.49x), plain 34,859 (1.42x); one step's
kernels 430.0 -> 424.6 ms, the norms 8.8 -> 5.0 (forward 1.6-1.9 ms, at its ~1.7 floor with the residual
add in it; backward 3.0-3.2 for ~2.0, the same at 8 and 16 warps a program), the gathers 10.8 -> 11.9-12.4
(inductor had read hidden[inputs] inside its norm and add kernels; now it is gathered once).
On another (matrix products 345.6 ms): compiled 37,736, plain 35,967, SpecForge 25,704 (1.47x, 1.40x;
35.3 GiB, 0.55 of its 64.3); norms 5.05 ms compiled, 4.96 plain (13.0 before). Alone, at 16,384 rows
(benchmarks.fused_kernels_check) the backward is the slow half: 0.93 ms for a 0.16 floor, each program
walking its rows one at a time, where inductor's whole formula took 0.53. What is left of the 1.5x,
group by group against the floors above: attention 26.7 ms for ~14, the q/k/v and hidden-row gathers
and scatters ~12 (no floor: a layout that makes them views removes them), the norms' backward ~3,
the loss 8.5 for 6.5, the device idle ~3.5 a step after the host syncs.

Then (2026-12-05) the TTT kernel reads q, k and v as the trainer's packed rows, through a map of each
position's row (step_rows.where): gone are the zero-filled [B*T] copies of q, k and v at every step and the
gathers back, part of the ~12 ms of gathers and scatters above (the rest: the hidden rows' and the embeddings'
gathers). Not measured: no device was lent that session. Built for sm_90 without one
(benchmarks.ttt_kernel_build), the dQ kernel spills 384 B a thread at 6 steps (640 before), the forward 208 (0
before). To measure in one call: `python -m benchmarks.ttt_kernel_check --sweep --best $OUT/best.json --batch
8,1 --seq 2048 --flex-steps ""`, then this benchmark at --shapes 8x2048 with and without `--tiles $OUT/best.json`.

Earlier (2026-12-02, flex attention, before the TTT kernel): 1.40x / 1.24x at 8 x 2048, 1.81x /
1.49x at 1 x 2048; 2.46x / 2.13x on 8 chats of 512..2,048 with 256-token prompts.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from math import nan
from pathlib import Path
from typing import Any

import torch

from backends.train import distributed
from backends.train.config import DraftConfig
from backends.train.data import Batch
from backends.train.trainer import build_draft
from benchmarks._common import print_table
from benchmarks._device_timing import timed_calls
from benchmarks.kernel_groups import Kernels, profile_kernels
from benchmarks.train_throughput import (
    LLAMA_31_8B,
    TINY,
    add_shape_arguments,
    make_trainer,
    synthetic_batch,
    target_matrices,
)

VARIANTS = ("ours-compiled", "ours-plain", "specforge-flex_attention", "specforge-sdpa")
GPU_VARIANTS = VARIANTS[:3]  # sdpa, SpecForge's slower backend, on request
# 8 x 2048 nearly all in the loss, one sample, and a batch of chats of 128 to 2,048 tokens (issue 25).
SHAPES = ("8x2048", "1x2048", "8x128-2048")
TINY_SHAPES = ("2x64", "1x64", "2x16-64")
LR = 1e-4
MAX_GRAD_NORM = 0.5
WARMUP_RATIO = 0.015
TOTAL_STEPS = 10_000


def start_process_group(device: torch.device) -> None:
    """SpecForge's backend wraps the draft in FSDP, which needs a process group: one process of one."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
    )


def use_reference_loss() -> None:
    """CPU only: SpecForge's loss kernel is Triton (CUDA); its own reference formula stands in."""
    import specforge.algorithms.eagle3.model as eagle3  # type: ignore[import-not-found,unused-ignore]
    import specforge.core.loss as sf_loss  # type: ignore[import-not-found,unused-ignore]

    class ReferenceLoss:
        apply = staticmethod(sf_loss._compute_loss)

    eagle3.LogSoftmaxLoss = ReferenceLoss


def specforge_step(cfg: DraftConfig, attention: str, ttt: int, batch: Batch, device: torch.device) -> Callable[[], Any]:
    """SpecForge's TrainerCore over a draft with our initial weights; returns one training step."""
    from specforge.algorithms.eagle3.model import OnlineEagle3Model  # type: ignore[import-not-found,unused-ignore]
    from specforge.modeling.draft.llama3_eagle import (  # type: ignore[import-not-found,unused-ignore]
        LlamaForCausalLMEagle3,
    )
    from specforge.modeling.target.target_head import TargetHead  # type: ignore[import-not-found,unused-ignore]
    from specforge.optimizer import BF16Optimizer  # type: ignore[import-not-found,unused-ignore]
    from specforge.runtime.contracts import TrainBatch  # type: ignore[import-not-found,unused-ignore]
    from specforge.training.backend import (  # type: ignore[import-not-found,unused-ignore]
        FSDPTrainingBackend,
        ParallelConfig,
    )
    from specforge.training.controller import TrainerCore  # type: ignore[import-not-found,unused-ignore]
    from specforge.training.strategies.base import Eagle3TrainStrategy  # type: ignore[import-not-found,unused-ignore]
    from transformers import LlamaConfig

    cuda = device.type == "cuda"
    fields: dict[str, Any] = {
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "hidden_act": cfg.hidden_act,
        "num_hidden_layers": 1,
        "tie_word_embeddings": False,
    }
    config = LlamaConfig(**fields)
    config.draft_vocab_size = cfg.draft_vocab_size
    config.target_hidden_size = cfg.target_hidden_size
    embed, lm_head, vocab = target_matrices(cfg, device)
    with torch.device(device):
        ours = build_draft(cfg, embed, lm_head, vocab, torch.float32, seed=0).state_dict()
        draft = LlamaForCausalLMEagle3(config, attention_backend=attention)
    del embed
    missing, unexpected = draft.load_state_dict(ours, strict=False)
    loaded = set(ours) - set(unexpected)
    if unexpected or any(not name.endswith("inv_freq") and "rotary" not in name for name in missing):
        raise RuntimeError(f"SpecForge's draft does not take our weights: missing {missing}, unexpected {unexpected}")
    if len(loaded) < 10:
        raise RuntimeError(f"only {sorted(loaded)} of our weights reached SpecForge's draft")
    del ours
    draft.freeze_embedding()
    draft = draft.to(device=device, dtype=torch.bfloat16)
    model = OnlineEagle3Model(draft_model=draft, length=ttt, attention_backend=attention).to(device, torch.bfloat16)
    with tempfile.TemporaryDirectory() as folder, torch.device(device):
        config.save_pretrained(folder)
        head = TargetHead(folder)
    with torch.no_grad():
        head.fc.weight.copy_(lm_head)
    del lm_head
    head.freeze_weights()
    head = head.eval().to(device=device, dtype=torch.bfloat16)

    def optimizer(module: Any) -> Any:
        return BF16Optimizer(
            module, lr=LR, max_grad_norm=MAX_GRAD_NORM, total_steps=TOTAL_STEPS, warmup_ratio=WARMUP_RATIO
        )

    backend = FSDPTrainingBackend(ParallelConfig.from_distributed(), optimizer_factory=optimizer)
    wrapped = backend.prepare_model(model, wrap=cuda, optimizer_target=model.draft_model)
    core = TrainerCore(Eagle3TrainStrategy(wrapped, target_head=head), backend)
    train_batch = TrainBatch(
        sample_ids=[str(i) for i in range(batch.input_ids.shape[0])],
        strategy="eagle3",
        tensors={
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask.long(),
            "loss_mask": batch.loss_mask.long(),
            # bf16 already on the GPU (the same tensors as ours); on the CPU ours are float32.
            "target": batch.hidden_state.to(torch.bfloat16),
            "hidden_state": batch.aux_hidden_states.to(torch.bfloat16),
        },
        metadata={"target_repr": "hidden_state"},
    )
    return lambda: core.train_step(train_batch)


@dataclass(frozen=True)
class Shape:
    """A batch of `batch` samples padded to `seq`; with `min_length`, chats of random lengths min_length..seq."""

    batch: int
    seq: int
    min_length: int | None = None

    @classmethod
    def parse(cls, text: str) -> Shape:
        """`8x2048`, or `8x128-2048` for chats of 128 to 2,048 tokens."""
        batch, _, lengths = text.partition("x")
        low, _, high = lengths.rpartition("-")
        return cls(int(batch), int(high), int(low) if low else None)

    def __str__(self) -> str:
        if self.min_length is None:
            return f"{self.batch} x {self.seq}"
        return f"{self.batch} chats {self.min_length}..{self.seq}"


def first_accuracy(variant: str, out: Any, ttt: int) -> float:
    """acc_0 of a step's result (ours: the stats row; SpecForge's: its StepResult)."""
    if variant.startswith("ours"):
        return float(out[1 + ttt] / out[1 + 2 * ttt].clamp_min(1))
    return float(out.metrics["acc_0"])


def measure(
    variant: str, cfg: DraftConfig, args: argparse.Namespace, batch: Batch, ctx: distributed.Dist
) -> tuple[dict[str, Any], Kernels | None]:
    """Build one trainer and time its steps (and profile one more with --profile); everything it built is
    garbage when this returns."""
    size = batch.input_ids.shape[0]
    if variant.startswith("ours"):
        args.batch_size = size
        trainer = make_trainer(cfg, args, variant == "ours-compiled", ctx)
        step: Callable[[], Any] = functools.partial(trainer.train_step, batch)
    else:
        step = specforge_step(cfg, variant.removeprefix("specforge-"), args.ttt, batch, ctx.device)
    outputs: list[Any] = []

    def step_keeping_the_first() -> Any:
        out = step()
        if not outputs:
            outputs.append(out)
        return out

    # At least one warm-up step: its accuracy, before any update, is compared across trainers.
    timing = timed_calls(step_keeping_the_first, max(args.warmup, 1), args.steps, ctx.device)
    kernels = profile_kernels(step, ctx.device) if args.profile else None
    return {**timing.rates(batch.tokens), "acc_0": first_accuracy(variant, outputs[0], args.ttt)}, kernels


def batch_gib(batch: Batch) -> float:
    tensors = (batch.input_ids, batch.loss_mask, batch.attention_mask, batch.hidden_state, batch.aux_hidden_states)
    return sum(t.numel() * t.element_size() for t in tensors) / 2**30


def free(device: torch.device) -> float:
    """Collect what the last variant left; the memory still allocated, in GiB."""
    gc.collect()
    if device.type != "cuda":
        return 0.0
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(device) / 2**30


def measure_kept(
    variant: str, shape: Shape, cfg: DraftConfig, args: argparse.Namespace, batch: Batch, ctx: distributed.Dist
) -> tuple[dict[str, Any], Kernels | None]:
    """measure(), its peak memory as a process of its own would see it, and a failure as a result: one
    variant's failure must not lose the others' figures."""
    device = ctx.device
    before = free(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    kernels = None
    try:
        result, kernels = measure(variant, cfg, args, batch, ctx)
    except torch.OutOfMemoryError:
        print(f"{variant}, {shape}: out of GPU memory", flush=True)
        result = {"tokens_per_s": float("nan"), "error": "out of memory"}
    except Exception as exc:
        traceback.print_exc()
        print(f"{variant}, {shape}: failed: {exc!r}", flush=True)
        result = {"tokens_per_s": float("nan"), "error": repr(exc)}
    # What an earlier variant left allocated (SpecForge's FSDP run leaves gigabytes) is not this one's;
    # the shared batch is, as it would be in a process of its own.
    cuda = device.type == "cuda"
    result["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 - before + batch_gib(batch) if cuda else nan
    result["held_before_gib"] = before
    # Compiled code must not keep the last variant's parameters alive into the next one's peak.
    if free(device) > before + 0.5:
        torch._dynamo.reset()
    return result, kernels


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.specforge_compare", description=__doc__)
    add_shape_arguments(parser, batches=None, steps=4, warmup=2)
    parser.add_argument(
        "--shapes",
        default=None,
        help=f"comma list of BATCHxSEQ or BATCHxMIN-SEQ (chats of random lengths); default {','.join(SHAPES)} "
        f"(tiny: {','.join(TINY_SHAPES)})",
    )
    parser.add_argument("--variants", default=None, help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument(
        "--tiles", type=Path, help="the TTT kernel's tiles from a sweep (benchmarks.ttt_kernel_check --sweep --best)"
    )
    args = parser.parse_args()
    if args.tiles is not None:
        from benchmarks.ttt_kernel_check import use_tiles

        use_tiles(args.tiles)
    started = time.perf_counter()
    ctx = distributed.init()
    device = ctx.device
    cuda = device.type == "cuda"
    cfg = TINY if args.tiny else LLAMA_31_8B
    shapes = [Shape.parse(s) for s in (args.shapes or ",".join(TINY_SHAPES if args.tiny else SHAPES)).split(",")]
    default_variants = GPU_VARIANTS if cuda else ("ours-plain", "specforge-sdpa")
    variants = args.variants.split(",") if args.variants else list(default_variants)
    args.attention = "auto"
    sf_version = version("specforge")
    wrap = "FSDP, 1 process, SHARD_GRAD_OP" if cuda else "unwrapped; reference loss for its Triton kernel"
    print(
        f"device {torch.cuda.get_device_name(device) if cuda else 'cpu'}, torch {torch.__version__}; "
        f"SpecForge {sf_version} ({wrap}); shapes {', '.join(map(str, shapes))}, TTT {args.ttt}; "
        f"teacher argmax in the draft vocab {args.in_vocab:.0%}, prompt {args.prompt} tokens",
        flush=True,
    )
    if any(v.startswith("specforge") for v in variants):
        if cuda:
            start_process_group(device)
        else:
            use_reference_loss()
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    results: dict[tuple[str, Shape], dict[str, Any]] = {}
    profiles: dict[str, Any] = {}
    for shape in shapes:
        gen = torch.Generator(device=device).manual_seed(2)
        batch = synthetic_batch(cfg, shape.batch, shape.seq, device, gen, args.in_vocab, args.prompt, shape.min_length)
        for variant in variants:
            if time.perf_counter() - started > args.budget_s:
                print(f"skipping {variant}, {shape}: over the time budget", flush=True)
                continue
            result, kernels = measure_kept(variant, shape, cfg, args, batch, ctx)
            results[variant, shape] = result
            print(f"{variant}, {shape}: {json.dumps(result)}", flush=True)
            if kernels is not None:
                print(f"{variant}, {shape}, one step's kernels:\n{kernels.report()}", flush=True)
                profiles[f"{variant}, {shape}"] = kernels.to_json()
            if args.results is not None:
                line = {"label": "compare", "variant": variant, "shape": str(shape), "specforge": sf_version}
                with args.results.open("a") as fh:
                    fh.write(json.dumps({**line, **result}) + "\n")
    if profiles and out_dir is not None:
        (out_dir / "specforge_compare_profiles.json").write_text(json.dumps(profiles))
    print_table(comparison_rows(results, shapes), headers=HEADERS)
    if cuda and any(v.startswith("specforge") for v in variants):
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


HEADERS = ("shape", "trainer", "tokens/s", "peak GiB", "x SpecForge", "goal", "GiB / SpecForge")
# ours / SpecForge's tokens/s to reach, compiled and plain (issue 25).
GOALS = {"ours-compiled": 1.5, "ours-plain": 1.3}


def comparison_rows(results: dict[tuple[str, Shape], dict[str, Any]], shapes: list[Shape]) -> list[list[str]]:
    """One row per (shape, trainer); ours as a multiple of SpecForge's tokens/s (flex attention where it ran,
    else sdpa) and its memory as a share of SpecForge's."""
    rows = []
    for shape in shapes:
        bases = [results.get((f"specforge-{backend}", shape)) for backend in ("flex_attention", "sdpa")]
        base = next((b for b in bases if b is not None), None)
        for (variant, at), r in results.items():
            if at != shape:
                continue
            ratio = memory = "-"
            if base is not None and variant.startswith("ours"):
                ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}"
                memory = f"{r['peak_gib'] / base['peak_gib']:.2f}"
            goal = f">= {GOALS[variant]}" if variant in GOALS else "-"
            rows.append([str(shape), variant, f"{r['tokens_per_s']:,.0f}", f"{r['peak_gib']:.1f}", ratio, goal, memory])
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
