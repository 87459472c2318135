"""The command line's grammar: the global options, each command's words (`Grammar`), and how a command line is
cut before argparse reads it (the run's own command after `--`, a stage's own arguments).

What each command does is `console.cli.commands`'s; it ties each grammar here to its handler, once.
"""

from __future__ import annotations

import argparse
import importlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, NoReturn, cast

import backends
from backends.protocol import MIN_INTERVAL_S, RUN_KINDS, SIGNAL_NAMES, parse_source
from console.cli import config
from console.cli.config import UsageError
from console.cli.width import columns

# The global options that take a value: the word after each is not HOST.
VALUED_OPTIONS = ("--workdir", "--remote-python", "--timeout", "--config")


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")

    def _get_formatter(self) -> argparse.HelpFormatter:
        """argparse's own, at the width it would find: argparse asks shutil, whose import (bz2 and lzma with it) was
        a tenth of a quick `status`'s imports, for each argument it adds (`width.columns` reads the same)."""
        return self.formatter_class(prog=self.prog, width=columns() - 2)  # type: ignore[call-arg]


def gpu_list(text: str) -> list[int]:
    try:
        gpus = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU list like 0,1,3") from None
    if any(g < 0 for g in gpus):
        raise argparse.ArgumentTypeError("GPU indices cannot be negative")
    return gpus


def env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def seconds(text: str) -> float:
    """A time in seconds, 0 or more: not nan, not inf."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    if value < 0:
        raise argparse.ArgumentTypeError("seconds cannot be negative")
    return value


def answer_time(text: str) -> float:
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("a host needs more than 0 seconds to answer")
    return value


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("give 1 or more")
    return value


def request_rate(text: str) -> float | None:
    """Above 0, or inf (bench_serving's all at once: None)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of requests a second") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("give more than 0 requests a second, or inf")
    return None if math.isinf(value) else value


def stall_window(text: str) -> float:
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("a stall window is more than 0 seconds")
    return value


def interval(text: str) -> float:
    value = seconds(text)
    if value < MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"give at least {MIN_INTERVAL_S} s: a shorter interval only spins the host")
    return value


