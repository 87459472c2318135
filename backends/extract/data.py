"""Reading the chats to extract: JSONL files or the built-in demo corpus.

A line is either `{"messages": [{"role", "content"}, ...]}` or
`{"prompt": ..., "response": ...}` (one user turn, one assistant turn). Lines
that are neither are skipped and counted by reason, with their line numbers, so
that the summary says what was wrong; blank lines are ignored. A dataset with no
usable chat is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from backends.demo_corpus import demo_chats

DEMO = "demo"
# Line numbers kept per skip reason, for the summary.
SHOWN_LINES = 5

Message = dict[str, str]


class DataError(Exception):
    """The data cannot be used; the message says why in one line."""


@dataclass
class Dataset:
    """The usable chats of one source, in file order, and what was skipped."""

    source: str
    chats: list[list[Message]]
    sha256: str
    lines: int = 0
    skipped: dict[str, list[int]] = field(default_factory=dict)

    @property
    def skipped_count(self) -> int:
        return sum(len(lines) for lines in self.skipped.values())

    def skip_summary(self) -> str:
        """'skipped 3 of 120 lines: 2 not JSON (lines 4, 9), 1 with no assistant turn (line 17)', or ''."""
        if not self.skipped:
            return ""
        parts = []
        for reason, lines in sorted(self.skipped.items(), key=lambda item: -len(item[1])):
            shown = ", ".join(str(n) for n in lines[:SHOWN_LINES]) + (", ..." if len(lines) > SHOWN_LINES else "")
            parts.append(f"{len(lines)} {reason} (line{'s' if len(lines) > 1 else ''} {shown})")
        return f"skipped {self.skipped_count} of {self.lines} lines: " + ", ".join(parts)


def parse_chat(obj: object) -> list[Message] | str:
    """The messages of one record, or the reason it is not a chat."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    if "messages" in obj:
        messages = obj["messages"]
        if not isinstance(messages, list) or not messages:
            return "with 'messages' not a non-empty list"
        chat: list[Message] = []
        for message in messages:
            if not isinstance(message, dict):
                return "with a message that is not an object"
            role, content = message.get("role"), message.get("content")
            if not isinstance(role, str) or not role:
                return "with a message without a 'role' string"
            if not isinstance(content, str):
                return "with a message whose 'content' is not a string"
            chat.append({"role": role, "content": content})
    elif "prompt" in obj or "response" in obj:
        prompt, response = obj.get("prompt"), obj.get("response")
        if not isinstance(prompt, str) or not isinstance(response, str):
            return "with 'prompt' or 'response' missing or not a string"
        chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    else:
        return "with neither 'messages' nor 'prompt'/'response'"
    if not any(m["role"] == "assistant" and m["content"].strip() for m in chat):
        return "with no non-empty assistant turn"
    return chat


def _collect(source: str, lines: Iterable[bytes], limit: int | None, salt: bytes = b"") -> Dataset:
    digest = hashlib.sha256(salt)
    data = Dataset(source=source, chats=[], sha256="")
    for number, raw in enumerate(lines, start=1):
        if limit is not None and len(data.chats) >= limit:
            break
        digest.update(raw)
        data.lines = number
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except UnicodeDecodeError:
            parsed: list[Message] | str = "not UTF-8"
        except ValueError:
            parsed = "not JSON"
        else:
            parsed = parse_chat(obj)
        if isinstance(parsed, str):
            data.skipped.setdefault(parsed, []).append(number)
        else:
            data.chats.append(parsed)
    data.sha256 = digest.hexdigest()
    if not data.chats:
        detail = f"; {data.skip_summary()}" if data.skipped else ""
        raise DataError(f"{source} holds no usable chat ({data.lines} lines{detail})")
    return data


def load_dataset(spec: str, limit: int | None = None) -> Dataset:
    """The chats of a JSONL file, or of the demo corpus when `spec` is 'demo'; the first `limit` only if given.

    The hash covers the lines read (all of them without a limit), so it names the data used.
    """
    if spec == DEMO:
        lines = [json.dumps(chat, sort_keys=True).encode() + b"\n" for chat in demo_chats()]
        return _collect(DEMO, lines, limit, salt=b"demo\n")
    path = Path(spec)
    try:
        with open(path, "rb") as fh:
            return _collect(str(path), fh, limit)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
