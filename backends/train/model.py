"""The EAGLE-3 draft, in SGLang's parameter names, with the training-time-test unroll.

One decoder layer `midlayer` whose attention input is
`cat(input_layernorm(embed), hidden_norm(h))` (width 2H), residual = h, then
post-attention norm and MLP; `fc` fuses the aux hidden states of the target;
`norm` + `lm_head` give logits over the draft vocabulary (forward stops before
`lm_head`: the loss applies it to the rows it reads); `embed_tokens` is the
target's, frozen. The hidden state handed to the next TTT step is the layer's
output before `norm`, as SGLang's draft hands it to its next draft step.

Alignment (EAGLE's): at position t the draft reads the target's features of
position t and the token x_{t+1}. At TTT step k it reads token x_{t+1+k} and
its own step k-1 output at position t, RoPE position t+k, and predicts
x_{t+2+k}, whose target distribution comes from the target's position t+1+k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from backends.train.attention import eager_ttt_attention, flex_ttt_attention
from backends.train.config import DraftConfig
from backends.train.rope import RotaryEmbedding

# Checkpoint keys leave out the embedding: SGLang takes the target's (SpecForge does the same).
FROZEN_WEIGHTS = ("embed_tokens.weight",)
INIT_STD = 0.02


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In float32 throughout (weight included), as one fused kernel where PyTorch has one.
        return F.rms_norm(x.float(), self.weight.shape, self.weight.float(), self.eps).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half(x) = cat(-x2, x1) = roll(x, half) * [-1.., 1..]:
    the sign rides on `sin` (see Attention.forward), which saves two passes over x."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)


# Keys or values of the TTT steps so far, one [B, kv_heads, T, d] tensor per step. Passed
# in and returned, never mutated: FSDP rebuilds a module's forward arguments, so
# a container filled in place would be lost between steps.
Past = tuple[torch.Tensor, ...]


class Attention(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        width = 2 * config.hidden_size
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[Past, Past],
        block_mask: BlockMask | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(output, this step's keys, this step's values)."""
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        half = sin.shape[-1] // 2
        cos, sin = cos.to(q.dtype), torch.cat([-sin[..., :half], sin[..., half:]], dim=-1).to(q.dtype)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        keys, values = [*past[0], k], [*past[1], v]
        if block_mask is None:
            out = eager_ttt_attention(q, keys, values)
        else:
            out = flex_ttt_attention(q, keys, values, block_mask)
        projected: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))
        return projected, k, v


class MLP(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not supported (silu only)")
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[Past, Past],
        block_mask: BlockMask | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(output hidden state, keys, values) of one TTT step."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        attended, k, v = self.self_attn(x, cos, sin, past, block_mask)
        hidden = hidden + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden)), k, v


def shift_left(ids: torch.Tensor, n: int) -> torch.Tensor:
    """ids[:, n:] padded on the right with zeros to the same length."""
    return F.pad(ids[:, n:], (0, min(n, ids.shape[1])))


class Eagle3Draft(nn.Module):
    def __init__(self, config: DraftConfig, embed_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=embed_dtype)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(config.num_aux * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = DecoderLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings
        )
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=INIT_STD)

    def forward(
        self,
        input_ids: torch.Tensor,
        aux_hidden_states: torch.Tensor,
        steps: int,
        block_masks: list[BlockMask] | None = None,
    ) -> torch.Tensor:
        """The lm_head's input at every TTT step, [steps, B, T, H] (logits = lm_head of it);
        input_ids [B, T], aux [B, T, num_aux*H]. The loss applies the lm_head itself, to the
        rows it needs only (loss.fused_ttt_loss)."""
        seq = input_ids.shape[1]
        hidden = self.fc(aux_hidden_states)
        keys: Past = ()
        values: Past = ()
        outputs = []
        for k in range(steps):
            embeds = self.embed_tokens(shift_left(input_ids, 1 + k))
            cos, sin = self.rotary(torch.arange(k, k + seq, device=input_ids.device))
            mask = None if block_masks is None else block_masks[k]
            hidden, k_step, v_step = self.midlayer(embeds, hidden, cos, sin, (keys, values), mask)
            keys, values = (*keys, k_step), (*values, v_step)
            outputs.append(self.norm(hidden))
        return torch.stack(outputs)
