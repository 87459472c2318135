"""The tensor side of a run: the draft wrapped for training, its optimizer and
schedule, one optimizer step, evaluation, and saving or restoring all of it."""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from backends.eagle3_contract import Manifest
from backends.fileio import private_dir
from backends.protocol import Metric, MetricRow
from backends.train import checkpoint, distributed
from backends.train.attention import ttt_block_mask
from backends.train.config import DraftConfig
from backends.train.data import Batch
from backends.train.errors import TrainError
from backends.train.loss import STEP_DECAY, LossParts, LossRows, fused_ttt_loss, loss_rows, simulated_accept_length
from backends.train.model import FROZEN_WEIGHTS, Eagle3Draft
from backends.train.options import TrainOptions
from backends.train.schedule import lr_factor, warmup_cosine, warmup_steps
from backends.train.step_rows import StepRows
from backends.train.target import Teacher, TeacherRows
from backends.train.vocab import VocabMap

ADAM_BETAS = (0.9, 0.95)
# torch's recompile limits, raised to cover every shape a run could compile (compile_limits).
RECOMPILE_LIMIT = 256
# Inductor's and Triton's caches for the run, under OUT: a relaunch of the same run loads its graphs and kernels.
COMPILE_CACHE = "compile-cache"


def compile_limits(padded_lengths: int, ttt: int) -> tuple[int, int]:
    """(per function, in all) how many compilations a run could make were its length not dynamic (one graph
    per padded length, and flex attention alone per length, TTT step and grad mode). One graph serves every
    length; the limits are there so that a torch that specialises it anyway still compiles every shape:
    past them the rest would run uncompiled, and eager flex materialises every score [B, heads, T, (k+1)T],
    which runs a long batch out of memory."""
    shapes = 2 * padded_lengths * ttt
    return max(RECOMPILE_LIMIT, shapes), max(RECOMPILE_LIMIT, 2 * shapes)


def use_compile_cache(out: Path) -> str:
    """Point inductor's and Triton's caches at OUT/compile-cache (private: 700, the caches write each entry to
    a temp file and rename it), before anything compiles; says whether an earlier start left it filled."""
    path = out / COMPILE_CACHE
    reused = path.is_dir() and any(path.iterdir())
    private_dir(path)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ["TRITON_CACHE_DIR"] = str(path / "triton")
    return f"cache reused from {path}" if reused else f"cache kept in {path} for a relaunch"


def keep_one_graph() -> None:
    """Inductor's mix-order reduction fusion (torch >= 2.10) weighs sizes against thresholds, and on dynamic
    sizes each weighing is a guard: every threshold the row counts cross compiled the step again (4 graphs
    over lengths 128..8192 on torch 2.11). Its non-strict mode fuses at every size, which cost 16% at 512
    tokens on an H200; off, the graphs ran as fast as those the thresholds had left unfused."""
    import torch._inductor.config as inductor

    if hasattr(inductor.triton, "mix_order_reduction"):
        inductor.triton.mix_order_reduction = False


@dataclass
class Progress:
    """Where the run is; saved in every checkpoint."""

    step: int = 0
    epoch: int = 0
    samples_in_epoch: int = 0
    val_history: list[float] = field(default_factory=list)


def rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


# Inductor's flex-attention kernel needs head_dim >= 16 (Triton's tl.dot).
FLEX_MIN_HEAD_DIM = 16


def resolve_attention(requested: str, device: torch.device, head_dim: int) -> str:
    """`auto`: on GPU, the Triton TTT kernel (flex where Triton is missing) when the head is wide enough;
    else eager."""
    gpu_ok = device.type == "cuda" and head_dim >= FLEX_MIN_HEAD_DIM
    if requested == "auto":
        if not gpu_ok:
            return "eager"
        return "triton" if _ttt_kernel_available(device) else "flex"
    if requested in ("flex", "triton") and not gpu_ok:
        raise TrainError(
            f"--attention {requested} needs a GPU (PyTorch has no flex-attention backward on CPU; the Triton "
            f"kernel runs on CUDA) and head_dim >= {FLEX_MIN_HEAD_DIM} (this draft's is {head_dim}); "
            "use --attention eager"
        )
    if requested == "triton" and not _ttt_kernel_available(device):
        raise TrainError("--attention triton needs Triton (pip install triton); use --attention flex")
    return requested


def _ttt_kernel_available(device: torch.device) -> bool:
    from backends.train import ttt_kernel  # imports Triton: only where a GPU could use it

    return ttt_kernel.available(device)


