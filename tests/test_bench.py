"""`bench`: a served draft driven from the host through SGLang's OpenAI-compatible API, its figures stored beside
the serve run and shown by `status RUN` and the console.

Real: the CLI, the agent, the run engine, the bench's own process and its HTTP requests (httpx), the console
(Textual's pilot) and SGLang 0.5.23's streams as the real server wrote them on CPU
(tests/sglang_output/bench_*_0.5.23.sse); the real server itself is benched in tests/test_sglang_real_serve.py. The
serving SGLang of the supervised runs is tests/sglang_standin.py, whose streams copy the real ones chunk for chunk; its
acceptance figures (`sglext.spec_tokens_details`) are RECONSTRUCTED from SGLang's source, since speculative decoding
runs on GPUs only.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.bench.client import Plan, drive
from backends.bench.measure import figures, latency_stats
from backends.bench.prompts import load_prompts, random_prompts
from backends.bench.stream import BenchError, Chunk, Outcome, SSEDecoder, parse_chunk
from backends.protocol import RunInfo
from backends.runs.store import RunDir
from console.fleet.hosts import Fleet
from console.link.local import LocalTransport
from console.render import bench_beside, bench_compare, bench_lines
from console.tui.app import ConsoleApp
from console.tui.panels import RunDetail, RunFacts, RunsTable, detail_text
from console.tui.timeline import timeline
from tests.conftest import CLI, free_port, launch, until, wait_state

OUTPUT = Path(__file__).parent / "sglang_output"
REAL = {api: (OUTPUT / f"bench_{api}_0.5.23.sse").read_bytes() for api in ("chat", "completions")}
# What the real server streamed for each (max_tokens 6, temperature 0, the tiny demo target).
REAL_TEXT = {"chat": " serve expect serve expect serve expect", "completions": " expect sum expect Mexico war war"}


def chunks(data: bytes, cuts: list[int] | None = None) -> list[Chunk]:
    decoder = SSEDecoder()
    bounds = [0, *sorted(min(c, len(data)) for c in cuts or []), len(data)]
    return [parse_chunk(p) for a, b in itertools.pairwise(bounds) for p in decoder.feed(data[a:b])]


# ----- SGLang's stream, read -----


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_a_real_stream_gives_its_text_its_token_count_and_its_end(api: str) -> None:
    read = chunks(REAL[api])
    assert "".join(c.text for c in read) == REAL_TEXT[api]
    assert [c.completion_tokens for c in read if c.completion_tokens is not None] == [6]
    assert read[-1].done and not any(c.done for c in read[:-1])
    # No speculative decoding on CPU: the server sends no verify steps, so no acceptance length is made up.
    assert all(c.verify_ct is None and c.error is None for c in read)


@given(cuts=st.lists(st.integers(0, max(map(len, REAL.values()))), max_size=40))
def test_a_real_stream_read_in_any_pieces_gives_the_same_chunks(cuts: list[int]) -> None:
    for data in REAL.values():
        assert chunks(data, cuts) == chunks(data)


TEXT = st.text(st.characters(codec="utf-8"), max_size=12)


@given(
    texts=st.lists(TEXT, min_size=1, max_size=8),
    tokens=st.integers(0, 10**6),
    verify=st.integers(0, 10**5),
    api=st.sampled_from(["chat", "completions"]),
    crlf=st.booleans(),
    cuts=st.lists(st.integers(0, 4000), max_size=10),
)
def test_any_chunk_sglang_writes_is_read_back_whole(
    texts: list[str], tokens: int, verify: int, api: str, crlf: bool, cuts: list[int]
) -> None:
    def choice(text: str) -> dict[str, object]:
        if api == "chat":
            return {"index": 0, "delta": {"reasoning_content": None, "content": text}, "finish_reason": None}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": None}

    events: list[dict[str, object]] = [{"id": "x", "choices": [choice(t)]} for t in texts]
    events.append({"id": "x", "choices": [], "sglext": {"spec_tokens_details": {"spec_verify_ct": verify}}})
    events.append({"id": "x", "choices": [], "usage": {"completion_tokens": tokens}})
    newline = "\r\n" if crlf else "\n"
    data = "".join(f"data: {json.dumps(e)}{newline}{newline}" for e in events) + f"data: [DONE]{newline}{newline}"
    read = chunks(data.encode(), cuts)
    assert [c.text for c in read[: len(texts)]] == texts
    assert read[-3].verify_ct == verify and read[-2].completion_tokens == tokens and read[-1].done


def test_an_error_chunk_is_the_servers_message_and_garbage_is_no_chunk() -> None:
    # The shape of 0.5.23's create_streaming_error_response.
    error = '{"error": {"object": "error", "message": "Generation aborted.", "type": "SERVICE_UNAVAILABLE"}}'
    assert parse_chunk(error).error == "Generation aborted."
    for garbage in ("not json", "[1, 2]", '"text"'):
        with pytest.raises(ValueError):
            parse_chunk(garbage)


def test_a_stream_cut_inside_an_event_is_told_from_one_cut_between_events() -> None:
    decoder = SSEDecoder()
    decoder.feed(REAL["chat"][:100])
    assert decoder.pending
    whole = SSEDecoder()
    whole.feed(REAL["chat"][: REAL["chat"].index(b"\n\n") + 2])
    assert not whole.pending


# ----- figures -----


def test_latency_stats_are_numpys_mean_median_linear_percentiles_and_max_in_milliseconds() -> None:
    assert latency_stats([i / 1000 for i in range(1, 101)]) == {
        "mean": 50.5, "median": 50.5, "p95": 95.05, "p99": 99.01, "max": 100.0
    }  # fmt: skip
    assert latency_stats([0.25]) == {"mean": 250.0, "median": 250.0, "p95": 250.0, "p99": 250.0, "max": 250.0}
    assert latency_stats([]) is None


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=50))
def test_latency_stats_are_ordered_and_within_the_values(values: list[float]) -> None:
    p = latency_stats(values)
    assert p is not None
    low, high = round(min(values) * 1000, 3), round(max(values) * 1000, 3)
    assert low <= p["median"] <= p["p95"] <= p["p99"] <= p["max"] == high and low <= p["mean"] <= high


def test_acceptance_is_all_tokens_over_all_verify_steps_of_the_requests_that_ended_well() -> None:
    outcomes = [
        Outcome(ttft_s=0.1, gaps_s=[0.01, 0.03], chunks=3, completion_tokens=30, verify_ct=10),
        Outcome(ttft_s=0.3, gaps_s=[0.02], chunks=2, completion_tokens=10, verify_ct=2),
        Outcome(error="HTTP 500: boom"),
        Outcome(ttft_s=0.2, chunks=5, completion_tokens=5, verify_ct=5, cut="RemoteProtocolError"),
    ]
    f = figures(outcomes, 2.0)
    assert (f["ok"], f["errors"], f["cut"], f["output_tokens"]) == (2, 1, 1, 40)
    assert f["accept_len"] == round(40 / 12, 3)  # not the mean of 3.0 and 5.0
    assert f["output_tok_s"] == 20.0
    assert f["ttft_ms"] == {"mean": 200.0, "median": 200.0, "p95": 290.0, "p99": 298.0, "max": 300.0}
    # Each request's own: 3.0 and 5.0, spread
    assert f["accept_len_per_request"] == {"min": 3.0, "p5": 3.1, "median": 4.0, "p95": 4.9, "max": 5.0, "mean": 4.0}
    assert figures([Outcome(chunks=4)], 1.0)["accept_len"] is None  # no verify steps: none made up
    assert figures([Outcome(chunks=4)], 1.0)["accept_len_per_request"] is None
    assert figures([Outcome(error="x")], 1.0)["output_tok_s"] is None


# ----- timings known: a stand-in whose clock is the bench's -----


class Clock:
    """The bench's clock, moved only by the stand-in below: every time the bench reads is known exactly."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Answer:
    """One request's answer: its first token `ttft` s after the send, then each (gap s, tokens) chunk, then the
    last lines `tail` s after the last text; `status` other than 200 answers an error at once."""

    ttft: float = 0.05
    chunks: tuple[tuple[float, int], ...] = ()
    tail: float = 0.001
    prompt: int = 100
    verify: int | None = None
    status: int = 200


