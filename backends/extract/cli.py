"""`python -m backends.extract`: the command line, its checks, progress reporting, and the run from end to end.

Exit codes: 0 done (or already complete), 1 the extraction failed (unusable
data, a target that does not load, out of memory), 2 the command line cannot be
followed (bad flags or paths, layer ids outside the target, an --out folder
made with other settings, a backend that is not available). Expected failures
print one `error: ...` line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import itertools
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from backends.ahead import background
from backends.eagle3_contract import ContractError, Manifest, default_aux_layers
from backends.extract import capture, sglang_capture
from backends.extract.args import DEFAULT_WRITERS, build_parser
from backends.extract.data import DEMO, DataError, Dataset, load_dataset
from backends.extract.output import (
    OutputError,
    Progress,
    Settings,
    ShardRecord,
    finish,
    open_output,
    record_shard,
    remove_if_empty,
    save_shard,
)
from backends.extract.pipeline import HostShard, ShardJob, run_pipeline
from backends.extract.template import ChatTokenizer, TemplateError, TokenizedChat
from backends.fileio import append_jsonl
from backends.host import cpus
from backends.host.memory import available_bytes
from backends.protocol import ENV_METRICS_FILE, Metric, MetricRow

NO_ASSISTANT_TOKEN = "no assistant token within --max-length"


class UsageError(Exception):
    """The command line cannot be followed (exit 2)."""


class ExtractFailed(Exception):
    """The extraction was attempted and failed (exit 1)."""


@dataclass
class Target:
    """What the extraction needs to know about the target before loading its weights."""

    path: Path
    architecture: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    config_sha256: str


def read_target(path: Path) -> Target:
    if not path.is_dir():
        raise UsageError(f"--target {path}: no such folder")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise UsageError(f"--target {path} has no config.json; give a Hugging Face model folder")
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:
        raise ExtractFailed(f"cannot read {config_path}: {exc}") from None
    text = config.get_text_config()
    architectures = getattr(config, "architectures", None) or [type(config).__name__]
    return Target(
        path=path.resolve(),
        architecture=str(architectures[0]),
        num_layers=int(text.num_hidden_layers),
        hidden_size=int(text.hidden_size),
        vocab_size=int(text.vocab_size),
        config_sha256=hashlib.sha256(config_path.read_bytes()).hexdigest(),
    )


def choose_layers(requested: list[int] | None, num_layers: int) -> list[int]:
    """The aux ids to capture: the default set, or `requested` checked against the target."""
    if requested is None:
        try:
            return default_aux_layers(num_layers)
        except ContractError as exc:
            raise UsageError(f"{exc}; pass --layers") from None
    last = num_layers - 2
    bad = [i for i in requested if not 0 <= i <= last]
    if bad:
        raise UsageError(
            f"--layers {','.join(map(str, bad))}: the target has {num_layers} layers, so aux ids run 0..{last} "
            f"(id X is the output of layer X; the last layer's output exists only after the final norm)"
        )
    if any(b <= a for a, b in itertools.pairwise(requested)):
        raise UsageError("--layers must be increasing: SGLang concatenates the captured layers in layer order")
    return requested


def use_cpu_threads(requested: int | None) -> str:
    """As many torch threads as there are idle CPUs (or --threads); what was chosen, for the log."""
    import torch  # the forward pass needs it anyway; the command line does not

    threads, why = cpus.cpu_threads(requested)
    torch.set_num_threads(threads)
    return f", {threads} CPU thread(s) ({why})"


# Pinned host memory the shards in flight may take by default: a share of what the host has available.
WRITER_MEMORY_SHARE = 0.25


def choose_writers(requested: int | None, shard_bytes: int, available: int | None) -> tuple[int, str]:
    """The shard-writing threads: `requested`, else DEFAULT_WRITERS capped so that the shards in flight
    (writers + the one being extracted, each at most `shard_bytes`) fit in a quarter of the available memory."""
    gb = f"{shard_bytes / 1e9:.1f} GB"
    if requested is not None:
        return requested, f"{requested} writer(s) (--writers), each shard up to {gb} of pinned memory"
    if available is None:
        return DEFAULT_WRITERS, f"{DEFAULT_WRITERS} writers, each shard up to {gb} of pinned memory"
    fit = int(available * WRITER_MEMORY_SHARE // max(shard_bytes, 1)) - 1
    writers = max(1, min(DEFAULT_WRITERS, fit))
    return writers, (
        f"{writers} writer(s), each shard up to {gb} of pinned memory "
        f"({available / 1e9:.0f} GB available; --writers to change)"
    )


def choose_device(requested: str | None) -> str:
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if (requested == "auto" or requested.startswith("cuda")) and not torch.cuda.is_available():
        raise UsageError(f"--device {requested}: no CUDA device is visible to this process")
    if requested not in ("cpu", "auto") and not requested.startswith("cuda"):
        raise UsageError(f"--device {requested}: use cpu, cuda, cuda:N or auto")
    return requested


def load_chat_tokenizer(target: Path, template_file: Path | None) -> ChatTokenizer:
    from transformers import AutoTokenizer

    template = None
    if template_file is not None:
        try:
            template = template_file.read_text()
        except OSError as exc:
            raise UsageError(f"--chat-template {template_file}: {exc.strerror or exc}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(target)
    except (OSError, ValueError) as exc:
        # transformers' reasons run over several lines; the first says what is missing.
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ExtractFailed(f"cannot load the tokenizer of {target}: {first}") from None
    try:
        return ChatTokenizer(tokenizer, template)
    except TemplateError as exc:
        raise UsageError(str(exc)) from None


class Reporter:
    """Progress for people (stdout) and for the run engine (metric rows in $EAGLE3_METRICS_FILE)."""

    def __init__(self, progress: Progress, shard_size: int) -> None:
        self.progress = progress
        self.total_shards = -(-progress.chats // shard_size)
        self.started = time.monotonic()
        self.first_chat = progress.next_chat
        self.tokens = 0
        self.metrics_file = os.environ.get(ENV_METRICS_FILE) or None

    def shard_done(self, shard: ShardRecord) -> None:
        self.tokens += shard.tokens
        elapsed = max(time.monotonic() - self.started, 1e-9)
        done = shard.end_chat - self.first_chat
        eta = (self.progress.chats - shard.end_chat) * elapsed / max(done, 1)
        rate = self.tokens / elapsed
        row: MetricRow = {
            Metric.STAGE: "extract",
            Metric.SAMPLES: self.progress.samples,
            Metric.TOKENS: self.progress.tokens,
            Metric.TOKENS_PER_S: round(rate, 1),
            Metric.ETA_S: round(eta, 1),
            Metric.SHARD: shard.index,
        }
        if self.metrics_file:
            append_jsonl(Path(self.metrics_file), row)
        print(
            f"shard {shard.index + 1}/{self.total_shards}: {shard.samples} samples, {shard.tokens:,} tokens"
            f" | total {self.progress.samples:,} samples, {self.progress.tokens:,} tokens"
            f" | {rate:,.0f} tokens/s | ETA {format_seconds(eta)}",
            flush=True,
        )


def format_seconds(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def tokenize_chats(
    chat_tokenizer: ChatTokenizer, chats: list[list[dict[str, str]]], max_length: int
) -> tuple[list[TokenizedChat], dict[str, int]]:
    """The chats that keep at least one assistant token, and counts of the others by reason."""
    kept: list[TokenizedChat] = []
    dropped: dict[str, int] = {}
    for sample in chat_tokenizer.tokenize(chats, max_length):
        if isinstance(sample, TemplateError):
            reason = str(sample).splitlines()[0]
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        if not any(sample.loss_mask):
            dropped[NO_ASSISTANT_TOKEN] = dropped.get(NO_ASSISTANT_TOKEN, 0) + 1
            continue
        kept.append(sample)
    return kept, dropped


def shard_jobs(chat_tokenizer: ChatTokenizer, dataset: Dataset, progress: Progress) -> Iterator[ShardJob]:
    """The shards still to extract, tokenised as they are reached."""
    settings = progress.settings
    for start in range(progress.next_chat, len(dataset.chats), settings.shard_size):
        end = min(start + settings.shard_size, len(dataset.chats))
        samples, dropped = tokenize_chats(chat_tokenizer, dataset.chats[start:end], settings.max_length)
        yield ShardJob(start // settings.shard_size, start, end, samples, dropped)


def run_shards(
    capturer: capture.Capturer,
    chat_tokenizer: ChatTokenizer,
    dataset: Dataset,
    progress: Progress,
    out: Path,
    args: argparse.Namespace,
) -> None:
    import torch

    reporter = Reporter(progress, progress.settings.shard_size)

    def save(job: ShardJob, shard: HostShard | None) -> ShardRecord:
        record = ShardRecord(
            index=job.index,
            file=None,
            first_chat=job.first_chat,
            end_chat=job.end_chat,
            samples=len(job.samples),
            tokens=sum(len(s.input_ids) for s in job.samples),
            dropped=job.dropped,
        )
        return save_shard(out, record, shard.tensors if shard else None)

    def record(shard: ShardRecord) -> None:
        record_shard(out, progress, shard)
        reporter.shard_done(shard)

    # The next shard's chats are tokenized in a thread while the target runs on this one's.
    jobs = background(shard_jobs(chat_tokenizer, dataset, progress), depth=1)
    try:
        with contextlib.closing(jobs):
            run_pipeline(capturer, jobs, args.batch_tokens, save, record, args.writers)
    except torch.OutOfMemoryError:
        raise ExtractFailed(f"out of memory with --batch-tokens {args.batch_tokens}; lower it") from None


def load_capturer(
    target: Target,
    args: argparse.Namespace,
    sglang: sglang_capture.SGLangModules | None,
    device: str,
    dtype: str,
    aux_ids: list[int],
    pad_id: int,
) -> capture.Capturer:
    """The target loaded by the chosen backend (`sglang`: SGLang's modules, for --backend sglang), ready to capture."""
    from safetensors import SafetensorError

    try:
        if sglang is not None:
            return sglang_capture.load(target.path, sglang, device, dtype, aux_ids, args.batch_tokens, args.max_length)
        return capture.HFCapturer(capture.load_target(target.path, device, dtype), aux_ids, pad_id)
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:  # a corrupt weights file among them
        raise ExtractFailed(f"cannot load the target from {target.path} with --backend {args.backend}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    target = read_target(args.target)
    if args.backend == "sglang" and args.device == "auto":
        raise UsageError("--device auto goes with --backend hf; the sglang backend runs on one GPU")
    if args.backend == "sglang":
        try:
            sglang_capture.check_available(target.architecture)
        except sglang_capture.SGLangUnavailable as exc:
            raise UsageError(str(exc)) from None
    if args.data != DEMO and not Path(args.data).is_file():
        raise UsageError(f"--data {args.data}: no such file (give a JSONL file, or demo for the built-in corpus)")
    aux_ids = choose_layers(args.layers, target.num_layers)
    if len(aux_ids) != 3:
        print(f"note: {len(aux_ids)} aux layers; SGLang 0.5.5 serves drafts with exactly 3", file=sys.stderr)
    device = choose_device(args.device)
    dtype = capture.resolve_dtype(args.dtype, device)
    threads = use_cpu_threads(args.threads) if device == "cpu" else ""
    sglang = None
    if args.backend == "sglang":
        try:
            sglang = sglang_capture.import_runner(device)
        except sglang_capture.SGLangUnavailable as exc:
            raise UsageError(str(exc)) from None
    chat_tokenizer = load_chat_tokenizer(target.path, args.chat_template)
    dataset = load_dataset(args.data, args.limit)
    print(f"data: {len(dataset.chats)} chats from {dataset.source}")
    if dataset.skipped:
        print(f"data: {dataset.skip_summary()}")
    settings = Settings(
        target=str(target.path),
        target_config_sha256=target.config_sha256,
        aux_layer_ids=aux_ids,
        max_length=args.max_length,
        data=DEMO if args.data == DEMO else str(Path(args.data).resolve()),
        data_sha256=dataset.sha256,
        limit=args.limit,
        dtype=dtype,
        shard_size=args.shard_size,
        backend=args.backend,
        chat_template_sha256=hashlib.sha256(chat_tokenizer.template.encode()).hexdigest(),
    )
    try:
        progress, notes = open_output(args.out, settings, len(dataset.chats))
    except OutputError as exc:
        raise UsageError(str(exc)) from None
    progress.skipped_lines = {reason: len(lines) for reason, lines in dataset.skipped.items()}
    for note in notes:
        print(f"resume: {note}")
    if progress.complete:
        print(f"{args.out} is already complete: {progress.samples} samples, {progress.tokens:,} tokens")
        return 0
    if progress.shards:
        print(f"resume: {len(progress.shards)} finished shards kept, from chat {progress.next_chat}")
    print(f"target: {target.architecture}, {target.num_layers} layers, aux ids {aux_ids}, {dtype} on {device}{threads}")
    # At most: every chat of a shard at --max-length, final and aux states in the chosen dtype.
    token_bytes = (len(aux_ids) + 1) * target.hidden_size * (4 if dtype == "float32" else 2)
    args.writers, why = choose_writers(args.writers, args.shard_size * args.max_length * token_bytes, available_bytes())
    print(f"shards: {why}")
    capturer = load_capturer(target, args, sglang, device, dtype, aux_ids, chat_tokenizer.pad_id)
    run_shards(capturer, chat_tokenizer, dataset, progress, args.out, args)
    dropped = progress.dropped()
    if dropped:
        print("dropped: " + ", ".join(f"{count} {reason}" for reason, count in dropped.items()))
    if not progress.samples:
        raise ExtractFailed(f"no chat kept any assistant token (--max-length {args.max_length}); nothing to train on")
    manifest = finish(
        args.out,
        progress,
        Manifest(
            target_path=str(target.path),
            architecture=target.architecture,
            num_layers=target.num_layers,
            hidden_size=target.hidden_size,
            vocab_size=target.vocab_size,
            dtype=dtype,
            aux_layer_ids=aux_ids,
            tokenizer=str(target.path),
            chat_template=chat_tokenizer.template,
            max_length=args.max_length,
            backend=args.backend,
            backend_version=importlib.metadata.version("sglang" if args.backend == "sglang" else "transformers"),
        ),
    )
    print(
        f"done: {manifest.samples} samples, {manifest.tokens:,} tokens in {len(manifest.shards)} shards; "
        f"manifest {args.out / 'manifest.json'} (content hash {manifest.content_hash[:12]})"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    made_out = not args.out.exists()
    try:
        return run(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ExtractFailed, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if made_out:
            remove_if_empty(args.out)  # a failure before the first shard leaves no empty folder behind
