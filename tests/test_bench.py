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

import itertools
import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.bench.cli import figures, load_prompts, percentiles
from backends.bench.stream import BenchError, Chunk, Outcome, SSEDecoder, parse_chunk
from backends.runs.store import RunDir
from console.fleet.hosts import Fleet
from console.link.local import LocalTransport
from console.render import bench_lines
from console.tui.app import ConsoleApp
from console.tui.panels import RunDetail, RunsTable
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


def test_percentiles_are_numpys_linear_ones_in_milliseconds() -> None:
    assert percentiles([i / 1000 for i in range(1, 101)]) == {"p50": 50.5, "p90": 90.1, "p99": 99.01}
    assert percentiles([0.25]) == {"p50": 250.0, "p90": 250.0, "p99": 250.0}
    assert percentiles([]) is None


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=50))
def test_percentiles_are_ordered_and_within_the_values(values: list[float]) -> None:
    p = percentiles(values)
    assert p is not None
    low, high = round(min(values) * 1000, 3), round(max(values) * 1000, 3)
    assert low <= p["p50"] <= p["p90"] <= p["p99"] <= high


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
    assert f["ttft_ms"] == {"p50": 200.0, "p90": 280.0, "p99": 298.0}
    assert figures([Outcome(chunks=4)], 1.0)["accept_len"] is None  # no verify steps: none made up
    assert figures([Outcome(error="x")], 1.0)["output_tok_s"] is None


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
    result = {
        "t": 0,
        "settings": {"api": "chat", "concurrency": 16, "max_tokens": 512},
        "figures": {"ok": 31, "errors": 1, "cut": 0, "accept_len": 2.345, "output_tok_s": 1234.5,
                    "ttft_ms": {"p50": 41.2, "p90": 50, "p99": 63.9}, "itl_ms": None},
    }  # fmt: skip
    [heading, whole] = bench_lines([result])
    assert heading.startswith("bench")
    figures = ["accept 2.35", "1234 tok/s", "TTFT 41/64 ms", "ITL n/a", "31/32 ok", "chat c16 m512"]
    assert whole.split("  ")[2:] == figures
    wrapped = bench_lines([result], width=30)[1:]
    assert len(wrapped) > 1 and all(len(line) <= 30 for line in wrapped)
    assert " ".join(" ".join(wrapped).split()) == " ".join(whole.split())


# ----- prompts -----


def test_the_builtin_prompts_vary_in_length() -> None:
    sizes = sorted(len(p) for p in load_prompts("builtin"))
    assert len(sizes) >= 10 and sizes[0] < 40 and sizes[-1] > 1500


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
    assert "6 ok, 0 errors, 0 cut" in table and "accept len    3" in table
    assert "output        " in table and "tok/s" in table and "TTFT          p50" in table and "ITL" in table
    [result] = stored(workdir, run_id)
    assert result["served_run"] == run_id and result["draft"] == "/drafts/step-1200"
    assert "--accept-len" in result["argv"] and result["bench_run"] and result["bench_run"] != run_id
    assert result["settings"] == {
        "prompts": "builtin",
        "requests": 6,
        "concurrency": 2,
        "max_tokens": 12,
        "api": "chat",
    }
    assert result["figures"]["accept_len"] == 3.0 and result["figures"]["output_tokens"] == 72
    assert result["figures"]["ttft_ms"]["p50"] > 0 and result["first_error"] is None
    # A second bench (completions, as JSON) goes beside the first; status shows both, newest last.
    again = cli("bench", run_id, "--api", "completions", "--requests", "3", "--max-tokens", "8", "--json", timeout=90)
    assert again.returncode == 0, again.stderr
    shown = json.loads(again.stdout)
    assert shown["bench_run"] != result["bench_run"] and shown["settings"]["api"] == "completions"
    assert [r["bench_run"] for r in stored(workdir, run_id)] == [result["bench_run"], shown["bench_run"]]
    status = cli("status", run_id).stdout.decode()
    lines = status[status.index("bench (") :].splitlines()[1:]
    assert len(lines) == 2 and "accept 3.00" in lines[0] and "6/6 ok  chat c2 m12" in lines[0]
    assert "3/3 ok  completions c4 m8" in lines[1]
    # The bench was a run of its own, ended well, with its log.
    info = json.loads(cli("status", result["bench_run"], "--json").stdout)
    assert info["kind"] == "command" and info["state"] == "exited" and info["name"] == f"bench-{run_id}"


def test_a_server_that_errs_or_cuts_streams_midway_is_counted_and_the_bench_fails(cli: CLI, workdir: Path) -> None:
    run_id, _port = serve_standin(cli, "--error-every", "3", "--cut-every", "4")
    bench = cli("bench", run_id, "--requests", "12", "--concurrency", "3", "--max-tokens", "10", timeout=90)
    assert bench.returncode == 1
    [result] = stored(workdir, run_id)
    f = result["figures"]
    # Requests 3, 6, 9, 12 answered HTTP 500; 4 and 8 cut half-way (the stand-in counts every request).
    assert (f["ok"], f["errors"], f["cut"]) == (6, 4, 2)
    assert f["output_tokens"] == 60 and result["first_error"]
    assert "6 ok, 4 errors, 2 cut" in bench.stdout.decode()
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
    async with app.run_test(size=(160, 50)) as pilot:
        table = app.query_one(RunsTable)
        await until(pilot, lambda: run_id in [run["id"] for run in table.runs], what="the serve run")
        app.select_run(run_id)
        detail = app.query_one(RunDetail)
        text = await until(
            pilot, lambda: detail.shown is not None and "bench (TTFT" in detail.shown.plain and detail.shown
        )
        shown = text.plain[text.plain.index("bench (TTFT") :].split("\n", 1)[1]  # below its heading
        # The latest three, each with its figures (wrapped between figures to the panel's width).
        assert re.findall(r"(\d+/\d+) ok", shown) == ["3/3", "4/4", "5/5"]
        assert shown.count("accept 2.50") == shown.count("tok/s") == shown.count("TTFT ") == 3
        await pilot.press("q")
