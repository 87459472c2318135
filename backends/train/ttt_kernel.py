"""The attention of the training-time test (TTT) as one Triton kernel, forward and backward.

The same function as attention.eager_ttt_attention: at TTT step k the query at position t
attends to the step-0 keys of positions 0..t and to the step-j keys of position t for
j = 1..k, one softmax over both. Flex computes it over the k+1 steps' keys concatenated
(a copy of them all at every step, and a mask over a (k+1)T-wide score row); here the
causal part is flash attention over step 0's keys (blocks above the diagonal are never
visited) and each earlier step adds one score per query row, read straight from that
step's own tensor and folded into the same online softmax.

Queries, keys and values come packed, one row per computed position (the rows each TTT step runs,
step_rows), with a map per tensor from each position of the batch to its row (-1 where there is none): the
kernels read rows through it and write the gradients back through it, so the trainer never lays the rows
out over the whole batch (a zero-filled copy of q, k and v at every step, and the gathers back, ~12 ms of
an 8 x 2048 step on an H200). A position with no row reads as zeros, as the trainer's zero-filled layout
did: no query the loss reads attends to one.

Grouped-query attention is packed (FlashAttention-3's PackGQA): one program takes the
`groups` query heads that share a key/value head, their rows stacked into one tile, so
each key and value block is read once for all of them, and the diagonal steps' key and
value gradients are summed over the group inside the program, without atomics.

Runs on CUDA, or on CPU under Triton's interpreter (TRITON_INTERPRET=1, set before
triton is imported), which is how the tests check it. Wrapped as torch custom ops, so
torch.compile keeps the kernel whole in its graph instead of tracing into it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # model.py then falls back to flex
    triton = tl = None

LOG2E = 1.4426950408889634
# tl.dot needs at least 16 along each side of a product.
MIN_HEAD_DIM = 16


def _interpreting() -> bool:
    return triton is not None and bool(triton.knobs.runtime.interpret)


def available(device: torch.device | str | None = None) -> bool:
    """Whether the kernel can run on tensors of `device` (default: CUDA if there is one)."""
    if triton is None:
        return False
    if _interpreting():
        return True
    if device is None:
        return torch.cuda.is_available()
    return torch.device(device).type == "cuda"


@dataclass(frozen=True)
class Blocks:
    """Tile sizes of one kernel: `rows` packed query rows (group heads x positions), `keys` per key block."""

    rows: int
    keys: int
    warps: int
    stages: int


@dataclass(frozen=True)
class Config:
    forward: Blocks
    key_grads: Blocks  # dK/dV of step 0: `keys` keys per program, `rows` query rows per inner step
    query_grads: Blocks  # dQ, and dK/dV of the diagonal steps


# head_dim 128's chosen on an H200 (benchmarks/ttt_kernel_check.py --sweep, 8 x 2048, TTT step 3); 64's and
# 256's are not measured yet (the interpreter checks them only). Wider heads take smaller tiles: the
# backward holds dK and dV (or dQ) in fp32 registers beside the tiles it multiplies.
CONFIGS: dict[int, Config] = {
    64: Config(Blocks(128, 64, 4, 3), Blocks(32, 128, 4, 3), Blocks(128, 32, 4, 3)),
    128: Config(Blocks(64, 64, 4, 3), Blocks(64, 64, 4, 2), Blocks(64, 64, 4, 2)),
    256: Config(Blocks(64, 32, 8, 2), Blocks(16, 64, 8, 2), Blocks(64, 16, 8, 2)),
}
# Small tiles under the interpreter: the tests' short sequences then span several blocks and a ragged tail.
INTERPRETER_CONFIG = Config(Blocks(32, 16, 1, 1), Blocks(16, 16, 1, 1), Blocks(32, 16, 1, 1))


def _config(head_dim: int) -> Config:
    if _interpreting():
        return INTERPRETER_CONFIG
    return CONFIGS[min(256, max(64, triton.next_power_of_2(head_dim)))]


def _tile(rows: int, groups: int) -> tuple[int, int]:
    """(group heads, positions) of a packed tile of about `rows` rows: a power of two each."""
    block_g = triton.next_power_of_2(groups)
    return block_g, max(rows // block_g, max(1, 16 // block_g))


def _jit(kernel: Callable[..., None]) -> Any:
    """triton.jit, or the function as it is where Triton is missing (it is then never launched).
    Triton decides here whether to compile or interpret: TRITON_INTERPRET must be set before import.
    The kernels' arguments go unannotated: Triton reads annotations (tl.constexpr) and no other."""
    return kernel if triton is None else triton.jit(kernel)


