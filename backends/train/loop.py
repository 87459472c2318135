"""One training run: set up from the data, the target and OUT (or its latest
checkpoint with --resume), then step, log, evaluate and save until --steps."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backends.eagle3_contract import Manifest, read_manifest
from backends.host import cpus
from backends.protocol import Metric, MetricRow
from backends.train import chats, checkpoint, distributed, online
from backends.train.attention import FLEX_BLOCK
from backends.train.config import DraftConfig, check_draft, check_target
from backends.train.data import (
    GROUPED,
    RANDOM,
    Batch,
    Layout,
    ShardReader,
    default_val_samples,
    padded_length,
    split_samples,
)
from backends.train.errors import TrainError, TrainingFailed
from backends.train.metrics import MetricsWriter, eval_line, plateaued, train_line
from backends.train.model import Eagle3Draft
from backends.train.options import TrainOptions
from backends.train.sources import ShardSource, Source
from backends.train.target import TargetConfig, Teacher, load_target_matrices, read_target_config
from backends.train.trainer import Trainer, build_draft, resolve_attention, use_compile_cache
from backends.train.vocab import VocabMap, build_vocab_map, token_frequencies

# On GPU, sequence lengths are padded to the flex-attention block size (flex's block tables need it: a
# multiple of it always, attention.FLEX_BLOCK). torch.compile compiles one graph for every length.
GPU_PAD_MULTIPLE = 128


def draft_config_for(
    options: TrainOptions, manifest: Manifest, resume_from: Path | None, target_cfg: TargetConfig
) -> DraftConfig:
    if resume_from is not None:
        config = DraftConfig.from_json(checkpoint.read_config(resume_from), manifest)
    elif options.draft_config is not None:
        try:
            raw = json.loads(options.draft_config.read_text())
        except (OSError, ValueError) as exc:
            raise TrainError(f"--draft-config {options.draft_config} cannot be read as JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise TrainError(f"--draft-config {options.draft_config} is not a JSON object")
        config = DraftConfig.from_json(raw, manifest)
    else:
        config = DraftConfig.from_target(target_cfg, manifest, options.draft_vocab_size)
    check_draft(config, manifest)
    return config


@dataclass
class Run:
    """Everything set up for a run, before the first step."""

    options: TrainOptions
    ctx: distributed.Dist
    source: Source
    trainer: Trainer
    vocab: VocabMap
    resumed_from: Path | None
    threads: str  # the CPU threads per process and why ("" on a GPU)
    compile_cache: str = ""  # where the compile cache is and whether it was reused ("" when nothing compiles)

    @property
    def layout(self) -> Layout:
        pad = pad_multiple(self.options, self.ctx, self.trainer.attention)
        return Layout(self.options.batch_size, self.ctx.world, self.ctx.rank, pad, self.options.max_length)


def pad_multiple(options: TrainOptions, ctx: distributed.Dist, attention: str) -> int:
    pad = options.pad_multiple or (GPU_PAD_MULTIPLE if ctx.device.type == "cuda" else 1)
    return math.lcm(pad, FLEX_BLOCK) if attention == "flex" else pad


def padded_lengths(options: TrainOptions, manifest: Manifest, ctx: distributed.Dist, attention: str) -> int:
    """How many lengths a batch can be padded to: multiples of the pad up to the longest sample."""
    longest = min(options.max_length or manifest.max_length, manifest.max_length)
    pad = pad_multiple(options, ctx, attention)
    return padded_length([longest], pad) // pad


def held_out(options: TrainOptions, total_samples: int) -> int:
    if total_samples < 2:
        raise TrainError(f"the data holds {total_samples} sample(s); training needs at least 2")
    return options.val_samples if options.val_samples is not None else default_val_samples(total_samples)


def open_shards(options: TrainOptions) -> ShardSource:
    manifest = read_manifest(options.data)
    split = split_samples(manifest, held_out(options, sum(s.samples for s in manifest.shards)))
    return ShardSource(manifest, ShardReader(options.data, manifest), split)


def open_online(
    options: TrainOptions, target_cfg: TargetConfig, ctx: distributed.Dist
) -> tuple[online.OnlineSource, chats.Chats]:
    tokenized = chats.load_chats(options)
    manifest = online.online_manifest(options, target_cfg, tokenized, ctx.device.type)
    held = held_out(options, len(tokenized.samples))
    source = online.OnlineSource(manifest, tokenized.samples, held, tokenized.tokenizer.pad_id, options.order)
    return source, tokenized


def prepare(options: TrainOptions, ctx: distributed.Dist) -> Run:
    """Read and check everything; build the draft, optimizer and schedule (restored with --resume)."""
    options.validate()
    threads = use_cpu_threads(options, ctx)
    source: Source
    tokenized = None
    if options.online:
        target_cfg = read_target_config(options.target)
        source, tokenized = open_online(options, target_cfg, ctx)
    else:
        source = open_shards(options)
        target_cfg = read_target_config(options.target)
    manifest = source.manifest
    latest = checkpoint.latest_checkpoint(options.out)
    if latest is not None and not options.resume:
        raise TrainError(f"{latest} already exists: pass --resume to continue that run, or choose another --out")
    check_target(manifest, target_cfg)
    if latest is not None:
        online.check_same_data(latest, manifest)
    config = draft_config_for(options, manifest, latest, target_cfg)
    global_batch = options.batch_size * ctx.world
    step_samples = global_batch * options.grad_accum
    if source.train_samples < step_samples:
        accumulated = f" x --grad-accum {options.grad_accum}" if options.grad_accum > 1 else ""
        raise TrainError(
            f"{source.train_samples} training samples cannot fill one step of {step_samples} "
            f"(--batch-size {options.batch_size} x {ctx.world} processes{accumulated})"
        )
    total_steps = options.steps or options.epochs * (source.train_samples // step_samples)
    embed, lm_head = load_target_matrices(options.target, target_cfg)
    compute_dtype = torch.bfloat16 if ctx.device.type == "cuda" else torch.float32
    if latest is not None:
        weights = checkpoint.load_weights(latest)
        vocab = VocabMap(d2t=weights["d2t"], t2d=weights["t2d"].bool(), distinct=None)
        draft = Eagle3Draft(config, embed_dtype=compute_dtype)
        draft.load_state_dict({**weights, "embed_tokens.weight": embed.to(compute_dtype)}, strict=True)
    else:
        counts = token_frequencies(source.token_streams(), manifest.vocab_size)
        vocab = build_vocab_map(counts, config.draft_vocab_size)
        draft = build_draft(config, embed.to(compute_dtype), lm_head, vocab, compute_dtype, options.seed)
    trainable = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    fsdp = distributed.use_fsdp(options.fsdp, ctx.world, trainable)
    teacher = Teacher(lm_head.to(ctx.device, compute_dtype), vocab.draft_ids, vocab.t2d)
    attention = resolve_attention(options.attention, ctx.device, config.head_dim)
    lengths = padded_lengths(options, manifest, ctx, attention)
    trainer = Trainer(draft, teacher, ctx, options, total_steps, fsdp=fsdp, padded_lengths=lengths)
    # Before anything compiles: the first step compiles the step (--compile) or, on a GPU, the attention.
    cache = use_compile_cache(options.out) if trainer.compiled or trainer.cuda else ""
    trainer.manifest = manifest
    if latest is not None:
        state = checkpoint.load_training_state(latest)
        check_same_order(latest, state, options.order, global_batch)
        trainer.restore(state)
    if tokenized is not None and not tokenized.from_copy and ctx.main:
        chats.keep_copy(options.out, tokenized)
    if isinstance(source, online.OnlineSource):
        placement = online.choose_placement(options.target_placement, ctx, options.target)
        model = online.load_target_model(options.target, ctx, placement, manifest.dtype)
        source.attach(model, placement, ctx)
    return Run(options, ctx, source, trainer, vocab, latest, threads, cache)


def check_same_order(checkpoint: Path, state: dict[str, Any], order: str, global_batch: int) -> None:
    """A resume skips the samples its run consumed: only in the same order are they the same samples."""
    recorded = state.get("batch_order", RANDOM)  # checkpoints from before the order was recorded
    if recorded != order:
        raise TrainError(f"{checkpoint} drew its batches in {recorded} order: resume with --batch-order {recorded}")
    was = int(state["batch_size"]) * int(state["world_size"])
    if order == GROUPED and was != global_batch:
        raise TrainError(
            f"{checkpoint} grouped its batches by length for a global batch of {was}, this run's is {global_batch}: "
            f"resume with --batch-size x processes = {was}"
        )


def use_cpu_threads(options: TrainOptions, ctx: distributed.Dist) -> str:
    """On the CPU, as many torch threads as there are idle CPUs (split between the processes); what was chosen."""
    if ctx.device.type != "cpu":
        return ""
    threads, why = cpus.cpu_threads(options.threads, ctx.world)
    torch.set_num_threads(threads)
    return f", {threads} CPU thread(s) per process ({why})"


def describe(run: Run) -> str:
    t, o, cfg = run.trainer, run.options, run.trainer.config
    trainable = sum(p.numel() for p in t.params)
    start = f"resuming {run.resumed_from} at step {t.progress.step}" if run.resumed_from else "starting at step 0"
    seen = f" ({run.vocab.distinct} distinct loss tokens in the data)" if run.vocab.distinct is not None else ""
    accumulated = f" x {o.grad_accum} micro-batches" if o.grad_accum > 1 else ""
    return (
        f"eagle3 train: {run.source.train_samples} train / {run.source.val_samples} val samples "
        f"({run.source.describe()}), aux layers {list(cfg.aux_layer_ids)}, "
        f"draft vocab {cfg.draft_vocab_size}{seen}, "
        f"{trainable:,} trainable parameters; {t.total_steps} steps x batch {o.batch_size} x "
        f"{run.ctx.world} process(es){accumulated} on {run.ctx.device}, TTT {o.ttt}, attention {t.attention}, "
        f"compile {compiling(t, run.compile_cache)}{run.threads}; {start}"
    )


def compiling(trainer: Trainer, cache: str) -> str:
    """Whether the step is compiled: once, by the first step, for every length the batches bring (the
    sequence length is dynamic); where its cache is, and whether an earlier start filled it."""
    if not trainer.compiled:
        return "off" + (f" ({cache})" if cache else "")
    return "on, one graph for every length, compiled by the first step" + (f" ({cache})" if cache else "")


class Logger:
    """Averages the step stats over a log window and writes rows (main process only)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.writer = MetricsWriter(run.options.out) if run.ctx.main else None
        self.reset()

    def reset(self) -> None:
        self.sums: torch.Tensor | None = None
        self.steps = 0
        self.tokens = 0
        self.lr = 0.0
        self.started = time.perf_counter()
        self.excluded = 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside (evaluation, saving) does not count against tokens/s."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - started

    def add(self, stats: torch.Tensor, tokens: int, lr: float) -> None:
        self.sums = stats if self.sums is None else self.sums + stats
        self.steps += 1
        self.tokens += tokens
        self.lr += lr

    def emit(self, step: int, epoch: int) -> None:
        if self.sums is None:
            return
        k = self.run.options.ttt
        packed = torch.cat([self.sums, torch.tensor([float(self.tokens)], device=self.sums.device)])
        totals = distributed.all_reduce_sum(packed).cpu()
        mean = (totals / (self.steps * self.run.ctx.world)).tolist()
        correct, counted = totals[1 + k : 1 + 2 * k], totals[1 + 2 * k : 1 + 3 * k]
        acc = (correct / counted.clamp_min(1)).tolist()
        elapsed = max(time.perf_counter() - self.started - self.excluded, 1e-9)
        if not math.isfinite(mean[0]):
            raise TrainingFailed(f"the loss became {mean[0]} by step {step}: lower --lr, or check the data")
        row: MetricRow = {Metric.STEP: step, Metric.EPOCH: epoch, Metric.LOSS: mean[0]}
        row.update({Metric.ploss(i): mean[1 + i] for i in range(k)})
        row.update({Metric.acc(i): acc[i] for i in range(k)})
        row.update(
            {
                Metric.LR: self.lr / self.steps,
                Metric.GRAD_NORM: mean[1 + 3 * k],
                Metric.TOKENS_PER_S: float(totals[-1]) / elapsed,
            }
        )
        self.write(row, train_line(row, self.run.trainer.total_steps, k))
        self.reset()

    def write(self, row: MetricRow, line: str) -> None:
        if self.writer is not None:
            self.writer.write(row)
            print(line, flush=True)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def evaluate(run: Run, logger: Logger) -> None:
    if run.source.val_samples == 0:
        return
    t = run.trainer
    row: MetricRow = {Metric.STEP: t.progress.step, Metric.EPOCH: t.progress.epoch}
    row.update(t.evaluate(run.source.val_batches(run.layout)))
    t.progress.val_history.append(row[Metric.VAL_LOSS])
    row[Metric.PLATEAU] = plateaued(t.progress.val_history, run.options.plateau_evals)
    logger.write(row, eval_line(row, run.options.ttt))


