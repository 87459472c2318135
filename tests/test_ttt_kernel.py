"""The training's Triton kernels against their torch formulas, on CPU: the TTT attention kernel
(backends/train/ttt_kernel.py) against eager attention, and the SiLU-and-multiply (swiglu.py), the
RMSNorm with and without its residual add (rmsnorm.py) and the teacher's row statistics
(teacher_kernel.py), which run in the same worker.

Triton's interpreter runs the kernel on CPU tensors, but only if TRITON_INTERPRET=1 is set before
triton is imported, and any test of this worker may have imported it already (torch does, for one).
So the kernel runs in a process of its own, started once for the module: it reads one case a line
(JSON) on stdin and answers the relative errors of the output and of every gradient. Hypothesis
draws the cases here, over the shapes the trainer gives the kernel: lengths on and off the
interpreter's block sizes, TTT steps 0..6, GQA groups 1 and 4 (and an odd 3), batch 1 and 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
GOAL = 1e-2


class Worker:
    """The process that runs the kernel under the interpreter."""

    def __init__(self) -> None:
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )

    def errors(self, case: dict[str, int]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the kernel's worker died on {case} (its error is above)"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    w = Worker()
    yield w
    w.close()


def check(worker: Worker, **case: int) -> None:
    answer = worker.errors(case)
    worst = max(answer["errors"].values())
    assert worst <= GOAL, f"{case}: relative errors {answer['errors']}"
    assert answer["interpreted"], "the kernel did not run under Triton's interpreter"


@pytest.mark.parametrize(
    ("batch", "kv_heads", "groups", "seq", "steps", "head_dim"),
    [
        (1, 2, 1, 32, 1, 16),  # step 0 alone, one block exactly
        (2, 1, 4, 50, 7, 16),  # every earlier step, GQA 4, a ragged tail
        (1, 2, 3, 33, 3, 32),  # an odd group count (packed tiles pad it to 4)
        (2, 2, 1, 17, 2, 64),  # head_dim 64, one position past a block
    ],
)
def test_kernel_matches_eager_attention(
    worker: Worker, batch: int, kv_heads: int, groups: int, seq: int, steps: int, head_dim: int
) -> None:
    check(worker, batch=batch, kv_heads=kv_heads, groups=groups, seq=seq, steps=steps, head_dim=head_dim, seed=0)


def test_kernel_matches_eager_with_a_row_at_every_position(worker: Worker) -> None:
    """The layout of a batch every row of which is computed (the maps hold no -1)."""
    check(worker, batch=2, kv_heads=2, groups=4, seq=40, steps=4, head_dim=16, seed=3, full=1)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batch=st.sampled_from([1, 2]),
    groups=st.sampled_from([1, 4]),
    seq=st.integers(1, 70),
    steps=st.integers(1, 7),
    seed=st.integers(0, 2**31 - 1),
)
def test_kernel_matches_eager_on_the_trainers_shapes(
    worker: Worker, batch: int, groups: int, seq: int, steps: int, seed: int
) -> None:
    check(worker, batch=batch, kv_heads=2, groups=groups, seq=seq, steps=steps, head_dim=16, seed=seed)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=st.integers(2, 40), steps=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_the_draft_through_the_kernel_is_the_draft_through_eager_attention(
    worker: Worker, seq: int, steps: int, seed: int
) -> None:
    """Eagle3Draft.use_ttt_kernel (what --attention triton sets): the rows the loss reads, with holes in
    the loss mask and right padding, and every parameter's gradient, as with eager attention."""
    check(worker, kind=1, batch=2, seq=seq, steps=steps, seed=seed)


