"""`convert`: rewrite a speculators or original-EAGLE draft (or a `layers.0.*` SGLang
draft) into the SGLang/SpecForge layout that every SGLang release loads.

Keys are renamed (`layers.0.` -> `midlayer.`, `model.` prefixes dropped), config.json
is rewritten (architecture, the flattened layer config, `draft_vocab_size`, aux
layer ids in eagle_config in the output-of-layer convention), `d2t`/`t2d` are
kept. A draft whose math SGLang cannot represent is refused with the reason.
SRC is never written; DST appears whole or not at all (written into a temporary
folder beside it, then renamed). The result is `doctor`'s verdict on DST.

    python -m backends.doctor.convert SRC DST [--to sglang]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.doctor.diagnosis import diagnose
from backends.doctor.reading import DraftFiles, load_state, read_draft
from backends.doctor.report import format_result
from backends.eagle3_contract import speculators_to_ours
from backends.protocol import DoctorResult
from backends.sglang import facts

if TYPE_CHECKING:
    import torch

TARGETS = ("sglang",)
# Layer-config fields the SGLang config carries over from the source.
_LAYER_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "max_position_embeddings",
    "vocab_size",
)


class ConvertError(ValueError):
    """A conversion refused; the message is one line that says why."""


def convert(src: Path, dst: Path, to: str = "sglang") -> DoctorResult:
    """Write the SGLang layout of draft `src` to the new folder `dst`; return doctor's result for `dst`."""
    if to not in TARGETS:
        raise ConvertError(f"unknown target layout {to!r}; known: {', '.join(TARGETS)}")
    _check_paths(src, dst)
    files, problems = read_draft(src)
    errors = [p["message"] for p in problems if p["severity"] == "error"]
    if files is None or errors:
        raise ConvertError(errors[0] if errors else f"{src} is not a draft")
    config = sglang_config(files)
    tensors = _renamed_tensors(files)
    _write_atomically(dst, config, tensors)
    return diagnose(dst)


def _check_paths(src: Path, dst: Path) -> None:
    if not src.exists():
        raise ConvertError(f"{src} does not exist")
    src_dir = (src.parent if src.is_file() else src).resolve()
    target = dst.resolve()
    if target == src_dir or target == src.resolve():
        raise ConvertError("DST is SRC: convert never overwrites its source")
    if target.is_relative_to(src_dir):
        raise ConvertError(f"DST {dst} lies inside SRC {src_dir}: choose a folder beside it")
    if dst.exists() or dst.is_symlink():
        raise ConvertError(f"{dst} already exists: convert writes a new folder and never replaces one")
    if not dst.parent.is_dir():
        raise ConvertError(f"{dst.parent} does not exist")