def timed_standin(clock: Clock, answers: list[Answer], in_flight: list[int] | None = None) -> httpx.MockTransport:
    """SGLang's chat stream, field by field as tests/sglang_standin.py writes it (REAL shape, from the real server's
    streams), with the running `usage` in every chunk that `continuous_usage_stats` asks for (RECONSTRUCTED from
    0.5.23's serving_chat.py: the CPU recordings were made without it) and `sglext.spec_tokens_details`
    (RECONSTRUCTED: GPU only). Each answer is served to the next request in turn, warm-up first; `in_flight` gets
    how many streams are open whenever one opens."""
    queue = iter(answers)
    open_streams = [0]

    def event(choices: list[object], **rest: object) -> bytes:
        head = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": choices}
        return f"data: {json.dumps({**head, **rest})}\n\n".encode()

    def text(content: str | None, finish: str | None = None) -> dict[str, object]:
        delta = {"role": "assistant", "content": content}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "/models/standin"}]})
        answer = next(queue)
        if answer.status != 200:
            return httpx.Response(answer.status, json={"object": "error", "message": "stand-in: internal error"})

        def usage(count: int) -> dict[str, int]:
            return {"prompt_tokens": answer.prompt, "completion_tokens": count, "total_tokens": answer.prompt + count}

        async def stream() -> AsyncIterator[bytes]:
            open_streams[0] += 1
            if in_flight is not None:
                in_flight.append(open_streams[0])
            yield event([text("")], usage=usage(0))
            await asyncio.sleep(0)  # the other requests' turn, as a server's streams interleave
            clock.now += answer.ttft
            count = 1
            yield event([text(" t0")], usage=usage(count))
            for gap, tokens in answer.chunks:
                clock.now += gap
                count += tokens
                yield event([text(" t" * tokens)], usage=usage(count))
            clock.now += answer.tail
            last = event([text(None, "length")], usage=usage(count))
            if answer.verify is not None:
                last += event([], sglext={"spec_tokens_details": {"spec_verify_ct": answer.verify}})
            open_streams[0] -= 1
            yield last + event([], usage=usage(count)) + b"data: [DONE]\n\n"

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream())

    return httpx.MockTransport(handle)


