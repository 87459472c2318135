"""The bench's requests, on the host: streamed completions sent with httpx, `concurrency` at a time, each timed
from its send to its first text (TTFT) and between its text chunks (ITL)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from backends.bench.stream import APIS, BenchError, Outcome, Prompt, SSEDecoder, parse_chunk, request_body

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


Clock = Callable[[], float]


@dataclass(frozen=True)
class Plan:
    """How a bench sends its requests: `requests` timed ones after `warmup` left out, at most `concurrency` in
    flight, sent `request_rate` a second in a Poisson process (None: all at once), as bench_serving does."""

    requests: int
    concurrency: int
    max_tokens: int
    warmup: int = 1
    request_rate: float | None = None
    seed: int = 1
    ignore_eos: bool = False


async def request(client: httpx.AsyncClient, url: str, body: dict[str, object], clock: Clock) -> Outcome:
    """One streamed request, timed; whatever happens to it is in its Outcome, never raised."""
    outcome = Outcome()
    decoder = SSEDecoder()
    started = clock()
    last: float | None = None
    counted = 0  # the server's running count of completion tokens before the next chunk
    done = False
    try:
        async with client.stream("POST", url, json=body) as answer:
            if answer.status_code != 200:
                text = (await answer.aread()).decode("utf-8", "replace")
                outcome.error = f"HTTP {answer.status_code}: {' '.join(text.split())[:ERROR_TEXT]}"
                return outcome
            async for data in answer.aiter_bytes():
                now = clock()
                for payload in decoder.feed(data):
                    outcome.latency_s = now - started
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
                            tokens = 1 if chunk.completion_tokens is None else chunk.completion_tokens - counted
                            outcome.chunk_tokens.append(tokens)
                        last = now
                        outcome.chunks += 1
                    if chunk.completion_tokens is not None:
                        outcome.completion_tokens = counted = chunk.completion_tokens
                    if chunk.prompt_tokens is not None:
                        outcome.prompt_tokens = chunk.prompt_tokens
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
    prompts: list[Prompt],
    plan: Plan,
    progress: Callable[[list[Outcome]], None],
    clock: Clock = time.perf_counter,
    transport: httpx.AsyncBaseTransport | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> tuple[list[Outcome], float]:
    """The warm-up, then the timed requests (prompts in turn); each timed outcome, and the seconds they took.
    BenchError when every warm-up request failed (nothing to time)."""
    timeout = httpx.Timeout(PROBE_TIMEOUT_S, read=READ_TIMEOUT_S)
    limits = httpx.Limits(max_connections=plan.concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False, transport=transport) as client:
        model = await probe(client, base)
        url = f"{base}{APIS[api]}"
        gate = asyncio.Semaphore(plan.concurrency)

        async def one(index: int, origin: float) -> Outcome:
            body = request_body(api, model, prompts[index % len(prompts)], plan.max_tokens, plan.ignore_eos)
            async with gate:
                sent = clock()
                outcome = await request(client, url, body, clock)
            outcome.start_s = sent - origin
            return outcome

        if plan.warmup:
            warm = await asyncio.gather(*(one(i, 0.0) for i in range(plan.warmup)))
            if not any(o.ok for o in warm):
                failed = next(o.error or f"stream cut: {o.cut}" for o in warm)
                raise BenchError(f"every warm-up request failed (first: {failed}); check the server and the settings")
        arrivals = random.Random(plan.seed)
        outcomes: list[Outcome] = []

        async def timed(index: int, origin: float) -> None:
            outcomes.append(await one(index, origin))
            progress(outcomes)

        started = clock()
        tasks = []
        for index in range(plan.requests):
            if index and plan.request_rate is not None:
                await sleep(arrivals.expovariate(plan.request_rate))
            tasks.append(asyncio.create_task(timed(plan.warmup + index, started)))  # prompts the warm-up did not send
        await asyncio.gather(*tasks)
        return outcomes, clock() - started
