"""One compiled graph for every sequence length, and a compile cache that a relaunch of the run reuses.

On the CPU the attention is eager, so what runs here is the rest of the step under inductor with a dynamic
length; flex's block tables, which let the attention's graph be dynamic too, are checked tile by tile against
the exact mask (compiled flex itself runs on the GPU: benchmarks/compile_time.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from backends.train.attention import FLEX_BLOCK, _exact_block_mask, _ttt_tables

REPO = Path(__file__).resolve().parent.parent

# One start of a run: the tiny draft's compiled step (inductor; TTT argv[2], 1 the smallest graph) and its eager
# twin on batches of three lengths, the run's compile cache under argv[1]; with argv[3] "kernel", the compiled
# step's attention is the Triton TTT kernel (under Triton's interpreter here), the eager twin's eager attention.
START = """
import argparse, json, sys, time
from pathlib import Path
import torch
from torch._dynamo.utils import counters
from backends.train import distributed
from backends.train.trainer import use_compile_cache
from benchmarks.train_throughput import TINY, make_trainer, synthetic_batch

cache = use_compile_cache(Path(sys.argv[1]))
ctx = distributed.init()
options = argparse.Namespace(ttt=int(sys.argv[2]), batch_size=2, attention="auto")
compiled, eager = make_trainer(TINY, options, True, ctx), make_trainer(TINY, options, False, ctx)
if sys.argv[3] == "kernel":
    compiled.draft.use_ttt_kernel()
full = synthetic_batch(TINY, 2, 64, ctx.device, torch.Generator().manual_seed(2), min_length=24)
losses, seconds = [], []
for length in (48, 32, 64):
    batch = full.prefix(length)
    started = time.perf_counter()
    losses.append([float(compiled.train_step(batch)[0]), float(eager.train_step(batch)[0])])
    seconds.append(time.perf_counter() - started)
print(json.dumps({"cache": cache, "losses": losses, "first_step_s": seconds[0],
                  "graphs": counters["stats"]["unique_graphs"], "fxgraph": dict(counters["inductor"])}))
"""


def start_run(out: Path, ttt: int = 1, kernel: bool = False) -> dict[str, Any]:
    # Inductor's scalar C++ builds in half the time of its vectorised ones (30 s, not 50, for the first start
    # on 2 cores), and in the process: the cache and the graph count are what is checked, not the speed.
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_VEC_ISA_OK": "0", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    if kernel:
        env["TRITON_INTERPRET"] = "1"
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env.pop(name, None)
    argv = [sys.executable, "-c", START, str(out), str(ttt), "kernel" if kernel else "eager"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.timeout(500)  # two starts of up to 240 s each (a loaded machine's compile), not the suite's 120 s
def test_one_graph_trains_every_length_as_eager_does_and_a_relaunch_reuses_its_cache(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = start_run(out)
    cache = out / "compile-cache"
    assert first["cache"] == f"cache kept in {cache} for a relaunch"
    assert cache.stat().st_mode & 0o777 == 0o700
    assert first["graphs"] == 1, "three lengths, one graph"
    for compiled, eager in first["losses"]:
        assert compiled == pytest.approx(eager, rel=1e-3)
    assert first["fxgraph"].get("fxgraph_cache_miss", 0) >= 1
    again = start_run(out)
    assert again["cache"] == f"cache reused from {cache}"
    assert again["graphs"] == 1
    assert again["fxgraph"].get("fxgraph_cache_hit", 0) >= 1 and "fxgraph_cache_miss" not in again["fxgraph"]
    assert again["losses"] == first["losses"]
    assert again["first_step_s"] < first["first_step_s"]


@pytest.mark.timeout(300)
def test_one_graph_with_the_ttt_kernel_trains_every_length_as_eager_attention_does(tmp_path: Path) -> None:
    """The kernel as a GPU's compiled step runs it (a custom op in the graph, its row maps and row counts
    symbolic), three TTT steps so that its earlier steps' rows are read through their maps too."""
    run = start_run(tmp_path / "run", ttt=3, kernel=True)
    assert run["graphs"] == 1, "three lengths, one graph"
    for compiled, eager in run["losses"]:
        assert compiled == pytest.approx(eager, rel=1e-3)


@pytest.mark.parametrize("seq", [FLEX_BLOCK, 3 * FLEX_BLOCK])
@pytest.mark.parametrize("step", [0, 1, 3])
def test_block_tables_are_the_exact_masks_tiles(seq: int, step: int) -> None:
    """The tables written down from the length list the tiles that create_block_mask finds by evaluating the
    exact mask everywhere, and inside their partial tiles the length-free mask is the exact one."""
    tables, exact = _ttt_tables(seq, step, "cpu"), _exact_block_mask(seq, step, "cpu")
    for count, index in (
        ("kv_num_blocks", "kv_indices"),
        ("full_kv_num_blocks", "full_kv_indices"),
        ("q_num_blocks", "q_indices"),
        ("full_q_num_blocks", "full_q_indices"),
    ):
        counts = getattr(tables, count)[0, 0]
        assert torch.equal(counts, getattr(exact, count)[0, 0]), count
        mine, theirs = getattr(tables, index)[0, 0], getattr(exact, index)[0, 0]
        for row, n in enumerate(counts.tolist()):
            assert sorted(mine[row, :n].tolist()) == sorted(theirs[row, :n].tolist()), (index, row)

    def tiles(listed: torch.Tensor) -> torch.Tensor:
        return listed.repeat_interleave(FLEX_BLOCK, 0).repeat_interleave(FLEX_BLOCK, 1).bool()

    q, kv = torch.arange(seq)[:, None], torch.arange((step + 1) * seq)[None, :]
    listed = tables.to_dense()[0, 0]  # partial and full tiles
    full = torch.zeros_like(listed)
    full_counts, full_indices = tables.full_kv_num_blocks, tables.full_kv_indices
    assert full_counts is not None and full_indices is not None
    for row, n in enumerate(full_counts[0, 0].tolist()):
        full[row, full_indices[0, 0, row, :n]] = 1
    allowed = tiles(full) | (tiles(listed) & tables.mask_mod(q, q, q, kv))
    assert torch.equal(allowed, exact.mask_mod(q, q, q, kv))