def bench_of(answers: list[Answer], warmup: int = 1) -> tuple[list[Outcome], float]:
    """What the bench records of `answers`, one request at a time (so the shared clock is each one's)."""
    clock = Clock()
    plan = Plan(requests=len(answers) - warmup, concurrency=1, max_tokens=64, warmup=warmup)
    return asyncio.run(
        drive("http://standin", "chat", ["p"], plan, lambda _: None, clock, timed_standin(clock, answers))
    )


def test_a_bench_reads_the_timings_a_server_gave_exactly_and_leaves_the_warm_up_out() -> None:
    warm = Answer(ttft=5.0, chunks=((1.0, 1),), tail=1.0)  # slow: a warm-up counted would show
    first = Answer(ttft=0.040, chunks=((0.010, 1), (0.030, 3), (0.020, 2)), tail=0.004, prompt=120, verify=3)
    second = Answer(ttft=0.100, chunks=(), tail=0.002, prompt=80, verify=1)
    failed = Answer(status=500)
    outcomes, took = bench_of([warm, first, second, failed])
    assert [o.ok for o in outcomes] == [True, True, False] and took == pytest.approx(0.104 + 0.102)
    one = outcomes[0]
    assert one.start_s == 0.0 and one.ttft_s == pytest.approx(0.040)
    assert one.gaps_s == pytest.approx([0.010, 0.030, 0.020])
    assert one.chunk_tokens == [1, 3, 2] and one.latency_s == pytest.approx(0.104)
    assert (one.completion_tokens, one.prompt_tokens, one.verify_ct) == (7, 120, 3)
    assert outcomes[1].start_s == pytest.approx(0.104)
    f = figures(outcomes, took)
    assert (f["ok"], f["errors"], f["input_tokens"], f["output_tokens"]) == (2, 1, 200, 8)
    assert f["request_s"] == round(2 / 0.206, 3) and f["total_tok_s"] == round(208 / 0.206, 3)
    # ITL per token: the 30 ms chunk of 3 tokens is 3 gaps of 10 ms, the 20 ms one of 2 is 2 of 10 ms.
    assert f["itl_ms"] == {"mean": 10.0, "median": 10.0, "p95": 10.0, "p99": 10.0, "max": 10.0}
    assert f["tpot_ms"] is not None and f["tpot_ms"]["max"] == round(1000 * 0.064 / 6, 3)  # 1 token: no TPOT
    assert f["e2e_ms"] == {"mean": 103.0, "median": 103.0, "p95": 103.9, "p99": 103.98, "max": 104.0}
    assert f["accept_len"] == 2.0 and f["accept_len_per_request"] == {
        "min": 1.0, "p5": 1.067, "median": 1.667, "p95": 2.267, "max": 2.333, "mean": 1.667
    }  # fmt: skip


def test_a_bench_whose_warm_up_all_failed_says_so_and_times_nothing() -> None:
    with pytest.raises(BenchError, match=r"every warm-up request failed \(first: HTTP 500"):
        bench_of([Answer(status=500), Answer()])


