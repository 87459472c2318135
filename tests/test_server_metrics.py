"""A serve run's metric rows from SGLang's own /metrics (`--enable-metrics`), with its decode lines as the fallback.

Real: SGLang 0.5.23's expositions in tests/sglang_output/metrics_*_0.5.23.txt (captured from the real server on CPU,
see the README there), prometheus_client's parser, the supervisors and their watch; the real server's /metrics read
live is in tests/test_sglang_real_serve.py (one real server for the suite). The serving SGLang of the supervised
runs is tests/sglang_standin.py, whose /metrics is written by prometheus_client with SGLang's names, labels and
buckets (tests/standin_metrics.py).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.protocol import Metric
from backends.runs import watch
from backends.runs.store import RunDir, RunSpec
from backends.sglang import server_metrics
from backends.sglang.server_metrics import ServerMetrics, quantile
from console.actions import Serve, serve_argv
from console.cli.fleet_commands import launched
from console.cli.grammar import GRAMMARS, build_parser
from tests.conftest import CLI, REPO, free_port, wait_for, wait_state
from tests.standin_metrics import ITL_S, TTFT_S, StandinMetrics

OUTPUT = Path(__file__).parent / "sglang_output"
# REAL: the tiny demo target on CPU, ready (SGLang's warmup request done), then after three /generate requests.
READY = (OUTPUT / "metrics_ready_0.5.23.txt").read_text()
AFTER_3 = (OUTPUT / "metrics_after_3_requests_0.5.23.txt").read_text()
GAUGE_LABELS = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'


def exposition(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


def test_sglangs_real_exposition_is_read_into_one_row_of_our_names() -> None:
    reader = ServerMetrics()
    first = reader.row(READY)
    # SGLang's warmup request is the one finished so far: its TTFT lies in (1, 2] s, its whole request in (2, 4].
    assert first == {
        Metric.RUNNING_REQ: 0, Metric.QUEUE_REQ: 0, Metric.GEN_THROUGHPUT: 0, Metric.TOKEN_USAGE: 0,
        Metric.CACHE_HIT_RATE: 0, Metric.TTFT_P50: 1.5, Metric.TTFT_P99: 1.99, Metric.E2E_P50: 3.0,
    }  # fmt: skip
    # No speculative decoding: SGLang reports an accept length of 0, which is no accept length at all.
    assert "sglang:spec_accept_length{" in READY and Metric.ACCEPT_LEN not in first
    then = reader.row(AFTER_3)
    # The percentiles are those of the three requests since: first tokens at (0.6, 0.8], (0.8, 1] and (1, 2] s.
    assert then[Metric.TTFT_P50] == 0.9 and then[Metric.CACHE_HIT_RATE] == 0.8
    assert set(then) <= server_metrics.NAMES


def test_every_series_we_read_is_one_that_the_real_sglang_defines(sglang_python: Path) -> None:
    [collector] = sglang_python.parent.parent.glob(
        "lib/python3*/site-packages/sglang/srt/observability/metrics_collector.py"
    )
    source = collector.read_text()
    for name in [*server_metrics.GAUGES, *server_metrics.HISTOGRAMS]:
        assert f'name="{name}"' in source, f"{name} is not one of SGLang 0.5.23's series"


def test_counts_add_up_over_ranks_ratios_are_averaged_and_a_priority_breakdown_is_not_counted_twice() -> None:
    rank = 'engine_type="unified",model_name="m",dp_rank="{}"'
    text = exposition(
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{{{rank.format(0)}}} 3.0",
        f"sglang:num_running_reqs{{{rank.format(1)}}} 5.0",
        f'sglang:num_running_reqs{{{rank.format(1)},priority="2"}} 5.0',
        f"sglang:spec_accept_length{{{rank.format(0)}}} 3.0",
        f"sglang:spec_accept_length{{{rank.format(1)}}} 4.0",
        f"sglang:gen_throughput{{{rank.format(0)}}} 100.5",
        f"sglang:gen_throughput{{{rank.format(1)}}} 99.5",
    )
    assert ServerMetrics().row(text) == {Metric.RUNNING_REQ: 8, Metric.ACCEPT_LEN: 3.5, Metric.GEN_THROUGHPUT: 200}


def buckets(counts: dict[str, float], name: str = "sglang:inter_token_latency_seconds") -> str:
    return exposition(
        f"# TYPE {name} histogram",
        *(f'{name}_bucket{{engine_type="unified",le="{le}",model_name="m"}} {n}' for le, n in counts.items()),
    )


def test_latency_percentiles_are_those_of_the_requests_since_the_last_scrape() -> None:
    reader = ServerMetrics()
    # 10 inter-token gaps, 5 of them up to 10 ms, 5 more up to 20 ms.
    first = reader.row(buckets({"0.01": 5, "0.02": 10, "+Inf": 10}))
    assert first[Metric.ITL_P50] == 0.01 and first[Metric.ITL_P99] == pytest.approx(0.0198)
    # Then 10 more, all slow (over the last bound): the median since is the last finite bound, not a blend.
    assert reader.row(buckets({"0.01": 5, "0.02": 10, "+Inf": 20}))[Metric.ITL_P50] == 0.02
    # Nothing finished since: no percentile rather than a stale one.
    assert Metric.ITL_P50 not in reader.row(buckets({"0.01": 5, "0.02": 10, "+Inf": 20}))
    # Fewer than before: the server restarted, and its counts are read afresh.
    assert reader.row(buckets({"0.01": 2, "0.02": 2, "+Inf": 2}))[Metric.ITL_P50] == 0.005


def test_quantile_interpolates_within_the_bucket_like_prometheus() -> None:
    assert quantile(0.5, {0.1: 0, 0.2: 4, float("inf"): 4}) == pytest.approx(0.15)
    assert quantile(0.5, {0.1: 0, float("inf"): 0}) is None
    assert quantile(0.25, {1.0: 1, 2.0: 1, float("inf"): 4}) == 1.0  # the rank falls at a bound: no interpolation


SAMPLE = st.sampled_from([*server_metrics.GAUGES, "sglang:gen_throughput", "sglang:token_usage"])
VALUE = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**6), 10**6)
GARBAGE = st.text(alphabet=st.characters(blacklist_characters=":\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"))


@given(st.text())
def test_any_text_is_read_without_raising(text: str) -> None:
    row = ServerMetrics().row(text)
    assert all(isinstance(value, float) for value in row.values())


@given(lines=st.lists(GARBAGE, max_size=20))
def test_lines_that_name_no_sglang_series_give_no_row(lines: list[str]) -> None:
    assert ServerMetrics().row("\n".join(lines)) == {}


@given(gauges=st.dictionaries(SAMPLE, st.floats(0, 1e6)), garbage=st.lists(GARBAGE, max_size=5))
def test_garbage_lines_among_good_ones_change_nothing(gauges: dict[str, float], garbage: list[str]) -> None:
    good = [f"{name}{{{GAUGE_LABELS}}} {value!r}" for name, value in gauges.items()]
    mixed = [line for pair in zip(good, garbage + [""] * len(good), strict=False) for line in pair] + garbage[
        len(good) :
    ]
    assert ServerMetrics().row("\n".join(mixed)) == ServerMetrics().row("\n".join(good))


def test_the_metrics_endpoint_is_beside_the_health_url_when_the_command_turns_it_on() -> None:
    server = ["python3", "-m", "sglang.launch_server", "--model-path", "m", "--port", "8001"]
    url = watch.health_url(RunSpec(kind="serve", name="s", argv=[*server, "--enable-metrics"]))
    assert url == "http://127.0.0.1:8001/health"
    assert server_metrics.metrics_url([*server, "--enable-metrics"], url) == "http://127.0.0.1:8001/metrics"
    assert server_metrics.metrics_url(server, url) is None
    assert server_metrics.metrics_url(["--enable-metrics"], "unix:/x") is None


def serve_command(*args: str, flags: tuple[str, ...] = ()) -> list[str]:
    """The server's command line that `serve T D ARGS [-- FLAGS]` builds, through the CLI's own reading of it."""
    ns = build_parser(GRAMMARS).parse_args(["local", "serve", "T", "D", *args])
    serve = launched(ns, list(flags))
    assert isinstance(serve, Serve)
    return serve_argv(serve)


def test_serve_turns_sglangs_metrics_on_unless_told_not_to() -> None:
    assert serve_command().count("--enable-metrics") == 1
    assert "--enable-metrics" not in serve_command("--no-metrics")
    assert serve_command(flags=("--enable-metrics",)).count("--enable-metrics") == 1  # the user's own is not doubled


def metric_rows(cli: CLI, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in cli("metrics", run_id, "--json").stdout.splitlines()]


def serve_standin(cli: CLI, tmp_path: Path, *flags: str, sglang: tuple[str, ...] = ()) -> str:
    from tests.draft_fixtures import good_draft, write_target

    target, draft = write_target(tmp_path / "target"), good_draft(tmp_path / "draft")
    env = f"PYTHONPATH={REPO / 'tests' / 'fake_sglang'}:{REPO}"
    done = cli(
        "serve", str(target), str(draft), "--port", str(free_port()), "--python", sys.executable, "--env", env,
        *flags, "--", "--decode-lines", "5", *sglang,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.decode().splitlines()[0]
    wait_state(cli, run_id, {"ready"}, timeout=30)
    return run_id


def test_a_served_runs_rows_come_from_its_metrics_endpoint_and_not_twice_from_its_decode_lines(
    cli: CLI, tmp_path: Path, workdir: Path
) -> None:
    run_id = serve_standin(cli, tmp_path)
    # The stand-in prints its five decode lines once /metrics was read, then finishes a request with each.
    rows = wait_for(
        lambda: [r for r in metric_rows(cli, run_id) if Metric.TTFT_P50 in r], timeout=30, what="a latency row"
    )
    assert rows[0][Metric.TTFT_P50] == pytest.approx(0.15) and rows[0][Metric.ITL_P50] == pytest.approx(0.0125)
    assert TTFT_S == 0.15 and ITL_S == 0.012  # the stand-in's: each median lies within its bucket
    everything = metric_rows(cli, run_id)
    # Its last decode line's figures, from /metrics (only /metrics has an accept rate): no row from the lines.
    assert everything[-1][Metric.ACCEPT_LEN] == 3.4 and everything[-1][Metric.GEN_THROUGHPUT] == 440
    assert all(Metric.ACCEPT_RATE in row for row in everything), everything
    assert not [e for e in RunDir(workdir / "runs" / run_id).events() if e["type"] == "metrics_error"]
    cli("kill", run_id, "--grace", "1")


def test_a_server_without_a_metrics_endpoint_is_read_from_its_decode_lines_and_says_so_once(
    cli: CLI, tmp_path: Path, workdir: Path
) -> None:
    run_id = serve_standin(cli, tmp_path, sglang=("--no-metrics-endpoint",))
    rows = wait_for(lambda: len(found := metric_rows(cli, run_id)) == 5 and found, what="five decode rows")
    assert [row[Metric.ACCEPT_LEN] for row in rows] == [2.5, 2.6, 2.7, 2.8, 2.9]
    time.sleep(6)  # another scrape, refused the same way: still said once
    problems = [e for e in RunDir(workdir / "runs" / run_id).events() if e["type"] == "metrics_error"]
    assert len(problems) == 1 and "/metrics answered 404" in problems[0]["error"], problems
    cli("kill", run_id, "--grace", "1")


def test_serve_with_no_metrics_keeps_its_decode_lines_figures(cli: CLI, tmp_path: Path) -> None:
    run_id = serve_standin(cli, tmp_path, "--no-metrics")
    rows = wait_for(lambda: len(found := metric_rows(cli, run_id)) == 5 and found, what="five decode rows")
    assert rows[-1] == {**rows[-1], Metric.ACCEPT_LEN: 2.9, Metric.GEN_THROUGHPUT: 440.0}
    assert not any(Metric.TTFT_P50 in row for row in rows)
    cli("kill", run_id, "--grace", "1")


@pytest.mark.parametrize("missing", ["httpx", "prometheus_client"])
def test_a_host_without_the_http_or_metrics_library_says_once_that_server_metrics_are_off(
    missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if missing == "httpx":
        monkeypatch.setitem(sys.modules, "httpx", None)  # importing it now fails, as on a host without it
        watch.httpx_missing.cache_clear()
        request.addfinalizer(watch.httpx_missing.cache_clear)
    else:
        monkeypatch.setattr(server_metrics, "missing_parser", lambda: "prometheus_client is not installed (...)")
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "m", "--enable-metrics"]
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    watcher = watch.RunWatcher(run, RunSpec(kind="serve", name="s", argv=argv), None)
    watcher.start()
    watcher.stop()
    [problem] = [e for e in run.events() if e["type"] == "metrics_error"]
    assert f"{missing} is not installed" in problem["error"] and "install it beside the agent" in problem["error"]
    # Without httpx the server is ready by its own ready line; without the parser, health is still polled.
    assert (watcher.url is None) == (missing == "httpx") and watcher.metrics is None


def test_the_standins_exposition_reads_as_sglangs_does() -> None:
    metrics = StandinMetrics()
    metrics.decoded(running=2, token_usage=0.25, accept_len=3.2, accept_rate=0.55, gen=512.0)
    row = ServerMetrics().row(metrics.exposition().decode())
    assert row[Metric.ACCEPT_LEN] == 3.2 and row[Metric.RUNNING_REQ] == 2 and row[Metric.TTFT_P50] == 0.15
