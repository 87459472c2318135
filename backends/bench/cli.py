"""`python -m backends.bench (--served-run DIR | --url URL) [--prompts builtin|FILE] [--requests N]
[--concurrency N] [--max-tokens N] [--api chat|completions] [--out FILE]`: drive a served draft and store what it
did as one line of bench.jsonl (the served run's, else this run's own, else --out).

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
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from backends import PACKAGE_ROOT, serving
from backends.bench.prompts import PROMPTS
from backends.bench.stream import APIS, BenchError, Outcome
from backends.fileio import append_jsonl
from backends.masking import mask_argv
from backends.protocol import (
    ENV_RUN_DIR,
    ENV_RUN_ID,
    TERMINAL_STATES,
    BenchFigures,
    BenchResult,
    BenchSettings,
    Percentiles,
)
from backends.runs.store import BENCH, RunDir, RunSpec, RunStore, StoreError

BUILTIN = "builtin"
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


# ----- what to send -----


def load_prompts(source: str, cwd: str | None = None) -> list[str]:
    """The built-in prompts, or a file's: a .jsonl file holds one JSON string (or object with "prompt" or "text")
    per line; any other file one prompt per line. BenchError when it cannot be read or holds none."""
    if source == BUILTIN:
        return list(PROMPTS)
    path = Path(cwd or ".") / Path(source).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchError(f"cannot read the prompt file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    prompts = (
        [_jsonl_prompt(path, number, line) for number, line in lines]
        if path.suffix == ".jsonl"
        else [line for _, line in lines]
    )
    if not prompts:
        raise BenchError(f"the prompt file {path} holds no prompt; give one per line, or --prompts builtin")
    return prompts


def _jsonl_prompt(path: Path, number: int, line: str) -> str:
    try:
        row = json.loads(line)
    except ValueError:
        row = None
    if isinstance(row, dict):
        row = row.get("prompt", row.get("text"))
    if not isinstance(row, str) or not row.strip():
        raise BenchError(f'{path} line {number} is not a prompt: give a JSON string or {{"prompt": "..."}}')
    return row


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
) -> tuple[RunSpec, str | None]:
    """The run that benches `target` (a serve run, or a URL), and the serve run it measures; BenchError when the
    bench could not run (the run is no serve run, or has ended), ValueError for a setting out of range."""
    if min(requests, concurrency, max_tokens) <= 0:
        raise ValueError("--requests, --concurrency and --max-tokens need 1 or more")
    if api not in APIS:
        raise ValueError(f"unknown api {api!r}; use one of {', '.join(APIS)}")
    args = ["--prompts", prompts, "--requests", str(requests), "--concurrency", str(concurrency)]
    args += ["--max-tokens", str(max_tokens), "--api", api]
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


def percentiles(values: list[float]) -> Percentiles | None:
    """p50, p90, p99 in milliseconds (linear between the nearest ranks, as numpy's default); None for none."""
    if not values:
        return None
    ordered = sorted(values)

    def at(q: float) -> float:
        rank = q * (len(ordered) - 1)
        low = math.floor(rank)
        high = min(low + 1, len(ordered) - 1)
        return round(1000 * (ordered[low] + (ordered[high] - ordered[low]) * (rank - low)), 3)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99)}


def figures(outcomes: list[Outcome], duration_s: float) -> BenchFigures:
    """The bench's figures over the requests that streamed to their end."""
    done = [o for o in outcomes if o.ok]
    tokens = sum(o.tokens for o in done)
    verified = [o for o in done if o.verify_ct and o.completion_tokens is not None]
    steps = sum(o.verify_ct or 0 for o in verified)
    accepted = sum(o.completion_tokens or 0 for o in verified)
    return {
        "ok": len(done),
        "errors": sum(o.error is not None for o in outcomes),
        "cut": sum(o.cut is not None for o in outcomes),
        "output_tokens": tokens,
        "duration_s": round(duration_s, 3),
        "output_tok_s": round(tokens / duration_s, 2) if done and duration_s > 0 else None,
        "accept_len": round(accepted / steps, 3) if steps else None,
        "ttft_ms": percentiles([o.ttft_s for o in done if o.ttft_s is not None]),
        "itl_ms": percentiles([gap for o in done for gap in o.gaps_s]),
    }


def first_error(outcomes: list[Outcome]) -> str | None:
    return next((o.error or f"stream cut: {o.cut}" for o in outcomes if not o.ok), None)


def result_table(result: BenchResult) -> str:
    """The result as a person reads it: settings, then one figure per line."""
    f, s = result["figures"], result["settings"]

    def num(value: float | None, unit: str = "") -> str:
        return "n/a" if value is None else f"{value:g}{unit}"

    def spread(p: Percentiles | None) -> str:
        return "n/a" if p is None else f"p50 {p['p50']:.1f}  p90 {p['p90']:.1f}  p99 {p['p99']:.1f} ms"

    where = result["served_run"] or result["url"]
    lines = [
        f"bench of {where} ({s['api']}, {s['requests']} requests, {s['concurrency']} at a time, "
        f"max {s['max_tokens']} tokens, prompts {s['prompts']})",
        f"  requests      {f['ok']} ok, {f['errors']} errors, {f['cut']} cut",
        f"  accept len    {num(f['accept_len'])}" + ("" if f["accept_len"] is not None else " (the server gave none)"),
        f"  output        {num(f['output_tok_s'], ' tok/s')}  ({f['output_tokens']} tokens in {f['duration_s']:g} s)",
        f"  TTFT          {spread(f['ttft_ms'])}",
        f"  ITL           {spread(f['itl_ms'])}",
    ]
    if result["first_error"]:
        lines.append(f"  first error   {result['first_error']}")
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
    p.add_argument("--prompts", default=BUILTIN, help="builtin, or a .txt (a prompt per line) or .jsonl file")
    p.add_argument("--requests", type=positive, default=32)
    p.add_argument("--concurrency", type=positive, default=4)
    p.add_argument("--max-tokens", type=positive, default=256)
    p.add_argument("--api", choices=tuple(APIS), default="chat")
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
        "api": ns.api,
    }
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
        from backends.bench.client import drive  # httpx: needed only here, not by the agent that starts a bench
    except ImportError as exc:
        say(f"cannot send requests: {exc}; install httpx in {sys.executable} (pip install httpx)")
        return 1
    try:
        url, served, out = where_to(ns)
        prompts = load_prompts(ns.prompts)
        say(f"{ns.requests} requests to {url} ({ns.api}), {ns.concurrency} at a time, from {len(prompts)} prompts")
        outcomes, took = asyncio.run(
            drive(url, ns.api, prompts, ns.requests, ns.concurrency, ns.max_tokens, progress_printer(ns.requests))
        )
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
