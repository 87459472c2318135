"""CLI: `python -m backends.train --data EXTRACT_DIR --target DIR --out DIR [options]`.

Multi-GPU: `torchrun --nproc-per-node N -m backends.train ...` (DDP; FSDP when
the draft is large or with --fsdp on). Exit codes: 0 done, 1 the run failed
(non-finite loss, out of memory), 2 bad arguments or inputs (missing files,
data that disagrees with the target or the draft config). Expected failures
are one line on stderr.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from backends.eagle3_contract import ContractError
from backends.train.args import build_parser
from backends.train.errors import TrainError
from backends.train.loop import run_training
from backends.train.options import TrainOptions


def parse_args(argv: list[str] | None = None) -> TrainOptions:
    return TrainOptions(**vars(build_parser().parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        run_training(options)
    except (TrainError, ContractError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code if isinstance(exc, TrainError) else 2
    except KeyboardInterrupt:
        print("error: interrupted; continue with --resume from the last checkpoint", file=sys.stderr, flush=True)
        return 1
    return 0


def leave(code: int) -> NoReturn:
    """Exit with `code`. A process of a torchrun group leaves without the interpreter's finalization: gloo's
    worker threads, torn down there, abort it now and then ("terminate called without an active exception",
    SIGABRT; pytorch/pytorch#179291) after everything is saved, turning a finished training into a failed one."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    leave(main())