def test_requests_arrive_as_a_poisson_process_of_the_rate_and_never_more_than_the_cap_at_once() -> None:
    clock, waits, in_flight = Clock(), list[float](), list[int]()

    async def sleep(seconds: float) -> None:  # the arrivals' waits, on the bench's clock: none really slept
        waits.append(seconds)
        clock.now += seconds

    plan = Plan(requests=40, concurrency=3, max_tokens=8, warmup=0, request_rate=50.0, seed=7)
    answers = [Answer(ttft=0.01, chunks=((0.01, 1),) * 3) for _ in range(40)]
    outcomes, _ = asyncio.run(
        drive("http://s", "chat", ["p"], plan, lambda _: None, clock, timed_standin(clock, answers, in_flight), sleep)
    )
    draw = random.Random(7)
    assert waits == [draw.expovariate(50.0) for _ in range(39)]  # exponential gaps of mean 1/rate: Poisson
    assert len(outcomes) == 40 and all(o.ok for o in outcomes)
    assert max(in_flight) == 3  # the cap held, and was reached
    unlimited: list[int] = []
    asyncio.run(
        drive("http://s", "chat", ["p"], Plan(requests=8, concurrency=8, max_tokens=8, warmup=0), lambda _: None,
              clock, timed_standin(clock, answers[:8], unlimited))
    )  # fmt: skip
    assert max(unlimited) == 8  # no rate: all at once


