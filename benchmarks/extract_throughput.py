"""Extraction throughput on one GPU against its two limits: the target's forward pass and the output disk.

    PYTHONPATH=. python -m benchmarks.extract_throughput [--dir DIR] [--writers 1,2,4,8]
    PYTHONPATH=. python -m benchmarks.extract_throughput --tiny    # a tiny target on the CPU, in seconds

Builds a random target of Llama-3.2-1B's shape in memory (16 layers, hidden
2048, MLP 8192, 32 heads / 8 KV heads, vocabulary 128256: 1.24 B parameters),
bf16 on CUDA, and measures, with synthetic chats:
1. forward only: `base_model(..., output_hidden_states=True)` on a batch of
   16 x 2048 already on the GPU, back to back;
2. forward + copy to the host: the pipeline's `ShardExtractor` (batching,
   the hf backend's forward, copies on a side stream into a reused pinned
   block), no writes;
3. the output disk (--dir): `benchmarks.disk_bandwidth`, sequential writes
   with fsync, by 1 and more threads;
4. one shard written by one thread: `write_safetensors` (hashed as written,
   fsync), beside what the extraction did before (safetensors' `save_file`,
   then the file read back for its SHA-256);
5. the full loop, `pipeline.run_pipeline` as `python -m backends.extract`
   runs it, shards written to --dir by each --writers count: shards of 16
   full-length chats, and shards of --shard-size chats of mixed lengths
   (256..2048 tokens) in padded batches of at most 16 x 2048. Steady state:
   one loop over writers + 2 + --shards shards, the rate taken over the last
   --shards of them, from one shard's file written (fsynced) to the last's;
6. the same loop from text: --shard-size chats of the demo corpus's words
   (one token each to the demo tokenizer), tokenized with the demo target's
   chat template a shard ahead in a thread, as `python -m backends.extract`
   does (rows 5 feed tokenized chats, so they leave tokenization out), and
   tokenization alone on one thread.

Bytes per token: (1 + n_aux) * hidden * dtype size + 9 (input_ids int64,
loss_mask int8). The disk bound is the best bandwidth of 3. over that; the
loop's target is min(forward only, disk bound).

Measured on the lent H200 (16 CPU cores, virtual disk /dev/vda, shards in /tmp),
two runs on 2026-12-02 (--writers 4,8, then 8):

    forward only, 16 x 2048                 198,652 / 199,214 tokens/s (0.42 of the FLOP bound)
    forward + copy to host                  187,848 / 192,291
    disk, fsync, 1 / 4 / 8 threads          1.25 / 1.84 / 1.79 and 1.06 / 1.81 / 1.72 GB/s
    one shard, one thread, write_safetensors 0.96 / 0.89 GB/s (save_file + hash read back: 0.52 / 0.56)
    bytes per token                         16,393, so a disk bound of 112k / 110k tokens/s
    full loop, 16 x 2048, 8 writers         93,982 / 91,074 (0.84 / 0.83 of the bound)
    full loop, mixed lengths, 8 writers     102,281 / 128,500 (0.91 / 1.17)
    full loop from text, 8 writers          159,180 / 79,701 (1.42 / 0.72)
    tokenizing, one thread                  1.30M / 1.05M tokens/s

The first run timed the mixed and from-text loops over 4 shards, as the
difference of two loops; the second over 8, by the shards' fsync times (the
method above). The loops are disk-bound (the forward runs at 144k tokens/s on
the mixed batches), and the virtual disk's rate moves between runs and within
one: the loops wrote at 1.3 to 2.6 GB/s (tokens/s x bytes per token) where
the disk test gave 1.7 to 1.8, so a loop's ratio to the bound swings with it.
Earlier (2026-12-01): 61k, 82k, 93k and 117k tokens/s with 1, 2, 4 and 8
writers; the loop before this benchmark's rewrite, 55k with 2 writers.

FLOPs of one forward pass (extraction never runs the lm_head):
    2 * P * tokens + 4 * L * n_heads * head_dim * sum over samples of T(T+1)/2
with P the decoder layers' matmul weights (q, k, v, o, gate, up, down) and the
second term QK^T and AV over the causal half. Only real tokens count (no
padding). The bound is the H200's dense bf16 peak, 989 TFLOP/s (datasheet).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from backends.ahead import background
from backends.demo_target import write_demo_target
from backends.eagle3_contract import write_safetensors
from backends.extract.args import DEFAULT_WRITERS
from backends.extract.capture import HFCapturer, forward_states, pad_batch
from backends.extract.cli import load_chat_tokenizer, tokenize_chats
from backends.extract.data import DEMO, load_dataset
from backends.extract.pipeline import HostBuffers, HostShard, ShardExtractor, ShardJob, length_batches, run_pipeline
from backends.extract.template import ChatTokenizer, TokenizedChat
from benchmarks import disk_bandwidth
from benchmarks._common import print_table
from benchmarks._device_timing import timed_calls

H200_BF16_TFLOPS = 989.0
# --tiny: a target small enough for this CPU, and a disk test of a few seconds.
TINY = {
    "layers": 8,
    "hidden": 64,
    "intermediate": 128,
    "heads": 4,
    "kv_heads": 2,
    "vocab": 2048,  # the demo tokenizer's ids
    "batch": 4,
    "seq": 128,
    "iters": 2,
    "warmup": 1,
    "device": "cpu",
    "dtype": "float32",
    "writers": [1, 2],
    "shards": 4,
    "shard_size": 16,
    "size_gib": 1 / 16,
    "threads": [1, 2],
}


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


def synthetic(lengths: list[int], vocab: int, rng: random.Random) -> list[TokenizedChat]:
    return [TokenizedChat([rng.randrange(vocab) for _ in range(n)], [1] * n) for n in lengths]


# Shard jobs for a loop of `count` shards.
Jobs = Callable[[int], Iterator[ShardJob]]


def text_chats(count: int, seq: int, rng: random.Random) -> list[list[dict[str, str]]]:
    """Chats of a question and an answer of `min(256, seq)` to `seq` words of the demo corpus (one token each
    to the demo tokenizer, whose BPE learnt them)."""
    words = " ".join(m["content"] for chat in load_dataset(DEMO, None).chats for m in chat).split()
    words *= -(-2 * seq // len(words))
    chats = []
    for _ in range(count):
        start, size = rng.randrange(len(words) - seq), rng.randint(min(256, seq), seq)
        answer = " ".join(words[start : start + size])
        chats.append([{"role": "user", "content": "Tell me more."}, {"role": "assistant", "content": answer}])
    return chats


def tokenized_jobs(chat_tokenizer: ChatTokenizer, chats: list[list[dict[str, str]]], seq: int) -> Jobs:
    """Shards of `chats` tokenized as `python -m backends.extract` does: in a thread, a shard ahead."""

    def jobs(count: int) -> Iterator[ShardJob]:
        made = (ShardJob(i, 0, len(chats), *tokenize_chats(chat_tokenizer, chats, seq)) for i in range(count))
        return background(made, depth=1)

    return jobs


def ready_jobs(samples: list[TokenizedChat]) -> Jobs:
    """Shards of `samples`, tokenized already."""
    return lambda count: (ShardJob(i, 0, len(samples), samples, {}) for i in range(count))


def steady_loop(
    capturer: HFCapturer, jobs: Jobs, shard_tokens: int, budget: int, folder: Path, writers: int, shards: int
) -> float:
    """Tokens per second of run_pipeline in steady state: one loop over writers + 2 + `shards` shards, timed
    from the (writers + 2)-th shard written to the last, by when each shard's file was fsynced. What the loop
    pays once (pinning the host blocks, the first forward passes, the writers filling up) falls before that."""
    written: list[float] = []

    def save(job: ShardJob, shard: HostShard | None) -> None:
        assert shard is not None
        path = folder / f"shard-{job.index:05d}.safetensors"
        write_safetensors(path, {name: [t] for name, t in shard.tensors.items()})
        written.append(time.perf_counter())  # list.append is atomic: the writer threads share it
        path.unlink()

    run_pipeline(capturer, jobs(writers + 2 + shards), budget, save, lambda _: None, writers)
    written.sort()
    return shards * shard_tokens / (written[-1] - written[writers + 1])


def write_rates(shard: HostShard, folder: Path, repeats: int) -> tuple[float, float]:
    """Bytes per second of one thread writing `shard`: safetensors' save_file then the file hashed (what the
    extraction did before), and write_safetensors."""
    from safetensors.torch import save_file

    path = folder / "one-shard.safetensors"
    nbytes = sum(t.numel() * t.element_size() for t in shard.tensors.values())

    def before() -> None:
        save_file(shard.tensors, str(path))
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)

    def after() -> None:
        write_safetensors(path, {name: [t] for name, t in shard.tensors.items()})

    try:
        before_s, after_s = (timed_calls(write, 1, repeats, "cpu").call_s for write in (before, after))
        return nbytes / before_s, nbytes / after_s
    finally:
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.extract_throughput", description=__doc__)
    parser.add_argument("--tiny", action="store_true", help="a tiny target on the CPU and a small disk test")
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
    parser.add_argument(
        "--writers", type=disk_bandwidth.thread_counts, default=[1, 2, 4, 8], help="shard-writing threads to try"
    )
    parser.add_argument("--shards", type=int, default=8, help="shards timed per loop, after the warm-up ones")
    parser.add_argument("--shard-size", type=int, default=64, help="chats per shard of mixed lengths")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_TFLOPS)
    disk_bandwidth.add_arguments(parser)
    if "--tiny" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**TINY)
    args = parser.parse_args(argv)

    model = build_target(args)
    aux_ids = [1, args.layers // 2 - 1, args.layers - 4]
    params = sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(
        f"device {name}; target {params / 1e9:.3f} B params ({matmul_params(args) / 1e9:.3f} B in layer matmuls), "
        f"{args.layers} layers, hidden {args.hidden}, {args.dtype}, attention {model.config._attn_implementation}; "
        f"aux ids {aux_ids}; torch {torch.__version__}; shards written to {args.dir}"
    )
    rng = random.Random(0)
    budget = args.batch * args.seq
    tokens = budget
    full = synthetic([args.seq] * args.batch, args.vocab, rng)
    mixed_lengths = [rng.randint(min(256, args.seq), args.seq) for _ in range(args.shard_size)]
    mixed = synthetic(mixed_lengths, args.vocab, rng)
    capturer = HFCapturer(model, aux_ids, 0)
    scratch = Path(tempfile.mkdtemp(prefix="extract-bench-target-"))
    try:
        chat_tokenizer = load_chat_tokenizer(write_demo_target(scratch / "target"), None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ids = torch.tensor([s.input_ids for s in full], device=args.device)
    mask = torch.ones_like(ids)

    def forward() -> None:
        with torch.inference_mode():
            model.base_model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)

    def forward_mixed() -> None:
        for batch in length_batches(mixed_lengths, budget):
            forward_states(model, *pad_batch([mixed[i].input_ids for i in batch], 0), aux_ids)

    buffers = HostBuffers()
    extractor = ShardExtractor(capturer, budget, buffers)

    def extract() -> None:
        shard = extractor.extract(full)
        shard.wait()
        buffers.give_back(shard.block)

    folder = Path(tempfile.mkdtemp(prefix="extract-bench-", dir=args.dir))
    try:
        t_forward = timed_calls(forward, args.warmup, args.iters, args.device).call_s
        t_forward_mixed = timed_calls(forward_mixed, 1, max(1, args.iters // 2), args.device).call_s
        t_extract = timed_calls(extract, args.warmup, args.iters, args.device).call_s
        shard = extractor.extract(full)
        shard.wait()
        write_before, write_after = write_rates(shard, folder, args.iters)
        buffers.give_back(shard.block)
        buffers.close()
        disk = disk_bandwidth.measure(args)
        full_tokens = sum(len(s.input_ids) for s in full)
        loops = {
            w: steady_loop(capturer, ready_jobs(full), full_tokens, budget, folder, w, args.shards)
            for w in args.writers
        }
        w_mixed, mixed_shards = DEFAULT_WRITERS, args.shards
        loop_mixed = steady_loop(capturer, ready_jobs(mixed), sum(mixed_lengths), budget, folder, w_mixed, mixed_shards)
        chats = text_chats(args.shard_size, args.seq, rng)
        started = time.perf_counter()
        tokenized, _ = tokenize_chats(chat_tokenizer, chats, args.seq)
        shard_tokens = sum(len(s.input_ids) for s in tokenized)
        tokenize_rate = shard_tokens / (time.perf_counter() - started)
        from_text = tokenized_jobs(chat_tokenizer, chats, args.seq)
        loop_tokenized = steady_loop(capturer, from_text, shard_tokens, budget, folder, w_mixed, mixed_shards)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    itemsize = torch.finfo(getattr(torch, args.dtype)).bits // 8
    per_token = (1 + len(aux_ids)) * args.hidden * itemsize + 9
    best_disk = max(disk.values())
    disk_bound = best_disk / per_token
    forward_rate = tokens / t_forward
    mixed_forward_rate = sum(mixed_lengths) / t_forward_mixed
    flops = forward_flops(args, [args.seq] * args.batch)
    peak = args.peak_tflops * 1e12

    def row(metric: str, measured: float, target: float | None = None, digits: int = 0) -> list[str]:
        if target is None:
            return [metric, f"{measured:,.{digits}f}", "", ""]
        return [metric, f"{measured:,.{digits}f}", f"{target:,.{digits}f}", f"{measured / target:.3f}"]

    label = f"{args.batch} x {args.seq}"
    on_gpu = args.device.startswith("cuda")
    rows = [row(f"forward only, {label}: tokens/s", forward_rate, tokens / (flops / peak) if on_gpu else None)]
    if on_gpu:
        rows.append(row("forward only: TFLOP/s", flops / t_forward / 1e12, args.peak_tflops, 1))
    rows += [
        row(f"forward + copy to host (ShardExtractor), {label}: tokens/s", tokens / t_extract, forward_rate),
        *(row(f"disk write, {n} thread(s), fsync: GB/s", rate / 1e9, digits=2) for n, rate in disk.items()),
        row("one shard, 1 thread, save_file + SHA-256 read back (no fsync): GB/s", write_before / 1e9, digits=2),
        row("one shard, 1 thread, write_safetensors (fsync): GB/s", write_after / 1e9, best_disk / 1e9, 2),
        row("bytes per token", per_token),
        row("disk bound (best disk GB/s / bytes per token): tokens/s", disk_bound),
        *(
            row(f"full loop, {label}, {w} writer(s): tokens/s", rate, min(forward_rate, disk_bound))
            for w, rate in loops.items()
        ),
        row(
            f"full loop, {args.shard_size} chats of {min(256, args.seq)}..{args.seq} per shard, {w_mixed} writers: "
            "tokens/s",
            loop_mixed,
            min(mixed_forward_rate, disk_bound),
        ),
        row("tokenizing chats of as many tokens (template, encode, mask), one thread: tokens/s", tokenize_rate),
        row(
            f"full loop, the same from text, tokenized a shard ahead as `extract` does, {w_mixed} writers: tokens/s",
            loop_tokenized,
            min(mixed_forward_rate, disk_bound),
        ),
    ]
    print_table(rows)
    wrote = [*(f"{label}, {w} writer(s)" for w in loops), "mixed lengths", "from text"]
    rates = [*loops.values(), loop_mixed, loop_tokenized]
    print(
        "the loops wrote at (GB/s; the disk test's best: "
        f"{best_disk / 1e9:.2f}): "
        + "; ".join(f"{n} {r * per_token / 1e9:.2f}" for n, r in zip(wrote, rates, strict=True))
    )
    print(
        f"targets: forward only against the FLOP bound; the full loop against min(forward only, disk bound); "
        f"forward only on the mixed chats' padded batches: {mixed_forward_rate:,.0f} tokens/s; "
        f"one shard of {label}: {tokens * per_token / 2**20:,.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
