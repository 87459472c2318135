"""The trainer's command line, importable without torch: the console reads it to print `train --help` and to
check a training's arguments before anything is launched on the host."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from backends.eagle3_contract import DEFAULT_DRAFT_VOCAB
from backends.extract.args import layer_list

PROG = "python -m backends.train"
DESCRIPTION = (
    "Train an EAGLE-3 draft on extracted hidden states, or --online: on the states the target computes "
    "beside the draft, batch by batch, with nothing written to disk."
)
EPILOG = (
    "Several GPUs: torchrun --nproc-per-node N -m backends.train ... (the draft data-parallel: DDP, FSDP for "
    "large drafts; online, the target replicated on every GPU or tensor-parallel over them: --target-placement)."
)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def add_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--data",
        type=Path,
        required=True,
        help="extraction folder (manifest.json + shards); with --online, a JSONL file of chats or demo",
    )
    p.add_argument(
        "--target",
        type=Path,
        required=True,
        help="the target model folder (the data came from it; --online: it runs here)",
    )
    p.add_argument("--out", type=Path, required=True, help="checkpoints go to OUT/step-N/ and OUT/final/")
    p.add_argument("--steps", type=int, help="optimizer steps (default: --epochs over the training split)")
    p.add_argument("--epochs", type=int, default=1, help="epochs when --steps is not given (default 1)")
    p.add_argument("--ttt", type=int, default=7, help="training-time-test positions to unroll (default 7)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default 1e-4)")
    p.add_argument("--batch-size", type=int, default=4, help="samples per process per micro-batch (default 4)")
    p.add_argument(
        "--grad-accum",
        type=int,
        default=1,
        help="micro-batches per optimizer step: the step a batch that many times larger would take (default 1)",
    )
    p.add_argument("--log-every", type=int, default=10, help="steps between metric rows (default 10)")
    p.add_argument("--eval-every", type=int, default=200, help="steps between evaluations; 0: at the end only")
    p.add_argument("--save-every", type=int, default=1000, help="steps between checkpoints; 0: final only")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in OUT")
    p.add_argument("--warmup-ratio", type=float, default=0.015, help="warmup share of the steps (default 0.015)")
    p.add_argument("--max-grad-norm", type=float, default=0.5, help="gradient clipping norm (default 0.5)")
    p.add_argument("--draft-vocab-size", type=int, default=DEFAULT_DRAFT_VOCAB, help="default 32000")
    p.add_argument("--val-samples", type=int, help="held-out samples (default 5%%, 1..1000); 0: no evaluation")
    p.add_argument("--max-length", type=int, help="truncate samples to this many tokens (--online: default 2048)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draft's initialisation and the data order")
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="torch.compile the draft's layers (default: on GPU)",
    )
    p.add_argument("--pad-multiple", type=int, help="pad batch lengths to a multiple of this (default: GPU 128)")
    p.add_argument(
        "--attention",
        choices=("auto", "eager", "flex", "triton"),
        default="auto",
        help="auto: on GPU the Triton TTT kernel (flex where Triton is missing), else eager",
    )
    p.add_argument("--fsdp", choices=("auto", "on", "off"), default="auto", help="auto: FSDP for drafts > 2B params")
    p.add_argument("--draft-config", type=Path, help="a SGLang/SpecForge draft config.json to train")
    p.add_argument(
        "--threads", type=int, help="CPU threads per process when training on the CPU (default: the idle CPUs)"
    )
    online = p.add_argument_group("online training") if isinstance(p, argparse.ArgumentParser) else p
    online.add_argument(
        "--online",
        action="store_true",
        help="run the target in this job and train on its hidden states as they are computed (no extraction)",
    )
    online.add_argument("--layers", type=layer_list, help="--online: aux layer ids (default: 1, L//2-1, L-4)")
    online.add_argument("--chat-template", type=Path, help="--online: jinja chat template (default: the tokenizer's)")
    online.add_argument("--limit", type=int, help="--online: use only the first N usable chats")
    online.add_argument(
        "--target-placement",
        choices=("auto", "replicate", "spread", "tp"),
        default="auto",
        help="--online: the whole target on each training GPU; its layers spread over every visible GPU (one "
        "process); or tensor-parallel over the torchrun processes (auto: replicate while the target takes at "
        "most a third of a GPU)",
    )
    online.add_argument(
        "--batch-order",
        choices=("grouped", "random"),
        help="--online: batches of similar-length chats, in random order (the default: the target pads less), "
        "or chats in random order",
    )
    p.add_argument("--plateau-evals", type=int, default=5, help="evaluations without a 0.5%% gain that flag a plateau")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=DESCRIPTION, epilog=EPILOG)
    add_arguments(parser)
    return parser
