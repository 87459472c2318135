"""Rules on tensor shapes against config.json: SGLang's loader asserts on them, so a mismatch crashes startup."""

from __future__ import annotations

import re
from collections.abc import Mapping

from backends.doctor.codes import finding
from backends.doctor.draft_config import Geometry
from backends.doctor.rule_context import Context
from backends.protocol import Finding


def _expected_layer_shape(rest: str, layer: int, g: Geometry) -> tuple[int, ...] | None:
    width = 2 * g.hidden if layer == 0 else g.hidden
    q, kv = g.heads * g.head_dim, g.kv_heads * g.head_dim
    return {
        "self_attn.q_proj.weight": (q, width),
        "self_attn.k_proj.weight": (kv, width),
        "self_attn.v_proj.weight": (kv, width),
        "self_attn.o_proj.weight": (g.hidden, q),
        "mlp.gate_proj.weight": (g.intermediate, g.hidden),
        "mlp.up_proj.weight": (g.intermediate, g.hidden),
        "mlp.down_proj.weight": (g.hidden, g.intermediate),
        "input_layernorm.weight": (g.hidden,),
        "hidden_norm.weight": (g.hidden,),
        "post_attention_layernorm.weight": (g.hidden,),
    }.get(rest)


def shape_rules(ctx: Context, canon: Mapping[str, str]) -> list[Finding]:
    assert ctx.geo is not None
    g, tensors, found = ctx.geo, ctx.files.tensors, []
    bad: list[str] = []
    for name, original in canon.items():
        match = re.match(r"^layers\.(\d+)\.(.+)$", name)
        expected = _expected_layer_shape(match.group(2), int(match.group(1)), g) if match else None
        if name in ("norm.weight", "fc.bias"):
            expected = (g.hidden,)
        if expected is not None and tensors[original].shape != expected:
            bad.append(f"{original} is {list(tensors[original].shape)}, config implies {list(expected)}")
    if bad:
        found.append(
            finding(
                "weight-shape",
                "error",
                "shapes disagree with config.json (SGLang's loader asserts and startup crashes): " + "; ".join(bad),
                "fix hidden_size/intermediate_size/num_attention_heads/num_key_value_heads/head_dim in config.json "
                "to match the checkpoint",
            )
        )
    head = tensors.get(canon.get("lm_head.weight", ""))
    if head is not None and len(head.shape) == 2 and "draft_vocab_size" in ctx.view:
        rows = g.draft_vocab if g.draft_vocab is not None else g.vocab
        if head.shape[0] != rows:
            found.append(
                finding(
                    "lm-head-rows",
                    "error",
                    f"lm_head.weight has {head.shape[0]} rows, draft_vocab_size is {rows}",
                    f'set "draft_vocab_size": {head.shape[0]} in config.json (and check d2t has that length)',
                )
            )
        if head.shape[1] != g.hidden:
            found.append(
                finding("weight-shape", "error", f"lm_head.weight is {list(head.shape)}, hidden_size is {g.hidden}")
            )
    return found