def build_draft(
    config: DraftConfig,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    vocab: VocabMap,
    embed_dtype: torch.dtype,
    seed: int,
) -> Eagle3Draft:
    """A fresh draft: the target's embedding (frozen) and, as a warm start, the target's
    lm_head rows of the draft vocabulary (speculators does the same)."""
    torch.manual_seed(seed)
    draft = Eagle3Draft(config, embed_dtype=embed_dtype)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(embed)
        draft.lm_head.weight.copy_(lm_head[vocab.draft_ids].float())
        draft.get_buffer("d2t").copy_(vocab.d2t)
        draft.get_buffer("t2d").copy_(vocab.t2d)
    return draft


class Trainer:
    """The parts of a run that touch tensors: step, evaluate, save."""

    def __init__(
        self,
        draft: Eagle3Draft,
        teacher: Teacher,
        ctx: distributed.Dist,
        options: TrainOptions,
        total_steps: int,
        fsdp: bool = False,
        padded_lengths: int = 1,
    ) -> None:
        """`padded_lengths`: how many lengths the run's batches can be padded to (compile_limits)."""
        self.ctx = ctx
        self.options = options
        self.total_steps = total_steps
        self.teacher = teacher
        self.config = draft.config
        self.cuda = ctx.device.type == "cuda"
        self.compute_dtype = torch.bfloat16 if self.cuda else torch.float32
        self.attention = resolve_attention(options.attention, ctx.device, draft.config.head_dim)
        if self.attention == "triton":
            draft.use_ttt_kernel()
        self.compiled = self.cuda if options.compile is None else options.compile
        self.padded_lengths = padded_lengths
        self.draft = draft.to(ctx.device)
        self.model = distributed.wrap(self.draft, ctx, fsdp, self.compute_dtype)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # Fused kernels on GPU; elsewhere (and for FSDP's DTensors) one foreach op per state tensor.
        fused = self.cuda and not fsdp
        self.optimizer = torch.optim.AdamW(
            self.params, lr=options.lr, betas=ADAM_BETAS, weight_decay=0.0, fused=fused, foreach=not fused
        )
        self.warmup = warmup_steps(total_steps, options.warmup_ratio)
        self.scheduler = warmup_cosine(self.optimizer, self.warmup, total_steps)
        self.progress = Progress()
        # The data contract every checkpoint carries (manifest.json), so doctor and --resume can check against it.
        self.manifest: Manifest | None = None
        self.forward: Callable[..., torch.Tensor] = self._forward
        if self.cuda or self.compiled:
            limits = compile_limits(padded_lengths, options.ttt)
            torch._dynamo.config.recompile_limit, torch._dynamo.config.accumulated_recompile_limit = limits
        if self.compiled:
            # The draft's layers only (the loss has its own kernel), one graph for every batch: the rows
            # computed (step_rows) and the length are marked dynamic (losses), nothing else is.
            keep_one_graph()
            self.forward = torch.compile(self._forward, dynamic=False)

    # ---- one step -------------------------------------------------------
    def block_masks(self, seq_len: int) -> list[BlockMask] | None:
        if self.attention != "flex":
            return None
        return [ttt_block_mask(seq_len, k, str(self.ctx.device)) for k in range(self.options.ttt)]

    def _forward(self, model: nn.Module, input_ids: torch.Tensor, aux: torch.Tensor, plan: StepRows) -> torch.Tensor:
        # The length and the masks from the batch's shape, not from the plan's int, which a compiled graph
        # would be specialised to: compiled, the length is symbolic and one graph serves them all.
        seq = input_ids.shape[1]
        plan = dataclasses.replace(plan, seq=seq)
        with torch.autocast(self.ctx.device.type, dtype=torch.bfloat16, enabled=self.cuda):
            hidden: torch.Tensor = model(input_ids, aux, plan, self.block_masks(seq))
        return hidden

    def loss_rows(self, batch: Batch) -> tuple[TeacherRows, LossRows]:
        # Teacher and rows first: their host syncs (how many rows) then find the device nearly idle.
        teacher = self.teacher.rows(batch.hidden_state, batch.loss_mask)
        return teacher, loss_rows(batch.loss_mask, teacher, self.options.ttt)

    def losses(
        self,
        model: nn.Module,
        batch: Batch,
        rows: tuple[TeacherRows, LossRows],
        denominators: torch.Tensor | None,
        training: bool,
    ) -> LossParts:
        teacher, loss = rows
        forward = self.forward if training else self._forward
        if training and self.compiled:
            loss.plan.track_sizes()
            for tensor in (batch.input_ids, batch.aux_hidden_states):
                torch._dynamo.maybe_mark_dynamic(tensor, 1)  # the length: one graph for every length
        hidden = forward(model, batch.input_ids, batch.aux_hidden_states, loss.plan)
        # The draft's own lm_head: under FSDP the root keeps its parameters gathered from forward to backward.
        # Training backpropagates each micro-batch's loss alone (train_step): its gradient is 1.
        return fused_ttt_loss(hidden, self.draft.lm_head.weight, teacher, loss, denominators, unit_grad=training)

    def train_step(self, *batches: Batch) -> torch.Tensor:
        """One optimizer step on the micro-batches `batches` (--grad-accum), the step one batch holding them
        all would take; returns, on the device (no host sync), the row
        [loss, ploss_0..K-1, correct_0..K-1, counted_0..K-1, grad_norm]."""
        batches = tuple(batch.to(self.ctx.device, self.compute_dtype) for batch in batches)
        rows = [self.loss_rows(batch) for batch in batches]
        denominators = None
        if len(batches) > 1 or self.ctx.world > 1:
            # Each position's weight is 1 / the positions in the loss over every micro-batch and process: DDP
            # averages the processes' gradients, and the micro-batches' add up.
            in_loss = torch.stack([loss.in_loss for _, loss in rows]).sum(0).float()
            denominators = distributed.all_reduce_sum(in_loss).clamp_min(1) / self.ctx.world
        stats = []
        for n, (batch, batch_rows) in enumerate(zip(batches, rows, strict=True)):
            with distributed.gradient_sync(self.model, n == len(batches) - 1):
                parts = self.losses(self.model, batch, batch_rows, denominators, training=True)
                torch.autograd.backward(parts.loss)
            parts_row = [parts.loss.detach()[None], parts.ploss.detach(), parts.correct.float(), parts.counted.float()]
            stats.append(torch.cat(parts_row))
        grad_norm = nn.utils.clip_grad_norm_(self.params, self.options.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return torch.cat([torch.stack(stats).sum(0), grad_norm.detach()[None].float()])

    @torch.no_grad()
    def evaluate(self, batches: Iterable[Batch]) -> MetricRow:
        """val_loss, val_ploss_k, val_acc_k, val_sim_accept_len over all the held-out batches."""
        k = self.options.ttt
        sums = torch.zeros(4, k, device=self.ctx.device)
        for batch in batches:
            batch = batch.to(self.ctx.device, self.compute_dtype)
            parts = self.losses(self.draft, batch, self.loss_rows(batch), None, training=False)
            sums += torch.stack([parts.ce_sum, parts.in_loss, parts.correct, parts.counted]).float()
        ce_sum, in_loss, correct, counted = distributed.all_reduce_sum(sums).cpu()
        ploss = (ce_sum / in_loss.clamp_min(1)).tolist()
        acc = (correct / counted.clamp_min(1)).tolist()
        row: MetricRow = {Metric.VAL_LOSS: sum(STEP_DECAY**i * p for i, p in enumerate(ploss))}
        row.update({Metric.val_ploss(i): p for i, p in enumerate(ploss)})
        row.update({Metric.val_acc(i): a for i, a in enumerate(acc)})
        row[Metric.VAL_SIM_ACCEPT_LEN] = simulated_accept_length(acc)
        return row

    # ---- state ----------------------------------------------------------
    def save(self, out: Path, name: str) -> Path:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model_sd, optim_sd = get_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        path = out / name
        if self.ctx.main:
            weights = {
                k: v.float() if v.is_floating_point() else v for k, v in model_sd.items() if isinstance(v, torch.Tensor)
            }
            for key in FROZEN_WEIGHTS:
                weights.pop(key)
            state = {
                "step": self.progress.step,
                "epoch": self.progress.epoch,
                "samples_in_epoch": self.progress.samples_in_epoch,
                "val_history": list(self.progress.val_history),
                "optimizer": optim_sd,
                "scheduler": self.scheduler.state_dict(),
                "rng": rng_state(self.ctx.device),
                "world_size": self.ctx.world,
                "batch_size": self.options.batch_size,
                "seed": self.options.seed,
                "batch_order": self.options.order,
            }
            manifest = self.manifest.to_json() if self.manifest is not None else None
            path = checkpoint.save_checkpoint(out, name, weights, self.config.to_json(), state, manifest)
        distributed.barrier()
        return path

    def restore(self, state: dict[str, Any]) -> None:
        """Optimizer, scheduler, progress and RNG from a training_state.pt (weights are loaded before)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(
            self.model, self.optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True)
        )
        self.scheduler.load_state_dict(state["scheduler"])
        # The schedule follows this run's --lr and --steps, from the restored step on.
        self.scheduler.base_lrs = [self.options.lr for _ in self.optimizer.param_groups]
        factor = lr_factor(self.scheduler.last_epoch, self.warmup, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = self.options.lr * factor
        self.progress = Progress(
            step=int(state["step"]),
            epoch=int(state["epoch"]),
            samples_in_epoch=int(state["samples_in_epoch"]),
            val_history=[float(v) for v in state["val_history"]],
        )
        set_rng_state(state["rng"], self.ctx.device)