def save(run: Run, name: str) -> None:
    path = run.trainer.save(run.options.out, name)
    if run.ctx.main:
        print(f"saved {path} (step {run.trainer.progress.step})", flush=True)


def steps_of(batches: Iterator[Batch], size: int) -> Iterator[list[Batch]]:
    """The micro-batches of each optimizer step; an epoch's last, partial step is dropped."""
    step: list[Batch] = []
    for batch in batches:
        step.append(batch)
        if len(step) == size:
            yield step
            step = []


def train(run: Run) -> None:
    t, o, p = run.trainer, run.options, run.trainer.progress
    if run.ctx.main:
        print(describe(run), flush=True)
        if isinstance(run.source, online.OnlineSource):
            print(run.source.describe_order(run.layout, o.seed), flush=True)
    if p.step >= t.total_steps:
        if run.ctx.main:
            print(f"nothing to do: {run.resumed_from} is at step {p.step}, --steps is {t.total_steps}", flush=True)
        return
    logger = Logger(run)
    layout = run.layout
    try:
        while p.step < t.total_steps:
            batches = run.source.train_batches(layout, p.epoch, o.seed, p.samples_in_epoch)
            with contextlib.closing(batches):
                for micro in steps_of(batches, o.grad_accum):
                    lr = t.optimizer.param_groups[0]["lr"]
                    stats = t.train_step(*micro)
                    p.step += 1
                    p.samples_in_epoch += layout.global_batch * len(micro)
                    logger.add(stats, sum(batch.tokens for batch in micro), lr)
                    if p.step % o.log_every == 0 or p.step == t.total_steps:
                        logger.emit(p.step, p.epoch)
                    if o.eval_every and p.step % o.eval_every == 0:
                        with logger.paused():
                            evaluate(run, logger)
                    if o.save_every and p.step % o.save_every == 0:
                        with logger.paused():
                            save(run, checkpoint.step_name(p.step))
                    if p.step >= t.total_steps:
                        break
                else:
                    p.epoch += 1
                    p.samples_in_epoch = 0
        if not (o.eval_every and p.step % o.eval_every == 0):
            evaluate(run, logger)
        save(run, checkpoint.FINAL)
    finally:
        logger.close()


def run_training(options: TrainOptions) -> None:
    ctx = distributed.init()
    try:
        train(prepare(options, ctx))
    except torch.OutOfMemoryError:
        raise TrainingFailed(
            "out of GPU memory: lower --batch-size (raise --grad-accum as much to keep the step's batch) or "
            "--max-length, or use more GPUs through torchrun"
        ) from None
    finally:
        distributed.shutdown()
