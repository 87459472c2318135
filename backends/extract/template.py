"""Chats to token ids, with a loss mask over the assistant's tokens.

The chat is rendered once with the target's chat template and tokenised with
character offsets. Each assistant turn's characters are found by rendering the
template over message prefixes: the turn starts where the rendering of the
messages before it with the generation prompt ends, and ends where the
rendering up to and including it ends (so the end-of-turn token is part of the
turn, since the draft must learn to predict it too). This needs no
`{% generation %}` markers in the template. For templates that rewrite earlier
turns (a prefix rendering that is not a prefix of the whole chat), the turn's
text is searched for instead. Tokens that overlap an assistant span get mask 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Message = dict[str, str]


class TemplateError(Exception):
    """A chat the template cannot render, or whose assistant turns cannot be located."""


@dataclass
class TokenizedChat:
    input_ids: list[int]
    loss_mask: list[int]


class ChatTokenizer:
    """The target's tokenizer with the chat template used for this extraction."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise TemplateError("the target's tokenizer has no fast (Rust) version, which the loss mask needs")
        template = chat_template or getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str) or not template:
            raise TemplateError("the target's tokenizer has no chat template; pass one with --chat-template FILE")
        self.tokenizer = tokenizer
        self.template: str = template

    @property
    def pad_id(self) -> int:
        """The token that pads a batch: the tokenizer's pad token, else its end of sequence, else 0 (padding
        is on the right and masked out, so it only has to be a valid id)."""
        return next(i for i in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, 0) if i is not None)

    def render(self, messages: list[Message], generation_prompt: bool = False) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt, chat_template=self.template
            )
        except Exception as exc:  # jinja raises whatever the template raises
            raise TemplateError(f"chat template error: {exc}") from None
        return str(text)

    def assistant_spans(self, messages: list[Message]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered chat and the character span of each assistant turn, in order."""
        full = self.render(messages)
        spans: list[tuple[int, int]] = []
        cursor = 0
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            span = self._span_by_prefix(messages, index, full, cursor) or _span_by_search(
                full, message["content"], cursor
            )
            if span is None:
                raise TemplateError(f"assistant turn {index + 1} cannot be found in the rendered chat")
            spans.append(span)
            cursor = span[1]
        return full, spans

    def _span_by_prefix(self, messages: list[Message], index: int, full: str, cursor: int) -> tuple[int, int] | None:
        if index == 0:
            return None  # Templates refuse an empty conversation, so there is no "before".
        try:
            before = self.render(messages[:index], generation_prompt=True)
            upto = self.render(messages[: index + 1])
        except TemplateError:
            return None
        if not (upto.startswith(before) and full.startswith(upto)) or not cursor <= len(before) < len(upto):
            return None
        return len(before), len(upto)

    def tokenize(self, chats: list[list[Message]], max_length: int) -> list[TokenizedChat | TemplateError]:
        """Each chat's token ids and loss mask, truncated to `max_length` tokens, or why it cannot be had.

        The chats are encoded in one call, which the Rust tokenizer spreads over the cores (one chat at a
        time runs on one).
        """
        rendered: list[tuple[str, list[tuple[int, int]]] | TemplateError] = []
        for messages in chats:
            try:
                rendered.append(self.assistant_spans(messages))
            except TemplateError as exc:
                rendered.append(exc)
        texts = [r[0] for r in rendered if not isinstance(r, TemplateError)]
        empty: dict[str, list[Any]] = {"input_ids": [], "offset_mapping": []}
        encoded = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True) if texts else empty
        encodings = zip(encoded["input_ids"], encoded["offset_mapping"], strict=True)  # one per text, in order
        results: list[TokenizedChat | TemplateError] = []
        for r in rendered:
            if isinstance(r, TemplateError):
                results.append(r)
                continue
            ids, offsets = next(encodings)
            cut = np.asarray(offsets[:max_length], dtype=np.int64).reshape(-1, 2)
            results.append(TokenizedChat(input_ids=list(ids[:max_length]), loss_mask=span_mask(cut, r[1]).tolist()))
        return results


def span_mask(offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """int8 [tokens]: 1 where a token's characters [a, b) (`offsets` [tokens, 2]) overlap a span [start, end)."""
    mask = np.zeros(len(offsets), dtype=bool)
    for start, end in spans:
        mask |= (offsets[:, 0] < end) & (offsets[:, 1] > start)
    return mask.astype(np.int8)


def _span_by_search(full: str, content: str, cursor: int) -> tuple[int, int] | None:
    needle = content.strip()
    start = full.find(needle, cursor) if needle else -1
    return None if start < 0 else (start, start + len(needle))
