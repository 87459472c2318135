"""Our trainer's step against SpecForge's, on identical inputs, in one process.

    PYTHONPATH=/tmp/site:. python -m benchmarks.specforge_compare          # on the H200
    PYTHONPATH=/tmp/site:. python -m benchmarks.specforge_compare --tiny   # CPU smoke run

SpecForge is its PyPI release, installed apart from this repository and never
copied into it: `pip install --no-deps --target /tmp/site specforge==0.2.0`.
Its draft model, loss and training step need nothing beyond torch, transformers
and triton (no sglang, no yunchang), which the GPU host has.

Both trainers get the same tensors: one synthetic batch (benchmarks.train_throughput's:
Llama-3.1-8B shapes, draft vocabulary 32,000 of 128,256, the teacher's argmax in the
draft vocabulary 95% of the time), the same target lm_head and embedding, the same
draft vocabulary and the same initial draft weights. Ours runs `Trainer.train_step`
(teacher, TTT unroll, loss, backward, clip, AdamW, schedule), compiled or not
(`--no-compile`: flex attention alone compiled). SpecForge runs its own training
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

Measured on one H200 (2026-12-02; torch 2.11, transformers 5.17, SpecForge 0.2.0;
4 timed steps after 2), each step computing only the rows that reach the loss
(backends/train/step_rows.py), with each sample's first 16 tokens (the default)
and 512 tokens (--prompt 512: a quarter of each sample, as a chat's system
prompt and user turn) outside the loss:

    batch     trainer                   prompt 16        prompt 512
                                        tok/s   GiB  x   tok/s   GiB  x
    8 x 2048  ours, compiled            35,295  32.1 1.40 44,929  28.0 1.70
    8 x 2048  ours, --no-compile        31,454  40.1 1.24 39,861  34.2 1.51
    8 x 2048  SpecForge, flex_attention 25,269  64.3      26,357  64.3
    1 x 2048  ours, compiled            30,778  11.7 1.81 38,134  11.2 2.53
    1 x 2048  ours, --no-compile        25,430  12.8 1.49 32,661  11.8 2.16
    1 x 2048  SpecForge, flex_attention 17,028  13.2      15,097  13.2

(x: ours / SpecForge flex_attention.) After this run, the skipped rows' layout
stopped keeping copies for backward: without torch.compile, 37.5 GiB at 8 x
2048 and 12.5 GiB at 1 x 2048 (prompt 16, benchmarks.train_throughput), below
SpecForge's 64.3 and 13.2. SpecForge computes every row at every TTT
step, so the prompt changes its time only through its loss. Earlier the same
day, before rows outside the loss were skipped (6 timed steps): 1.37 / 1.23 at 8
x 2048 and 1.94 / 1.61 at 1 x 2048 against SpecForge's 24,952 and 15,834 (its
batch-1 figure varies by about 10% between runs). The sdpa backend, 16,270 and
12,725 tokens/s on 2026-12-01, was not run again.

A batch of chats (--min-length 512 --prompt 256: 8 chats of 512 to 2,048 tokens,
56% of the 8 x 2048 positions real, right-padded, each chat's first 256 tokens
outside the loss; 3 timed steps after 2; tokens/s of real tokens): ours without
torch.compile 34,951 tokens/s (24.7 GiB), SpecForge flex_attention 16,410 (64.3
GiB): 2.13x. Compiled, on 2026-12-02 (the same batch): ours 39,685 tokens/s
(22.2 GiB) against SpecForge flex_attention's 16,100 (64.3 GiB): 2.46x.

With the teacher's argmax in the draft vocabulary 25% of the time (--in-vocab
0.25: a random target's, the case of the issue that asked for this benchmark,
where SpecForge skips the loss math of ~75% of rows), 8 x 2048, prompt 16, 3
timed steps after 2 (2026-12-02): ours compiled 60,100 tokens/s (24.9 GiB),
--no-compile 52,595 (28.5 GiB), SpecForge flex_attention 26,839 (64.3 GiB):
2.24x and 1.96x.

Where the 8 x 2048, prompt 16, 95% case stands (its step, compiled, profiled
on 2026-12-02 with benchmarks.train_throughput --profile: 483 ms of kernels):
matrix products take 369 ms, about 713 TFLOP/s against the ~790 this H200
reaches on large products; flex attention 43 ms (10 forward, 33 backward);
the rest (SiLU and its backward, the soft cross-entropy, RMSNorm, the
gathers of step_rows, AdamW, clipping) 71 ms. The products are those of
SpecForge's step less its skipped work, and none is redundant (each weight's
gradient, each input's gradient on the chain, the teacher's full-vocabulary
argmax). 1.5x SpecForge's 25,269 would be a 432 ms step: with the products
at 790 TFLOP/s (333 ms) it leaves 99 ms for the rest, where 114 ms run now.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import torch

from backends.train import distributed
from backends.train.config import DraftConfig
from backends.train.data import Batch
from backends.train.trainer import build_draft
from benchmarks._common import print_table
from benchmarks._device_timing import kernel_averages, timed_calls
from benchmarks.train_throughput import (
    LLAMA_31_8B,
    TINY,
    add_shape_arguments,
    make_trainer,
    synthetic_batch,
    target_matrices,
)

VARIANTS = ("ours-compiled", "ours-plain", "specforge-flex_attention", "specforge-sdpa")
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


def first_accuracy(variant: str, out: Any, ttt: int) -> float:
    """acc_0 of a step's result (ours: the stats row; SpecForge's: its StepResult)."""
    if variant.startswith("ours"):
        return float(out[1 + ttt] / out[1 + 2 * ttt].clamp_min(1))
    return float(out.metrics["acc_0"])


def measure(
    variant: str, cfg: DraftConfig, args: argparse.Namespace, batch: Batch, ctx: distributed.Dist
) -> dict[str, Any]:
    """Build one trainer and time its steps; everything it built is garbage when this returns."""
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
    if args.profile:
        kernels = kernel_averages(step, ctx.device)
        table = kernels.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=70)
        print(f"{variant}, batch {size}, one step:\n{table}", flush=True)
    return {**timing.rates(batch.tokens), "acc_0": first_accuracy(variant, outputs[0], args.ttt)}


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


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.specforge_compare", description=__doc__)
    add_shape_arguments(parser, batches="8,1 (tiny: 2,1)", steps=6, warmup=2)
    parser.add_argument("--variants", default=None, help=f"comma list of {', '.join(VARIANTS)}")
    args = parser.parse_args()
    started = time.perf_counter()
    ctx = distributed.init()
    device = ctx.device
    cuda = device.type == "cuda"
    cfg = TINY if args.tiny else LLAMA_31_8B
    sizes = [int(b) for b in (args.batch_size or ("2,1" if args.tiny else "8,1")).split(",")]
    seq = args.seq or (64 if args.tiny else 2048)
    default_variants = VARIANTS if cuda else ("ours-plain", "specforge-sdpa")
    variants = args.variants.split(",") if args.variants else list(default_variants)
    args.attention = "auto"
    sf_version = version("specforge")
    wrap = "FSDP, 1 process, SHARD_GRAD_OP" if cuda else "unwrapped; reference loss for its Triton kernel"
    print(
        f"device {torch.cuda.get_device_name(device) if cuda else 'cpu'}, torch {torch.__version__}; "
        f"SpecForge {sf_version} ({wrap}); batches {sizes} x {seq}, TTT {args.ttt}; "
        f"teacher argmax in the draft vocab {args.in_vocab:.0%}, prompt {args.prompt} tokens",
        flush=True,
    )
    if any(v.startswith("specforge") for v in variants):
        if cuda:
            start_process_group(device)
        else:
            use_reference_loss()
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for size in sizes:
        gen = torch.Generator(device=device).manual_seed(2)
        batch = synthetic_batch(cfg, size, seq, device, gen, args.in_vocab, args.prompt, args.min_length)
        for variant in variants:
            if time.perf_counter() - started > args.budget_s:
                print(f"skipping {variant}, batch {size}: over the time budget", flush=True)
                continue
            before = free(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            try:
                result = measure(variant, cfg, args, batch, ctx)
            except torch.OutOfMemoryError:
                print(f"{variant}, batch {size}: out of GPU memory", flush=True)
                result = {"tokens_per_s": float("nan"), "error": "out of memory"}
            except Exception as exc:  # one variant's failure must not lose the others' figures
                traceback.print_exc()
                print(f"{variant}, batch {size}: failed: {exc!r}", flush=True)
                result = {"tokens_per_s": float("nan"), "error": repr(exc)}
            # What an earlier variant left allocated (SpecForge's FSDP run leaves gigabytes) is not this one's;
            # the shared batch is, as it would be in a process of its own.
            peak = torch.cuda.max_memory_allocated(device) / 2**30 - before + batch_gib(batch) if cuda else float("nan")
            result["peak_gib"] = peak
            result["held_before_gib"] = before
            results[variant, size] = result
            print(f"{variant}, batch {size}: {json.dumps(result)}", flush=True)
            if args.results is not None:
                line = {"label": "compare", "variant": variant, "batch": size, "seq": seq, "specforge": sf_version}
                with args.results.open("a") as fh:
                    fh.write(json.dumps({**line, **result}) + "\n")
            # Compiled code must not keep the last variant's parameters alive into the next one's peak.
            if free(device) > before + 0.5:
                torch._dynamo.reset()
    headers = ("batch", "trainer", "tokens/s", "peak GiB", "ours / SpecForge flex", "ours / SpecForge sdpa")
    print_table(comparison_rows(results, sizes, seq), headers=headers)
    if cuda and any(v.startswith("specforge") for v in variants):
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


def comparison_rows(results: dict[tuple[str, int], dict[str, Any]], sizes: list[int], seq: int) -> list[list[str]]:
    """One row per (batch, trainer); ours as a multiple of each SpecForge backend's tokens/s."""
    rows = []
    for size in sizes:
        bases = [results.get((f"specforge-{backend}", size)) for backend in ("flex_attention", "sdpa")]
        for (variant, batch), r in results.items():
            if batch != size:
                continue
            ratios = [
                f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}" if base and variant.startswith("ours") else "-"
                for base in bases
            ]
            rows.append([f"{size} x {seq}", variant, f"{r['tokens_per_s']:,.0f}", f"{r['peak_gib']:.1f}", *ratios])
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
