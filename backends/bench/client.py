"""The bench's requests, on the host: streamed completions sent with httpx, `concurrency` at a time, each timed
from its send to its first text (TTFT) and between its text chunks (ITL)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from backends.bench.stream import APIS, BenchError, Outcome, SSEDecoder, parse_chunk, request_body

PROBE_TIMEOUT_S = 10.0
# The longest wait for the next chunk: a server that takes longer is counted as having cut the stream.
READ_TIMEOUT_S = 300.0
ERROR_TEXT = 300  # characters of an error answer kept


async def probe(client: httpx.AsyncClient, base: str) -> str:
    """The served model's name from /v1/models; BenchError when nothing answers there, or not 200."""
    try:
        answer = await client.get(f"{base}/v1/models", timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise BenchError(
            f"nothing answers at {base} ({type(exc).__name__}: {exc or 'no detail'}); is the server up and ready? "
            "`status` shows its state"
        ) from None
    if answer.status_code != 200:
        raise BenchError(
            f"{base}/v1/models answered HTTP {answer.status_code}: the server is not ready to serve; wait until "
            "its state is ready, then bench again"
        )
    try:
        models = answer.json().get("data") or []
        return str(models[0]["id"])
    except (ValueError, AttributeError, LookupError, TypeError):
        return "default"  # SGLang serves whatever model it loaded under any name


async def request(client: httpx.AsyncClient, url: str, body: dict[str, object]) -> Outcome:
    """One streamed request, timed; whatever happens to it is in its Outcome, never raised."""
    outcome = Outcome()
    decoder = SSEDecoder()
    started = time.perf_counter()
    last: float | None = None
    done = False
    try:
        async with client.stream("POST", url, json=body) as answer:
            if answer.status_code != 200:
                text = (await answer.aread()).decode("utf-8", "replace")
                outcome.error = f"HTTP {answer.status_code}: {' '.join(text.split())[:ERROR_TEXT]}"
                return outcome
            async for data in answer.aiter_bytes():
                now = time.perf_counter()
                for payload in decoder.feed(data):
                    chunk = parse_chunk(payload)
                    if chunk.error is not None:
                        outcome.error = f"error chunk: {chunk.error[:ERROR_TEXT]}"
                        return outcome
                    done |= chunk.done
                    if chunk.text:
                        if last is None:
                            outcome.ttft_s = now - started
                        else:
                            outcome.gaps_s.append(now - last)
                        last = now
                        outcome.chunks += 1
                    if chunk.completion_tokens is not None:
                        outcome.completion_tokens = chunk.completion_tokens
                    if chunk.verify_ct is not None:
                        outcome.verify_ct = chunk.verify_ct
    except ValueError as exc:
        outcome.error = f"the server sent something that is not a stream chunk: {exc}"
        return outcome
    except httpx.HTTPError as exc:
        what = f"{type(exc).__name__}: {exc or 'no detail'}"
        if last is None and outcome.chunks == 0 and not decoder.pending:
            outcome.error = f"no answer ({what})"
        else:
            outcome.cut = what
        return outcome
    if not done:
        outcome.cut = "the stream ended before its [DONE]"
    return outcome


async def drive(
    base: str,
    api: str,
    prompts: list[str],
    requests: int,
    concurrency: int,
    max_tokens: int,
    progress: Callable[[list[Outcome]], None],
) -> tuple[list[Outcome], float]:
    """`requests` requests (prompts in turn), `concurrency` at a time; each outcome, and the seconds they took."""
    timeout = httpx.Timeout(PROBE_TIMEOUT_S, read=READ_TIMEOUT_S)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        model = await probe(client, base)
        url = f"{base}{APIS[api]}"
        queue = iter(range(requests))
        outcomes: list[Outcome] = []

        async def worker() -> None:
            for index in queue:  # one iterator shared by the workers: each index is taken once
                prompt = prompts[index % len(prompts)]
                outcomes.append(await request(client, url, request_body(api, model, prompt, max_tokens)))
                progress(outcomes)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
        return outcomes, time.perf_counter() - started