def metrics_source(text: str) -> str:
    try:
        return parse_source(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def as_flag(text: str) -> str:
    """'disable-cuda-graph' and '--disable-cuda-graph' both name the flag."""
    return text if text.startswith("-") else f"--{text}"


class RunArgument(argparse._StoreAction):
    """An argument that names a run of the host: shell completion offers the host's run ids and names
    (`console.cli.completion`)."""


def run_argument(
    p: Parser,
    *,
    dest: str = "run",
    metavar: str = "RUN",
    nargs: str | None = None,
    help: str = "run id, unique id prefix, or name",
) -> None:
    p.add_argument(dest, action=RunArgument, nargs=nargs, metavar=metavar, help=help)


# What may follow a command's options: nothing; the run's own command line after '--' ("argv"); or every word
# ("rest": a stage's own arguments, which argparse never sees).
Tail = Literal["none", "argv", "rest"]


@dataclass(frozen=True)
class Grammar:
    """One command's words: its name, its line in `--help`, and its arguments and options."""

    name: str
    help: str
    arguments: Callable[[Parser], None]
    description: str | None = None
    tail: Tail = "none"
    completed: Callable[[Parser], None] | None = None  # what only completion needs of the grammar besides

    def check_tail(self, tail: list[str]) -> None:
        if tail and self.tail == "none":
            raise UsageError(f"'--' and a command line only go with 'launch', not {self.name!r}")


def command(
    name: str, help: str, *, description: str | None = None, tail: Tail = "none"
) -> Callable[[Callable[[Parser], None]], Grammar]:
    """The grammar of the command `name`, whose arguments the decorated function adds to its parser."""

    def grammar(arguments: Callable[[Parser], None]) -> Grammar:
        return Grammar(name, help, arguments, description, tail)

    return grammar


ENDED_SHOWN = 20  # the ended runs `status` shows besides the live ones, the newest ended first


class AllPagesNothing(argparse.Action):
    """`status --all` pages nothing: --all beside a --page other than 1 is refused, in either order."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        every = self.dest == "all" or getattr(namespace, "all", False)
        page = cast(object, values) if self.dest == "page" else getattr(namespace, "page", 1)  # `positive`: an int
        if every and page != 1:
            parser.error("--all lists every run on one page; leave out --page")
        setattr(namespace, self.dest, True if self.dest == "all" else values)


@command(
    "status",
    "runs and GPUs; with RUN, that run whole",
    description="The live runs, the most recently ended ones and the GPUs; --all or --page for the older ended runs.",
)
def status(p: Parser) -> None:
    run_argument(p, nargs="?", help="one run, every field whole (the runs table cuts large ones)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--all", action=AllPagesNothing, nargs=0, default=False, help="every run, however many ended")
    shown.add_argument(
        "--limit",
        type=positive,
        default=ENDED_SHOWN,
        metavar="N",
        help=f"ended runs shown, the newest ended first (default {ENDED_SHOWN}); live runs are always shown",
    )
    p.add_argument(
        "--page",
        type=positive,
        default=1,
        action=AllPagesNothing,
        metavar="P",
        help="page P of the ended runs: 2 is the next N",
    )


@command("launch", "start a run: launch KIND [options] -- ARGV...", tail="argv")
def launch(p: Parser) -> None:
    p.add_argument("kind", choices=RUN_KINDS, help="what the run is: the console charts and checks each kind its way")
    p.add_argument("--name", help="a name to find the run by")
    p.add_argument("--gpus", type=gpu_list, default=[], help="GPUs for CUDA_VISIBLE_DEVICES, e.g. 0,1")
    p.add_argument("--health-url", help="URL polled for health (any command; default: a serve command's own)")
    p.add_argument(
        "--metrics-url", help="the server's Prometheus metrics URL (any command; default: a serve command's own)"
    )
    sglang_python_option(p)
    p.add_argument("--stall-after", type=stall_window, help="seconds of silence before the run counts as stalled")
    p.add_argument("--env", type=env_pair, action="append", default=[], help="NAME=VALUE for the run (repeatable)")
    p.add_argument("--cwd", help="working directory of the run (default: the current one)")
    p.add_argument(
        "--metrics-from",
        type=metrics_source,
        metavar="SOURCE",
        help="where a train run's metrics come from: jsonl, specforge, speculators, eagle "
        "or tensorboard:DIR (DIR relative to the run's --cwd)",
    )
    p.add_argument("--force", action="store_true", help="launch even when doctor finds errors in the draft")
    p.add_argument("--json", action="store_true", help="the launch's reply as JSON (run id, state, checks)")
    job = p.add_argument_group("a node of a multi-node job (the command meets the other nodes its own way)")
    job.add_argument("--job", metavar="NAME", help="the job's id, the same on every node's launch")
    job.add_argument("--node-rank", type=int, metavar="R", help="this node's rank, 0 to NNODES-1")
    job.add_argument("--nnodes", type=positive, metavar="N", help="how many nodes the job has")


def sglang_python_option(p: Parser) -> None:
    p.add_argument(
        "--sglang-python",
        metavar="PATH",
        help="a serve command's host Python with the SGLang that serves, when the command does not show it (a "
        "wrapper script, a container): its parser, version and loader check the launch",
    )


@command("watch", "print every run's changes of state as they happen, until Ctrl-C")
def watch(p: Parser) -> None:
    p.add_argument("--interval", type=interval, default=2.0, help="seconds between looks (default 2)")
    p.add_argument(
        "--json", action="store_true", help="one JSON object per change: t, from, to, and the run as status gives it"
    )


@command("stacks", "every process's stack of a run: the latest dump, or a fresh one with --now")
def stacks(p: Parser) -> None:
    run_argument(p)
    p.add_argument("--now", action="store_true", help="dump the live processes now (py-spy on the host)")


@command("kill", "stop a run: SIGTERM, grace period, then SIGKILL")
def kill(p: Parser) -> None:
    run_argument(p)
    p.add_argument("--signal", choices=SIGNAL_NAMES, default="TERM", help="the first signal (default TERM)")
    p.add_argument("--grace", type=seconds, default=10.0, help="seconds before SIGKILL (default 10)")
    p.add_argument("--json", action="store_true", help="what was signalled and how it ended, as JSON")


@command("relaunch", "start a copy of a run with flags changed (stops the old one)")
def relaunch(p: Parser) -> None:
    run_argument(p)
    p.add_argument(
        "--set",
        dest="sets",
        type=as_flag,
        action="append",
        default=[],
        metavar="FLAG[=VALUE]",
        help="add or change a flag of the run's command line (repeatable), e.g. --set --disable-cuda-graph",
    )
    p.add_argument(
        "--unset",
        dest="unsets",
        type=as_flag,
        action="append",
        default=[],
        metavar="FLAG",
        help="remove a flag and its value (repeatable)",
    )
    p.add_argument("--grace", type=seconds, default=10.0, help="seconds the old run gets before SIGKILL (default 10)")
    p.add_argument("--force", action="store_true", help="relaunch even when doctor finds errors in the draft")
    p.add_argument("--dry-run", action="store_true", help="show the new command line and its checks; stop nothing")
    p.add_argument("--json", action="store_true", help="the new run (or the preview) as JSON")


@command("free-gpus", "kill your processes holding GPU memory")
def free_gpus(p: Parser) -> None:
    p.add_argument("--gpus", type=gpu_list, help="GPU indices (default: all)")
    p.add_argument("--dry-run", action="store_true", help="show the plan only")
    p.add_argument("--yes", action="store_true", help="do it without asking")
    p.add_argument("--timeout", type=seconds, default=15.0, help="seconds to wait for memory to be released")
    p.add_argument("--json", action="store_true", help="the plan and what was done, as JSON")


@command("logs", "a run's output")
def logs(p: Parser) -> None:
    run_argument(p)
    p.add_argument("--tail", type=int, help="only the last N lines")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    p.add_argument(
        "--raw",
        action="store_true",
        help="to a terminal too, the bytes as the run wrote them, escape sequences included (a pipe or a file "
        "always gets them so; a terminal otherwise sees the run's control characters written out, as \\x1b)",
    )


@command("metrics", "a run's metric rows")
def metrics(p: Parser) -> None:
    run_argument(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="JSON Lines: each row one JSON object a line, as the run wrote it (timestamps in full, never 1.8e+09); "
        "with --follow the same objects, each as it arrives",
    )
    p.add_argument("--tail", type=int, help="only the last N rows")
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing rows until the run ends (exit 0 when it exited, 1 otherwise); a table, or with --json "
        "or --csv the same rows as without --follow",
    )
    p.add_argument("--wide", action="store_true", help="with --follow: every column, per-position ones included")
    p.add_argument(
        "--csv",
        action="store_true",
        help="CSV: a header, then every row, one column per metric; with --follow the header is written once, from "
        "the first rows to arrive, and a column first seen later is left out and said once on stderr",
    )


@command("export", "write a run's metrics to files on this machine: export RUN --tensorboard DIR")
def export(p: Parser) -> None:
    run_argument(p)
    p.add_argument(
        "--tensorboard",
        metavar="DIR",
        type=Path,
        required=True,
        help="the folder for a TensorBoard event file, one scalar tag per metric (SpecForge's tags where it has them)",
    )


@command("doctor", "check a draft against its target, data and SGLang, from files alone")
def doctor(p: Parser) -> None:
    p.add_argument("draft", metavar="DRAFT", help="the draft folder (config.json + weights)")
    p.add_argument("--target", help="the target model folder")
    p.add_argument("--data", help="the extraction folder the draft was trained on")
    p.add_argument("--sglang-version", help="the SGLang release that will serve (default: the host's)")
    p.add_argument("--context-length", type=int, help="the --context-length the server will get")
    p.add_argument("--dry-load", action="store_true", help="also feed the draft to the host SGLang's own loader")
    p.add_argument(
        "--sglang-python",
        metavar="PATH",
        help="the host's Python that serves SGLang: its version and its loader (default: the agent's)",
    )
    p.add_argument("--json", action="store_true", help="the findings as JSON")


@command("convert", "convert a speculators or original-EAGLE draft to the SGLang layout")
def convert(p: Parser) -> None:
    p.add_argument("src", metavar="SRC", help="the draft folder to convert, on the host")
    p.add_argument("dst", metavar="DST", help="the folder to write the converted draft to")
    p.add_argument("--to", choices=("sglang",), default="sglang", help="the layout to write (default sglang)")
    p.add_argument("--json", action="store_true", help="doctor's findings on the result, as JSON")


@command(
    "serve",
    "serve a target with its EAGLE-3 draft: serve TARGET DRAFT [options] [-- SGLANG FLAGS...]",
    description="Shorthand for `launch serve -- PYTHON -m sglang.launch_server --model-path TARGET "
    "--speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT --port PORT [--tp-size #GPUS] "
    "--enable-metrics FLAGS...` (its /metrics charted; --no-metrics leaves it out); SGLang's parser and doctor check "
    "it first.",
    tail="argv",
)
def serve(p: Parser) -> None:
    p.add_argument("target", metavar="TARGET", help="the target model's folder (or hub name) on the host")
    p.add_argument("draft", metavar="DRAFT", help="the draft's folder on the host")
    p.add_argument("--name", help="a name to find the run by (default: serve)")
    p.add_argument("--gpus", type=gpu_list, default=[], help="GPUs for CUDA_VISIBLE_DEVICES; --tp-size follows them")
    p.add_argument("--port", type=int, help="the server's port (default: SGLang's own)")
    p.add_argument("--python", default="python3", help="the host interpreter that has SGLang (default python3)")
    sglang_python_option(p)
    p.add_argument("--env", type=env_pair, action="append", default=[], help="NAME=VALUE for the run (repeatable)")
    p.add_argument("--stall-after", type=stall_window, help="seconds of idle silence that make the launch stalled (30)")
    p.add_argument("--force", action="store_true", help="launch even when SGLang's parser or doctor refuses it")
    p.add_argument("--follow", action="store_true", help="print the startup phases until the server is ready")
    job_options(p, "SGLang's --dist-init-addr")
    p.add_argument(
        "--no-metrics",
        action="store_true",
        help="leave out --enable-metrics: no TTFT/ITL percentiles; accept length and throughput then come from "
        "the server's decode log lines",
    )


@command(
    "bench",
    "drive a served draft from the host: bench RUN|URL [--requests N] [--concurrency N] [--request-rate R], or "
    "bench --compare RUN RUN",
    description="Streams completions through the server's OpenAI-compatible API from the host (a run of its own: "
    "`logs`, `kill`, and it goes on when the link drops), then prints SGLang bench_serving's figures with its "
    "definitions (request, input, output and total throughput; TTFT, TPOT, ITL per token and E2E latency: mean, "
    "median, p95, p99, max) and SGLang's acceptance length, over all and per request; each result is stored with "
    "the serve run (bench.jsonl), shown by `status RUN` and the console. --compare puts two serve runs' latest "
    "benches side by side.",
)
def bench(p: Parser) -> None:
    run_argument(
        p, dest="target", nargs="?", metavar="RUN|URL", help="a serve run (id, prefix or name), or http://HOST:PORT"
    )
    p.add_argument("--compare", nargs=2, metavar="RUN", action=RunArgument, help="two serve runs' latest benches")
    p.add_argument(
        "--prompts",
        default="builtin",
        help="builtin; random (--input-len random token ids each, answers exactly --max-tokens long); or a file on "
        "the host: a prompt per line, .jsonl, or ShareGPT .json",
    )
    p.add_argument("--input-len", type=positive, default=1024, help="tokens per random prompt (default 1024)")
    p.add_argument("--requests", type=positive, default=32, help="timed requests (default 32)")
    p.add_argument("--warmup", type=int, default=1, help="requests sent first and left out of the figures (default 1)")
    p.add_argument("--concurrency", type=positive, default=4, help="requests in flight at most (default 4)")
    p.add_argument(
        "--request-rate", type=request_rate, default=None, help="requests a second, Poisson arrivals (default inf)"
    )
    p.add_argument("--seed", type=int, default=1, help="of the random prompts and the arrivals (default 1)")
    p.add_argument("--max-tokens", type=positive, default=256, help="tokens per answer at most (default 256)")
    p.add_argument("--api", choices=("chat", "completions"), default="chat", help="the endpoint (default chat)")
    p.add_argument("--name", help="a name to find the bench's run by (default: bench-RUN)")
    p.add_argument("--json", action="store_true", help="print the result object instead of the table")


@command(
    "hosts",
    "(given without HOST) the hosts it knows: config.toml's, ~/.ssh/config's, the groups; hosts -h says more",
    description="The hosts the console knows, each with where it is and what it sets: config.toml's [hosts] "
    "first, then the Host entries of ~/.ssh/config (and the files it Includes), then config.toml's [groups]. "
    "Given where HOST goes: eagle3-console hosts [--json].",
)
def listing(p: Parser) -> None:
    p.add_argument("--json", action="store_true", help="a list of hosts: name, address, source, settings, description")


def listing_parser() -> Parser:
    """`eagle3-console hosts`' own words (it stands where HOST does, so it is no command of a host)."""
    parser = Parser(prog=f"eagle3-console {listing.name}", description=listing.description)
    listing.arguments(parser)
    return parser


# Our stages and the modules that hold their command lines (importable without torch); imported only for a
# stage's own words, so that other commands start faster.
STAGE_ARGS = {"extract": "backends.extract.args", "train": "backends.train.args"}


def stage_args(name: str) -> ModuleType:
    return importlib.import_module(STAGE_ARGS[name])


def job_options(p: Parser | argparse._ArgumentGroup, engine: str) -> None:
    """A multi-node job's options: one node per host of HOST (a,b or a group), meeting at the first."""
    p.add_argument(
        "--nodes",
        type=positive,
        help=f"a job over this many hosts (HOST as a,b or a group): a node per host, {engine} meeting at the first",
    )
    p.add_argument(
        "--rdzv-host",
        metavar="ADDR",
        help="with --nodes: the first host's address as the others reach it (default: the one the console used)",
    )


def run_options(p: Parser | argparse._ArgumentGroup) -> None:
    """What a stage's run gets besides the stage's own arguments."""
    p.add_argument("--name", help="a name to find the run by (default: the stage's)")
    p.add_argument("--gpus", type=gpu_list, default=[], help="GPUs for CUDA_VISIBLE_DEVICES, e.g. 0,1")
    p.add_argument("--nproc", "--nproc-per-node", type=positive, help="processes under torchrun (one per GPU)")
    job_options(p, "torchrun")
    p.add_argument("--env", type=env_pair, action="append", default=[], help="NAME=VALUE for the run (repeatable)")
    p.add_argument("--cwd", help="working directory of the run on the host (default: the current one)")
    p.add_argument("--python", metavar="PATH", help="the host's Python with torch to run it (default: the agent's)")
    p.add_argument("--stall-after", type=stall_window, help="seconds of silence before the run counts as stalled")
    p.add_argument("--follow", action="store_true", help="print its progress rows until it ends")


def stage_groups(p: Parser, name: str) -> list[argparse.Action]:
    """The run options and the stage's own options, each in a group of `p`; the stage's own actions."""
    run_options(p.add_argument_group("run options (anywhere on the line)"))
    own = p.add_argument_group(f"{name} options (python -m backends.{name} ...)")
    stage_args(name).add_arguments(own)
    return own._group_actions


def stage(name: str) -> Grammar:
    """`extract` or `train`: the run's options and the stage's own (`python -m backends.NAME`'s), in any order."""

    def completed(p: Parser) -> None:
        # Completion alone reads the stage's words with this parser: `stage_options` has parsers of its own.
        for action in stage_groups(p, name):
            action.required = False

    return Grammar(
        name,
        f"launch our {name} stage: {name} [run options] {name.upper()} OPTIONS... (see {name} --help)",
        lambda _: None,
        tail="rest",
        completed=completed,
    )


def stage_description(name: str) -> str:
    return (
        f"Shorthand for `launch {name} -- python -m backends.{name} OPTIONS...`, checked here first: "
        f"{stage_args(name).DESCRIPTION}"
    )


extract, train = stage("extract"), stage("train")

# Every command's grammar, in the order `--help` lists them.
GRAMMARS = (
    status,
    launch,
    watch,
    stacks,
    kill,
    relaunch,
    free_gpus,
    logs,
    metrics,
    export,
    doctor,
    convert,
    serve,
    bench,
    extract,
    train,
)
COMMAND_NAMES = frozenset(grammar.name for grammar in GRAMMARS)


SHELLS = ("bash", "zsh", "fish")


class Completion(argparse.Action):
    """`--completion SHELL`: print argcomplete's hook for SHELL, and exit."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: object, values: object, option_string: str | None = None
    ) -> None:
        from argcomplete.shell_integration import shellcode  # only when asked: not every command pays for it

        print(shellcode(["eagle3-console"], shell=str(values)), end="")
        parser.exit()


def host_names(prefix: str, parsed_args: argparse.Namespace | None = None, **_: object) -> list[str]:
    """HOST's completions: 'local', the hosts of config.toml (--config's) and of ~/.ssh/config, and the `hosts`
    listing."""
    try:
        known = [host.name for host in config.known_hosts(config.load(getattr(parsed_args, "config", None)))]
    except config.ConfigError:
        known = [host.name for host in config.ssh_config_hosts()]
    return [name for name in ("local", "hosts", *known) if name.startswith(prefix)]


def first_word(args: list[str]) -> int:
    """Where the words after the global options begin (HOST, or `hosts`)."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in VALUED_OPTIONS else 1
    return i