def sglang_config(files: DraftFiles) -> dict[str, Any]:
    """config.json of the SGLang layout for a draft in any layout doctor recognises."""
    config = files.config
    if files.format == "unknown":
        raise ConvertError(f"{files.root}: not a speculators, original-EAGLE or SGLang draft; nothing to convert from")
    if files.format == "sglang" and not any(n.startswith("layers.") for n in _bare_names(files)):
        raise ConvertError(f"{files.root} is already in the SGLang layout (midlayer.*); nothing to convert")
    if config.get("norm_before_residual"):
        raise ConvertError(
            "the draft uses norm_before_residual, which no SGLang release implements; retrain without it"
        )
    if files.format == "speculators":
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ConvertError("speculators config.json has no transformer_layer_config object")
        out = _with_rope_fields({**_layer_defaults(layer), **layer})
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        # speculators counts inputs to layers; SGLang's config field counts outputs.
        ours = speculators_to_ours(ids) if isinstance(ids, list) else None
        extra: dict[str, Any] = {k: config[k] for k in ("draft_vocab_size", "tie_word_embeddings") if k in config}
        if config.get("target_hidden_size") is not None:
            extra["target_hidden_size"] = config["target_hidden_size"]
    else:
        out = dict(config)
        eagle = config.get("eagle_config")
        ours = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
        extra = {}
    layers = out.get("num_hidden_layers", 1)
    if layers != 1:
        raise ConvertError(
            f"the draft has {layers} layers; the midlayer layout holds one (serve it as is with SGLang 0.5.23 or newer)"
        )
    result: dict[str, Any] = {
        "architectures": [facts.LLAMA_DRAFT],
        "model_type": "llama",
        "num_hidden_layers": 1,
        **{k: out[k] for k in _LAYER_FIELDS if k in out},
        "tie_word_embeddings": bool(out.get("tie_word_embeddings", False)),
        "bias": bool(out.get("bias", False)),
        **extra,
    }
    for key in ("torch_dtype", "dtype", "target_hidden_size", "draft_vocab_size"):
        if key in out and key not in result and out[key] is not None:
            result[key] = out[key]
    for option in facts.DRAFT_OPTIONS:  # kept for the releases that implement them
        if any(config.get(k) for k in option.config_keys):
            result[option.name] = True
    if "draft_vocab_size" not in result:
        result["draft_vocab_size"] = _head_rows(files)
    if ours is not None:
        result["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ours), "use_aux_hidden_state": True}
    return result


def _layer_defaults(layer: dict[str, Any]) -> dict[str, Any]:
    """Values of the fields speculators left out (it saves only the differences from the defaults)."""
    from transformers import AutoConfig

    try:
        defaults: dict[str, Any] = AutoConfig.for_model(layer.get("model_type", "llama")).to_dict()
    except ValueError as exc:
        raise ConvertError(f"transformer_layer_config has an unknown model_type: {exc}") from None
    return _with_rope_fields(defaults)


def _with_rope_fields(layer: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 folds rope_theta and rope_scaling into rope_parameters; SGLang reads the two fields."""
    rope = layer.pop("rope_parameters", None)
    if isinstance(rope, dict):
        if "rope_theta" in rope:
            layer["rope_theta"] = rope["rope_theta"]
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        if scaling.get("rope_type", "default") != "default":
            layer["rope_scaling"] = scaling
    return layer


def _head_rows(files: DraftFiles) -> int:
    for name, meta in files.tensors.items():
        if name.removeprefix("model.") == "lm_head.weight" and len(meta.shape) == 2:
            return meta.shape[0]
    raise ConvertError("config.json has no draft_vocab_size and the checkpoint has no lm_head.weight to take it from")


def _bare_names(files: DraftFiles) -> list[str]:
    return [n.removeprefix("model.") for n in files.tensors]


def sglang_name(name: str) -> str:
    """The SGLang-layout name of a checkpoint tensor."""
    bare = name.removeprefix("model.")
    if bare.startswith("layers.0."):
        return "midlayer." + bare.removeprefix("layers.0.")
    return bare


def _renamed_tensors(files: DraftFiles) -> dict[str, torch.Tensor]:

    # The files SGLang would load, in its order (a later copy of a name wins, as it does there); leftovers never.
    loaded: dict[str, torch.Tensor] = {}
    if files.weights != "safetensors":
        for file in files.loaded.files:
            loaded.update(load_state(file))
    else:
        from safetensors.torch import load_file

        for file in files.loaded.files:
            loaded.update(load_file(str(file)))
    renamed: dict[str, torch.Tensor] = {}
    seen_storage: set[int] = set()
    for name, tensor in loaded.items():
        new = sglang_name(name)
        if new in renamed:
            raise ConvertError(f"two tensors become {new} in the SGLang layout (one of them is {name})")
        # safetensors refuses tensors that share memory (a tied head, a view).
        storage = tensor.untyped_storage().data_ptr()
        tensor = tensor.clone() if storage in seen_storage else tensor.contiguous()
        seen_storage.add(storage)
        renamed[new] = tensor
    return renamed


def _write_atomically(dst: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        if dst.exists():
            raise ConvertError(f"{dst} appeared while converting; left it alone")
        os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="convert", description="Convert an EAGLE-3 draft to the SGLang layout.")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--to", default="sglang", choices=TARGETS)
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    try:
        result = convert(args.src, args.dst, args.to)
    except ConvertError as exc:
        print(f"convert: refused: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.dst}")
    print(format_result(result))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