def recorded_trace(speculative: bool) -> list[Answer]:
    """A bench's worth of answers: varied first tokens and gaps, chunks of 1 to 4 tokens when speculative (1 else),
    a request of a single token, one that failed."""
    draw = random.Random(26)
    answers = [Answer()]  # the warm-up
    for index in range(24):
        size = 1 if index == 5 else draw.randint(2, 40)
        chunks = tuple(
            (round(draw.uniform(0.002, 0.03), 6), draw.randint(1, 4) if speculative else 1) for _ in range(size - 1)
        )
        answers.append(
            Answer(ttft=round(draw.uniform(0.02, 0.4), 6), chunks=chunks, tail=round(draw.uniform(0, 0.003), 6),
                   prompt=draw.randint(10, 2000), verify=max(1, size // 3) if speculative else None,
                   status=500 if index == 11 else 200)
        )  # fmt: skip
    return answers


# bench_serving's figure (BenchmarkMetrics) : ours
THROUGHPUTS = {
    "completed": "ok", "total_input": "input_tokens", "total_output": "output_tokens",
    "request_throughput": "request_s", "input_throughput": "input_tok_s", "output_throughput": "output_tok_s",
    "total_throughput": "total_tok_s", "concurrency": "concurrency",
}  # fmt: skip
LATENCIES = {f"{stat}_{theirs}_ms": (ours, stat) for theirs, ours in
             (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("itl", "itl_ms"), ("e2e_latency", "e2e_ms"))
             for stat in ("mean", "median", "p95", "p99")} | {"max_itl_ms": ("itl_ms", "max")}  # fmt: skip


def test_our_figures_are_bench_servings_own_on_the_same_recorded_trace(sglang_python: Path) -> None:
    """Real: SGLang 0.5.23's calculate_metrics (what `python -m sglang.bench_serving` prints), in its tier, on the
    trace our bench recorded of the stand-in above: speculative (several tokens a chunk: bench_serving's
    retokenized ITL, the accept length given) and plain (a token a chunk)."""
    cases, ours = [], []
    for speculative in (True, False):
        outcomes, took = bench_of(recorded_trace(speculative))
        requests = [{"ok": o.ok, "start_s": o.start_s, "ttft_s": o.ttft_s or 0.0, "latency_s": o.latency_s,
                     "gaps_s": o.gaps_s, "chunk_tokens": o.chunk_tokens, "output_len": o.tokens,
                     "prompt_len": o.prompt_tokens or 0} for o in outcomes]  # fmt: skip
        assert sum(not o.ok for o in outcomes) == 1 and any(o.tokens == 1 for o in outcomes)
        cases.append({"duration_s": took, "accept_length": 2.5 if speculative else None, "requests": requests})
        ours.append(figures(outcomes, took))
    done = subprocess.run(
        [str(sglang_python), str(Path(__file__).parent / "bench_serving_tier.py")],
        input=json.dumps(cases), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    worst = 0.0
    for mine, real in zip(ours, theirs, strict=True):
        for name, key in THROUGHPUTS.items():
            assert mine[key] == pytest.approx(real[name], abs=1e-3), name  # type: ignore[literal-required]
        for name, (key, stat) in LATENCIES.items():
            spread = mine[key]  # type: ignore[literal-required]
            worst = max(worst, abs(spread[stat] - real[name]))
            assert spread[stat] == pytest.approx(real[name], abs=1e-3), name  # within a microsecond
    assert worst < 1e-3


def test_a_runs_status_carries_its_latest_bench_results_without_the_served_command_line(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "20261130-000000-000-0000")
    run.path.mkdir()
    padding = "x" * 200  # enough rows to pass the tail a status poll reads: its first line is cut
    rows = [
        json.dumps({"t": i, "argv": ["--api-key", "***"], "figures": {"ok": i}, "pad": padding}) for i in range(900)
    ]
    rows += ["not json", json.dumps({"t": 1000}), json.dumps([1])]  # no figures, not an object: no result
    (run.path / "bench.jsonl").write_text("\n".join(rows) + '\n{"t": 2000, "figures": {"ok"')  # a torn last line
    results = run.bench()
    assert [r["figures"]["ok"] for r in results] == [895, 896, 897, 898, 899]
    assert all("argv" not in r for r in results)


def test_a_bench_line_wraps_between_its_figures_to_the_panels_width() -> None:
    itl = {"mean": 2.2, "median": 2.14, "p95": 2.9, "p99": 3.04, "max": 4}
    result = {
        "t": 0,
        "settings": {"api": "chat", "concurrency": 16, "max_tokens": 512},
        "figures": {
            "ok": 31,
            "errors": 1,
            "cut": 0,
            "accept_len": 2.345,
            "output_tok_s": 1234.5,
            "ttft_ms": {"p50": 41.2, "p90": 50, "p99": 63.9},
            "itl_ms": itl,
        },
    }  # fmt: skip  (TTFT as a result stored before bench_serving's figures: p50 for the median)
    [heading, whole] = bench_lines([result])
    assert heading.startswith("bench")
    # Named as /metrics' series (ttft_p50, itl_p99) and in their unit, seconds; ITL per token as theirs.
    figures = ["accept 2.35", "1234 tok/s", "ttft_p50/p99 0.041/0.064 s", "itl_p50/p99 0.0021/0.0030 s", "31/32 ok"]
    assert whole.split("  ")[2:] == [*figures, "chat c16 m512"]
    wrapped = bench_lines([result], width=32)[1:]
    assert len(wrapped) > 1 and all(len(line) <= 32 for line in wrapped)
    assert " ".join(" ".join(wrapped).split()) == " ".join(whole.split())


def test_two_drafts_benches_sit_side_by_side_under_bench_servings_names() -> None:
    def result(draft: str, tok_s: float, ttft: float) -> dict[str, object]:
        stats = {"mean": ttft, "median": ttft, "p95": ttft, "p99": ttft, "max": ttft}
        figures = {"ok": 32, "errors": 0, "cut": 0, "output_tok_s": tok_s, "accept_len": 3.1, "ttft_ms": stats}
        return {"draft": draft, "figures": figures}

    table = bench_compare(
        [({"id": "a", "name": "srv-1200"}, result("/d/step-1200/", 1500.5, 40.0)),
         ({"id": "b", "name": "srv-\x1b[2J"}, result("/d/step-2400", 1720.25, 38.5))]
    )  # fmt: skip
    assert table[0].split() == ["srv-1200", "srv-\\x1b[2J"]  # a name's control characters shown, not obeyed
    assert table[1].split() == ["step-1200", "step-2400"]
    rows = {name: values.split() for name, values in (re.split(r"(?<=:) ", line, maxsplit=1) for line in table[2:])}
    assert rows["Output token throughput (tok/s):"] == ["1,500.50", "1,720.25"]
    assert rows["Median TTFT (ms):"] == ["40.00", "38.50"] and rows["Mean TPOT (ms):"] == ["n/a", "n/a"]
    assert rows["Successful requests:"] == ["32", "32"] and rows["Accept length:"] == ["3.10", "3.10"]
    assert len({len(line) for line in table[2:]}) == 1  # the columns line up


def test_the_detail_sets_a_serve_runs_latest_bench_beside_other_drafts_latest() -> None:
    def serve(name: str, draft: str, t: float, accept: float) -> dict[str, object]:
        figures = {"ok": 8, "errors": 0, "cut": 0, "accept_len": accept, "output_tok_s": 1000 * accept}
        result = {"t": t, "draft": draft, "settings": {"api": "chat", "concurrency": 4, "max_tokens": 64}}
        return {"id": name, "name": name, "bench": [{**result, "figures": figures}]}

    this = serve("srv-b", "/d/step-2400", 30, 3.1)
    unbenched: dict[str, object] = {"id": "x", "name": "x"}
    others = [serve("srv-a", "/d/step-1200/", 20, 2.4), serve("old", "/d/step-600", 10, 1.9), unbenched]
    [heading, *lines] = bench_beside(this, others, shown=1)
    assert heading.startswith("latest bench beside")
    # This run first, then the most recently benched other; each headed by its checkpoint and its run.
    assert [line.split("  ")[1:3] for line in lines] == [
        ["step-2400 (srv-b)", "accept 3.10"],
        ["step-1200 (srv-a)", "accept 2.40"],
    ]
    assert bench_beside(this, [unbenched], shown=2) == [] == bench_beside(unbenched, others, shown=2)
    narrow = bench_beside(this, others, shown=2, width=40)
    assert len(narrow) > 3 and all(len(line) <= 40 for line in narrow)


def test_a_benched_servers_detail_leads_with_its_bench_and_the_others_beside_it_within_100x30s_panel() -> None:
    """At 100x30 the detail shows about 12 lines of a 44-column panel: the bench, which is what a benched server's
    detail is read for, comes before its startup timeline and its notes (which used to push it out of view)."""

    def serve(name: str, draft: str, t: float, accept: float, benches: int = 1) -> dict[str, object]:
        figures = {"ok": 8, "errors": 0, "cut": 0, "accept_len": accept, "output_tok_s": 1000 * accept}
        result = {"t": t, "draft": draft, "settings": {"api": "chat", "concurrency": 4, "max_tokens": 64}}
        base = {"id": name, "name": name, "kind": "serve", "state": "ready", "phase": "ready", "argv": ["serve"]}
        return {**base, "bench": [{**result, "figures": figures}] * benches}

    events: list[dict[str, object]] = [{"t": 0.0, "type": "launch"}]
    events += [{"t": float(i), "type": "phase", "phase": p} for i, p in enumerate(["init", "load-weights", "ready"], 1)]
    message = "flags not checked: the command is wrapper script: SGLang's flags are not on its command line"
    events.append({"t": 4.0, "type": "flags", "severity": "info", "message": message, "fix": "write the command " * 6})
    this = serve("srv-b", "/d/step-2400", 30, 3.1, benches=3)
    other = cast(RunInfo, serve("srv-a", "/d/step-1200/", 20, 2.4))  # the fields the detail reads of a status row
    facts = RunFacts(line=timeline(events), benched=[other])
    shown = detail_text(this, facts, now=10.0, width=44).plain.splitlines()
    within = "\n".join(shown[:12])

    def first(text: str) -> int:
        return next(i for i, line in enumerate(shown) if text in line)

    # Its latest first, beside the other's (its own history would push the comparison out of view).
    assert shown[2].startswith("latest bench beside") and within.count("accept 3.10") == 1
    assert first("step-2400 (srv-b)") < first("step-1200 (srv-a)") < 12 and within.count("itl_p50/p99") == 2
    assert all(len(line) <= 44 for line in shown)

    # The startup timeline and the parser's note follow the bench, not lost.
    assert first("step-1200 (srv-a)") < first("ready in 3.0 s") < first("flags not checked")
    alone = detail_text(this, RunFacts(line=timeline(events)), now=10.0, width=44).plain
    assert alone.count("accept 3.10") == 3  # no other draft benched: its latest three


# ----- prompts -----


def test_the_builtin_prompts_vary_in_length() -> None:
    sizes = sorted(len(p) for p in load_prompts("builtin"))
    assert len(sizes) >= 10 and sizes[0] < 40 and sizes[-1] > 1500


def test_random_prompts_are_token_ids_of_the_length_asked_the_same_for_a_seed() -> None:
    prompts = random_prompts(5, 300, seed=3)
    assert [len(p) for p in prompts] == [300] * 5 and len({tuple(p) for p in prompts}) == 5
    assert prompts == random_prompts(5, 300, seed=3) != random_prompts(5, 300, seed=4)
    assert all(1000 <= i < 30000 for p in prompts for i in p)


def test_a_sharegpt_file_gives_each_conversations_first_human_turn(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "only the model speaks"}]},
        {"id": "c", "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "2+2?"}]},
    ]
    (tmp_path / "share.json").write_text(json.dumps(rows))
    assert load_prompts("share.json", cwd=str(tmp_path)) == ["hi there", "2+2?"]
    (tmp_path / "share.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:1]))
    assert load_prompts("share.jsonl", cwd=str(tmp_path)) == ["hi there"]
    (tmp_path / "bad.json").write_text('{"not": "a list"}')
    with pytest.raises(BenchError, match="holds no list of conversations"):
        load_prompts(str(tmp_path / "bad.json"))


def test_a_prompt_file_is_a_prompt_per_line_or_jsonl(tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("first prompt\n\n  \nsecond prompt\n")
    assert load_prompts(str(tmp_path / "p.txt")) == ["first prompt", "second prompt"]
    rows = [json.dumps("a\nb"), json.dumps({"prompt": "c"}), json.dumps({"text": "d"})]
    (tmp_path / "p.jsonl").write_text("\n".join(rows) + "\n")
    assert load_prompts("p.jsonl", cwd=str(tmp_path)) == ["a\nb", "c", "d"]


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("empty.txt", "\n  \n", "holds no prompt"),
        ("bad.jsonl", '"ok"\n{"messages": []}\n', "bad.jsonl line 2 is not a prompt"),
        ("missing.txt", None, "cannot read the prompt file"),
        ("latin1.txt", b"caf\xe9", "cannot read the prompt file"),
    ],
)
def test_a_prompt_file_that_gives_no_prompts_is_refused_in_one_line(
    tmp_path: Path, name: str, content: str | bytes | None, said: str
) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(BenchError, match=said) as caught:
        load_prompts(str(path))
    assert "\n" not in str(caught.value)


