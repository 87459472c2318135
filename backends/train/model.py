"""The EAGLE-3 draft, in SGLang's parameter names, with the training-time-test unroll.

One decoder layer `midlayer` whose attention input is
`cat(input_layernorm(embed), hidden_norm(h))` (width 2H), residual = h, then
post-attention norm and MLP; `fc` fuses the aux hidden states of the target;
`norm` + `lm_head` give logits over the draft vocabulary (forward stops before
`lm_head`: the loss applies it to the rows it reads); `embed_tokens` is the
target's, frozen. The hidden state handed to the next TTT step is the layer's
output before `norm`, as SGLang's draft hands it to its next draft step. Each
step runs only the rows that reach the loss (step_rows.StepRows), packed.
The Triton attention kernel reads them as they are, through a map of each
position's row; only eager and flex attention see them laid out over the
whole batch.

Alignment (EAGLE's): at position t the draft reads the target's features of
position t and the token x_{t+1}. At TTT step k it reads token x_{t+1+k} and
its own step k-1 output at position t, RoPE position t+k, and predicts
x_{t+2+k}, whose target distribution comes from the target's position t+1+k.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from backends.train.attention import eager_ttt_attention, flex_ttt_attention
from backends.train.config import DraftConfig
from backends.train.rmsnorm import add_rms_norm, rms_norm
from backends.train.rope import RotaryEmbedding
from backends.train.step_rows import StepRows
from backends.train.swiglu import silu_mul

# Checkpoint keys leave out the embedding: SGLang takes the target's (SpecForge does the same).
FROZEN_WEIGHTS = ("embed_tokens.weight",)
INIT_STD = 0.02


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In float32 throughout (weight included): rmsnorm's kernels on CUDA, the torch formula elsewhere.
        return rms_norm(x, self.weight, self.eps)

    def after_add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, the norm of it) in one pass."""
        return add_rms_norm(x, residual, self.weight, self.eps)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half(x) = cat(-x2, x1) = roll(x, half) * [-1.., 1..]:
    the sign rides on `sin` (see _rope_tables), which saves two passes over x."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)


