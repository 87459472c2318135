"""A short, real, training-like job for `make demo`: `python -m backends.demo_job`.

It fits a tiny softmax classifier by gradient descent in pure Python, prints a
carriage-return progress bar like tqdm, and writes one metric row per step to
$EAGLE3_METRICS_FILE in the schema the trainer uses (step, loss, acc_0, lr,
tokens_per_s). It stands in for the EAGLE-3 trainer until that lands.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from typing import IO


def make_data(n: int, dim: int, classes: int, rng: random.Random) -> list[tuple[list[float], int]]:
    centers = [[rng.gauss(0, 1) for _ in range(dim)] for _ in range(classes)]
    data = []
    for _ in range(n):
        label = rng.randrange(classes)
        data.append(([c + rng.gauss(0, 1.2) for c in centers[label]], label))
    return data


def softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(v - top) for v in logits]
    total = sum(exps)
    return [e / total for e in exps]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.demo_job", description=__doc__)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--step-time", type=float, default=0.05, help="extra seconds per step, to watch it live")
    args = parser.parse_args(argv)
    rng = random.Random(0)
    dim, classes, batch = 8, 4, 64
    data = make_data(2048, dim, classes, rng)
    weights = [[0.0] * dim for _ in range(classes)]
    print(f"demo job: softmax regression, {len(data)} samples, {args.steps} steps", flush=True)
    with open(os.environ.get("EAGLE3_METRICS_FILE") or os.devnull, "a", buffering=1) as metrics:
        final = train(args, data, weights, classes, dim, batch, rng, metrics)
    print(f"\ndone: final loss {final['loss']:.3f}, accuracy {final['acc_0']:.2f}", flush=True)
    return 0


def train(
    args: argparse.Namespace,
    data: list[tuple[list[float], int]],
    weights: list[list[float]],
    classes: int,
    dim: int,
    batch: int,
    rng: random.Random,
    metrics: IO[str],
) -> dict[str, float]:
    row: dict[str, float] = {}
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        grads = [[0.0] * dim for _ in range(classes)]
        loss = 0.0
        correct = 0
        for x, label in rng.sample(data, batch):
            probs = softmax([sum(w * v for w, v in zip(row, x, strict=True)) for row in weights])
            loss -= math.log(max(probs[label], 1e-12))
            correct += probs.index(max(probs)) == label
            for k in range(classes):
                err = probs[k] - (k == label)
                for j in range(dim):
                    grads[k][j] += err * x[j] / batch
        for k in range(classes):
            for j in range(dim):
                weights[k][j] -= lr * grads[k][j]
        time.sleep(args.step_time)
        elapsed = time.perf_counter() - started
        row = {
            "step": step,
            "loss": round(loss / batch, 5),
            "acc_0": correct / batch,
            "lr": round(lr, 6),
            "tokens_per_s": round(batch / elapsed, 1),
        }
        metrics.write(json.dumps(row) + "\n")
        filled = step * 30 // args.steps
        sys.stdout.write(f"\rtraining |{'#' * filled}{' ' * (30 - filled)}| {step}/{args.steps} loss={row['loss']:.3f}")
        sys.stdout.flush()
    return row


if __name__ == "__main__":
    sys.exit(main())