def config_flag(words: list[str]) -> Path | None:
    """The settings file --config names among the global options (the last one given, as argparse takes it);
    read before argparse is, since the file says what HOST is when the words leave it out."""
    found: str | None = None
    i, end = 0, first_word(words)
    while i < end:
        word = words[i]
        if word.startswith("--config="):
            found = word.partition("=")[2]
        elif word == "--config" and i + 1 < len(words):
            found = words[i + 1]
        i += 2 if word in VALUED_OPTIONS else 1
    return None if found is None else Path(found)


def command_of(words: list[str]) -> str | None:
    """The COMMAND of a command line, HOST given or left out (`with_host`'s reading)."""
    rest = words[first_word(words) :]
    if not rest:
        return None
    if host_left_out(rest):
        return rest[0]
    return rest[1] if len(rest) > 1 else None


def host_left_out(rest: list[str]) -> bool:
    """Whether the words after the global options begin without HOST: nothing (the console), or a command
    alone at the head (`status`, `kill RUN`). A command followed by a command names a host, kubectl's way
    round (`eagle3-console status status`: the host `status`, its runs)."""
    if not rest:
        return True
    return rest[0] in COMMAND_NAMES and (len(rest) == 1 or rest[1] not in COMMAND_NAMES)


def asks_for_help(words: list[str]) -> bool:
    """-h, --help or --version before any '--' (after it, the words are the run's)."""
    own = words[: words.index("--")] if "--" in words else words
    return any(word in ("-h", "--help", "--version") for word in own)


