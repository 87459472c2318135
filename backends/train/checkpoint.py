"""Checkpoints in the SGLang layout, written atomically, plus the state to resume from.

    OUT/step-N/ and OUT/final/
        config.json          SGLang/SpecForge draft config (LlamaForCausalLMEagle3)
        model.safetensors    midlayer.*, fc, norm, lm_head, d2t, t2d (no embedding); float32
        training_state.pt    optimizer, scheduler, step, epoch, data position, RNG, eval history
        checkpoint.json      {"step": N, "epoch": E}: which step this is, without unpickling
        manifest.json        the data contract it was trained on (aux ids, target, tokenizer, chat template,
                             data hash): the extraction's manifest, or what an online training would have
                             extracted; doctor reads it when no --data is given

A checkpoint is written into a hidden temporary folder and renamed into place (swapped with an older one of
its name), so a reader (SGLang, `--resume`, the console) never sees half of one. Weights
are saved in float32, the trainer's master copy, so a reload reproduces the
trainer's outputs exactly; SGLang casts them to the serving dtype at load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from backends.eagle3_contract import MANIFEST, SGLANG_DRAFT_WEIGHTS
from backends.fileio import NO_EXCHANGE, exchange
from backends.train.errors import TrainError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TRAINING_STATE = "training_state.pt"
MARKER = "checkpoint.json"
FINAL = "final"
STEP_DIR = re.compile(r"step-(\d+)")


def step_name(step: int) -> str:
    return f"step-{step}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    out: Path,
    name: str,
    weights: dict[str, torch.Tensor],
    config: dict[str, Any],
    training_state: dict[str, Any],
    manifest: dict[str, Any] | None = None,
) -> Path:
    """Write OUT/name atomically (replacing an older one of that name) and return its path."""
    from safetensors.torch import save_file

    missing = sorted(set(SGLANG_DRAFT_WEIGHTS) - set(weights))
    extra = sorted(set(weights) - set(SGLANG_DRAFT_WEIGHTS))
    if missing or extra:
        raise ValueError(f"draft weights do not match the SGLang layout: missing {missing}, unexpected {extra}")
    final = out / name
    tmp = out / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, str(tmp / WEIGHTS), {"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        torch.save(training_state, tmp / TRAINING_STATE)
        marker = {"step": training_state["step"], "epoch": training_state["epoch"]}
        (tmp / MARKER).write_text(json.dumps(marker) + "\n")
        if manifest is not None:
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        for path in [*tmp.iterdir(), tmp]:
            _fsync(path)
        older = _into_place(tmp, final, out / f".{name}.old-{os.getpid()}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a checkpoint is large: no half of one left on the disk
        raise
    try:
        _fsync(out)
    finally:
        if older is not None:
            shutil.rmtree(older, ignore_errors=True)
    return final


def _into_place(tmp: Path, final: Path, aside: Path) -> Path | None:
    """Make `tmp` the checkpoint `final`; the older one of that name, if any, is returned to be removed.

    The two are swapped in one step where the file system can, so that a reader of `final` finds the old one or
    the new one, whole. Where it cannot, the old one is set aside first and put back if the new one cannot take
    its place; only a death between those two renames leaves `final` missing (the old one whole, as `aside`).
    """
    if not final.exists():
        tmp.rename(final)
        return None
    try:
        exchange(tmp, final)
        return tmp
    except OSError as exc:
        if exc.errno not in NO_EXCHANGE:
            raise
    final.rename(aside)
    try:
        tmp.rename(final)
    except BaseException:
        aside.rename(final)
        raise
    return aside


def checkpoint_step(path: Path) -> int | None:
    try:
        step = json.loads((path / MARKER).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return step if isinstance(step, int) else None


def latest_checkpoint(out: Path) -> Path | None:
    """The complete checkpoint with the highest step in OUT (step-N folders and final)."""
    found: list[tuple[int, Path]] = []
    if out.is_dir():
        for path in out.iterdir():
            if not (STEP_DIR.fullmatch(path.name) or path.name == FINAL):
                continue
            step = checkpoint_step(path)
            if step is not None and (path / WEIGHTS).exists() and (path / TRAINING_STATE).exists():
                found.append((step, path))
    return max(found, key=lambda item: (item[0], item[1].name != FINAL))[1] if found else None


def read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise TrainError(f"{path / CONFIG} cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise TrainError(f"{path / CONFIG} is not a JSON object")
    return config


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        weights: dict[str, torch.Tensor] = load_file(str(path / WEIGHTS))
    except (OSError, ValueError) as exc:
        raise TrainError(f"{path / WEIGHTS} cannot be read: {exc}") from None
    missing = sorted(set(SGLANG_DRAFT_WEIGHTS) - set(weights))
    if missing:
        raise TrainError(f"{path / WEIGHTS} lacks {', '.join(missing)}: not a draft checkpoint of this layout")
    return weights


def load_training_state(path: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = torch.load(path / TRAINING_STATE, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError) as exc:
        raise TrainError(f"{path / TRAINING_STATE} cannot be read: {exc}") from None
    return state
