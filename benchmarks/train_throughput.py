"""Trainer throughput for a Llama-3.1-8B-shaped EAGLE-3 draft on synthetic features.

    PYTHONPATH=. python -m benchmarks.train_throughput            # on the H200
    PYTHONPATH=. python -m benchmarks.train_throughput --tiny      # CPU smoke run

Runs the trainer's own step (teacher logits, TTT unroll, loss, backward, clip,
AdamW, schedule) on random hidden states, tokens and target weights of the
real shapes: hidden 4096, 32 heads / 8 KV heads, MLP 14336, target vocabulary
128,256, draft vocabulary 32,000, 3 aux layers, sequence 2,048, TTT 7, bf16
autocast. Before timing, on GPU, it checks flex attention (the fast path)
against the eager formula, forward and backward.

Model FLOPs per token, training = 3 x forward (`train_flops_per_token`):
  fc                  2 * (3H) * H                              once per token
  per TTT step        2 * [2H*(n_h*d) + 2*2H*(n_kv*d) + (n_h*d)*H + 3*H*I + H*V_draft]
  attention, step k   4 * n_h * d * ((T+1)/2 + k)               (QK^T and PV; causal prefix + k own keys)
Not counted: the teacher's logits over the full target vocabulary (2*H*V per
token, forward only; reported separately), the frozen embedding lookup (no
FLOPs), norms, RoPE, softmax and the loss. fc's backward needs no input
gradient, so counting it 3x overstates the work by about 0.6%.
MFU = model FLOPs per second / 989 TFLOP/s (H100/H200 SXM dense bf16).

The synthetic teacher's argmax falls in the draft vocabulary 95% of the time
(--in-vocab; a random lm_head would put it there 25% of the time, while the
draft vocabulary of real data covers most argmaxes) and each sample's first 16
tokens are outside the loss (--prompt); with --min-length, samples are of
random lengths, right-padded, and tokens/s counts real tokens only. The FLOP
model counts the whole layer and the lm_head on every row; the trainer computes
the lm_head only on the rows in the loss (94% here), and the layer at steps 1
to 6 only on the rows whose chain the loss still reads (step_rows). It also
counts the embedding half of the attention's input projection at every step,
as the formula reads; the trainer projects it once for all steps (about 6% of
the FLOPs). So MFU here is of the formula's FLOPs, and overstates what the GPU
did where rows are skipped; tokens/s is the figure to compare.

Measured on one H200 (torch 2.11, 2026-12-04; 6 timed steps after 2), with the TTT kernel and the fused
elementwise passes: batch 8 x 2048 compiled 37,159 tokens/s = 61.5% MFU (0.441 s a step, 35.3 GiB);
before the fused passes (a378213, the same day) 34,761. --profile groups one
step's kernels (benchmarks.kernel_groups); --head-chunk-rows times the loss's lm_head chunk sizes.

Measured on one H200 (torch 2.11, 2026-12-02; 4 timed steps after 2), each step
computing only the rows that reach the loss: batch 8 x 2048, compiled 34,668
tokens/s = 57.4% MFU (0.47 s a step, 31.7 GiB peak), without torch.compile
(flex attention still compiled) 31,142 = 51.6% MFU (37.5 GiB); batch 1 x 2048,
compiled 31,165 (11.8 GiB), without 26,996 (12.5 GiB). With --prompt 512 (a
quarter of each sample outside the loss) at batch 8: compiled 43,847 and
without 39,275, against 38,346 and 34,022 for the code before (the same
session). Before rows were skipped (the same day): 34,185 and 30,906 at batch
8, 30,779 and 27,298 at batch 1; the day before, before the embedding half was
projected once and q/k/v and gate/up were fused: 33,150 and 30,030 at batch 8,
29,890 and 26,360 at batch 1.
Matrix products take 77% of the compiled step's device time; the loss kernel 2%.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from backends.train import distributed, loss
from backends.train.config import DraftConfig
from backends.train.data import Batch
from backends.train.options import TrainOptions
from backends.train.target import Teacher
from backends.train.trainer import Trainer, build_draft
from backends.train.vocab import VocabMap
from benchmarks._common import print_table
from benchmarks._device_timing import timed_calls
from benchmarks.kernel_groups import profile_kernels

PEAK_BF16 = 989.4e12  # dense bf16 FLOP/s, H100/H200 SXM datasheet
TARGET_MFU = 0.35

LLAMA_31_8B = DraftConfig(
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    draft_vocab_size=32000,
    target_hidden_size=4096,
    aux_layer_ids=(1, 15, 28),
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    hidden_act="silu",
)
TINY = dataclasses.replace(
    LLAMA_31_8B,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    draft_vocab_size=256,
    target_hidden_size=64,
)


def train_flops_per_token(cfg: DraftConfig, ttt: int, seq: int) -> float:
    h, d = cfg.hidden_size, cfg.head_dim
    q = 2 * (2 * h) * (cfg.num_attention_heads * d)
    kv = 2 * 2 * (2 * h) * (cfg.num_key_value_heads * d)
    o = 2 * (cfg.num_attention_heads * d) * h
    mlp = 3 * 2 * h * cfg.intermediate_size
    head = 2 * h * cfg.draft_vocab_size
    attention = sum(4 * cfg.num_attention_heads * d * ((seq + 1) / 2 + k) for k in range(ttt))
    fc = 2 * (cfg.num_aux * cfg.target_hidden_size) * h
    return 3 * (fc + ttt * (q + kv + o + mlp + head) + attention)


def teacher_flops_per_token(cfg: DraftConfig) -> float:
    return 2 * cfg.hidden_size * cfg.vocab_size


# The synthetic teacher's argmax falls in the draft vocabulary this often, as on real data (the draft
# vocabulary is the data's most frequent tokens). A random lm_head would put it there only
# draft_vocab/vocab = 25% of the time, and then the rows skipped by the loss would flatter the trainer.
IN_VOCAB = 0.95
PROMPT_TOKENS = 16  # loss_mask is 0 on each sample's first tokens
PEAK = 7.0  # the chosen next token's logit lead, in units of a logit's standard deviation (4)


def target_matrices(cfg: DraftConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, VocabMap]:
    """(embedding, lm_head, draft vocabulary) of a random target, the same on every call."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    # Scaled so that the teacher's logits have a standard deviation of 4, like a real model's.
    scale = 4.0 / cfg.hidden_size**0.5
    with torch.device(device):
        embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen).to(dtype)
        lm_head = (torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) * scale).to(dtype)
        ids = torch.randperm(cfg.vocab_size, generator=gen)[: cfg.draft_vocab_size].sort().values
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[ids] = True
    vocab = VocabMap(d2t=ids - torch.arange(cfg.draft_vocab_size, device=device), t2d=t2d, distinct=len(ids))
    return embed, lm_head, vocab


