"""The draft's TTT unroll is EAGLE-3's, step by step, whatever the model does to go fast.

The model projects the embedding half of the attention's input once for all
steps, fuses q/k/v and gate/up into single products, runs every step in one
call of its layer and computes only the rows that reach the loss (step_rows).
The reference below is the plain formula, one step at a time, over every row,
with the layer's own parameters: the outputs and every parameter's gradient
must agree. The attention is eager here (PyTorch has no flex backward
on the CPU); flex is checked against eager in test_train and, on the GPU, by
benchmarks.train_throughput.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.train.attention import eager_ttt_attention
from backends.train.config import DraftConfig
from backends.train.loss import pairs_in_loss, step_masks
from backends.train.model import Eagle3Draft
from backends.train.step_rows import step_rows

CONFIG = DraftConfig(
    hidden_size=32,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=40,
    draft_vocab_size=24,
    target_hidden_size=32,
    aux_layer_ids=(1, 3, 5),
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    rope_scaling=None,
    hidden_act="silu",
)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def reference_unroll(draft: Eagle3Draft, ids: torch.Tensor, aux: torch.Tensor, steps: int) -> torch.Tensor:
    """Step k: tokens x_{t+1+k} (zeros past the end), cat(input_layernorm(embed), hidden_norm(h)),
    q/k/v, RoPE at positions t+k, TTT attention, residuals, MLP; the output is norm(h)."""
    batch, seq = ids.shape
    layer, cfg = draft.midlayer, draft.config
    attn, mlp = layer.self_attn, layer.mlp
    hidden = draft.fc(aux)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    outputs = []
    for k in range(steps):
        tokens = F.pad(ids[:, 1 + k :], (0, min(1 + k, seq)))
        x = torch.cat([layer.input_layernorm(draft.embed_tokens(tokens)), layer.hidden_norm(hidden)], dim=-1)

        def heads(proj: torch.nn.Linear, n: int, x: torch.Tensor = x) -> torch.Tensor:
            projected: torch.Tensor = proj(x)
            return projected.view(batch, seq, n, cfg.head_dim).transpose(1, 2)

        q = heads(attn.q_proj, cfg.num_attention_heads)
        key, value = heads(attn.k_proj, cfg.num_key_value_heads), heads(attn.v_proj, cfg.num_key_value_heads)
        cos, sin = draft.rotary(torch.arange(k, k + seq))
        q, key = q * cos + _rotate_half(q) * sin, key * cos + _rotate_half(key) * sin
        keys.append(key)
        values.append(value)
        out = eager_ttt_attention(q, keys, values).transpose(1, 2).reshape(batch, seq, -1)
        hidden = hidden + attn.o_proj(out)
        normed = layer.post_attention_layernorm(hidden)
        hidden = hidden + mlp.down_proj(F.silu(mlp.gate_proj(normed)) * mlp.up_proj(normed))
        outputs.append(draft.norm(hidden))
    return torch.stack(outputs)


def make_draft() -> Eagle3Draft:
    torch.manual_seed(0)
    draft = Eagle3Draft(CONFIG).double()
    for norm in (draft.midlayer.input_layernorm, draft.midlayer.hidden_norm, draft.norm):
        torch.nn.init.normal_(norm.weight, 1.0, 0.2)  # gradients that reach every norm weight differ
    return draft


def trained(draft: Eagle3Draft) -> list[torch.nn.Parameter]:
    # The forward stops before the lm_head (the loss applies it).
    return [p for name, p in draft.named_parameters() if p.requires_grad and name != "lm_head.weight"]


@pytest.mark.parametrize(("seq", "steps"), [(9, 4), (3, 5)], ids=["long", "shorter-than-the-steps"])
def test_the_unroll_is_the_step_by_step_formula(seq: int, steps: int) -> None:
    draft = make_draft()
    ids = torch.randint(1, CONFIG.vocab_size, (2, seq))
    aux = torch.randn(2, seq, CONFIG.num_aux * CONFIG.target_hidden_size, dtype=torch.float64)
    probe = torch.randn(steps, 2, seq, CONFIG.hidden_size, dtype=torch.float64)
    every_row = step_rows(torch.ones(steps, 2, seq, dtype=torch.bool))
    params = trained(draft)
    results = []
    for unroll in (
        lambda: draft(ids, aux, every_row).view(steps, 2, seq, -1),
        lambda: reference_unroll(draft, ids, aux, steps),
    ):
        out = unroll()
        results.append([out, *torch.autograd.grad((out * probe).sum(), params)])
    # Float32 precision: the norms compute in float32.
    for got, expected in zip(*results, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    seq=st.integers(1, 10),
    steps=st.integers(1, 5),
    prompt=st.integers(0, 6),
    density=st.sampled_from([0.0, 0.5, 0.8, 1.0]),
)
def test_computing_only_the_rows_the_loss_reads_changes_none_of_them(
    seed: int, seq: int, steps: int, prompt: int, density: float
) -> None:
    """A prompt, right padding, holes in the loss mask and target argmaxes outside the draft vocabulary
    (chains that enter the loss at a later step): the rows the loss reads, and every parameter's
    gradient through them, are those of the formula over every row."""
    draft = make_draft()
    gen = torch.Generator().manual_seed(seed)
    batch = 3
    ids = torch.randint(1, CONFIG.vocab_size, (batch, seq), generator=gen)
    aux = torch.randn(batch, seq, CONFIG.num_aux * CONFIG.target_hidden_size, dtype=torch.float64, generator=gen)
    position = torch.arange(seq)
    lengths = torch.randint(1, seq + 1, (batch,), generator=gen)
    loss_mask = (torch.rand(batch, seq, generator=gen) < density) & (position >= prompt) & (position < lengths[:, None])
    in_loss = pairs_in_loss(step_masks(loss_mask, torch.rand(batch, seq, generator=gen) < 0.7, steps), seq)
    plan = step_rows(in_loss)
    params = trained(draft)
    got = draft(ids, aux, plan)[plan.output[in_loss.flatten(1)]]
    expected = reference_unroll(draft, ids, aux, steps)[in_loss]
    assert len(got) == int(in_loss.sum())
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    weights = torch.randn(got.shape, dtype=torch.float64, generator=gen)
    got_grads = torch.autograd.grad((got * weights).sum(), params, allow_unused=True)
    expected_grads = torch.autograd.grad((expected * weights).sum(), params, allow_unused=True)
    for g, e, p in zip(got_grads, expected_grads, params, strict=True):
        zero = torch.zeros_like(p)
        torch.testing.assert_close(zero if g is None else g, zero if e is None else e, rtol=1e-4, atol=1e-5)


def test_rows_outside_the_loss_are_not_computed() -> None:
    """A prompt of 4, a sample padded after 6 of 10, the loss on the rest: step 0 projects keys up to
    each sample's last row in the loss, and later steps run only the chains the loss still reads."""
    steps, seq = 3, 10
    lengths = torch.tensor([10, 6])
    position = torch.arange(seq)
    in_loss = (position >= 4) & (position + 1 + torch.arange(steps)[:, None, None] < lengths[:, None])
    plan = step_rows(in_loss)
    # Sample 0's last position has no next token; sample 1's loss is its position 4 at step 0 only.
    assert plan.keys.tolist() == [*range(0, 9), *range(10, 15)]
    assert [r.tolist() for r in plan.rows] == [[4, 5, 6, 7, 8, 14], [4, 5, 6, 7], [4, 5, 6]]
    assert plan.output.max() + 1 == sum(len(r) for r in plan.rows)
    # Where each position's row sits (what the TTT kernel reads rows through): -1 where it has none.
    assert plan.where.shape == (1 + steps, 2, seq) and plan.where.dtype == torch.int32
    for where, rows in zip(plan.where, [plan.keys, *plan.rows], strict=True):
        expected = torch.full((2 * seq,), -1, dtype=torch.int32)
        expected[rows] = torch.arange(len(rows), dtype=torch.int32)
        assert where.flatten().tolist() == expected.tolist()


def test_a_batch_without_a_row_in_the_loss_computes_nothing_and_has_zero_gradients() -> None:
    """An all-prompt batch (or one whose targets are all outside the draft vocabulary)."""
    draft = make_draft()
    plan = step_rows(torch.zeros(3, 2, 5, dtype=torch.bool))
    assert len(plan.keys) == 0 and all(len(r) == 0 for r in plan.rows)
    aux = torch.randn(2, 5, CONFIG.num_aux * CONFIG.target_hidden_size, dtype=torch.float64)
    out = draft(torch.randint(1, CONFIG.vocab_size, (2, 5)), aux, plan)
    assert out.shape == (0, CONFIG.hidden_size)
    grads = torch.autograd.grad(out.sum(), trained(draft), allow_unused=True)
    assert all(g is None or not g.any() for g in grads)
