"""A checkpoint write interrupted at any of its steps loses nothing: real files in tmp_path, and a fault injected
at the k-th step that writes (a file, an fsync, a folder, a rename, the swap), for every k until one save runs
through untouched."""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from backends.eagle3_contract import MANIFEST, SGLANG_DRAFT_WEIGHTS
from backends.fileio import exchange
from backends.train import checkpoint

STEPS: list[tuple[Any, str]] = [
    (safetensors.torch, "save_file"),
    (torch, "save"),
    (Path, "write_text"),
    (Path, "write_bytes"),
    (os, "mkdir"),
    (os, "fsync"),
    (os, "rename"),
    (os, "replace"),
    (checkpoint, "exchange"),
]


def save(out: Path, name: str, step: int) -> None:
    """A checkpoint whose every file tells `step`: its weights are all `step`."""
    weights = {key: torch.full((2,), float(step)) for key in SGLANG_DRAFT_WEIGHTS}
    state = {"step": step, "epoch": 0}
    checkpoint.save_checkpoint(out, name, weights, {"step": step}, state, manifest={"step": step})


def whole(path: Path) -> int:
    """The step the checkpoint at `path` holds, each of its files read back and telling the same one."""
    step = checkpoint.checkpoint_step(path)
    assert step is not None, f"{path} has no readable {checkpoint.MARKER}"
    weights = checkpoint.load_weights(path)
    assert all(torch.equal(w, torch.full((2,), float(step))) for w in weights.values()), f"{path}: weights"
    assert checkpoint.read_config(path) == {"step": step}, f"{path}: config"
    assert checkpoint.load_training_state(path)["step"] == step, f"{path}: training state"
    assert json.loads((path / MANIFEST).read_text()) == {"step": step}, f"{path}: manifest"
    return step


def contents(path: Path) -> dict[str, str]:
    return {file.name: hashlib.sha256(file.read_bytes()).hexdigest() for file in sorted(path.iterdir())}


def interrupt_at(monkeypatch: pytest.MonkeyPatch, k: int) -> list[str]:
    """Make the k-th step that writes raise EIO before it does anything; the steps taken are listed."""
    taken: list[str] = []

    def wrapped(owner: Any, attr: str) -> None:
        real = getattr(owner, attr)

        def step(*args: Any, **kwargs: Any) -> Any:
            taken.append(attr)
            if len(taken) == k:
                raise OSError(errno.EIO, f"injected at step {k}, {attr}")
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, attr, step)

    for owner, attr in STEPS:
        wrapped(owner, attr)
    return taken


@pytest.fixture(params=["swap", "no swap"])
def file_system(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """This one (which swaps two folders in one step), or one that cannot (NFS): the fallback sets aside."""
    if request.param == "no swap":

        def cannot(a: Path, b: Path) -> None:
            raise OSError(errno.EINVAL, "Invalid argument")

        monkeypatch.setattr(checkpoint, "exchange", cannot)
    return str(request.param)


@pytest.mark.parametrize("name", ["step-10", "final"], ids=["a new name", "the name of an older one"])
def test_a_checkpoint_write_interrupted_at_any_step_leaves_the_previous_whole_and_latest_complete(
    tmp_path: Path, file_system: str, name: str
) -> None:
    base = tmp_path / "base"
    save(base, "step-5", 5)
    save(base, "final", 5)
    before = {kept: contents(base / kept) for kept in ("step-5", "final")}
    for k in itertools.count(1):
        out = shutil.copytree(base, tmp_path / str(k))
        with pytest.MonkeyPatch.context() as patch:
            taken = interrupt_at(patch, k)
            try:
                save(out, name, 10)
            except OSError as exc:
                assert exc.errno == errno.EIO and f"injected at step {k}," in str(exc)
        where = f"interrupted at step {k} of {taken}"
        assert whole(out / "step-5") == 5 and contents(out / "step-5") == before["step-5"], where
        if whole(out / "final") == 5:  # never missing, never a mix of the old one and the new one
            assert contents(out / "final") == before["final"], where
        else:
            assert name == "final", where
        assert set(os.listdir(out)) <= {"step-5", "final", "step-10"}, f"{where}: a temporary left behind"
        placed = (out / name).is_dir() and whole(out / name) == 10
        latest = checkpoint.latest_checkpoint(out)
        assert latest is not None and whole(latest) == (10 if placed else 5), where
        if len(taken) < k:  # this save ran through: every step before was interrupted once
            assert placed and latest == out / name
            break
    assert k > 10, f"only {k - 1} steps were interrupted: {taken}"


def test_exchange_swaps_two_folders_in_one_step(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "from-a").touch()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "from-b").touch()
    exchange(tmp_path / "a", tmp_path / "b")
    assert os.listdir(tmp_path / "a") == ["from-b"] and os.listdir(tmp_path / "b") == ["from-a"]
    with pytest.raises(FileNotFoundError):
        exchange(tmp_path / "a", tmp_path / "missing")