def synthetic_batch(
    cfg: DraftConfig,
    batch: int,
    seq: int,
    device: torch.device,
    gen: torch.Generator,
    in_vocab: float = IN_VOCAB,
    prompt: int = PROMPT_TOKENS,
    min_length: int | None = None,
) -> Batch:
    """Random tokens and features; the final hidden state of each position leans towards one
    next token (in the draft vocabulary with probability `in_vocab`), which the teacher's
    argmax then is, with a peaked distribution. With `min_length`, samples are of random
    lengths from it to `seq` (the first one `seq` long), right-padded to `seq` as collate
    pads a batch of chats."""
    h = cfg.hidden_size
    _, lm_head, vocab = target_matrices(cfg, device)
    lengths = torch.full((batch,), seq, device=device)
    if min_length is not None:
        lengths[1:] = torch.randint(min(min_length, seq), seq + 1, (batch - 1,), device=device, generator=gen)
    real = torch.arange(seq, device=device) < lengths[:, None]
    loss_mask = real.clone()
    loss_mask[:, :prompt] = False
    inside = torch.rand(batch, seq, device=device, generator=gen) < in_vocab
    draft_ids, other_ids = vocab.t2d.nonzero().squeeze(1), (~vocab.t2d).nonzero().squeeze(1)
    pick_draft = draft_ids[torch.randint(0, len(draft_ids), (batch, seq), device=device, generator=gen)]
    pick_other = other_ids[torch.randint(0, max(len(other_ids), 1), (batch, seq), device=device, generator=gen)]
    chosen = torch.where(inside | (len(other_ids) == 0), pick_draft, pick_other)
    lean = lm_head[chosen].float()
    hidden = torch.randn(batch, seq, h, device=device, generator=gen) + PEAK * lean / lean.norm(dim=-1, keepdim=True)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device, generator=gen)
    aux = torch.randn(batch, seq, cfg.num_aux * h, device=device, generator=gen)
    return Batch(
        input_ids=ids * real,
        loss_mask=loss_mask,
        attention_mask=real,
        hidden_state=(hidden * real[..., None]).to(lm_head.dtype),
        aux_hidden_states=(aux * real[..., None]).to(lm_head.dtype),
    )


