"""The chat tokenizer's batch: one encode call for many chats gives each chat what it would get alone, a chat
the template refuses keeps its place, and the loss mask marks exactly the tokens that overlap an assistant turn.
Real tokenizer and template (the demo target's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from backends import demo_target
from backends.extract.cli import load_chat_tokenizer
from backends.extract.data import DEMO, load_dataset
from backends.extract.template import TemplateError, TokenizedChat, span_mask


@given(
    tokens=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 30)), max_size=60),
    spans=st.lists(st.tuples(st.integers(0, 200), st.integers(1, 50)), max_size=4),
)
def test_the_mask_marks_exactly_the_tokens_that_overlap_a_span(
    tokens: list[tuple[int, int]], spans: list[tuple[int, int]]
) -> None:
    offsets = np.array([(a, a + width) for a, width in tokens], dtype=np.int64).reshape(-1, 2)
    turns = [(start, start + width) for start, width in spans]
    expected = [int(any(a < end and b > start for start, end in turns)) for a, b in offsets.tolist()]
    assert span_mask(offsets, turns).tolist() == expected


def test_a_batch_gives_each_chat_what_it_gets_alone_and_keeps_refused_chats_in_place(
    target: Path, tmp_path: Path
) -> None:
    refusing = "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
    template = tmp_path / "template.jinja"
    template.write_text(refusing + "{% endfor %}" + demo_target.CHAT_TEMPLATE)
    chat_tokenizer = load_chat_tokenizer(target, template)
    refused = [{"role": "user", "content": "call it"}, {"role": "tool", "content": "3"}]
    demo = load_dataset(DEMO, 9).chats
    chats = [*demo[:5], refused, *demo[5:]]
    batch = chat_tokenizer.tokenize(chats, 48)  # short enough to truncate some
    alone = [chat_tokenizer.tokenize([chat], 48)[0] for chat in chats]
    assert isinstance(batch[5], TemplateError) and "no tools" in str(batch[5]) and isinstance(alone[5], TemplateError)
    kept = [(b, a) for b, a in zip(batch, alone, strict=True) if isinstance(b, TokenizedChat)]
    assert len(kept) == 9
    for b, a in kept:
        assert isinstance(a, TokenizedChat)
        assert b.input_ids == a.input_ids and b.loss_mask == a.loss_mask and len(b.input_ids) <= 48
    assert any(len(b.input_ids) == 48 for b, _ in kept) and all(any(b.loss_mask) for b, _ in kept[:3])