def with_host(words: list[str], default_host: str | None, settings: Path) -> list[str]:
    """The command line with HOST where the person left it out: config.toml's default_host. UsageError when
    there is none (help is the same for any host, so it needs none)."""
    i = first_word(words)
    if not host_left_out(words[i:]):
        return words
    if default_host is None and not asks_for_help(words):
        raise UsageError(
            f"no HOST given and no default_host in {settings}; give HOST (e.g. `eagle3-console local status`) "
            "or set default_host"
        )
    return [*words[:i], default_host or "local", *words[i:]]


def build_parser(commands: Iterable[Grammar], completing: bool = False) -> Parser:
    """The global options, HOST, and `commands` in the order `--help` lists them; `completing`: with what only
    completion reads (a stage's own options)."""
    parser = Parser(
        prog="eagle3-console",
        # The global options are read before argparse (`first_word`, `config_flag`): only whole names agree.
        allow_abbrev=False,
        description="Train, serve and debug EAGLE-3 drafts on a GPU host.",
        epilog="HOST is 'local' (this machine), a host named in ~/.config/eagle3-console/config.toml, or "
        "[user@]host[:port] (over SSH; ~/.ssh/config applies); left out ('eagle3-console status'), it is "
        "config.toml's default_host. Without a COMMAND the terminal console opens. "
        "'eagle3-console hosts' lists the hosts it knows; 'eagle3-console HOST COMMAND --help' a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {backends.__version__}")
    parser.add_argument(
        "--completion",
        action=Completion,
        choices=SHELLS,
        metavar="SHELL",
        help="print what makes bash, zsh or fish complete this command line, e.g. "
        'eval "$(eagle3-console --completion bash)" in ~/.bashrc, or eagle3-console --completion fish | source',
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="PATH",
        help=f"the settings file (default: ${config.CONFIG_ENV}, else ~/.config/eagle3-console/config.toml, "
        "XDG_CONFIG_HOME applying; a file named here or there must exist)",
    )
    parser.add_argument("--workdir", type=Path, help="run store on the host (default ~/.eagle3-console)")
    parser.add_argument(
        "--readonly",
        action=argparse.BooleanOptionalAction,
        help="the console without kill, relaunch or free-gpus (--no-readonly overrides config.toml)",
    )
    parser.add_argument(
        "--remote-python",
        metavar="PATH",
        help="the host's Python (3.10 or newer) for the agent (default: python3 on the host's PATH)",
    )
    parser.add_argument(
        "--timeout",
        dest="timeout_s",
        type=answer_time,
        metavar="SECONDS",
        help="how long a host has to answer each request before the command gives up on it, naming the host "
        "(default: 30 for a look like status or kill, 300 for a launch or doctor, 900 for doctor --dry-load; a "
        "kill's --grace comes on top)",
    )
    parser.add_argument(
        "--accept-new-host-key",
        action="store_true",
        help="trust a host key seen for the first time (its fingerprint is shown; a changed key is still refused)",
    )
    parser.add_argument(
        "--no-reuse",
        action="store_true",
        help="over SSH, connect afresh for this command instead of through the shared connection that the first "
        "command for a host leaves running (it exits after 5 idle minutes)",
    )
    host = parser.add_argument(
        "host",
        metavar="HOST",
        help="'local', a host of config.toml, or [user@]host[:port]; for status, watch and free-gpus --dry-run "
        "also several: a,b or a group of config.toml",
    )
    host.completer = host_names  # type: ignore[attr-defined]  # argcomplete's hook
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for grammar in commands:
        command = sub.add_parser(grammar.name, help=grammar.help, description=grammar.description)
        grammar.arguments(command)
        if completing and grammar.completed is not None:
            grammar.completed(command)
    if not completing:  # argcomplete looks up a parser for each listed name: `hosts` has none here
        # `hosts` stands where HOST does: listed with the commands in --help, but no command of a host, so it is
        # argparse's own entry for a listed name (its parser is `listing_parser`).
        sub._choices_actions.append(sub._ChoicesPseudoAction(listing.name, (), listing.help))
    return parser


