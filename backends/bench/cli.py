"""`python -m backends.bench (--served-run DIR | --url URL) [--prompts builtin|random|FILE] [--input-len N]
[--requests N] [--concurrency N] [--request-rate R] [--warmup N] [--max-tokens N] [--api chat|completions]
[--seed N] [--out FILE]`: drive a served draft and store what it did as one line of bench.jsonl (the served run's,
else this run's own, else --out). Its figures are bench_serving's (backends/bench/measure.py).

The agent starts it as a run (`bench_spec`), so a bench has a log, can be killed, and goes on when the console's
link drops. Exit 0 when every request streamed to its end, 1 otherwise (the result is stored all the same), 2 for
usage errors.

Acceptance length is SGLang's own per-request count: each request asks for `return_spec_tokens_details` and reads
`spec_verify_ct` (the verification steps) beside `completion_tokens`; the bench's is their sums' ratio (what
SGLang's `spec_accept_length` is per request). Unlike the `/metrics` gauge `sglang:spec_accept_length`, it counts
this bench's requests only (not other traffic's), needs no `--enable-metrics`, and comes with each request.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from backends import PACKAGE_ROOT, serving
from backends.bench.measure import figures
from backends.bench.prompts import BUILTIN, RANDOM, load_prompts, random_prompts
from backends.bench.stream import APIS, BenchError, Outcome, Prompt
from backends.bench.table import figures_table
from backends.fileio import append_jsonl
from backends.masking import mask_argv
from backends.protocol import (
    ENV_RUN_DIR,
    ENV_RUN_ID,
    TERMINAL_STATES,
    BenchResult,
    BenchSettings,
)
from backends.runs.store import BENCH, RunDir, RunSpec, RunStore, StoreError

MODULE = "backends.bench"
PROGRESS_LINES = 10  # about this many progress lines per bench, whatever its size


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return value


def not_negative(text: str) -> int:
    return 0 if text.strip() == "0" else positive(text)


def rate(text: str) -> float | None:
    """Requests a second: a number above 0, or inf (bench_serving's spelling of all at once: None)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of requests a second") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0 (inf: all at once)")
    return None if value == float("inf") else value


# ----- what to send -----


# ----- where -----


def served_url(run: RunDir, spec: RunSpec) -> str:
    """The base URL (scheme, host, port) the serve run serves on, from its health URL; BenchError when it is no
    serve run or names none."""
    if spec.kind != "serve":
        raise BenchError(f"run {run.id} is a {spec.kind} run, not a serve run; bench a serve run, or a URL")
    health = spec.health_url or serving.health_url(spec.argv, spec.env)
    if health is None or "://" not in health:
        raise BenchError(
            f"run {run.id} names no health URL or port to reach its server (launch it with --health-url URL); "
            "bench its URL instead"
        )
    scheme, _, rest = health.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def bench_spec(
    store: RunStore,
    target: str,
    *,
    prompts: str,
    requests: int,
    concurrency: int,
    max_tokens: int,
    api: str,
    name: str | None,
    cwd: str | None,
    input_len: int = 1024,
    request_rate: float | None = None,
    warmup: int = 1,
    seed: int = 1,
) -> tuple[RunSpec, str | None]:
    """The run that benches `target` (a serve run, or a URL), and the serve run it measures; BenchError when the
    bench could not run (the run is no serve run, or has ended), ValueError for a setting out of range."""
    if min(requests, concurrency, max_tokens, input_len) <= 0:
        raise ValueError("--requests, --concurrency, --max-tokens and --input-len need 1 or more")
    if warmup < 0 or (request_rate is not None and not request_rate > 0):
        raise ValueError("--warmup needs 0 or more, --request-rate a number above 0")
    if api not in APIS:
        raise ValueError(f"unknown api {api!r}; use one of {', '.join(APIS)}")
    args = ["--prompts", prompts, "--requests", str(requests), "--concurrency", str(concurrency)]
    args += ["--max-tokens", str(max_tokens), "--api", api, "--input-len", str(input_len)]
    args += ["--request-rate", str(request_rate or "inf"), "--warmup", str(warmup), "--seed", str(seed)]
    served: str | None = None
    if is_url(target):
        args += ["--url", target]
    else:
        run = store.get(target)
        served_url(run, run.spec())
        state = run.state()
        if state in TERMINAL_STATES:
            raise BenchError(f"run {run.id} is {state}: nothing serves there; bench a live serve run")
        served = run.id
        args += ["--served-run", str(run.path)]
    inherited = os.environ.get("PYTHONPATH")  # the child runs in the user's folder, yet must import our package
    spec = RunSpec(
        kind="command",
        argv=[sys.executable, "-m", MODULE, *args],
        name=name or f"bench-{served or 'url'}",
        env={"PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), inherited]))},
        cwd=cwd,
    )
    return spec, served


# ----- what it did -----


def first_error(outcomes: list[Outcome]) -> str | None:
    return next((o.error or f"stream cut: {o.cut}" for o in outcomes if not o.ok), None)


def result_table(result: BenchResult) -> str:
    """The result as a person reads it: what was benched and how, then bench_serving's figures."""
    s = result["settings"]
    where = result["served_run"] or result["url"]
    prompts = f"random {s.get('input_len')} tokens" if s.get("prompts") == RANDOM else s.get("prompts")
    rate = s.get("request_rate")
    lines = [
        f"bench of {where} ({s.get('api')}, {s.get('requests')} requests after {s.get('warmup', 0)} warm-up, "
        f"{'all at once' if rate is None else f'{rate:g}/s'}, {s.get('concurrency')} at most at a time, "
        f"max {s.get('max_tokens')} tokens, prompts {prompts})",
        *figures_table([([result["draft"] or str(where)], result["figures"])]),
    ]
    if result["first_error"]:
        lines.append(f"first error: {result['first_error']}")
    return "\n".join(lines)


# ----- the command -----


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"bench: {message} (see --help)\n")


def parser() -> Parser:
    p = Parser(prog="python -m backends.bench", description=__doc__.split("\n\n")[0] if __doc__ else None)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--served-run", type=Path, metavar="DIR", help="the serve run's folder in the run store")
    where.add_argument("--url", help="the server's base URL, e.g. http://127.0.0.1:30000")
    p.add_argument(
        "--prompts",
        default=BUILTIN,
        help="builtin; random (--input-len token ids each, answers --max-tokens long, through completions); or a "
        ".txt (a prompt per line), .jsonl or ShareGPT .json file",
    )
    p.add_argument("--input-len", type=positive, default=1024, help="tokens per random prompt")
    p.add_argument("--requests", type=positive, default=32, help="timed requests")
    p.add_argument("--concurrency", type=positive, default=4, help="requests in flight at most")
    p.add_argument("--request-rate", type=rate, default=None, help="requests a second, Poisson (default inf)")
    p.add_argument("--warmup", type=not_negative, default=1, help="requests sent first, left out of the figures")
    p.add_argument("--max-tokens", type=positive, default=256)
    p.add_argument("--api", choices=tuple(APIS), default="chat")
    p.add_argument("--seed", type=int, default=1, help="of the random prompts and the arrivals")
    p.add_argument("--out", type=Path, help="the bench.jsonl to append to (default: the served run's)")
    return p


def say(text: str) -> None:
    print(f"bench: {text}", flush=True)


def progress_printer(total: int) -> Callable[[list[Outcome]], None]:
    step = max(1, total // PROGRESS_LINES)

    def show(outcomes: list[Outcome]) -> None:
        done = len(outcomes)
        if done % step == 0 or done == total:
            failed = sum(not o.ok for o in outcomes)
            say(f"{done}/{total} requests done" + (f", {failed} failed" if failed else ""))

    return show


def where_to(ns: argparse.Namespace) -> tuple[str, RunDir | None, Path | None]:
    """The base URL, the serve run measured, and the bench.jsonl the result goes to (None: nowhere)."""
    if ns.url is not None:
        if not is_url(ns.url):
            raise BenchError(f"{ns.url!r} is not a URL: give http://HOST:PORT")
        own = os.environ.get(ENV_RUN_DIR)
        return ns.url.rstrip("/"), None, ns.out or (Path(own) / BENCH if own else None)
    run = RunDir(ns.served_run)
    try:
        spec = run.spec()
    except StoreError as exc:
        raise BenchError(str(exc)) from None
    return served_url(run, spec), run, ns.out or run.file(BENCH)


def api(ns: argparse.Namespace) -> str:
    """Random prompts are token ids, which only the completions endpoint takes."""
    return "completions" if ns.prompts == RANDOM else str(ns.api)


def record(
    ns: argparse.Namespace, url: str, served: RunDir | None, outcomes: list[Outcome], took: float
) -> BenchResult:
    spec = served.spec() if served is not None else None
    draft = serving.served_draft(spec.argv, spec.cwd, spec.env, spec.sglang_python) if spec is not None else None
    settings: BenchSettings = {
        "prompts": ns.prompts,
        "requests": ns.requests,
        "concurrency": ns.concurrency,
        "max_tokens": ns.max_tokens,
        "api": api(ns),
        "request_rate": ns.request_rate,
        "warmup": ns.warmup,
        "seed": ns.seed,
    }
    if ns.prompts == RANDOM:
        settings["input_len"] = ns.input_len
    return {
        "t": round(time.time(), 3),
        "bench_run": os.environ.get(ENV_RUN_ID),
        "served_run": served.id if served is not None else None,
        "url": url,
        "argv": mask_argv(spec.argv) if spec is not None else None,
        "draft": str(draft.draft) if draft is not None else None,
        "settings": settings,
        "figures": figures(outcomes, took),
        "first_error": first_error(outcomes),
    }


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    try:
        from backends.bench.client import Plan, drive  # httpx: needed only here, not by the agent that starts a bench
    except ImportError as exc:
        say(f"cannot send requests: {exc}; install httpx in {sys.executable} (pip install httpx)")
        return 1
    try:
        url, served, out = where_to(ns)
        prompts: list[Prompt]
        if ns.prompts == RANDOM:
            prompts = list(random_prompts(ns.warmup + ns.requests, ns.input_len, ns.seed))
        else:
            prompts = list(load_prompts(ns.prompts))
        plan = Plan(
            ns.requests, ns.concurrency, ns.max_tokens, ns.warmup, ns.request_rate, ns.seed, ns.prompts == RANDOM
        )
        say(
            f"{ns.warmup} warm-up and {ns.requests} timed requests to {url} ({api(ns)}), {ns.concurrency} at most at "
            f"a time, from {len(prompts)} prompts"
        )
        outcomes, took = asyncio.run(drive(url, api(ns), prompts, plan, progress_printer(ns.requests)))
    except BenchError as exc:
        say(str(exc))
        return 1
    result = record(ns, url, served, outcomes, took)
    print(result_table(result), flush=True)
    if out is not None:
        try:
            append_jsonl(out, result)
        except OSError as exc:
            say(f"cannot store the result in {out}: {exc.strerror or exc}")
            return 1
        say(f"stored in {out}")
    failed = len(outcomes) - result["figures"]["ok"]
    if failed:
        say(f"{failed} of {len(outcomes)} requests failed; first: {result['first_error']}")
    return 1 if failed else 0
