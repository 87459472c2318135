"""The target model, read without instantiating it.

The trainer needs three things from the target: its config (the draft's shape
and RoPE come from it), its input embedding (copied into the draft, frozen) and
its `lm_head` (the teacher: target logits from the extracted final hidden
state). The two matrices are read from the safetensors files with `safe_open`,
one tensor at a time, so a 70B target costs two matrices of memory, not 140 GB.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backends.train.errors import TrainError

EMBED_NAME = "model.embed_tokens.weight"
LM_HEAD_NAME = "lm_head.weight"
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class TargetConfig:
    """The fields of the target's config.json that shape the draft."""

    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    hidden_act: str
    tie_word_embeddings: bool


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) in the legacy fields SGLang reads; transformers 5 writes `rope_parameters`."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return float(theta), scaling


def read_target_config(directory: Path) -> TargetConfig:
    path = directory / "config.json"
    try:
        cfg = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise TrainError(f"{path} does not exist: --target must be a Hugging Face model folder") from None
    except (OSError, ValueError) as exc:
        raise TrainError(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise TrainError(f"{path} is not a JSON object")
    # Multimodal configs nest the language model's fields.
    text = cfg.get("text_config") if "hidden_size" not in cfg else None
    fields: dict[str, Any] = {**cfg, **text} if isinstance(text, dict) else cfg
    try:
        hidden = int(fields["hidden_size"])
        heads = int(fields["num_attention_heads"])
        theta, scaling = _rope(fields)
        return TargetConfig(
            architecture=str((cfg.get("architectures") or ["?"])[0]),
            num_layers=int(fields["num_hidden_layers"]),
            hidden_size=hidden,
            intermediate_size=int(fields["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(fields.get("num_key_value_heads") or heads),
            head_dim=int(fields.get("head_dim") or hidden // heads),
            vocab_size=int(fields["vocab_size"]),
            max_position_embeddings=int(fields.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(fields.get("rms_norm_eps", 1e-5)),
            rope_theta=theta,
            rope_scaling=scaling,
            hidden_act=str(fields.get("hidden_act", "silu")),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )
    except KeyError as exc:
        raise TrainError(f"{path} lacks {exc.args[0]!r}: is it a decoder-only language model?") from None
    except (TypeError, ValueError) as exc:
        raise TrainError(f"{path} has a field of the wrong type: {exc}") from None


def _weight_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (single file or sharded)."""
    from safetensors import safe_open

    index = directory / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_bytes())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise TrainError(f"{index} cannot be read: {exc}") from None
        return {name: directory / file for name, file in weight_map.items()}
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise TrainError(f"{directory} holds no .safetensors weights (the trainer reads only safetensors)")
    located: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            located.update(dict.fromkeys(handle.keys(), file))
    return located


def _find(located: dict[str, Path], exact: str, suffix: str) -> str | None:
    if exact in located:
        return exact
    # Wrapped language models (e.g. `model.language_model.embed_tokens.weight`).
    matches = [name for name in located if name.endswith(suffix) and "vision" not in name]
    return matches[0] if len(matches) == 1 else None


def load_target_matrices(directory: Path, target: TargetConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(embedding [V, H], lm_head [V, H]) as stored; lm_head is the embedding when the target ties them."""
    from safetensors import safe_open

    located = _weight_files(directory)
    embed_name = _find(located, EMBED_NAME, "embed_tokens.weight")
    head_name = _find(located, LM_HEAD_NAME, "lm_head.weight")
    if embed_name is None:
        raise TrainError(f"{directory} has no {EMBED_NAME} tensor")
    if head_name is None and not target.tie_word_embeddings:
        raise TrainError(f"{directory} has no {LM_HEAD_NAME} tensor and its config does not tie word embeddings")

    def read(name: str) -> torch.Tensor:
        with safe_open(str(located[name]), framework="pt") as handle:
            tensor: torch.Tensor = handle.get_tensor(name)
        if tuple(tensor.shape) != (target.vocab_size, target.hidden_size):
            raise TrainError(
                f"{name} has shape {tuple(tensor.shape)}, not (vocab_size, hidden_size) = "
                f"({target.vocab_size}, {target.hidden_size}) as config.json says"
            )
        return tensor

    embed = read(embed_name)
    return embed, embed if head_name is None else read(head_name)


@dataclass
class TeacherRows:
    """The same, computed only at the positions the loss reads: those followed by a loss
    token (j >= 1 with loss_mask[j+1]); one row per such position, in position order."""

    logits: torch.Tensor  # [R, draft_vocab] compute dtype: the distribution is softmax(logits.float())
    lse: torch.Tensor  # [R] float32: logsumexp(logits.float()), so the probabilities are exp(logits - lse)
    argmax: torch.Tensor  # [R] int64: draft id of the largest logit (the first one on ties)
    in_vocab: torch.Tensor  # [B, T] bool: the target's argmax is in the draft vocabulary (False where no row)
    row: torch.Tensor  # [B, T] int64: each position's row (-1 where none)


# Full-vocabulary logits of this many positions at a time: [rows, vocab] is the largest tensor of the teacher.
TEACHER_CHUNK_ROWS = 4096


class Teacher:
    """The target's lm_head, applied to extracted final hidden states.

    Its rows are kept in the order [draft vocabulary | the rest], both ascending: the
    draft vocabulary's logits come out of the product as one contiguous block, and
    whether the target's argmax lies in it is one comparison of two row maxima
    (ties go to the smaller target id, as argmax over the whole vocabulary does).
    """

    def __init__(self, lm_head: torch.Tensor, draft_ids: torch.Tensor, t2d: torch.Tensor) -> None:
        device = lm_head.device
        self.draft_ids = draft_ids.to(device)  # [draft_vocab] target ids, ascending
        self.other_ids = (~t2d.to(device)).nonzero().squeeze(1)  # the target ids outside it, ascending
        self.weight = lm_head.index_select(0, torch.cat([self.draft_ids, self.other_ids]))  # [V, H]

    def draft_logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(draft-vocabulary logits, their logsumexp, their argmax, in_vocab) of hidden states [R, H]."""
        from backends.train import teacher_kernel  # Triton: only where a teacher runs, not for a config's reader

        fused = teacher_kernel.available(hidden.device)
        rows, size = hidden.shape[0], len(self.draft_ids)
        logits = hidden.new_empty(rows, size, dtype=self.weight.dtype)
        lse = hidden.new_empty(rows, dtype=torch.float32)
        argmax = hidden.new_empty(rows, dtype=torch.int64)
        # The fused kernel writes every row's; filling it first cost a launch while the device waited for the
        # host (this runs right after the step's first host sync).
        in_vocab = hidden.new_empty(rows, dtype=torch.bool) if fused else hidden.new_ones(rows, dtype=torch.bool)
        for start in range(0, rows, TEACHER_CHUNK_ROWS):
            end = min(start + TEACHER_CHUNK_ROWS, rows)
            if fused:
                # The draft columns' product straight into the logits kept; one kernel reads both parts once.
                x = hidden[start:end].to(self.weight.dtype)
                torch.mm(x, self.weight[:size].T, out=logits[start:end])
                other = x @ self.weight[size:].T
                stats = (lse[start:end], argmax[start:end], in_vocab[start:end])
                teacher_kernel.row_stats(logits[start:end], other, self.draft_ids, self.other_ids, stats)
                continue
            full = hidden[start:end].to(self.weight.dtype) @ self.weight.T
            draft = full[:, :size]
            logits[start:end] = draft
            lse[start:end] = torch.logsumexp(draft.float(), dim=-1)
            best = draft.argmax(-1)
            argmax[start:end] = best
            if len(self.other_ids):
                top = draft.gather(1, best[:, None]).squeeze(1)
                other = full[:, size:]
                other_best = other.argmax(-1)
                other_top = other.gather(1, other_best[:, None]).squeeze(1)
                tie = (top == other_top) & (self.draft_ids[best] < self.other_ids[other_best])
                in_vocab[start:end] = (top > other_top) | tie
        return logits, lse, argmax, in_vocab

    @torch.no_grad()
    def rows(self, hidden_state: torch.Tensor, loss_mask: torch.Tensor) -> TeacherRows:
        """hidden_state [B, T, H], loss_mask [B, T] bool."""
        batch, seq, width = hidden_state.shape
        needed = torch.zeros_like(loss_mask)
        needed[:, 1:-1] = loss_mask[:, 2:]
        positions = needed.flatten().nonzero().squeeze(1)
        logits, lse, argmax, in_vocab = self.draft_logits(hidden_state.reshape(-1, width).index_select(0, positions))
        row = torch.full((batch * seq,), -1, dtype=torch.int64, device=positions.device)
        row[positions] = torch.arange(len(positions), device=positions.device)
        in_vocab_at = torch.zeros(batch * seq, dtype=torch.bool, device=positions.device)
        in_vocab_at[positions] = in_vocab
        return TeacherRows(logits, lse, argmax, in_vocab_at.view(batch, seq), row.view(batch, seq))