def split(words: list[str], commands: Iterable[Grammar]) -> tuple[list[str], list[str]]:
    """The words argparse reads (each `--set VALUE` joined), and the tail it must not: a stage's own arguments,
    or else the run's command line after the first '--'."""
    options, tail = split_stage(words, [c.name for c in commands if c.tail == "rest"]) or split_argv(words)
    return join_flag_values(options), tail


def split_argv(args: list[str]) -> tuple[list[str], list[str]]:
    """Split at the first '--': options before, the run's own argv after."""
    if "--" in args:
        cut = args.index("--")
        return args[:cut], args[cut + 1 :]
    return args, []


def split_stage(args: list[str], stages: list[str]) -> tuple[list[str], list[str]] | None:
    """`[GLOBAL OPTIONS] HOST STAGE REST...`: REST belongs to the stage, not to argparse."""
    i = first_word(args)
    if i + 1 < len(args) and args[i + 1] in stages:
        return args[: i + 2], args[i + 2 :]
    return None


def join_flag_values(options: list[str]) -> list[str]:
    """`--set --disable-cuda-graph` -> `--set=--disable-cuda-graph`: argparse alone
    would take the value for an option of its own."""
    joined: list[str] = []
    items = iter(options)
    for item in items:
        if item in ("--set", "--unset"):
            value = next(items, None)
            joined.append(item if value is None else f"{item}={value}")
        else:
            joined.append(item)
    return joined


def stage_options(name: str, args: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The run options among a stage's words, and the rest for `python -m backends.NAME`, checked by the stage's
    own parser here so that a typo is a usage error, not a failed run on the host. `--help` prints both and exits."""
    prog = f"eagle3-console HOST {name}"
    if "-h" in args or "--help" in args:
        shown = Parser(prog=prog, description=stage_description(name))
        stage_groups(shown, name)
        shown.print_help()
        raise SystemExit(0)
    own = Parser(prog=prog, add_help=False, allow_abbrev=False)
    run_options(own)
    opts, rest = own.parse_known_args(args)
    check = Parser(prog=prog, add_help=False, allow_abbrev=False)
    stage_args(name).add_arguments(check)
    check.parse_args(rest)
    return opts, rest
