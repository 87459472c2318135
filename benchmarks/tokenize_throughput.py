"""Chats tokenized per second with the target's chat template and loss mask, one chat per call against batches.

    PYTHONPATH=. python -m benchmarks.tokenize_throughput                        # demo chats, demo target
    PYTHONPATH=. python -m benchmarks.tokenize_throughput --data chats.jsonl --target /models/Llama-3.1-8B-Instruct

`ChatTokenizer.tokenize` renders each chat (and the prefixes that locate its assistant turns) with the template,
encodes the texts with the fast tokenizer in one call, and marks the tokens that overlap an assistant turn. The
extraction tokenizes a shard's chats at a time (--shard-size, 64) in a thread beside the target's forward pass;
online training tokenizes every chat at the start, 1,024 at a time. One chat per call is how both worked before
2026-12-02 (each encode on one core, and the mask a Python loop over tokens). Without --target, the demo target
is built in a temporary folder.

Measured 2026-12-02 on this machine (2 CPUs, nothing else running), demo target, 10,000 chats (Alpaca's 1,000,
lm-sys/FastChat data/alpaca_data_cleaned_1000.json at 04a1074d, ten times; 3,606,250 tokens), best of one run:
| chats per call | tokens/s | ratio to one per call |
| 1              | 867,293   | 1.00 |
| 64             | 982,387   | 1.13 |
| 1,024          | 1,089,967 | 1.26 |
The code before (dff6843), through `tokenize_chats` 1,024 chats at a time, best of 3: 639,204 tokens/s, and
929,846 now: 1.45x, the same tokens and masks. Encoding takes most of what is left, and spreads over more
cores than these two.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from backends.demo_target import write_demo_target
from backends.extract.cli import load_chat_tokenizer
from backends.extract.data import DEMO, load_dataset
from backends.extract.template import ChatTokenizer, TokenizedChat
from benchmarks._common import print_table


def rate(chat_tokenizer: ChatTokenizer, chats: list[list[dict[str, str]]], per_call: int, max_length: int) -> float:
    """Tokens per second of tokenizing every chat, `per_call` chats at a time."""
    started = time.perf_counter()
    tokens = 0
    for start in range(0, len(chats), per_call):
        for sample in chat_tokenizer.tokenize(chats[start : start + per_call], max_length):
            tokens += len(sample.input_ids) if isinstance(sample, TokenizedChat) else 0
    return tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DEMO, help="a JSONL file of chats, or demo")
    parser.add_argument("--target", type=Path, help="the target whose tokenizer and chat template to use")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--per-call", default="1,64,1024", help="chats per call, comma-separated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        chat_tokenizer = load_chat_tokenizer(args.target or write_demo_target(Path(scratch) / "target"), None)
    chats = load_dataset(args.data, None).chats
    rates = {int(n): rate(chat_tokenizer, chats, int(n), args.max_length) for n in args.per_call.split(",")}
    one = rates.get(1)
    print(f"{args.data}: {len(chats):,} chats, --max-length {args.max_length}")
    print_table(
        [(str(n), f"{r:,.0f}", f"{r / one:.2f}" if one else "") for n, r in rates.items()],
        headers=("chats per call", "tokens/s", "ratio to one per call"),
    )


if __name__ == "__main__":
    main()
