"""Rotary position embedding with the target's settings, as SGLang applies it to the draft.

The RoPE types of the common targets are computed here: `default` (Qwen,
Mistral, Llama 2), `linear`, and `llama3` (Llama 3.1+), with Hugging Face's
formulas; any other type (yarn, longrope, ...) is delegated to transformers,
imported only then: that import costs seconds on every process's start.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def _llama3(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = float(scaling["factor"])
    low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
    context = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    return torch.where(medium, smoothed, scaled)


def _from_transformers(
    head_dim: int, theta: float, scaling: dict[str, Any], max_positions: int
) -> tuple[torch.Tensor, float]:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    fields: dict[str, Any] = {
        "hidden_size": head_dim,
        "num_attention_heads": 1,
        "head_dim": head_dim,
        "max_position_embeddings": max_positions,
        "rope_theta": theta,
        "rope_scaling": scaling,
    }
    rotary = LlamaRotaryEmbedding(config=LlamaConfig(**fields))
    return rotary.inv_freq.float(), float(rotary.attention_scaling)


def inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, max_positions: int
) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2] float32, scale of cos/sin)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if scaling is None or kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(scaling["factor"]), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    return _from_transformers(head_dim, theta, scaling, max_positions)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None, max_positions: int) -> None:
        super().__init__()
        inv_freq, self.scale = inverse_frequencies(head_dim, theta, scaling, max_positions)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, head_dim] (float32) for integer positions [T]."""
        freqs = positions.float()[:, None] * self.get_buffer("inv_freq")[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)
        return angles.cos() * self.scale, angles.sin() * self.scale
