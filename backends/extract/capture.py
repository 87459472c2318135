"""The target forward pass that produces the hidden states a draft trains on.

`capture_states` runs the target's base model (no lm_head: the trainer applies
it to `hidden_state` itself) over a right-padded batch and returns, per sample,
the final hidden state (`last_hidden_state`, after the final norm) and the aux
layers concatenated in the order given (`forward_states`: hooks on those
layers), left on the device for the pipeline to copy while the next batch
runs. Aux id X is the output of layer X = HF `hidden_states[X + 1]`. The
benchmark (`benchmarks.extract_throughput`) times the pipeline over
`capture_states`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from backends.eagle3_contract import hf_hidden_state_index

if TYPE_CHECKING:
    import torch

DTYPES = ("bfloat16", "float16", "float32")


@dataclass
class Captured:
    """One sample's states: hidden [T, H], aux [T, len(aux_ids) * H], on the CPU or on the GPU that computed them
    (queued on its current stream, maybe not computed yet: copy them on a stream that waits for it)."""

    hidden_state: torch.Tensor
    aux_hidden_states: torch.Tensor


class Capturer(Protocol):
    """A loaded target that turns token sequences into the states a draft trains on."""

    def capture(self, batch: list[list[int]]) -> list[Captured]:
        """Each sequence's states, in `batch`'s order (sequences of any lengths)."""
        ...


@dataclass
class HFCapturer:
    """The transformers backend: the target's base model with `output_hidden_states`."""

    model: Any
    aux_ids: list[int]
    pad_id: int

    def capture(self, batch: list[list[int]]) -> list[Captured]:
        return capture_states(self.model, batch, self.aux_ids, self.pad_id)


def resolve_dtype(name: str, device: str) -> str:
    """'auto' is bf16 on a GPU (as the target is served) and fp32 on the CPU (where bf16 matmuls are slow)."""
    if name != "auto":
        return name
    return "float32" if device == "cpu" else "bfloat16"


def load_target(path: Path, device: str, dtype: str) -> Any:
    """The target as an eval-mode causal LM on `device` (`auto`: its layers spread over the visible GPUs)."""
    import torch
    from transformers import AutoModelForCausalLM

    if device == "auto":
        spread: Any = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), device_map="auto")
        return spread.eval()
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    return model.to(device).eval()


def pad_batch(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [B, max length], right-padded with `pad_id`, on the CPU."""
    import torch

    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    return input_ids, attention_mask


def decoder_layers(model: Any) -> Any:
    """The base model's decoder layers (a ModuleList), or None for an architecture that keeps them elsewhere."""
    import torch

    layers = getattr(model.base_model, "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) else None


def forward_states(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, aux_ids: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(final hidden state [B, T, H], aux layers concatenated [B, T, len(aux_ids) * H]) on the device
    (the last layer's device when the target is spread over GPUs). Online training uses these directly.

    The aux layers' outputs are taken by forward hooks on those layers alone: `output_hidden_states` would keep
    every layer's output until the pass ends (21 GB for a 70B target over 16k tokens); it remains the way for
    an architecture whose layers are not `base_model.layers`.
    """
    import torch

    device = model.device
    layers = decoder_layers(model)
    kept: dict[int, torch.Tensor] = {}

    def keeper(index: int) -> Any:
        def keep(module: Any, args: Any, output: Any) -> None:
            kept[index] = output[0] if isinstance(output, tuple) else output

        return keep

    hooks = [layers[i].register_forward_hook(keeper(i)) for i in aux_ids] if layers is not None else []
    try:
        with torch.inference_mode():
            out = model.base_model(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                output_hidden_states=layers is None,
                use_cache=False,
            )
            if layers is None:
                kept = {i: out.hidden_states[hf_hidden_state_index(i)] for i in aux_ids}
            # With the layers spread over GPUs (--device auto) each layer's output is on its own GPU.
            last = kept[aux_ids[-1]].device
            aux = torch.cat([kept[i].to(last) for i in aux_ids], dim=-1)
    finally:
        for hook in hooks:
            hook.remove()
    return out.last_hidden_state, aux


def capture_states(model: Any, batch: list[list[int]], aux_ids: list[int], pad_id: int) -> list[Captured]:
    """Hidden states for each token sequence of `batch` (any lengths; padded on the right here), as views of the
    padded batch's states where the target left them, not waited for."""
    input_ids, attention_mask = pad_batch(batch, pad_id)
    hidden, aux = forward_states(model, input_ids, attention_mask, aux_ids)
    return [Captured(hidden[row, : len(ids)], aux[row, : len(ids)]) for row, ids in enumerate(batch)]


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the CPU; from a GPU, copied into pinned memory without waiting (the caller synchronises).

    Pinned blocks come from PyTorch's caching host allocator and are reused once a shard is written,
    where a plain `.to("cpu")` would page-fault a fresh pageable buffer for every batch.
    """
    import torch

    if tensor.device.type != "cuda":
        return tensor.to("cpu")
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host
