"""What online training's target forward spends on padding, in random order and grouped by length (CPU, seconds).

    PYTHONPATH=. python -m benchmarks.batch_padding                          # demo chats, demo target
    PYTHONPATH=. python -m benchmarks.batch_padding --data chats.jsonl --target /models/Llama-3.1-8B-Instruct

The chats are tokenized as `train --online` does (the target's chat template, --max-length) and the first
epoch's batches are drawn by `backends.train.online.OnlineSource` (the code the trainer runs), for each global
batch size, in both orders. The target's forward runs on batch x its longest chat rounded up to
--pad-multiple (128, the GPU default): `target tokens per chat token` is what it computes per token it needs,
and `random / grouped` the most grouping can speed that forward up (attention, quadratic in the width, gains
more). Without --target, the demo target is built in a temporary folder; its byte-level BPE of 2,048 ids
splits English text into more tokens than a real tokenizer, so lengths there are longer than a Llama's.

Measured 2026-12-02 on this machine (CPU), demo target, target tokens computed per chat token:
| global batch | demo chats, pad 1: random | grouped | ratio | Alpaca, pad 128: random | grouped | ratio |
| 1  | 1.00 | 1.00 | 1.00 | 1.17 | 1.17 | 1.00 |
| 2  | 1.15 | 1.01 | 1.14 | 1.62 | 1.18 | 1.37 |
| 4  | 1.32 | 1.01 | 1.31 | 2.10 | 1.19 | 1.76 |
| 8  | 1.48 | 1.01 | 1.46 | 2.51 | 1.20 | 2.09 |
| 16 | 1.59 | 1.02 | 1.56 | 2.92 | 1.21 | 2.43 |
| 32 | 1.71 | 1.06 | 1.61 | 3.29 | 1.25 | 2.64 |
The demo's 400 chats are 32 to 105 tokens (median 53): at --pad-multiple 128 every batch is one block and both
orders compute 2.24 tokens per token. Alpaca: the 1,000 chats of lm-sys/FastChat's
data/alpaca_data_cleaned_1000.json (at 04a1074d), each as {"messages": [user: instruction + input, assistant:
output]}, 39 to 1,594 tokens (median 271).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from backends.demo_target import write_demo_target
from backends.eagle3_contract import Manifest
from backends.extract.cli import load_chat_tokenizer
from backends.extract.data import DEMO, load_dataset
from backends.train.chats import DEFAULT_MAX_LENGTH, Samples, tokenize
from backends.train.data import GROUPED, RANDOM, Layout
from backends.train.online import OnlineSource
from benchmarks._common import print_table


def load(data: str, target: Path, max_length: int) -> Samples:
    dataset = load_dataset(data, None)
    return tokenize(load_chat_tokenizer(target, None), dataset.chats, max_length)


def computed_per_token(source: OnlineSource, layout: Layout, order: str) -> float:
    """Target tokens computed per chat token over the first epoch (1 / (1 - padding share))."""
    return 1 / (1 - source.padding_share(layout, seed=0, order=order))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DEMO, help="a JSONL file of chats, or demo")
    parser.add_argument("--target", type=Path, help="the target whose tokenizer and chat template to use")
    parser.add_argument("--max-length", type=int, default=DEFAULT_MAX_LENGTH)
    parser.add_argument("--pad-multiple", type=int, default=128)
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32", help="global batch sizes, comma-separated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        target = args.target or write_demo_target(Path(scratch) / "target")
        samples = load(args.data, target, args.max_length)
    lengths = samples.lengths
    manifest = Manifest(
        target_path=str(target),
        architecture="LlamaForCausalLM",
        num_layers=8,
        hidden_size=1,
        vocab_size=1,
        dtype="bfloat16",
        aux_layer_ids=[1, 3, 4],
        tokenizer=str(target),
        chat_template=None,
        max_length=args.max_length,
        data=args.data,
    )
    source = OnlineSource(manifest, samples, 0, pad_id=0, order=GROUPED)
    print(
        f"{args.data}: {len(samples):,} chats, {len(samples.ids):,} tokens, {min(lengths)} to {max(lengths)} "
        f"tokens each (median {statistics.median(lengths):.0f}); padded to a multiple of {args.pad_multiple}"
    )
    rows = []
    for size in (int(s) for s in args.batch_sizes.split(",")):
        if size > len(samples):
            continue
        layout = Layout(size, pad_multiple=args.pad_multiple)
        random_order, grouped = (computed_per_token(source, layout, order) for order in (RANDOM, GROUPED))
        rows.append((str(size), f"{random_order:.2f}", f"{grouped:.2f}", f"{random_order / grouped:.2f}"))
    print_table(rows, headers=("global batch", "random order", "grouped", "random / grouped"))
    print("(target tokens computed per chat token over the first epoch)")


if __name__ == "__main__":
    main()