def make_trainer(cfg: DraftConfig, args: argparse.Namespace, compile_: bool, ctx: distributed.Dist) -> Trainer:
    dtype = torch.bfloat16 if ctx.device.type == "cuda" else torch.float32
    embed, lm_head, vocab = target_matrices(cfg, ctx.device)
    with torch.device(ctx.device):
        draft = build_draft(cfg, embed, lm_head, vocab, dtype, seed=0)
    if getattr(args, "bf16_params", False):
        draft.to(torch.bfloat16)
    options = TrainOptions(
        data=Path("."),
        target=Path("."),
        out=Path("."),
        ttt=args.ttt,
        batch_size=args.batch_size,
        compile=compile_,
        attention=args.attention,
    )
    return Trainer(draft, Teacher(lm_head, vocab.draft_ids, vocab.t2d), ctx, options, total_steps=10_000)


def in_loss_fraction(trainer: Trainer, batch: Batch) -> float:
    """The share of (position, TTT step) rows the loss reads: loss token next, target argmax in the draft vocabulary."""
    parts = trainer.losses(trainer.draft, batch, trainer.loss_rows(batch), None, training=False)
    return float(parts.in_loss.sum() / parts.counted.sum().clamp_min(1))


def host_syncs(trainer: Trainer, batch: Batch) -> int:
    """Host-device synchronisations in one training step (CUDA's sync debug mode, which warns on each)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.train_step(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def measure(trainer: Trainer, batch: Batch, warmup: int, steps: int) -> dict[str, float]:
    timing = timed_calls(lambda: trainer.train_step(batch), warmup, steps, trainer.ctx.device)
    return {**timing.rates(batch.tokens), "loss": float(timing.last[0])}


def check_flex(device: torch.device) -> float:
    """Max relative error of flex attention vs the eager formula (outputs and q/k/v grads), TTT step 2."""
    from backends.train.attention import eager_ttt_attention, flex_ttt_attention, ttt_block_mask

    gen = torch.Generator(device=device).manual_seed(1)
    seq, steps = 256, 3
    q = torch.randn(2, 8, seq, 64, device=device, generator=gen, requires_grad=True)
    keys = [torch.randn(2, 2, seq, 64, device=device, generator=gen, requires_grad=True) for _ in range(steps)]
    values = [torch.randn(2, 2, seq, 64, device=device, generator=gen, requires_grad=True) for _ in range(steps)]
    leaves = [q, *keys, *values]
    weights = torch.linspace(-1, 1, 64, device=device)
    results = []
    for out in (
        eager_ttt_attention(q, keys, values),
        flex_ttt_attention(q, keys, values, ttt_block_mask(seq, steps - 1, str(device))),
    ):
        grads = torch.autograd.grad((out * weights).sum(), leaves)
        results.append([out.detach(), *grads])
    return max(float((b - a).norm() / a.norm()) for a, b in zip(*results, strict=True))


def profile_step(trainer: Trainer, batch: Batch, path: Path | None) -> str:
    """One more step's kernels, grouped (benchmarks.kernel_groups); every kernel by name to `path` (JSON)."""
    kernels = profile_kernels(lambda: trainer.train_step(batch), trainer.ctx.device)
    if path is not None:
        path.write_text(json.dumps(kernels.to_json()))
    return kernels.report()


