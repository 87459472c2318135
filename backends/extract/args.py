"""The extractor's command line, importable without torch: the console reads it to print `extract --help` and to
check an extraction's arguments before anything is launched on the host."""

from __future__ import annotations

import argparse
from pathlib import Path

from backends.extract.capture import DTYPES

PROG = "python -m backends.extract"
# Shard-writing threads. One writes about 0.9 GB/s (SHA-256 bound), and the H200 host's disk gave its full
# 2 GB/s only to 8 at once: the loop reached 0.75 of that bound with 4 writers, 0.95 with 8
# (benchmarks.extract_throughput). Each holds a shard in pinned host memory: by default no more than a
# quarter of the host's available memory allows (backends.extract.cli.choose_writers).
DEFAULT_WRITERS = 8
DESCRIPTION = "Run a target model over chats and save the hidden states an EAGLE-3 draft trains on."


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def layer_list(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of layer ids, like 1,5,8") from None
    return ids


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--target", type=Path, required=True, help="Hugging Face model folder of the target")
    parser.add_argument("--data", required=True, help="JSONL of chats ({'messages'} or {'prompt','response'}), or demo")
    parser.add_argument("--out", type=Path, required=True, help="output folder (resumed when it holds a partial run)")
    parser.add_argument(
        "--layers",
        type=layer_list,
        help="aux layer ids, 'output of layer X (0-based)', increasing (default: 1, L//2-1, L-4)",
    )
    parser.add_argument("--max-length", type=positive_int, default=2048, help="tokens per chat, truncated beyond")
    parser.add_argument(
        "--backend",
        choices=("hf", "sglang"),
        default="hf",
        help="hf: transformers in this process (default); sglang: SGLang's engine captures the states",
    )
    parser.add_argument(
        "--dtype", choices=("auto", *DTYPES), default="auto", help="auto: bfloat16 on a GPU, float32 on CPU"
    )
    parser.add_argument(
        "--device",
        help="cpu, cuda, cuda:N, or auto: the target's layers spread over every visible GPU, for a target "
        "larger than one GPU (hf backend; default: cuda when available)",
    )
    parser.add_argument("--shard-size", type=positive_int, default=64, help="chats per shard")
    parser.add_argument("--batch-tokens", type=positive_int, default=16384, help="padded tokens per forward pass")
    parser.add_argument(
        "--writers",
        type=positive_int,
        help=f"threads writing shards while the target runs (default {DEFAULT_WRITERS}, fewer where a quarter of "
        "the available memory cannot hold them: each holds one shard in pinned host memory, up to 2.7 GB for 64 "
        "chats of 2048 tokens of a 1B target)",
    )
    parser.add_argument(
        "--threads", type=positive_int, help="CPU threads when the target runs on the CPU (default: the idle CPUs)"
    )
    parser.add_argument("--limit", type=positive_int, help="use only the first N usable chats")
    parser.add_argument("--chat-template", type=Path, help="jinja chat template file (default: the tokenizer's)")