@pytest.mark.timeout(300)
def test_the_attention_kernels_build_for_hopper() -> None:
    """Triton's compiler for sm_90 (no GPU needed), where the interpreter above accepts code the compiler
    refuses: every kernel with no earlier step and with six, at each head_dim's tiles."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.ttt_kernel_build", "--steps", "0,6", "--head-dims", "64,128,256"],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    built = [line.split()[:3] for line in done.stdout.splitlines()[1:]]
    kernels = ("forward", "key_grads", "query_grads")
    assert built == [[k, d, s] for d in ("64", "128", "256") for s in ("0", "6") for k in kernels]


def test_silu_mul_kernels_are_the_torch_formula(worker: Worker) -> None:
    """Forward and gate-up's gradient, over rows wider than one program's block, with a ragged tail."""
    check(worker, kind=2, rows=3, width=2500, seed=0)


def test_the_teachers_row_kernel_is_the_torch_formula(worker: Worker) -> None:
    """Logits, logsumexp, argmax and in-vocabulary flags through the kernel (what a GPU runs) and through
    the torch formula, over several column blocks, with argmaxes tied across the draft vocabulary."""
    answer = worker.errors({"kind": 3, "seed": 0})
    assert answer["interpreted"], "the kernel did not run under Triton's interpreter"
    assert answer["errors"]["logits"] <= 1e-5 and answer["errors"]["lse"] <= 1e-5, answer
    assert answer["same_argmax"] and answer["same_in_vocab"], answer
    assert 0 < answer["in_vocab"] < answer["rows"], "the ties should fall on both sides"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.integers(0, 40),
    width=st.sampled_from([16, 100, 256, 1000]),
    add=st.booleans(),
    bf16=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_rms_norm_kernels_are_the_torch_formula(
    worker: Worker, rows: int, width: int, add: bool, bf16: bool, seed: int
) -> None:
    """The norm (and the sum, after an add) and every gradient (the input's, with the sum's own gradient
    added, and the weight's, summed over more rows than the backward has programs), against the formula
    in float32; no rows at all included. In bfloat16, the interpreter's rounding differs from torch's."""
    answer = worker.errors({"kind": 4, "rows": rows, "width": width, "add": add, "bf16": bf16, "seed": seed})
    assert answer["interpreted"], "the kernel did not run under Triton's interpreter"
    goal = 1e-2 if bf16 else 1e-5
    assert max(answer["errors"].values()) <= goal, answer


def _rms_norm_errors(case: dict[str, int]) -> dict[str, float]:
    import torch

    from backends.train import rmsnorm

    gen = torch.Generator().manual_seed(case["seed"])
    dtype = torch.bfloat16 if case["bf16"] else torch.float32
    shape = (case["rows"], case["width"])
    x, residual, grad, total_grad = (torch.randn(shape, generator=gen).to(dtype) for _ in range(4))
    weight = 1 + 0.1 * torch.randn(case["width"], generator=gen)
    leaves = [t.requires_grad_() for t in (x, residual, weight)]

    def formula(x: Any, residual: Any, weight: Any) -> tuple[Any, Any]:
        total = x + residual
        return total, rmsnorm.formula(total, weight, 1e-5)

    def kernel(x: Any, residual: Any, weight: Any) -> tuple[Any, Any]:
        if case["add"]:
            return rmsnorm.add_rms_norm(x, residual, weight, 1e-5)
        return x, rmsnorm.rms_norm(x, weight, 1e-5)

    results = []
    for fn in (kernel, formula if case["add"] else lambda x, r, w: (x, rmsnorm.formula(x, w, 1e-5))):
        total, out = fn(*leaves)
        outputs, grads = ((total, out), (total_grad, grad)) if case["add"] else ((out,), (grad,))
        wanted = leaves if case["add"] else [leaves[0], leaves[2]]
        results.append([out.detach().float(), *(g.float() for g in torch.autograd.grad(outputs, wanted, grads))])
    names = ["out", "dx", "dresidual", "dweight"] if case["add"] else ["out", "dx", "dweight"]
    if not case["rows"]:  # nothing to compare but the shapes, and the weight's gradient, zero
        return {n: float(a.shape != b.shape or a.abs().sum()) for n, a, b in zip(names, *results, strict=True)}
    return _relative(names, *results)


def _silu_mul_errors(case: dict[str, int]) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    from backends.train.swiglu import silu_mul

    gen = torch.Generator().manual_seed(case["seed"])
    gate_up = torch.randn(case["rows"], 2 * case["width"], generator=gen).requires_grad_()
    grad = torch.randn(case["rows"], case["width"], generator=gen)
    results = []
    for fn in (silu_mul, lambda x: F.silu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1]):
        out = fn(gate_up)
        results.append([out.detach(), *torch.autograd.grad(out, [gate_up], grad)])
    return _relative(["out", "d_gate_up"], *results)


def _teacher_answer(case: dict[str, int]) -> dict[str, Any]:
    import torch

    from backends.train import teacher_kernel
    from backends.train.target import Teacher

    gen = torch.Generator().manual_seed(case["seed"])
    vocab, draft_vocab, width, rows = 12000, 9000, 16, 24  # 3 blocks of draft columns, 1 of the rest
    lm_head = torch.randn(vocab, width, generator=gen)
    draft_ids = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_ids] = True
    other_ids = (~t2d).nonzero().squeeze(1)
    hidden = torch.randn(rows, width, generator=gen)
    # Every row's argmax is a tie of a draft token and another one, each the smaller id about half the time.
    for row in range(rows):
        strong = torch.randn(width, generator=gen)
        pair = draft_ids[torch.randint(0, draft_vocab, (1,), generator=gen)], other_ids[row * 100]
        lm_head[pair[0]] = lm_head[pair[1]] = strong
        hidden[row] = 8 * strong
    teacher = Teacher(lm_head, draft_ids, t2d)
    fused = teacher.draft_logits(hidden)
    available = teacher_kernel.available
    teacher_kernel.available = lambda device: False
    try:
        formula = teacher.draft_logits(hidden)
    finally:
        teacher_kernel.available = available
    return {
        "errors": _relative(["logits", "lse"], [fused[0], fused[1]], [formula[0], formula[1]]),
        "same_argmax": bool(torch.equal(fused[2], formula[2])),
        "same_in_vocab": bool(torch.equal(fused[3], formula[3])),
        "in_vocab": int(fused[3].sum()),
        "rows": rows,
        "interpreted": teacher_kernel.available(torch.device("cpu")),
    }


def _draft_errors(case: dict[str, int]) -> dict[str, float]:
    """The draft of tests/test_train_model.py, widened to head_dim 16 (tl.dot's least), through the kernel
    and through eager attention."""
    import dataclasses

    import torch

    from backends.train.loss import pairs_in_loss, step_masks
    from backends.train.model import Eagle3Draft
    from backends.train.step_rows import step_rows
    from tests.test_train_model import CONFIG

    config = dataclasses.replace(CONFIG, head_dim=16)
    gen = torch.Generator().manual_seed(case["seed"])
    batch, seq, steps = case["batch"], case["seq"], case["steps"]
    torch.manual_seed(case["seed"])
    draft = Eagle3Draft(config)
    ids = torch.randint(1, config.vocab_size, (batch, seq), generator=gen)
    aux = torch.randn(batch, seq, config.num_aux * config.target_hidden_size, generator=gen)
    lengths = torch.randint(1, seq + 1, (batch,), generator=gen)
    loss_mask = (torch.rand(batch, seq, generator=gen) < 0.8) & (torch.arange(seq) < lengths[:, None])
    in_loss = pairs_in_loss(step_masks(loss_mask, torch.rand(batch, seq, generator=gen) < 0.7, steps), seq)
    plan = step_rows(in_loss)
    params = [p for name, p in draft.named_parameters() if p.requires_grad and name != "lm_head.weight"]
    results = []
    for on in (True, False):
        draft.use_ttt_kernel(on)
        out = draft(ids, aux, plan)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        grads = torch.autograd.grad((out * weights).sum(), params, allow_unused=True)
        results.append([out.detach(), *(torch.zeros(()) if g is None else g for g in grads)])
    names = ["out", *(name for name, p in draft.named_parameters() if p.requires_grad and name != "lm_head.weight")]
    return _relative(names, *results)


def _relative(names: list[str], got: list[Any], ref: list[Any]) -> dict[str, float]:
    # Relative to the reference, or to 1e-3 where it is about zero: one position and one step have a
    # softmax of one entry, whose gradients are zero up to rounding.
    errors = {n: float((a - b).norm() / b.norm().clamp_min(1e-3)) for n, a, b in zip(names, got, ref, strict=True)}
    return {n: (e if e == e else float("inf")) for n, e in errors.items()}  # NaN fails


def _serve() -> None:
    """The worker's side: one case a line in, its errors a line out."""
    import torch

    from backends.train import ttt_kernel

    torch.set_num_threads(1)
    for line in sys.stdin:
        case = json.loads(line)
        if case.get("kind") == 1:
            print(json.dumps({"errors": _draft_errors(case), "interpreted": ttt_kernel.available("cpu")}), flush=True)
            continue
        if case.get("kind") == 2:
            answer = {"errors": _silu_mul_errors(case), "interpreted": ttt_kernel.available("cpu")}
            print(json.dumps(answer), flush=True)
            continue
        if case.get("kind") == 4:
            answer = {"errors": _rms_norm_errors(case), "interpreted": ttt_kernel.available("cpu")}
            print(json.dumps(answer), flush=True)
            continue
        if case.get("kind") == 3:
            print(json.dumps(_teacher_answer(case)), flush=True)
            continue
        print(json.dumps({"errors": _kernel_errors(case), "interpreted": ttt_kernel.available("cpu")}), flush=True)


def _kernel_errors(case: dict[str, int]) -> dict[str, float]:
    """The kernel on packed rows against eager attention on the same rows laid out over the batch, zeros
    where a position has no row (the trainer's layout before the kernel took rows packed). Each tensor
    holds a random subset of the positions (or all, with `full`), in a random order; the values are a
    view into wider rows, as the trainer's are (a slice of q, k and v's projection)."""
    import torch

    from backends.train import ttt_kernel
    from backends.train.attention import eager_ttt_attention

    gen = torch.Generator().manual_seed(case["seed"])
    batch, kv_heads, seq, dim, steps = case["batch"], case["kv_heads"], case["seq"], case["head_dim"], case["steps"]
    heads, size = kv_heads * case["groups"], batch * seq

    def row_map() -> tuple[Any, Any]:
        """(the positions that have a row, in their rows' order; the [B, T] int32 map to those rows)"""
        present = torch.ones(size, dtype=torch.bool) if case.get("full") else torch.rand(size, generator=gen) < 0.8
        positions = present.nonzero().squeeze(1)
        positions = positions[torch.randperm(len(positions), generator=gen)]
        where = torch.full((size,), -1, dtype=torch.int32)
        where[positions] = torch.arange(len(positions), dtype=torch.int32)
        return positions, where.view(batch, seq)

    def laid_out(x: Any, positions: Any) -> Any:
        return x.new_zeros(size, *x.shape[1:]).index_put((positions,), x).view(batch, seq, *x.shape[1:]).transpose(1, 2)

    q_at, q_rows = row_map()
    q = torch.randn(len(q_at), heads, dim, generator=gen).requires_grad_()
    maps = [row_map() for _ in range(steps)]
    keys = [torch.randn(len(at), kv_heads, dim, generator=gen).requires_grad_() for at, _ in maps]
    wide = [torch.randn(len(at), kv_heads * dim + 8, generator=gen).requires_grad_() for at, _ in maps]
    values = [w[:, 8:].view(len(w), kv_heads, dim) for w in wide]
    grad = torch.randn(q.shape, generator=gen)
    leaves = [q, *keys, *wide]
    kernel_out = ttt_kernel.ttt_attention(q, q_rows, keys, values, [where for _, where in maps])
    eager_out = eager_ttt_attention(
        laid_out(q, q_at),
        [laid_out(k, at) for k, (at, _) in zip(keys, maps, strict=True)],
        [laid_out(v, at) for v, (at, _) in zip(values, maps, strict=True)],
    )
    eager_out = eager_out.transpose(1, 2).reshape(size, heads, dim)[q_at]
    names = ["out", "dq", *(f"dk{j}" for j in range(steps)), *(f"dv{j}" for j in range(steps))]
    results = [[out.detach(), *torch.autograd.grad(out, leaves, grad)] for out in (kernel_out, eager_out)]
    return _relative(names, *results)


if __name__ == "__main__":
    _serve()
