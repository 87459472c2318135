"""Rules on the vocabularies: the draft's against the target's, and the `d2t` map from draft to target ids."""

from __future__ import annotations

from collections.abc import Mapping

from backends.doctor.codes import finding
from backends.doctor.rule_context import Context
from backends.protocol import Finding
from backends.safetensors_header import INTEGER_DTYPES
from backends.sglang import facts


def vocab_rules(ctx: Context, canon: Mapping[str, str]) -> list[Finding]:
    assert ctx.geo is not None
    g, files, found = ctx.geo, ctx.files, []
    target_vocab = ctx.target.vocab if ctx.target else None
    if target_vocab is not None and target_vocab != g.vocab:
        found.append(
            finding(
                "vocab-mismatch",
                "error",
                f"draft vocab_size is {g.vocab}, the target's vocabulary has {target_vocab} tokens",
                "vocab_size must be the target's; train the draft for this target (its d2t maps into that vocabulary)",
            )
        )
    embed = files.tensors.get(canon.get("embed_tokens.weight", ""))
    if embed is not None and len(embed.shape) == 2 and embed.shape != (g.vocab, g.hidden):
        found.append(
            finding(
                "vocab-mismatch",
                "error",
                f"embed_tokens.weight is {list(embed.shape)}, config says {g.vocab} x {g.hidden} "
                "(vocab_size x hidden_size)",
                "the draft's embedding must be the target's: fix vocab_size/hidden_size or drop the tensor",
            )
        )
    vocab = target_vocab or g.vocab
    d2t_name = next((n for n in files.tensors if facts.HOT_TOKEN_MARK in n), None)
    draft_vocab = g.draft_vocab
    if d2t_name is None:
        if draft_vocab is not None and draft_vocab < vocab:
            found.append(
                finding(
                    "d2t-missing",
                    "error",
                    f"draft_vocab_size {draft_vocab} < vocab_size {vocab} but the checkpoint has no d2t: SGLang "
                    "would read draft token ids as target ids",
                    "export d2t (and t2d) from the trainer's vocabulary mapping into the checkpoint",
                )
            )
        return found
    meta = files.tensors[d2t_name]
    if draft_vocab is not None and meta.shape != (draft_vocab,):
        found.append(
            finding(
                "d2t-length",
                "error",
                f"{d2t_name} has shape {list(meta.shape)}, draft_vocab_size is {draft_vocab}",
                "rebuild d2t with one entry per draft token (pad the vocabulary mapping to draft_vocab_size)",
            )
        )
        return found
    values = files.read_ints(d2t_name) if meta.dtype in INTEGER_DTYPES else None
    if values is None:
        found.append(
            finding(
                "d2t-range",
                "error",
                f"{d2t_name} is {meta.dtype}, not an integer vector SGLang can use as token offsets",
                "save d2t as int64 offsets (target id = draft id + d2t[draft id])",
            )
        )
        return found
    targets = [i + v for i, v in enumerate(values)]
    outside = [i for i, t in enumerate(targets) if not 0 <= t < vocab]
    if outside:
        found.append(
            finding(
                "d2t-range",
                "error",
                f"{d2t_name} maps {len(outside)} draft ids outside the target vocabulary [0, {vocab}) "
                f"(first: draft id {outside[0]} -> {targets[outside[0]]})",
                "d2t must hold offsets (target id - draft id) into this target's vocabulary; rebuild it",
            )
        )
    elif len(set(targets)) != len(targets):
        found.append(
            finding(
                "d2t-range",
                "error",
                f"{d2t_name} maps {len(targets) - len(set(targets))} draft ids onto target ids already taken",
                "d2t must map draft ids one to one; rebuild it from the sorted token set",
            )
        )
    return found