# ----- the command, end to end -----


def serve_standin(cli: CLI, *flags: str, name: str = "srv") -> tuple[str, int]:
    """A serve run of the stand-in, ready; its id and port."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.sglang_standin", "--port", str(port), *flags]
    argv += ["--speculative-draft-model-path", "/drafts/step-1200"]
    run_id = launch(
        cli, "serve", "--force", "--name", name, "--health-url", f"http://127.0.0.1:{port}/health", "--", *argv
    )
    assert wait_state(cli, run_id, {"ready", "failed"}, timeout=60)["state"] == "ready"
    return run_id, port


def stored(workdir: Path, run_id: str) -> list[dict]:  # type: ignore[type-arg]
    path = workdir / "runs" / run_id / "bench.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_bench_of_a_serve_run_prints_its_figures_stores_them_with_the_run_and_status_shows_them(
    cli: CLI, workdir: Path
) -> None:
    run_id, _port = serve_standin(cli, "--accept-len", "3")
    bench = cli("bench", "srv", "--requests", "6", "--concurrency", "2", "--max-tokens", "12", timeout=90)
    assert bench.returncode == 0, bench.stderr
    table = bench.stdout.decode()
    rows = dict(re.findall(r"^(\S.*?:) +(\S+)$", table, re.MULTILINE))
    assert rows["Successful requests:"] == "6" and rows["Accept length:"] == "3.00"
    assert rows["Total generated tokens:"] == "72" and rows["Total input tokens:"] == "54"  # 9 a prompt
    assert float(rows["Output token throughput (tok/s):"]) > 0 and float(rows["P99 ITL (ms):"]) > 0
    assert rows["Accept length per request, min:"] == rows["Accept length per request, max:"] == "3.00"
    assert "1 warm-up and 6 timed requests" in table
    [result] = stored(workdir, run_id)
    assert result["served_run"] == run_id and result["draft"] == "/drafts/step-1200"
    assert "--accept-len" in result["argv"] and result["bench_run"] and result["bench_run"] != run_id
    assert result["settings"] == {
        "prompts": "builtin",
        "requests": 6,
        "concurrency": 2,
        "max_tokens": 12,
        "api": "chat",
        "request_rate": None,
        "warmup": 1,
        "seed": 1,
    }
    assert result["figures"]["accept_len"] == 3.0 and result["figures"]["output_tokens"] == 72
    assert result["figures"]["ttft_ms"]["median"] > 0 and result["first_error"] is None
    # A second bench (completions, as JSON) goes beside the first; status shows both, newest last.
    again = cli("bench", run_id, "--api", "completions", "--requests", "3", "--max-tokens", "8", "--json", timeout=90)
    assert again.returncode == 0, again.stderr
    shown = json.loads(again.stdout)
    assert shown["bench_run"] != result["bench_run"] and shown["settings"]["api"] == "completions"
    assert [r["bench_run"] for r in stored(workdir, run_id)] == [result["bench_run"], shown["bench_run"]]
    status = cli("status", run_id).stdout.decode()
    lines = status[status.index("\nbench:\n") + 1 :].splitlines()[1:]
    assert len(lines) == 2 and "accept 3.00" in lines[0] and "6/6 ok  chat c2 m12" in lines[0]
    assert "3/3 ok  completions c4 m8" in lines[1]
    # The bench was a run of its own, ended well, with its log.
    info = json.loads(cli("status", result["bench_run"], "--json").stdout)
    assert info["kind"] == "command" and info["state"] == "exited" and info["name"] == f"bench-{run_id}"
    # Two benches side by side: a serve run's latest (the completions one) against the same draft by name.
    compared = cli("bench", "--compare", run_id, "srv")
    assert compared.returncode == 0, compared.stderr
    lines = compared.stdout.decode().splitlines()
    assert lines[0].split() == ["srv", "srv"] and lines[1].split() == ["step-1200", "step-1200"]
    assert [line.split()[-2:] for line in lines if line.startswith("Successful requests:")] == [["3", "3"]]
    alone = cli("bench", "--compare", run_id, result["bench_run"])
    assert alone.returncode == 1 and b"has no bench result yet; bench it first" in alone.stderr
    for usage in ([], ["--compare", run_id, run_id, run_id], [run_id, "--compare", run_id, run_id]):
        wrong = cli("bench", *usage)
        assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr


def test_a_server_that_errs_or_cuts_streams_midway_is_counted_and_the_bench_fails(cli: CLI, workdir: Path) -> None:
    run_id, _port = serve_standin(cli, "--error-every", "3", "--cut-every", "4")
    bench = cli("bench", run_id, "--requests", "12", "--concurrency", "3", "--max-tokens", "10", timeout=90)
    assert bench.returncode == 1
    [result] = stored(workdir, run_id)
    f = result["figures"]
    # Requests 3, 6, 9, 12 answered HTTP 500; 4 and 8 cut half-way (the stand-in counts every request, the warm-up
    # its first, so 12 timed requests are its 2nd to 13th).
    assert (f["ok"], f["errors"], f["cut"]) == (6, 4, 2)
    assert f["output_tokens"] == 60 and result["first_error"]
    assert re.search(r"^Successful requests: +6 \(6 failed\)$", bench.stdout.decode(), re.MULTILINE)
    assert "6 of 12 requests failed" in bench.stdout.decode()


def test_bench_refuses_what_it_cannot_bench_in_one_line(cli: CLI, workdir: Path, tmp_path: Path) -> None:
    job = launch(cli, "command", "--name", "job", "--", sys.executable, "-c", "import time; time.sleep(60)")
    refused = cli("bench", "job")
    assert refused.returncode == 1 and b"is a command run, not a serve run" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert cli("bench", "nosuch").returncode == 1
    for usage in (["--requests", "0"], ["--concurrency", "-2"], ["--max-tokens", "x"]):
        wrong = cli("bench", job, *usage)
        assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
    cli("kill", job)
    wait_state(cli, job, {"killed"})
    # A URL where nothing listens: the bench run fails, saying so; nothing is stored.
    nobody = cli("bench", f"http://127.0.0.1:{free_port()}", "--requests", "2", timeout=60)
    assert nobody.returncode == 1 and b"nothing answers at http://127.0.0.1:" in nobody.stdout
    # An empty prompt file.
    (tmp_path / "empty.txt").write_text("\n")
    run_id, _port = serve_standin(cli, name="srv2")
    empty = cli("bench", run_id, "--prompts", str(tmp_path / "empty.txt"), timeout=60)
    assert empty.returncode == 1 and b"holds no prompt" in empty.stdout
    assert stored(workdir, run_id) == []
    cli("kill", run_id)
    ended = wait_state(cli, run_id, {"killed"})
    late = cli("bench", ended["id"])
    assert late.returncode == 1 and b"is killed: nothing serves there" in late.stderr


async def test_the_console_shows_a_serve_runs_latest_bench_results_in_its_detail(cli: CLI, workdir: Path) -> None:
    run_id, _port = serve_standin(cli, "--accept-len", "2.5")
    for requests in ("2", "3", "4", "5"):
        assert cli("bench", run_id, "--requests", requests, "--max-tokens", "10", timeout=90).returncode == 0
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.query_one(RunsTable)
        await until(pilot, lambda: run_id in [run["id"] for run in table.runs], what="the serve run")
        app.select_run(run_id)
        detail = app.query_one(RunDetail)
        for size in ((160, 48), (100, 30)):
            await pilot.resize_terminal(*size)

            def bench_shown() -> list[str] | None:
                plain = detail.shown.plain if detail.shown is not None else ""
                if "\nbench:\n" not in plain:
                    return None
                lines = plain[plain.index("\nbench:\n") + 1 :].split("\n")[1:]  # below its heading
                lines = list(itertools.takewhile(lambda line: line.startswith("  "), lines))
                return lines if all(len(line) <= detail.content_region.width for line in lines) else None

            lines = await until(pilot, bench_shown, what=f"the bench lines within the detail at {size}")
            shown = "\n".join(lines)
            # The latest three, each with its figures (wrapped between figures to the panel's width).
            assert re.findall(r"(\d+/\d+) ok", shown) == ["3/3", "4/4", "5/5"]
            assert shown.count("accept 2.50") == shown.count("tok/s") == shown.count("ttft_p50/p99 ") == 3
            assert shown.count("itl_p50/p99 ") == 3
        await pilot.press("q")