def _rope_tables(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin as _rope takes them: in `dtype`, rotate_half's sign on the first half of sin."""
    half = sin.shape[-1] // 2
    return cos.to(dtype), torch.cat([-sin[..., :half], sin[..., half:]], dim=-1).to(dtype)


class Attention(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        # The Triton TTT kernel's entry (ttt_kernel.ttt_attention) instead of flex or eager: Eagle3Draft.use_ttt_kernel.
        self.ttt_kernel: (
            Callable[
                [torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]], torch.Tensor
            ]
            | None
        ) = None
        width = 2 * config.hidden_size
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def qkv_weight(self) -> torch.Tensor:
        """q, k and v's projections as one matrix [(heads + 2 kv_heads) * d, 2H]: one product a step."""
        return torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])

    def forward(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        plan: StepRows,
        step: int,
        past_keys: list[torch.Tensor],
        past_values: list[torch.Tensor],
        block_mask: BlockMask | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """TTT step `step` from the projected input qkv [N, (heads + 2 kv_heads) * d] of the rows it
        projects (plan.keys at step 0, plan.rows[step] after) and their RoPE tables [N, d] (`_rope_tables`),
        after the steps whose keys and values are given: (the output of plan.rows[step]; this step's keys;
        its values). The kernel takes the rows packed, as they are; eager and flex take keys and values laid
        out over the whole batch, zeros where no row was computed (no query that counts reads those:
        step_rows), and are given them so."""
        count = qkv.shape[0]
        q, k, v = torch.split(qkv, [self.heads * self.head_dim, *(2 * [self.kv_heads * self.head_dim])], dim=-1)
        cos, sin = cos[:, None], sin[:, None]
        q = _rope(q.view(count, self.heads, self.head_dim), cos, sin)
        k = _rope(k.view(count, self.kv_heads, self.head_dim), cos, sin)
        v = v.view(count, self.kv_heads, self.head_dim)
        if step == 0:  # step 0 projects keys for more rows than it asks queries of
            q = q[plan.inputs[0]]
        if self.ttt_kernel is not None:
            keys, values = [*past_keys, k], [*past_values, v]
            key_rows = [plan.where[0], *plan.where[2 : 2 + step]]
            mine = self.ttt_kernel(q, plan.where[1 + step], keys, values, key_rows).flatten(1)
        else:
            shape = (plan.batch, plan.seq)
            rows = plan.keys if step == 0 else plan.rows[step]
            keys = [*past_keys, _over_batch(k, rows, shape)]
            values = [*past_values, _over_batch(v, rows, shape)]
            q_all = _over_batch(q, plan.rows[step], shape)
            if block_mask is None:
                out = eager_ttt_attention(q_all, keys, values)
            else:
                out = flex_ttt_attention(q_all, keys, values, block_mask)
            mine = out.transpose(1, 2).reshape(-1, self.heads * self.head_dim)[plan.rows[step]]
        projected: torch.Tensor = self.o_proj(mine)
        return projected, keys[-1], values[-1]


def _over_batch(x: torch.Tensor, rows: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """x [N, heads, d] of `rows` laid out as attention takes it, [B, heads, T, d], zeros elsewhere."""
    batch, seq = shape
    full = x.new_zeros(batch * seq, *x.shape[1:]).index_put((rows,), x)  # index_copy would keep x for backward
    return full.view(batch, seq, *x.shape[1:]).transpose(1, 2)


class MLP(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not supported (silu only)")
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def gate_up_weight(self) -> torch.Tensor:
        return torch.cat([self.gate_proj.weight, self.up_proj.weight])

    def forward(self, x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(silu_mul(F.linear(x, gate_up)))
        return out


class DecoderLayer(nn.Module):
    """The draft's one layer, applied at every TTT step (one call runs them all: FSDP gathers
    its parameters once, and the fused weights are built once)."""

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.hidden_size = config.hidden_size
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
        plan: StepRows,
        block_masks: list[BlockMask] | None,
    ) -> torch.Tensor:
        """The layer's output rows of every step, as `plan.output` numbers them [rows, H]. hidden
        [len(plan.keys), H] is fc's output at step 0's rows; embeds [B, T-1+steps, H] the embeddings
        of x_1.. (zeros past the end), cos/sin [T-1+steps, d]: step k of position t reads t + k."""
        qkv_weight = _in_compute_dtype(self.self_attn.qkv_weight())
        gate_up = _in_compute_dtype(self.mlp.gate_up_weight())
        # The attention's input is cat(input_layernorm(embeds), hidden_norm(hidden)), so its projection
        # is a sum of the two halves'. Step k's token at position t is step 0's at t + k: the embedding
        # half is projected once, over the window of every step, and each step reads its own.
        from_embeds = F.linear(self.input_layernorm(embeds), qkv_weight[:, : self.hidden_size]).flatten(0, 1)
        from_hidden = qkv_weight[:, self.hidden_size :]
        cos, sin = _rope_tables(cos, sin, from_embeds.dtype)  # the dtype of q and k
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outputs = []
        for k in range(plan.steps):
            qkv = F.linear(self.hidden_norm(hidden), from_hidden) + from_embeds[plan.tokens[k]]
            mask = None if block_masks is None else block_masks[k]
            position = plan.positions[k]
            attended, key, value = self.self_attn(qkv, cos[position], sin[position], plan, k, keys, values, mask)
            keys.append(key)
            values.append(value)
            if k == 0:
                hidden = hidden[plan.inputs[0]]
            hidden, normed = self.post_attention_layernorm.after_add(hidden, attended)
            hidden = hidden + self.mlp(normed, gate_up)
            outputs.append(hidden)
            if k + 1 < plan.steps:
                hidden = hidden[plan.inputs[k + 1]]
        return torch.cat(outputs)


def _in_compute_dtype(weight: torch.Tensor) -> torch.Tensor:
    """A computed weight cast once for every step to share: autocast casts a non-parameter
    at each use and keeps each copy for backward (7 copies of the MLP's weights)."""
    device = weight.device.type
    return weight.to(torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else weight


def extend_tokens(ids: torch.Tensor, steps: int) -> torch.Tensor:
    """x_1.. followed by `steps` zeros: [B, T-1+steps]; step k's tokens are the window [k, k+T)
    (at position t, x_{t+1+k}, zero past the end)."""
    return F.pad(ids[:, 1:], (0, steps))


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

    def use_ttt_kernel(self, on: bool = True) -> None:
        """The attention through the Triton TTT kernel (where ttt_kernel.available()). Imported here, not at
        the top: importing Triton costs a CPU-only process most of a second."""
        if not on:
            self.midlayer.self_attn.ttt_kernel = None
            return
        from backends.train import ttt_kernel

        self.midlayer.self_attn.ttt_kernel = ttt_kernel.ttt_attention

    def forward(
        self,
        input_ids: torch.Tensor,
        aux_hidden_states: torch.Tensor,
        plan: StepRows,
        block_masks: list[BlockMask] | None = None,
    ) -> torch.Tensor:
        """The lm_head's input at the rows `plan` computes, [rows, H], as `plan.output` numbers them
        (logits = lm_head of it); input_ids [B, T], aux [B, T, num_aux*H]. The loss applies the
        lm_head itself, to the rows it needs only (loss.fused_ttt_loss). The attention is the Triton
        kernel after use_ttt_kernel(), else flex with `block_masks` (one per step), else eager."""
        seq = input_ids.shape[1]
        cos, sin = self.rotary(torch.arange(seq - 1 + plan.steps, device=input_ids.device))
        embeds = self.embed_tokens(extend_tokens(input_ids, plan.steps))
        # fc on every row, then the rows step 0 needs: fc keeps its input for backward, and the batch's
        # aux tensor is held anyway, where a gathered copy would cost 3 of a row's H-wide tensors more.
        hidden = self.fc(aux_hidden_states).flatten(0, 1)[plan.keys]
        out: torch.Tensor = self.midlayer(embeds, hidden, cos, sin, plan, block_masks)
        normed: torch.Tensor = self.norm(out)
        return normed