@_jit
def _query_rows(  # type: ignore[no-untyped-def]
    t0, b, kvh, T, QW, sq_n, sq_h,
    HEAD_DIM: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """A packed tile of queries from position t0: row r is query head kvh * G + r // BLOCK_T at position
    t0 + r % BLOCK_T. (its heads, its positions, which rows are real, their offsets in Q and their mask)."""
    r = tl.arange(0, BLOCK_G * BLOCK_T)
    head, t = kvh * G + r // BLOCK_T, t0 + r % BLOCK_T
    row = tl.load(QW + b * T + t, mask=(r // BLOCK_T < G) & (t < T), other=-1)
    row_ok = row >= 0
    d = tl.arange(0, BLOCK_D)
    q_at = row[:, None] * sq_n + head[:, None] * sq_h + d[None, :]
    return head, t, row_ok, q_at, row_ok[:, None] & (d < HEAD_DIM)[None, :]


@_jit
def _key_rows(  # type: ignore[no-untyped-def]
    W, b, positions, T, kvh, s_n, s_h, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Offsets and mask of the key (or value) rows of `positions` of sample b through the map W, as a
    [positions, d] tile."""
    row = tl.load(W + b * T + positions, mask=positions < T, other=-1)
    d = tl.arange(0, BLOCK_D)
    return (row * s_n + kvh * s_h)[:, None] + d[None, :], (row >= 0)[:, None] & (d < HEAD_DIM)[None, :]


@_jit
def _forward_kernel(  # type: ignore[no-untyped-def]
    Q, QW, K0, V0, KW0, KD, VD, KWD, Out, Lse,
    sq_n, sq_h, sk_n, sk_h, sl_b, sl_h,
    T, KV_HEADS, qk_scale,
    HEAD_DIM: tl.constexpr, G: tl.constexpr, STEPS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    t0 = tl.program_id(0) * BLOCK_T
    b = tl.program_id(1) // KV_HEADS
    kvh = tl.program_id(1) % KV_HEADS
    head, t, row_ok, q_at, q_ok = _query_rows(t0, b, kvh, T, QW, sq_n, sq_h, HEAD_DIM, G, BLOCK_G, BLOCK_T, BLOCK_D)
    q = tl.load(Q + q_at, mask=q_ok, other=0.0)
    n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_G * BLOCK_T], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G * BLOCK_T], tl.float32)
    acc = tl.zeros([BLOCK_G * BLOCK_T, BLOCK_D], tl.float32)
    # Each earlier TTT step: the key and value of the row's own position, one more score in the softmax.
    # Before the causal part: after it, each step's term had to be moved into acc's matrix-unit layout
    # (through shared memory) and registers spilled; at 8 x 2048, k=6, 1.03 ms then, 0.89 now (H200).
    qf = q.to(tl.float32)
    for j in tl.static_range(STEPS):
        kj_at, kj_ok = _key_rows(KWD[j], b, t, T, kvh, sk_n, sk_h, HEAD_DIM, BLOCK_D)
        kj = tl.load(KD[j] + kj_at, mask=kj_ok, other=0.0).to(tl.float32)
        sj = tl.sum(qf * kj, 1) * qk_scale
        m_new = tl.maximum(m_i, sj)
        alpha = tl.exp2(m_i - m_new)
        pj = tl.exp2(sj - m_new)
        l_i = l_i * alpha + pj
        vj = tl.load(VD[j] + kj_at, mask=kj_ok, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + pj[:, None] * vj
        m_i = m_new
    # Key blocks wholly below the tile's first position need no mask; the rest up to its last
    # position do; none past it is visited (causal block skipping).
    unmasked_end = (t0 // BLOCK_N) * BLOCK_N
    end = tl.minimum(t0 + BLOCK_T, T)
    for start in range(0, end, BLOCK_N):
        keys = start + n
        k_at, k_ok = _key_rows(KW0, b, keys, T, kvh, sk_n, sk_h, HEAD_DIM, BLOCK_D)
        k = tl.load(K0 + k_at, mask=k_ok, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if start >= unmasked_end:
            s = tl.where(keys[None, :] <= t[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V0 + k_at, mask=k_ok, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(Out + q_at, out.to(Out.dtype.element_ty), mask=q_ok)
    # log2 of the softmax's denominator, in the scaled-by-log2(e) units the backward recomputes in.
    tl.store(Lse + b * sl_b + head * sl_h + t, m_i + tl.log2(l_i), mask=row_ok)


@_jit
def _key_grads_kernel(  # type: ignore[no-untyped-def]
    Q, QW, K0, V0, KW0, dO, Lse, Delta, dK0, dV0,
    sq_n, sq_h, sk_n, sk_h, sl_b, sl_h,
    T, KV_HEADS, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, G: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """dK, dV of step 0's keys: one key block per program, over the query tiles at or after it (after
    _query_grads_kernel, which writes Delta). dK and dV are laid out as K (sk_n, sk_h)."""
    n0 = tl.program_id(0) * BLOCK_N
    b = tl.program_id(1) // KV_HEADS
    kvh = tl.program_id(1) % KV_HEADS
    keys = n0 + tl.arange(0, BLOCK_N)
    k_at, k_ok = _key_rows(KW0, b, keys, T, kvh, sk_n, sk_h, HEAD_DIM, BLOCK_D)
    k = tl.load(K0 + k_at, mask=k_ok, other=0.0)
    v = tl.load(V0 + k_at, mask=k_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # Query tiles that straddle the block's diagonal take the causal mask; those after it see every key.
    first = (n0 // BLOCK_T) * BLOCK_T
    masked_end = n0 + BLOCK_N
    for t0 in range(first, T, BLOCK_T):
        head, t, row_ok, q_at, q_ok = _query_rows(t0, b, kvh, T, QW, sq_n, sq_h, HEAD_DIM, G, BLOCK_G, BLOCK_T, BLOCK_D)
        q = tl.load(Q + q_at, mask=q_ok, other=0.0)
        do = tl.load(dO + q_at, mask=q_ok, other=0.0)
        at = b * sl_b + head * sl_h + t
        lse = tl.load(Lse + at, mask=row_ok, other=0.0)
        delta = tl.load(Delta + at, mask=row_ok, other=0.0)
        p = tl.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None])
        if t0 < masked_end:
            p = tl.where(keys[None, :] <= t[:, None], p, 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    tl.store(dK0 + k_at, (dk * sm_scale).to(dK0.dtype.element_ty), mask=k_ok)
    tl.store(dV0 + k_at, dv.to(dV0.dtype.element_ty), mask=k_ok)


@_jit
def _query_grads_kernel(  # type: ignore[no-untyped-def]
    Q, QW, K0, V0, KW0, KD, VD, KWD, Out, dO, Lse, Delta, dQ, dKD, dVD,
    sq_n, sq_h, sk_n, sk_h, sl_b, sl_h,
    T, KV_HEADS, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, G: tl.constexpr, STEPS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """dQ over step 0's keys up to the diagonal, and the diagonal steps' terms: their share of dQ
    and, summed over the group's heads, their dK and dV (rows of the tile's positions only; laid out as K)."""
    t0 = tl.program_id(0) * BLOCK_T
    b = tl.program_id(1) // KV_HEADS
    kvh = tl.program_id(1) % KV_HEADS
    head, t, row_ok, q_at, q_ok = _query_rows(t0, b, kvh, T, QW, sq_n, sq_h, HEAD_DIM, G, BLOCK_G, BLOCK_T, BLOCK_D)
    q = tl.load(Q + q_at, mask=q_ok, other=0.0)
    do = tl.load(dO + q_at, mask=q_ok, other=0.0)
    at = b * sl_b + head * sl_h + t
    lse = tl.load(Lse + at, mask=row_ok, other=0.0)
    # D_i = dO_i . O_i, the softmax's backward term of each row (FlashAttention-2's preprocessing), computed
    # here and stored for the key-gradient kernel, which runs after this one.
    o = tl.load(Out + q_at, mask=q_ok, other=0.0)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    tl.store(Delta + at, delta, mask=row_ok)
    # The diagonal steps first, into dq's starting value. After the loop over keys, each step's share had to
    # be moved into dq's matrix-unit layout (through shared memory) while fp32 q and dO sat beside dq: 2.3 KB
    # of spilled registers a thread at 6 steps, 640 B now; the backward at 8 x 2048, k=6, 3.47 ms then, 2.86
    # now (H200).
    dq = tl.zeros([BLOCK_G * BLOCK_T, BLOCK_D], tl.float32)
    qf = q.to(tl.float32)
    dof = do.to(tl.float32)
    positions = t0 + tl.arange(0, BLOCK_T)
    for j in tl.static_range(STEPS):
        kj_at, kj_ok = _key_rows(KWD[j], b, t, T, kvh, sk_n, sk_h, HEAD_DIM, BLOCK_D)
        kj = tl.load(KD[j] + kj_at, mask=kj_ok, other=0.0).to(tl.float32)
        vj = tl.load(VD[j] + kj_at, mask=kj_ok, other=0.0).to(tl.float32)
        pj = tl.exp2(tl.sum(qf * kj, 1) * qk_scale - lse)
        dsj = pj * (tl.sum(dof * vj, 1) - delta)
        dq += dsj[:, None] * kj
        # Rows of padding heads (g >= G) and of positions with no query hold zeros in q and dO, so they add
        # nothing to the sums.
        dkj = tl.sum(tl.reshape(dsj[:, None] * qf, (BLOCK_G, BLOCK_T, BLOCK_D)), 0) * sm_scale
        dvj = tl.sum(tl.reshape(pj[:, None] * dof, (BLOCK_G, BLOCK_T, BLOCK_D)), 0)
        own_at, own_ok = _key_rows(KWD[j], b, positions, T, kvh, sk_n, sk_h, HEAD_DIM, BLOCK_D)
        tl.store(dKD[j] + own_at, dkj.to(dKD[j].dtype.element_ty), mask=own_ok)
        tl.store(dVD[j] + own_at, dvj.to(dVD[j].dtype.element_ty), mask=own_ok)
    n = tl.arange(0, BLOCK_N)
    unmasked_end = (t0 // BLOCK_N) * BLOCK_N
    end = tl.minimum(t0 + BLOCK_T, T)
    for start in range(0, end, BLOCK_N):
        keys = start + n
        k_at, k_ok = _key_rows(KW0, b, keys, T, kvh, sk_n, sk_h, HEAD_DIM, BLOCK_D)
        k = tl.load(K0 + k_at, mask=k_ok, other=0.0)
        v = tl.load(V0 + k_at, mask=k_ok, other=0.0)
        p = tl.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None])
        if start >= unmasked_end:
            p = tl.where(keys[None, :] <= t[:, None], p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    tl.store(dQ + q_at, (dq * sm_scale).to(dQ.dtype.element_ty), mask=q_ok)


def _check(
    q: torch.Tensor,
    q_rows: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    key_rows: list[torch.Tensor],
) -> None:
    if len(keys) != len(values) or len(keys) != len(key_rows):
        raise ValueError(f"{len(keys)} steps of keys, {len(values)} of values and {len(key_rows)} row maps")
    tensors = [q, *keys, *values]
    if any(k.shape != v.shape for k, v in zip(keys, values, strict=True)):
        raise ValueError("each step's keys and values must have one shape")
    if any(k.shape[1:] != keys[0].shape[1:] for k in keys) or not all(x.is_contiguous() for x in tensors):
        raise ValueError("q, keys and values must be contiguous [rows, heads, head_dim], one width for every step")
    if any(x.numel() >= 2**31 for x in tensors):
        raise ValueError("the kernel indexes q, keys and values with 32-bit offsets: split the batch")
    if any(w.shape != q_rows.shape or w.dtype != torch.int32 or not w.is_contiguous() for w in [q_rows, *key_rows]):
        raise ValueError("the row maps must be contiguous int32 [batch, seq], one shape")
    if q.shape[1] % keys[0].shape[1] or q.shape[-1] < MIN_HEAD_DIM:
        raise ValueError(f"heads {q.shape[1]} / kv heads {keys[0].shape[1]}, head_dim {q.shape[-1]} not supported")


def _strides(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor) -> tuple[int, ...]:
    """Q's (and O's and dO's) row and head strides, the keys' (and values' and their gradients'), Lse's."""
    return (q.stride(0), q.stride(1), k.stride(0), k.stride(1), lse.stride(0), lse.stride(1))


# Custom ops: torch.compile sees one opaque node with a known output shape (and so never guards on the
# kernel's internals); the backward is an op of its own for the same reason.
@torch.library.custom_op("eagle3::ttt_attention_forward", mutates_args=())
def _forward_op(
    q: torch.Tensor,
    q_rows: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    key_rows: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(q, q_rows, keys, values, key_rows)
    heads, dim = q.shape[1:]
    batch, seq = q_rows.shape
    kv_heads = keys[0].shape[1]
    groups = heads // kv_heads
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq, dtype=torch.float32, device=q.device)
    blocks = _config(dim).forward
    block_g, block_t = _tile(blocks.rows, groups)
    grid = (triton.cdiv(seq, block_t), batch * kv_heads)
    _forward_kernel[grid](
        q, q_rows, keys[0], values[0], key_rows[0], tuple(keys[1:]), tuple(values[1:]), tuple(key_rows[1:]), out, lse,
        *_strides(q, keys[0], lse), seq, kv_heads, dim**-0.5 * LOG2E,
        HEAD_DIM=dim, G=groups, STEPS=len(keys) - 1, BLOCK_G=block_g, BLOCK_T=block_t,
        BLOCK_N=blocks.keys, BLOCK_D=triton.next_power_of_2(dim), num_warps=blocks.warps, num_stages=blocks.stages,
    )  # fmt: skip
    return out, lse


@torch.library.custom_op("eagle3::ttt_attention_backward", mutates_args=())
def _backward_op(
    grad: torch.Tensor,
    q: torch.Tensor,
    q_rows: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    key_rows: list[torch.Tensor],
    out: torch.Tensor,
    lse: torch.Tensor,
) -> list[torch.Tensor]:
    heads, dim = q.shape[1:]
    batch, seq = q_rows.shape
    kv_heads = keys[0].shape[1]
    groups = heads // kv_heads
    # The kernels index dO and O with q's strides.
    grad = grad.contiguous()
    delta = torch.empty_like(lse)
    dq = torch.empty_like(q)
    dkeys = [torch.empty_like(k) for k in keys]
    dvalues = [torch.empty_like(v) for v in values]
    config = _config(dim)
    scales = (dim**-0.5 * LOG2E, dim**-0.5)
    block_d = triton.next_power_of_2(dim)
    strides = _strides(q, keys[0], lse)
    qb = config.query_grads
    block_g, block_t = _tile(qb.rows, groups)
    _query_grads_kernel[(triton.cdiv(seq, block_t), batch * kv_heads)](
        q, q_rows, keys[0], values[0], key_rows[0], tuple(keys[1:]), tuple(values[1:]), tuple(key_rows[1:]),
        out, grad, lse, delta, dq, tuple(dkeys[1:]), tuple(dvalues[1:]),
        *strides, seq, kv_heads, *scales,
        HEAD_DIM=dim, G=groups, STEPS=len(keys) - 1, BLOCK_G=block_g, BLOCK_T=block_t, BLOCK_N=qb.keys,
        BLOCK_D=block_d, num_warps=qb.warps, num_stages=qb.stages,
    )  # fmt: skip
    kb = config.key_grads
    block_g, block_t = _tile(kb.rows, groups)
    _key_grads_kernel[(triton.cdiv(seq, kb.keys), batch * kv_heads)](
        q, q_rows, keys[0], values[0], key_rows[0], grad, lse, delta, dkeys[0], dvalues[0],
        *strides, seq, kv_heads, *scales,
        HEAD_DIM=dim, G=groups, BLOCK_G=block_g, BLOCK_T=block_t, BLOCK_N=kb.keys, BLOCK_D=block_d,
        num_warps=kb.warps, num_stages=kb.stages,
    )  # fmt: skip
    return [dq, *dkeys, *dvalues]


@_forward_op.register_fake
def _(
    q: torch.Tensor,
    q_rows: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    key_rows: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), q.new_empty((q_rows.shape[0], q.shape[1], q_rows.shape[1]), dtype=torch.float32)


@_backward_op.register_fake
def _(
    grad: torch.Tensor,
    q: torch.Tensor,
    q_rows: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    key_rows: list[torch.Tensor],
    out: torch.Tensor,
    lse: torch.Tensor,
) -> list[torch.Tensor]:
    return [torch.empty_like(q), *(torch.empty_like(k) for k in keys), *(torch.empty_like(v) for v in values)]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, q_rows, keys, values, key_rows = inputs
    ctx.steps = len(keys)
    ctx.save_for_backward(q, q_rows, *keys, *values, *key_rows, *output)


def _backward_rule(ctx: Any, grad: torch.Tensor, _grad_lse: torch.Tensor | None) -> tuple[Any, ...]:
    q, q_rows, *rest = ctx.saved_tensors
    steps = ctx.steps
    keys, values, key_rows = rest[:steps], rest[steps : 2 * steps], rest[2 * steps : 3 * steps]
    out, lse = rest[3 * steps :]
    grads = _backward_op(grad, q, q_rows, keys, values, key_rows, out, lse)
    return grads[0], None, grads[1 : 1 + steps], grads[1 + steps :], [None] * steps


_forward_op.register_autograd(_backward_rule, setup_context=_setup_context)


def ttt_attention(
    q: torch.Tensor,
    q_rows: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    key_rows: list[torch.Tensor],
) -> torch.Tensor:
    """eager_ttt_attention's result through the kernel, on packed rows: q [Nq, heads, d], the queries'
    rows; keys[j] and values[j] [Nj, kv_heads, d], step j's (the current one last); q_rows and key_rows[j]
    [B, T] int32, the row of each position of the batch in q and in keys[j] (-1: none, read as zeros).
    Returns [Nq, heads, d], laid out as q."""
    if triton is None:
        raise RuntimeError("the TTT attention kernel needs Triton (pip install triton)")
    # Values laid out as keys: one offset tile serves both (separate ones spilled registers: 1.4 KB a thread
    # in the dQ kernel at 6 steps, 640 B with one).
    keys, values = [k.contiguous() for k in keys], [v.contiguous() for v in values]
    out: torch.Tensor = _forward_op(q.contiguous(), q_rows, keys, values, list(key_rows))[0]
    return out
