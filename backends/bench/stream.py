"""What a bench sends and how it reads SGLang's answer: the request bodies and the server-sent events of a
streamed completion (stdlib only: the agent imports this without httpx).

The stream, as SGLang 0.5.23 writes it (srt/entrypoints/openai/serving_chat.py, serving_completions.py,
sse_utils.py): one `data: {json}` line and a blank line per event; chat chunks carry `choices[0].delta.content`,
completion chunks `choices[0].text`; with `return_spec_tokens_details` a chunk with empty `choices` carries
`sglext.spec_tokens_details` (`spec_verify_ct`, `spec_accept_length`) once the request ends; with
`stream_options.include_usage` a last chunk carries `usage.completion_tokens`, and with
`continuous_usage_stats` every text chunk carries the running count too (so each chunk's tokens are known without a
tokenizer); then `data: [DONE]`. An error
after the stream began is `data: {"error": {"message": ..., "code": ...}}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

APIS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
DONE = "[DONE]"


class BenchError(Exception):
    """A bench that cannot be run; the message says why and what to do."""


Prompt = str | list[int]  # text, or token ids (random prompts of an exact length, sent to /v1/completions)


def request_body(api: str, model: str, prompt: Prompt, max_tokens: int, ignore_eos: bool = False) -> dict[str, Any]:
    """A streamed, greedy request (the target's output, so the work, is then the same for every draft);
    `ignore_eos` makes every answer `max_tokens` long, as bench_serving's random prompts are."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        # the server's own token counts: running in each chunk, and the whole request's in the last
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_spec_tokens_details": True,  # SGLang's own verify steps for this request (0.5.23; older: ignored)
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


class SSEDecoder:
    """Server-sent events from bytes as they arrive: each event's data (its `data:` lines joined), in order; a
    partial line waits for the rest."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        events: list[str] = []
        for raw in lines:
            line = raw.removesuffix(b"\r").decode("utf-8", "replace")
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                self._data.append(line[5:].removeprefix(" "))
            # `event:`, `id:`, comments: nothing a bench needs
        return events

    @property
    def pending(self) -> bool:
        """Whether an event was begun and not ended (a stream cut in the middle of one)."""
        return bool(self._buffer.strip() or self._data)


@dataclass(frozen=True)
class Chunk:
    """One event of a streamed completion, as a bench reads it."""

    text: str = ""
    done: bool = False
    error: str | None = None
    completion_tokens: int | None = None  # the running count so far (continuous usage), or the request's
    prompt_tokens: int | None = None
    verify_ct: int | None = None  # SGLang's verification steps for the request (speculative decoding only)


def parse_chunk(payload: str) -> Chunk:
    """One event's data; ValueError when it is not a chunk of a completion."""
    if payload.strip() == DONE:
        return Chunk(done=True)
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"a JSON {type(obj).__name__}, not a chunk")
    if "error" in obj:
        error = obj["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return Chunk(error=str(message))
    return Chunk(
        text=_text(obj.get("choices")),
        completion_tokens=_usage(obj, "completion_tokens"),
        prompt_tokens=_usage(obj, "prompt_tokens"),
        verify_ct=_verify_ct(obj),
    )


def _text(choices: Any) -> str:
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return text if isinstance(text, str) else ""


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _usage(obj: dict[str, Any], key: str) -> int | None:
    usage = obj.get("usage")
    return _count(usage.get(key)) if isinstance(usage, dict) else None


def _verify_ct(obj: dict[str, Any]) -> int | None:
    ext = obj.get("sglext")
    details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
    if isinstance(details, list):  # one per choice when n > 1; a bench asks for one
        details = details[0] if details else None
    return _count(details.get("spec_verify_ct")) if isinstance(details, dict) else None


@dataclass
class Outcome:
    """One request of a bench: when its tokens came, how many, and how it ended."""

    start_s: float = 0.0  # when it was sent, from the start of the timed part
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)  # between chunks that carried text
    chunk_tokens: list[int] = field(default_factory=list)  # the tokens of the chunk that ends each gap
    latency_s: float = 0.0  # from the send to the last line read (E2E)
    chunks: int = 0  # chunks that carried text
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    verify_ct: int | None = None
    error: str | None = None  # the server's answer was an error, or there was none
    cut: str | None = None  # the stream ended before its [DONE]: how

    @property
    def ok(self) -> bool:
        return self.error is None and self.cut is None

    @property
    def tokens(self) -> int:
        """The server's count; without one, the chunks (one token each unless speculative decoding batched)."""
        return self.completion_tokens if self.completion_tokens is not None else self.chunks
