"""SGLang's real loader on a draft, judged without the dry-load's method: run in the real-SGLang tier's Python.

    PYTHON tests/sglang_real_loader.py DRAFT...    (our package on PYTHONPATH)

SGLang's own model loader (`DefaultModelLoader.load_model`: its ModelConfig, its
choice of weight files, its weight iterator, the class's `load_weights` over the
whole checkpoint at once, as the server loads a draft) loads a copy of the draft
folder, every file in place, whose floating tensors hold fresh random values (each
file its own), into parameters filled with NaN first. Then every tensor the loader
fed (the last copy of a name fed twice) is looked for, row by row, in the model's
parameters (a tensor none of whose rows landed was ignored), and a parameter still
holding NaN was never written. Prints one JSON object, each draft's verdict by its
path: {"files": [names SGLang's _prepare_weights picked], "ignored": [...],
"unwritten": {param: fraction}, "hot_token_id_ok": bool}, or {"error": "..."} when
SGLang refuses the files (the server would not start).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import shutil
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


def _sglang(module: str) -> Any:
    return importlib.import_module(f"sglang.srt.{module}")  # sglang is not in the test venv: mypy must not need it


def _randomized(tensors: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(t.shape, generator=generator).to(t.dtype) if t.is_floating_point() else t
        for name, t in tensors.items()
    }


def _randomized_copy(draft: Path, folder: Path) -> None:
    """Every file of `draft` into `folder`; weight files SGLang could read get fresh values, the rest (a corrupt
    header, junk, a trainer's state) are copied byte for byte."""
    from safetensors.torch import load_file, save_file

    for seed, path in enumerate(sorted(draft.iterdir())):
        if not path.is_file():
            continue
        out = folder / path.name
        try:
            if path.suffix == ".safetensors":
                save_file(_randomized(load_file(str(path)), seed), str(out))
                continue
            if path.suffix in (".bin", ".pt"):
                state = torch.load(path, map_location="cpu", weights_only=True)
                if isinstance(state, dict) and all(isinstance(t, torch.Tensor) for t in state.values()):
                    torch.save(_randomized(state, seed), out)
                    continue
        except Exception:  # SGLang meets it as it is
            pass
        shutil.copy(path, out)


def _load_with_sglang(folder: Path) -> tuple[Any, list[str], list[tuple[str, torch.Tensor]]]:
    """The model SGLang loads from `folder`, the files it picked, and the tensors it fed `load_weights`."""
    from backends.sglang import runtime as sglang_runtime

    server_args = _sglang("server_args").ServerArgs(model_path=str(folder), device="cpu")
    sglang_runtime.start_one_rank(server_args, device="cpu")
    model_config = _sglang("configs.model_config").ModelConfig.from_server_args(
        server_args, model_path=str(folder), is_draft_model=True
    )
    cls, _ = _sglang("models.registry").ModelRegistry.resolve_model_cls(model_config.hf_config.architectures)
    load_weights = cls.load_weights
    fed: list[tuple[str, torch.Tensor]] = []

    def nan_first(model: Any, weights: Any) -> Any:
        """The parameters are torch.empty (any old memory, maybe a freed tensor's): NaN before the real load."""
        with torch.no_grad():
            for p in model.parameters():
                if p.is_floating_point():
                    p.fill_(float("nan"))
        fed.extend(weights)
        return load_weights(model, iter(fed))

    loader = _sglang("model_loader.loader").DefaultModelLoader(_sglang("configs.load_config").LoadConfig())
    _, files, _ = loader._prepare_weights(str(folder), None, fall_back_to_pt=True)
    cls.load_weights = nan_first
    try:
        with _rotary_kernel_stand_in():
            model = loader.load_model(
                model_config=model_config, device_config=_sglang("configs.device_config").DeviceConfig("cpu")
            )
    finally:
        cls.load_weights = load_weights
    return model, [Path(f).name for f in files], fed


def picked_files(folder: Path) -> dict[str, Any]:
    """The files SGLang's DefaultModelLoader picks from `folder` ({"files": [names]}), or why it refuses it."""
    from backends.sglang import runtime as sglang_runtime
    from tests.draft_fixtures import DraftSpec

    with tempfile.TemporaryDirectory() as tmp:  # server arguments need a model's config; the folder may have none
        (Path(tmp) / "config.json").write_text(json.dumps(DraftSpec().config()))
        sglang_runtime.publish_one_rank(_sglang("server_args").ServerArgs(model_path=tmp, device="cpu"), gpu_id=0)
    loader = _sglang("model_loader.loader").DefaultModelLoader(_sglang("configs.load_config").LoadConfig())
    try:
        _, files, _ = loader._prepare_weights(str(folder), None, fall_back_to_pt=True)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"files": [Path(f).name for f in files]}


def _rows(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows of `t` as the loader's copy into a parameter of `dtype` rounds them."""
    t = t.detach().to(dtype).float()
    return t.reshape(t.shape[0], -1) if t.dim() > 1 else t.reshape(1, -1)


@contextlib.contextmanager
def _rotary_kernel_stand_in() -> Iterator[None]:
    """No CUDA here: SGLang's rotary embedding takes its fallback kernel from vllm when it is built (as it would
    on any CPU-only machine). Nothing here runs a forward, so a module without kernels stands in for vllm's."""
    if importlib.util.find_spec("vllm") is not None:
        yield
        return
    package, kernels = types.ModuleType("vllm"), types.ModuleType("vllm._custom_ops")
    package.__path__ = []
    kernels.rotary_embedding = None  # type: ignore[attr-defined]
    sys.modules.update({"vllm": package, "vllm._custom_ops": kernels})
    try:
        yield
    finally:
        del sys.modules["vllm"], sys.modules["vllm._custom_ops"]


def judge(draft: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        _randomized_copy(draft, Path(tmp))
        try:
            model, files, fed = _load_with_sglang(Path(tmp))
        except Exception as exc:  # SGLang refuses the files: the server would crash at startup
            return {"error": f"{type(exc).__name__}: {exc}".replace(tmp, str(draft))}
    params = {name: (_rows(p, p.dtype), p.dtype) for name, p in model.named_parameters()}
    served = dict(fed)  # a name fed twice: the later copy overwrote the earlier
    ignored = []
    for name, tensor in served.items():
        if "d2t" in name or "t2d" in name:
            continue
        landed = False
        for prows, dtype in params.values():
            rows = _rows(tensor, dtype)
            if prows.shape[1] != rows.shape[1]:
                continue
            if (prows.unsqueeze(1) == rows.unsqueeze(0)).all(-1).any():  # some parameter row is a tensor row
                landed = True
                break
        if not landed:
            ignored.append(name)
    d2t = next((t for n, t in served.items() if "d2t" in n), None)
    hot = getattr(model, "hot_token_id", None)
    unwritten = {n: float(torch.isnan(p).float().mean()) for n, p in model.named_parameters() if p.is_floating_point()}
    return {
        "files": files,
        "ignored": ignored,
        "unwritten": {n: f for n, f in unwritten.items() if f},
        "hot_token_id_ok": d2t is None or (hot is not None and torch.equal(hot, d2t + torch.arange(d2t.shape[0]))),
    }


if __name__ == "__main__":
    print(json.dumps({draft: judge(Path(draft)) for draft in sys.argv[1:]}))
