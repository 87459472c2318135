"""The draft's TTT unroll is EAGLE-3's, step by step, whatever the model does to go fast.

The model projects the embedding half of the attention's input once for all
steps, fuses q/k/v and gate/up into single products and runs every step in one
call of its layer. The reference below is the plain formula, one step at a
time, with the layer's own parameters: the outputs and every parameter's
gradient must agree. The attention is eager here (PyTorch has no flex backward
on the CPU); flex is checked against eager in test_train and, on the GPU, by
benchmarks.train_throughput.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backends.train.attention import eager_ttt_attention
from backends.train.config import DraftConfig
from backends.train.model import Eagle3Draft

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


@pytest.mark.parametrize(("seq", "steps"), [(9, 4), (3, 5)], ids=["long", "shorter-than-the-steps"])
def test_the_unroll_is_the_step_by_step_formula(seq: int, steps: int) -> None:
    torch.manual_seed(0)
    draft = Eagle3Draft(CONFIG).double()
    for norm in (draft.midlayer.input_layernorm, draft.midlayer.hidden_norm, draft.norm):
        torch.nn.init.normal_(norm.weight, 1.0, 0.2)  # gradients that reach every norm weight differ
    ids = torch.randint(1, CONFIG.vocab_size, (2, seq))
    aux = torch.randn(2, seq, CONFIG.num_aux * CONFIG.target_hidden_size, dtype=torch.float64)
    probe = torch.randn(steps, 2, seq, CONFIG.hidden_size, dtype=torch.float64)
    # The forward stops before the lm_head (the loss applies it).
    params = [p for name, p in draft.named_parameters() if p.requires_grad and name != "lm_head.weight"]
    results = []
    for unroll in (lambda: draft(ids, aux, steps), lambda: reference_unroll(draft, ids, aux, steps)):
        out = unroll()
        results.append([out, *torch.autograd.grad((out * probe).sum(), params)])
    # Float32 precision: the norms compute in float32.
    for got, expected in zip(*results, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