def add_shape_arguments(parser: argparse.ArgumentParser, batches: str | None, steps: int, warmup: int) -> None:
    """The synthetic data and the timing, as both trainer benchmarks take them, and the batch shapes
    (--batch-size, --seq, --min-length) unless `batches` is None (the caller takes shapes its own way)."""
    parser.add_argument("--tiny", action="store_true", help="a tiny draft, for a CPU smoke run")
    if batches is not None:
        parser.add_argument("--batch-size", default=None, help=f"comma list of batch sizes; default {batches}")
        parser.add_argument("--seq", type=int, help="default 2048 (tiny: 64)")
        parser.add_argument(
            "--min-length",
            type=int,
            help="samples of random lengths from this to --seq, right-padded (default: all --seq)",
        )
    parser.add_argument("--ttt", type=int, default=7)
    parser.add_argument("--steps", type=int, default=steps, help="timed steps")
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed steps first (compilation)")
    parser.add_argument("--in-vocab", type=float, default=IN_VOCAB, help="share of teacher argmaxes in the draft vocab")
    parser.add_argument("--prompt", type=int, default=PROMPT_TOKENS, help="tokens of each sample outside the loss")
    parser.add_argument("--results", type=Path, help="append one JSON line per measurement to this file")
    parser.add_argument("--profile", action="store_true", help="print the top kernels of one more step of each")
    parser.add_argument("--budget-s", type=float, default=1e9, help="skip variants once this much time has passed")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_throughput", description=__doc__)
    add_shape_arguments(parser, batches="8 (tiny: 2)", steps=8, warmup=3)
    parser.add_argument("--attention", default="auto", choices=("auto", "eager", "flex", "triton"))
    parser.add_argument("--variants", default="plain,compiled", help="comma list of plain (no torch.compile), compiled")
    parser.add_argument(
        "--bf16-params", action="store_true", help="the draft's parameters in bf16 (timing only: no fp32 master copy)"
    )
    parser.add_argument("--label", default="", help="a name for this run in --results")
    parser.add_argument(
        "--head-chunk-rows",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[],
        help="comma list: time each variant again with the loss's lm_head in chunks of these many rows",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    ctx = distributed.init()
    cuda = ctx.device.type == "cuda"
    cfg = TINY if args.tiny else LLAMA_31_8B
    sizes = [int(b) for b in (args.batch_size or ("2" if args.tiny else "8")).split(",")]
    seq = args.seq or (64 if args.tiny else 2048)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    flops = train_flops_per_token(cfg, args.ttt, seq)
    print(
        f"device {torch.cuda.get_device_name(ctx.device) if cuda else 'cpu'}, torch {torch.__version__}; "
        f"draft {'tiny' if args.tiny else 'Llama-3.1-8B-shaped'}, batch {sizes} x seq {seq}, "
        f"TTT {args.ttt}; train FLOPs/token {flops / 1e9:.3f} G, teacher {teacher_flops_per_token(cfg) / 1e9:.3f} G; "
        f"teacher argmax in the draft vocab {args.in_vocab:.0%}, prompt {args.prompt} tokens",
        flush=True,
    )
    rows: list[list[str]] = []
    report: dict[str, Any] = {"flops_per_token": flops, "teacher_flops_per_token": teacher_flops_per_token(cfg)}
    if cuda:
        err = check_flex(ctx.device)
        report["flex_rel_err"] = err
        rows.append(["flex vs eager attention, rel. error (fwd+bwd)", f"{err:.2e}", "< 1e-2", f"{err / 1e-2:.2f}"])
    target_tps = TARGET_MFU * PEAK_BF16 / flops
    for size in sizes:
        args.batch_size = size
        gen = torch.Generator(device=ctx.device).manual_seed(2)
        batch = synthetic_batch(cfg, size, seq, ctx.device, gen, args.in_vocab, args.prompt, args.min_length)
        for variant in args.variants.split(","):
            name = f"{variant}, batch {size}"
            if time.perf_counter() - started > args.budget_s:
                print(f"skipping {name}: over the time budget", flush=True)
                continue
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(ctx.device)
            trainer = make_trainer(cfg, args, variant == "compiled", ctx)
            result = measure(trainer, batch, args.warmup, args.steps)
            for chunk in args.head_chunk_rows:
                # The lm_head's chunk is outside the compiled graph: the same trainer, nothing compiled again.
                loss.HEAD_CHUNK_ROWS = chunk
                timed = measure(trainer, batch, 1, args.steps)
                stats = torch.cuda.memory_stats(ctx.device) if cuda else {}
                retries = stats.get("num_alloc_retries", 0)
                result[f"tokens_per_s_head_chunk_{chunk}"] = timed["tokens_per_s"]
                print(
                    f"{name}, head chunk {chunk} rows: {timed['tokens_per_s']:,.0f} tokens/s, alloc retries {retries}"
                )
            result["peak_mem_gb"] = torch.cuda.max_memory_allocated(ctx.device) / 2**30 if cuda else float("nan")
            with torch.no_grad():
                result["in_loss_rows"] = in_loss_fraction(trainer, batch)
            if cuda:
                result["host_syncs"] = host_syncs(trainer, batch)
            mfu = flops * result["tokens_per_s"] / PEAK_BF16
            result["mfu"] = mfu
            report[name] = result
            print(f"{name}: {json.dumps(result)}", flush=True)
            if args.results is not None:
                line = {"label": args.label, "variant": variant, "batch": size, "seq": seq, **result}
                with args.results.open("a") as fh:
                    fh.write(json.dumps(line) + "\n")
            rows.append(
                [
                    f"tokens/s ({name}, attention {trainer.attention})",
                    f"{result['tokens_per_s']:,.0f}",
                    f"{target_tps:,.0f}",
                    f"{result['tokens_per_s'] / target_tps:.2f}",
                ]
            )
            rows.append([f"MFU ({name})", f"{mfu:.1%}", f"{TARGET_MFU:.0%}", f"{mfu / TARGET_MFU:.2f}"])
            rows.append(
                [f"step time s ({name}; warmup {result['warmup_s']:.0f} s)", f"{result['step_s']:.3f}", "-", "-"]
            )
            rows.append([f"peak GPU memory GiB ({name})", f"{result['peak_mem_gb']:.1f}", "139", "-"])
            if args.profile:
                path = out_dir / f"profile-{variant}-{size}.json" if out_dir else None
                print(profile_step(trainer, batch, path), flush=True)
            del trainer
            gc.collect()
    if out_dir is not None:
        (out_dir / "train_throughput.json").write_text(json.dumps(report, indent=2))
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
