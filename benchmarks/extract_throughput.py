"""Extraction throughput on one GPU against the forward pass's FLOP bound (run on the lent H200).

    PYTHONPATH=. python -m benchmarks.extract_throughput

Builds a random target of Llama-3.2-1B's shape in memory (16 layers, hidden
2048, MLP 8192, 32 heads / 8 KV heads, vocabulary 128256: 1.24 B parameters),
bf16 on CUDA, and times, over synthetic token batches of 16 x 2048:
1. the bare forward pass (`base_model(..., output_hidden_states=True)`);
2. `pipeline.extract_shard`: batching by length, the hf backend's
   (`capture.HFCapturer`) forward, aux concat, copy to (pinned) host memory, per-sample tensors;
3. `pipeline.run_pipeline`, the loop `backends.extract` runs: shards extracted
   while `--writers` threads save the previous ones (the contract's write_shard
   to a temporary folder, then SHA-256 of the file, as `output.seal_shard`
   does); once with full-length chats, once with chats of mixed lengths
   (256..2048 tokens) in padded batches of at most 16 x 2048.

FLOPs of one forward pass (extraction never runs the lm_head):
    2 * P * tokens + 4 * L * n_heads * head_dim * sum over samples of T(T+1)/2
with P the decoder layers' matmul weights (q, k, v, o, gate, up, down) and the
second term QK^T and AV over the causal half. Only real tokens count (no
padding). The bound is the H200's dense bf16 peak, 989 TFLOP/s (datasheet).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from backends.eagle3_contract import write_shard
from backends.extract.capture import HFCapturer
from backends.extract.output import sha256_file
from backends.extract.pipeline import Row, ShardJob, extract_shard, run_pipeline
from backends.extract.template import TokenizedChat
from benchmarks._common import print_table

H200_BF16_TFLOPS = 989.0


def build_target(args: argparse.Namespace) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=max(args.seq, 2048),
        tie_word_embeddings=True,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, args.dtype))
    try:
        with torch.device(args.device):
            model: Any = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def matmul_params(args: argparse.Namespace) -> int:
    head_dim = args.hidden // args.heads
    attention = args.hidden * head_dim * (2 * args.heads + 2 * args.kv_heads)
    mlp = 3 * args.hidden * args.intermediate
    return int(args.layers * (attention + mlp))


def forward_flops(args: argparse.Namespace, lengths: list[int]) -> float:
    head_dim = args.hidden // args.heads
    attention = 4 * args.layers * args.heads * head_dim * sum(t * (t + 1) / 2 for t in lengths)
    return float(2 * matmul_params(args) * sum(lengths) + attention)


def timed(fn: Callable[[], object], device: str, warmup: int, iters: int) -> float:
    """Mean seconds per call after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / iters


def synthetic(lengths: list[int], vocab: int, rng: random.Random) -> list[TokenizedChat]:
    return [TokenizedChat([rng.randrange(vocab) for _ in range(n)], [1] * n) for n in lengths]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.extract_throughput", description=__doc__)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--writers", type=int, default=2, help="shard-saving threads, as backends.extract --writers")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_TFLOPS)
    args = parser.parse_args(argv)

    model = build_target(args)
    aux_ids = [1, args.layers // 2 - 1, args.layers - 4]
    params = sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(
        f"device {name}; target {params / 1e9:.2f} B params ({matmul_params(args) / 1e9:.3f} B in layer matmuls), "
        f"{args.layers} layers, hidden {args.hidden}, {args.dtype}, attention {model.config._attn_implementation}; "
        f"aux ids {aux_ids}; torch {torch.__version__}"
    )
    rng = random.Random(0)
    budget = args.batch * args.seq
    full = synthetic([args.seq] * args.batch, args.vocab, rng)
    mixed_lengths = [rng.randint(min(256, args.seq), args.seq) for _ in range(args.batch * 4)]
    mixed = synthetic(mixed_lengths, args.vocab, rng)
    capturer = HFCapturer(model, aux_ids, 0)
    ids = torch.tensor([s.input_ids for s in full], device=args.device)
    mask = torch.ones_like(ids)

    def forward() -> None:
        with torch.inference_mode():
            model.base_model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)

    folder = Path(tempfile.mkdtemp(prefix="extract-bench-"))
    saved: list[float] = []

    def save(job: ShardJob, rows: list[Row]) -> float:
        started = time.perf_counter()
        path = folder / f"shard-{job.index:05d}.safetensors"
        write_shard(path, rows)
        sha256_file(path)
        path.unlink()
        return time.perf_counter() - started

    def pipeline(samples: list[TokenizedChat], shards: int) -> None:
        jobs = (ShardJob(i, 0, len(samples), samples, {}) for i in range(shards))
        run_pipeline(capturer, jobs, budget, save, saved.append, args.writers)

    try:
        t_forward = timed(forward, args.device, args.warmup, args.iters)
        t_extract = timed(lambda: extract_shard(capturer, full, budget), args.device, args.warmup, args.iters)
        pipeline(full, 1)  # warms up the pinned host blocks and the writer
        saved.clear()
        t_pipeline = timed(lambda: pipeline(full, args.iters), args.device, 0, 1) / args.iters
        t_save = sum(saved) / len(saved)
        t_mixed = timed(lambda: pipeline(mixed, 2), args.device, 0, 1) / 2
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    tokens = args.batch * args.seq
    flops = forward_flops(args, [args.seq] * args.batch)
    mixed_flops = forward_flops(args, mixed_lengths)
    peak = args.peak_tflops * 1e12
    bound = tokens / (flops / peak)
    mixed_bound = sum(mixed_lengths) / (mixed_flops / peak)
    shard_bytes = tokens * (len(aux_ids) + 1) * args.hidden * torch.finfo(getattr(torch, args.dtype)).bits // 8

    def row(metric: str, measured: float, target: float) -> list[str]:
        return [metric, f"{measured:,.1f}", f"{target:,.1f}", f"{measured / target:.3f}"]

    label = f"{args.batch} x {args.seq}"
    print_table(
        [
            row(f"forward only, {label}: tokens/s", tokens / t_forward, bound),
            row("forward only: TFLOP/s", flops / t_forward / 1e12, args.peak_tflops),
            row(f"extract_shard (forward + host copy), {label}: tokens/s", tokens / t_extract, bound),
            row(f"extraction loop incl. shard save, {label}: tokens/s", tokens / t_pipeline, bound),
            row("extraction loop incl. shard save: TFLOP/s", flops / t_pipeline / 1e12, args.peak_tflops),
            row(
                f"extraction loop, {len(mixed)} chats of 256..{args.seq} per shard: tokens/s",
                sum(mixed_lengths) / t_mixed,
                mixed_bound,
            ),
        ]
    )
    print(
        f"per shard of {label}: forward {t_forward * 1e3:.0f} ms, extract_shard {t_extract * 1e3:.0f} ms, "
        f"save {t_save * 1e3:.0f} ms in each of {args.writers} writer threads ({shard_bytes / 2**20:,.0f} MiB of "
        f"states, {shard_bytes / t_save / 1e9:.1f} GB/s per thread), loop {t_pipeline * 1e3:.0f} ms; "
        f"FLOPs {flops / 1e12:.1f} T"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
