"""Online training against offline: tokens/s of the target's forward pass, of the trainer on ready states, and of
both in one job as `--online` runs them (run on the lent H200).

    PYTHONPATH=. python -m benchmarks.online_throughput            # Llama-3.1-8B target and draft, bf16
    PYTHONPATH=. python -m benchmarks.online_throughput --tiny     # CPU smoke run
    PYTHONPATH=. python -m benchmarks.online_throughput --min-length 128 --batch-order random   # chats of all lengths

The target is a random Llama-3.1-8B (32 layers, hidden 4096, MLP 14336, 32 / 8 heads, vocabulary 128,256;
8.0 B parameters) built in GPU memory; the draft, its trainer (compiled unless --no-compile) and the teacher
are `benchmarks.train_throughput`'s. Batches of --batch-size chats of --seq random tokens (with --min-length, of
random lengths from it to --seq, batched in --batch-order as `train --online` does; the rates count chat tokens,
not padding) come from `backends.train.online.OnlineSource` (the code `--online` runs), one process, the
target replicated beside the draft. Timed, each after --warmup steps, over --steps steps:
1. `forward`: OnlineSource batches alone (target forward with every hidden state, aux concat, padding mask);
2. `offline`: the trainer's step on ready batches (what training from an extraction's shards costs, the
   shards' reading aside);
3. `online`: both, as the training loop runs them.
`offline, both stages` is the rate of extracting and then training the same tokens once each, 1 / (1/forward
+ 1/offline), with the forward pass as the extraction's upper bound (no disk): online should equal it, without
the shards (about 64 KB a token for a 70B target, 2 x 4 x 4096 x 2 = 32 KB here) and without waiting for an
extraction to finish before training starts.

Measured on one H200 (torch 2.11, transformers 5.17, 2026-12-02; batch 8 x 2048, TTT 7, compiled, 4 steps
after 2; the trainer with its 2026-12-02 speed-ups and the target's forward through hooks):
| target forward | 34,863 tokens/s |
| trainer on ready states | 44,970 |
| offline, both stages | 19,638 |
| online, one job | 19,460 (0.99x), 45.8 GiB peak |
The trainer's rate on these batches is above `benchmarks.train_throughput`'s (34k), most likely because a
random target's argmax falls in the draft vocabulary about a quarter of the time (32,000 of 128,256 ids), so
the loss reads fewer rows than with that benchmark's synthetic teacher (95%); not measured apart.

The target's forward on chats of random lengths (--forward-only --min-length N, batch 8, padded to multiples of
128, 48 timed batches after 4; 2026-12-02), chat tokens/s:
| chats of | --batch-order grouped | random | ratio |
| 128 to 2,048 tokens | 29,891 | 19,060 | 1.57 |
| 1,024 to 2,048 | 30,793 | 24,923 | 1.24 |
With --min-length, the trainer steps through every padded length first (each compiles apart) and says how long
that took, so that no timed step waits for a compilation. On the H200 (2026-12-02, --min-length 1536, grouped):
5 padded lengths in 330 s, 66 s each, so chats of 128 to 2,048 tokens would compile for about 18 minutes before
the first timed step. The timed steps of that run did not finish within the 140 s of device time left. Most
likely they compiled again: the warm-up batches below 2,048 were slices of a longer batch, not contiguous, and a
compiled step guards on its inputs' strides (Batch.prefix now returns contiguous tensors).

The day before (2026-12-01; 8 steps after 3), before the trainer's speed-ups and the hooks:
| | compiled | without torch.compile |
| target forward | 34,862 tokens/s | 34,889 |
| trainer on ready states | 33,126 | 25,986 |
| offline, both stages | 16,986 | 14,893 |
| online, one job | 16,969 (1.00x), 55.4 GiB peak | 14,815 (0.99x), 79.8 GiB |
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from backends.eagle3_contract import Manifest
from backends.train import distributed
from backends.train.chats import Samples
from backends.train.data import GROUP_BATCHES, GROUPED, RANDOM, Batch, Layout, padded_length
from backends.train.online import OnlineSource
from benchmarks._common import print_table
from benchmarks._device_timing import timed_calls
from benchmarks.train_throughput import LLAMA_31_8B, TINY, make_trainer


def build_target(tiny: bool, device: torch.device) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = TINY if tiny else LLAMA_31_8B
    config = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=8 if tiny else 32,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
    )
    config._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if device.type == "cuda" else torch.float32)
    try:
        with torch.device(device):
            model: Any = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval().requires_grad_(False)


def synthetic_samples(count: int, seq: int, vocab: int, min_length: int | None) -> Samples:
    """Random chats of --seq tokens, or of random lengths from `min_length` to --seq; the first 16 are a prompt."""
    gen = torch.Generator().manual_seed(0)
    if min_length is None:
        lengths = [seq] * count
    else:
        lengths = torch.randint(min(min_length, seq), seq + 1, (count,), generator=gen).tolist()
    masks = [torch.ones(length, dtype=torch.int8) for length in lengths]
    for mask in masks:
        mask[:16] = 0
    return Samples(
        ids=torch.randint(0, vocab, (sum(lengths),), generator=gen, dtype=torch.int32),
        loss_mask=torch.cat(masks),
        offsets=[0, *itertools.accumulate(lengths)],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, on the CPU")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--ttt", type=int, default=7)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--attention", default="auto")
    parser.add_argument(
        "--min-length", type=int, help="chats of random lengths from this to --seq (default: all of --seq tokens)"
    )
    parser.add_argument("--batch-order", choices=(GROUPED, RANDOM), default=GROUPED, help="as train --batch-order")
    parser.add_argument(
        "--forward-only",
        action="store_true",
        help="the target's forward alone (no trainer, nothing compiled): with --min-length, what --batch-order saves",
    )
    args = parser.parse_args()
    if args.tiny:
        args.seq, args.batch_size = min(args.seq, 64), min(args.batch_size, 2)
    ctx = distributed.init()
    cfg = TINY if args.tiny else LLAMA_31_8B
    compiled = ctx.device.type == "cuda" if args.compile is None else args.compile
    model = build_target(args.tiny, ctx.device)
    calls = args.warmup + args.steps
    # Enough chats that grouping sorts as many batches together as in training (GROUP_BATCHES).
    count = max(calls * 3, GROUP_BATCHES) * args.batch_size + 1
    manifest = Manifest(
        target_path="(in memory)",
        architecture="LlamaForCausalLM",
        num_layers=model.config.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size,
        dtype="bfloat16",
        aux_layer_ids=list(cfg.aux_layer_ids) if not args.tiny else [1, 3, 4],
        tokenizer="",
        chat_template=None,
        max_length=args.seq,
        data="synthetic",
    )
    samples = synthetic_samples(count, args.seq, cfg.vocab_size, args.min_length)
    source = OnlineSource(manifest, samples, 1, pad_id=0, order=args.batch_order)
    source.attach(model, "replicate", ctx)
    layout = Layout(args.batch_size, pad_multiple=128 if ctx.device.type == "cuda" else 1)

    def batches() -> Iterator[Batch]:
        epoch = 0
        while True:
            yield from source.train_batches(layout, epoch, 0, 0)
            epoch += 1

    def rate(batch: Callable[[], Batch], step: Callable[[Batch], object]) -> float:
        """Chat tokens (padding aside) per second over --steps calls of `step` on a `batch()` each, after --warmup
        calls (compilation, allocator warm-up)."""
        tokens: list[int] = []

        def call() -> None:
            taken = batch()
            tokens.append(taken.tokens)
            step(taken)

        seconds = timed_calls(call, args.warmup, args.steps, ctx.device).call_s
        return float(sum(tokens[args.warmup :]) / args.steps / seconds)

    stream = batches()
    forward = rate(lambda: next(stream), lambda _: None)
    shape = "tiny" if args.tiny else "Llama-3.1-8B target + its EAGLE-3 draft"
    lengths = "" if args.min_length is None else f" (chats of {args.min_length} to {args.seq}, {args.batch_order})"
    if args.forward_only:
        print(
            f"{shape}, batch {args.batch_size} x {args.seq}{lengths}, {ctx.device}; target forward {forward:,.0f} "
            f"chat tokens/s ({args.steps} timed batches after {args.warmup})"
        )
        return
    trainer = make_trainer(cfg, args, compiled, ctx)
    if args.min_length is not None:
        # Each padded length compiles apart: all of them first, so that no timed step waits for a compilation.
        pad = layout.pad_multiple
        widths = range(padded_length([args.min_length], pad), args.seq + 1, pad)
        longest = next(b for b in stream if b.input_ids.shape[1] == args.seq)
        cuts = iter(widths)
        each = timed_calls(lambda: trainer.train_step(longest.prefix(next(cuts))), 0, len(widths), ctx.device).call_s
        print(f"{len(widths)} padded lengths stepped through first: {each * len(widths):.0f} s ({each:.1f} s each)")
    ready = iter([next(stream) for _ in range(calls)])
    offline = rate(lambda: next(ready), trainer.train_step)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    online = rate(lambda: next(stream), trainer.train_step)
    peak = f"{torch.cuda.max_memory_allocated(ctx.device) / 2**30:.1f} GiB peak" if ctx.device.type == "cuda" else "CPU"
    both = 1 / (1 / forward + 1 / offline)
    print(
        f"{shape}, batch {args.batch_size} x {args.seq}{lengths}, TTT {args.ttt}, "
        f"compile {'on' if compiled else 'off'}, {ctx.device}; {args.steps} timed steps after {args.warmup}"
    )
    print_table(
        [
            ("target forward (extraction's upper bound)", f"{forward:,.0f}", f"{forward / both:.2f}"),
            ("offline: trainer on ready states", f"{offline:,.0f}", f"{offline / both:.2f}"),
            ("offline, both stages (1 / (1/forward + 1/trainer))", f"{both:,.0f}", "1.00"),
            (f"online: target + trainer in one job ({peak})", f"{online:,.0f}", f"{online / both:.2f}"),
        ],
        headers=("what", "chat tokens/s", "ratio to offline, both stages"),
    )


if __name__ == "__main__":
    main()
