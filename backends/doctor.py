"""`doctor`: why SGLang would drop, skip or refuse an EAGLE-3 draft, found from files alone.

SGLang loads a draft without a word about names it does not know and parameters
it never fills, and it skips `fc` when the target's features are one layer
wide; either way acceptance collapses to about 1.0. `diagnose` reads only
config.json files, safetensors headers (and the small `d2t` vector), an
original-EAGLE `pytorch_model.bin` through a memory map, and the extraction
manifest, and turns every such fault into a finding with a stable code and a
fix. It never raises for any file content. The SGLang knowledge it applies
lives in `sglang_facts`; `dryload` is the exact check with the real loader.

    python -m backends.doctor DRAFT [--target DIR] [--data DIR] [--sglang-version V]
                             [--context-length N] [--json] [--dry-load]
"""

from __future__ import annotations

import argparse
import array
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends import sglang_facts as facts
from backends.eagle3_contract import MANIFEST, ContractError, Manifest, read_manifest
from backends.protocol import DoctorResult, Finding, Severity
from backends.safetensors_header import (
    INDEX_FILE,
    INTEGER_DTYPES,
    HeaderError,
    TensorInfo,
    read_checkpoint,
    read_header,
    read_index,
)

# Every finding code, with what it means (stable: tools and docs key on them).
CODES: Mapping[str, str] = {
    "draft-format": "which checkpoint layout the draft is in (SGLang/SpecForge, speculators, original EAGLE bin)",
    "draft-not-found": "the draft folder, its config.json or its weights file is missing",
    "config-unreadable": "a config.json is not a JSON object",
    "config-invalid": "a draft config field SGLang needs is missing or not a valid value",
    "weights-unreadable": "the weights file is truncated, corrupt, or its header lies about the data",
    "sglang-version": "which SGLang release(s) the draft was checked against",
    "architecture": "config `architectures` is not an EAGLE-3 draft class this SGLang release knows",
    "model-type": "config `model_type` is one transformers cannot load as the draft's config class",
    "draft-vocab-size": "`draft_vocab_size` is missing or larger than `vocab_size`",
    "tied-embeddings": "`tie_word_embeddings` is true, so a separate lm_head is ignored",
    "num-layers": "`num_hidden_layers` is not 1 on a release that supports only one draft layer",
    "unsupported-option": "the config turns on a draft option this release does not implement",
    "weights-dropped": "checkpoint tensors SGLang's loader would skip without a word",
    "weights-missing": "draft parameters SGLang's loader would leave uninitialised",
    "weight-shape": "a tensor's shape disagrees with the config (SGLang's loader asserts: startup crash)",
    "fc-width": "`fc.weight` does not match num_aux x target_hidden_size -> hidden_size",
    "single-layer-features": "SGLang would feed one layer's features, so it never applies the trained fc",
    "aux-count-mismatch": "the width of the features SGLang captures differs from what fc takes",
    "lm-head-rows": "`lm_head.weight` rows differ from `draft_vocab_size`",
    "d2t-missing": "no `d2t` although the draft vocabulary is smaller than the target's",
    "d2t-length": "`d2t` length differs from `draft_vocab_size`",
    "d2t-range": "`d2t` maps draft ids outside the target vocabulary, or not one to one",
    "vocab-mismatch": "the draft's `vocab_size` or embedding differs from the target's vocabulary",
    "target-unreadable": "the target folder's config.json or weights cannot be read",
    "target-hidden-size": "the draft's `target_hidden_size` differs from the target's hidden size",
    "target-no-capture": "the target class cannot capture EAGLE-3 aux hidden states in this release",
    "aux-layers": "which aux layers the draft config, the manifest and SGLang name",
    "aux-ids-ignored": "aux layer ids outside `eagle_config`, where SGLang never reads them",
    "aux-layers-mismatch": "SGLang would capture other layers than the draft was trained on",
    "aux-layers-out-of-range": "an aux layer SGLang would capture does not exist in the target",
    "aux-layers-cuda-graph": "custom aux layers reach CUDA-graph replays only as the defaults (SGLang 0.5.5)",
    "manifest-missing": "the extraction folder has no manifest.json, so the trained aux layers are unknown",
    "manifest-invalid": "manifest.json cannot be read or breaks the contract",
    "manifest-mismatch": "the extraction manifest describes another target or draft geometry",
    "context-length": "the draft's context length is shorter than the target's (startup fails)",
    "doctor-failed": "doctor itself failed on this input (a bug: please report it)",
    "dry-load-skipped": "the dry-load with SGLang's own loader did not run",
    "dry-load-failed": "SGLang's own loader raised while building or loading the draft",
    "dry-load-unconsumed": "checkpoint tensors SGLang's real loader did not consume",
    "dry-load-unwritten": "draft parameters SGLang's real loader left unwritten",
}

CONVERT_FIX = "eagle3-console HOST convert {src} {dst} (writes the SGLang layout beside it)"
MAX_D2T_BYTES = 64 * 2**20
_ARRAY_CODES = {"I8": "b", "U8": "B", "I16": "h", "U16": "H", "I32": "i", "U32": "I", "I64": "q", "U64": "Q"}
_LAYER = re.compile(r"^(?:model\.)?(?:midlayer|layers\.(\d+))\.(.+)$")


def finding(code: str, severity: Severity, message: str, fix: str | None = None) -> Finding:
    if code not in CODES:
        raise KeyError(f"unregistered finding code {code!r}")
    return {"code": code, "severity": severity, "message": message, "fix": fix}


def convert_fix(draft: Path) -> str:
    return CONVERT_FIX.format(src=draft, dst=f"{draft}-sglang")


# --- reading the draft ------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorMeta:
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]


@dataclass
class DraftFiles:
    root: Path
    config: dict[str, Any]
    tensors: dict[str, TensorMeta]
    weights: str  # "safetensors" | "bin"
    format: str  # "sglang" | "speculators" | "eagle-bin" | "unknown"
    read_ints: Callable[[str], list[int] | None]  # values of a small integer tensor


def read_json_object(path: Path) -> dict[str, Any] | str:
    """The JSON object in `path`, or why it is not one."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path} cannot be read: {exc.strerror or exc}"
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return f"{path} is not JSON: {exc}"
    if not isinstance(data, dict):
        return f"{path} holds a JSON {type(data).__name__}, not an object"
    return data


def read_draft(path: Path) -> tuple[DraftFiles | None, list[Finding]]:
    """Config, tensor names/shapes and format of a draft folder (or of the folder of a weights file)."""
    root = path.parent if path.is_file() else path
    if not root.is_dir():
        return None, [finding("draft-not-found", "error", f"{path} is not a folder or a file", "check the path")]
    config = read_json_object(root / "config.json")
    if isinstance(config, str):
        code = "draft-not-found" if not (root / "config.json").exists() else "config-unreadable"
        return None, [finding(code, "error", f"draft config: {config}", "every draft needs its config.json")]
    bin_path = root / "pytorch_model.bin"
    has_safetensors = (root / INDEX_FILE).is_file() or any(root.glob("*.safetensors"))
    try:
        if has_safetensors:
            infos = read_checkpoint(root)
            tensors = {n: TensorMeta(i.dtype, i.shape) for n, i in infos.items()}
            files = DraftFiles(root, config, tensors, "safetensors", "", lambda n: _safetensors_ints(infos[n]))
        elif bin_path.is_file():
            files = _read_bin(root, config, bin_path)
        else:
            msg = f"{root} has no model.safetensors, {INDEX_FILE} or pytorch_model.bin"
            return None, [finding("draft-not-found", "error", msg, "point doctor at the checkpoint folder")]
    except HeaderError as exc:
        return None, [finding("weights-unreadable", "error", str(exc), "re-save or re-copy the checkpoint")]
    files.format = detect_format(config, files.tensors, files.weights)
    return files, []


def _safetensors_ints(info: TensorInfo) -> list[int] | None:
    code = _ARRAY_CODES.get(info.dtype)
    if code is None or info.nbytes > MAX_D2T_BYTES:
        return None
    with info.file.open("rb") as fh:
        fh.seek(info.offset)
        raw = fh.read(info.nbytes)
    values = array.array(code)
    values.frombytes(raw[: len(raw) - len(raw) % values.itemsize])
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


_TORCH_DTYPES = {
    "torch.float32": "F32",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.float64": "F64",
    "torch.int64": "I64",
    "torch.int32": "I32",
    "torch.int16": "I16",
    "torch.int8": "I8",
    "torch.uint8": "U8",
    "torch.bool": "BOOL",
}


def _read_bin(root: Path, config: dict[str, Any], path: Path) -> DraftFiles:
    import torch  # only original-EAGLE drafts need it; importing it costs seconds

    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise HeaderError(f"{path}: torch.load(mmap=True, weights_only=True) failed: {exc}") from None
    if isinstance(state, dict) and len(state) == 1 and isinstance(next(iter(state.values())), dict):
        state = next(iter(state.values()))  # {"state_dict": {...}} or {"module": {...}}
    if not isinstance(state, dict):
        raise HeaderError(f"{path}: holds a {type(state).__name__}, not a state dict")
    tensors = {str(k): v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if len(tensors) != len(state):
        others = sorted(str(k) for k, v in state.items() if not isinstance(v, torch.Tensor))
        raise HeaderError(f"{path}: entries that are not tensors: {', '.join(others[:5])}")
    metas = {k: TensorMeta(_TORCH_DTYPES.get(str(v.dtype), str(v.dtype)), tuple(v.shape)) for k, v in tensors.items()}

    def ints(name: str) -> list[int] | None:
        value = tensors[name]
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            return None
        return [int(x) for x in value.flatten().tolist()]

    return DraftFiles(root, config, metas, "bin", "", ints)


def detect_format(config: Mapping[str, Any], tensors: Mapping[str, TensorMeta], weights: str) -> str:
    names = list(tensors)
    has_midlayer = any(_layer_spelling(n) == "midlayer.*" for n in names)
    has_layers = any(_layer_spelling(n) == "layers.N.*" for n in names)
    archs = config.get("architectures")
    sglang_arch = isinstance(archs, list) and any(a in (facts.LLAMA_DRAFT, facts.MLA_DRAFT) for a in archs)
    if "speculators_config" in config or "speculators_model_type" in config:
        return "speculators"
    if weights == "bin":
        return "eagle-bin" if has_midlayer else "unknown"
    if has_midlayer or (has_layers and sglang_arch):
        return "sglang"
    return "unknown"


# --- the draft's geometry -----------------------------------------------------------------------


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _int_list(value: object) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


def sglang_view(files: DraftFiles) -> dict[str, Any]:
    """The config as SGLang would see it: LlamaConfig defaults for fields the file leaves out.

    A speculators config keeps the layer geometry in `transformer_layer_config`
    and its aux ids in the input-of-layer convention; it is flattened here the
    way `convert` writes it, so that its geometry can be checked before converting.
    """
    config = files.config
    if files.format != "speculators":
        return {**facts.LLAMA_CONFIG_DEFAULTS, **config}
    layer = config.get("transformer_layer_config")
    layer = layer if isinstance(layer, dict) else {}
    view: dict[str, Any] = {**facts.LLAMA_CONFIG_DEFAULTS, **layer}
    for key in ("draft_vocab_size", "tie_word_embeddings", *(k for o in facts.DRAFT_OPTIONS for k in o.config_keys)):
        if key in config:
            view[key] = config[key]
    if config.get("target_hidden_size") is not None:
        view["target_hidden_size"] = config["target_hidden_size"]
    ids = _int_list(config.get("eagle_aux_hidden_state_layer_ids"))
    if ids is not None:
        view["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids], "use_aux_hidden_state": True}
    view["architectures"] = config.get("architectures")
    return view


@dataclass
class Geometry:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    draft_vocab: int | None  # None: the head is borrowed from the target
    target_hidden: int
    num_layers: int


def geometry(view: Mapping[str, Any]) -> tuple[Geometry | None, list[Finding]]:
    found: list[Finding] = []
    values: dict[str, int] = {}
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "num_hidden_layers"):
        value = _positive_int(view.get(key))
        if value is None:
            found.append(
                finding("config-invalid", "error", f"draft config {key} = {view.get(key)!r} is not a positive integer")
            )
        else:
            values[key] = value
    kv = view.get("num_key_value_heads")
    kv_heads = values.get("num_attention_heads", 0) if kv is None else _positive_int(kv)
    if kv_heads is None:
        found.append(finding("config-invalid", "error", f"draft config num_key_value_heads = {kv!r} is not valid"))
    target_hidden = values.get("hidden_size", 0)
    if "target_hidden_size" in view:
        th = _positive_int(view["target_hidden_size"])
        if th is None:
            found.append(
                finding(
                    "config-invalid",
                    "error",
                    f"draft config target_hidden_size = {view['target_hidden_size']!r}: SGLang uses it as given "
                    "and fails to build fc",
                    "set it to the target's hidden size, or remove the key when it equals hidden_size",
                )
            )
        else:
            target_hidden = th
    draft_vocab = view.get("draft_vocab_size")
    if draft_vocab is not None and _positive_int(draft_vocab) is None:
        found.append(finding("config-invalid", "error", f"draft config draft_vocab_size = {draft_vocab!r} is invalid"))
    if found or kv_heads is None:
        return None, found
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    head_dim = _positive_int(view.get("head_dim")) or hidden // heads
    return Geometry(
        hidden=hidden,
        intermediate=values["intermediate_size"],
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=values["vocab_size"],
        draft_vocab=draft_vocab if isinstance(draft_vocab, int) else None,
        target_hidden=target_hidden,
        num_layers=values["num_hidden_layers"],
    ), []


def aux_ids(view: Mapping[str, Any]) -> list[int] | None:
    """eagle_config.eagle_aux_hidden_state_layer_ids, the only place SGLang reads them."""
    eagle = view.get("eagle_config")
    return _int_list(eagle.get("eagle_aux_hidden_state_layer_ids")) if isinstance(eagle, dict) else None


def enabled_options(view: Mapping[str, Any]) -> frozenset[str]:
    eagle = view.get("eagle_config") if isinstance(view.get("eagle_config"), dict) else {}
    on = set()
    for option in facts.DRAFT_OPTIONS:
        for key in option.config_keys:
            if view.get(key) or (option.in_eagle_config and isinstance(eagle, dict) and eagle.get(key)):
                on.add(option.name)
    return frozenset(on)


def num_aux(release: facts.ReleaseFacts, view: Mapping[str, Any]) -> int:
    """How many aux states SGLang sizes fc for."""
    if not release.num_aux_from_config:
        return 3
    explicit = _positive_int(view.get("num_aux_hidden_states"))
    ids = aux_ids(view)
    return explicit or (len(ids) if ids else 3)


# --- the target and the extraction ----------------------------------------------------------


@dataclass
class Target:
    path: Path
    architecture: str | None
    num_layers: int | None
    hidden: int | None
    vocab: int | None
    context_length: int


def read_target(path: Path) -> tuple[Target | None, list[Finding]]:
    config = read_json_object(path / "config.json")
    if isinstance(config, str):
        return None, [finding("target-unreadable", "error", f"target config: {config}", "check --target")]
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    target = Target(
        path=path,
        architecture=arch,
        num_layers=_positive_int(text.get("num_hidden_layers")),
        hidden=_positive_int(text.get("hidden_size")),
        vocab=_positive_int(text.get("vocab_size")) or _positive_int(config.get("vocab_size")),
        context_length=facts.derived_context_length(text),
    )
    found: list[Finding] = []
    if target.hidden is None or target.vocab is None:
        # Only then are the (possibly huge) target's headers worth reading.
        try:
            embed = [i for n, i in _embedding_header(path).items() if n.endswith("embed_tokens.weight")]
        except HeaderError as exc:
            embed = []
            found.append(finding("target-unreadable", "warning", f"target weights: {exc}"))
        if len(embed) == 1 and len(embed[0].shape) == 2:
            target.vocab = target.vocab or embed[0].shape[0]
            target.hidden = target.hidden or embed[0].shape[1]
    return target, found


def _embedding_header(path: Path) -> dict[str, TensorInfo]:
    """The header that holds the embedding: one shard's when an index names it, else all."""
    if (path / INDEX_FILE).is_file():
        shards = {s for n, s in read_index(path / INDEX_FILE).items() if n.endswith("embed_tokens.weight")}
        if len(shards) == 1:
            return read_header(path / shards.pop())
    return read_checkpoint(path)


def read_data(path: Path) -> tuple[Manifest | None, list[Finding]]:
    if not (path / MANIFEST).exists():
        msg = f"{path} has no {MANIFEST}: the aux layers the draft was trained on are unknown"
        fix = "pass the extraction folder this draft was trained from, or re-run the extraction with eagle3-console"
        return None, [finding("manifest-missing", "warning", msg, fix)]
    try:
        return read_manifest(path), []
    except ContractError as exc:
        return None, [finding("manifest-invalid", "error", str(exc), "re-run the extraction")]


# --- the rules --------------------------------------------------------------------------------


@dataclass
class Context:
    files: DraftFiles
    view: dict[str, Any]
    geo: Geometry | None
    target: Target | None
    manifest: Manifest | None
    context_length: int | None
    options: frozenset[str] = field(default_factory=frozenset)


def _canonical(name: str) -> str:
    """A checkpoint name with the layout's spelling removed: layer 0 is `layers.0.` either way."""
    match = _LAYER.match(name)
    if match:
        return f"layers.{match.group(1) or 0}.{match.group(2)}"
    return name.removeprefix("model.")


def version_independent_rules(ctx: Context) -> list[Finding]:
    found: list[Finding] = []
    view, geo, tensors = ctx.view, ctx.geo, ctx.files.tensors
    canon = {_canonical(n): n for n in tensors}
    if "draft_vocab_size" not in view:
        found.append(
            finding(
                "draft-vocab-size",
                "error",
                "draft config has no draft_vocab_size; SGLang reads it without a default and fails to start",
                'add "draft_vocab_size": <rows of lm_head.weight> to config.json (null borrows the target\'s head)',
            )
        )
    if geo is None:
        return found
    if geo.draft_vocab is not None and geo.draft_vocab > geo.vocab:
        found.append(
            finding(
                "draft-vocab-size",
                "error",
                f"draft_vocab_size {geo.draft_vocab} is larger than vocab_size {geo.vocab}",
                "draft_vocab_size counts the draft's head rows; vocab_size must be the target's vocabulary",
            )
        )
    if view.get("tie_word_embeddings") is True:
        if "lm_head.weight" in canon:
            found.append(
                finding(
                    "tied-embeddings",
                    "error",
                    "tie_word_embeddings is true, so SGLang uses the (target's) embedding as the head and skips "
                    "the checkpoint's trained lm_head.weight",
                    'set "tie_word_embeddings": false in config.json',
                )
            )
        else:
            found.append(
                finding(
                    "tied-embeddings",
                    "warning",
                    "tie_word_embeddings is true: the draft's head will be the target's embedding",
                    "EAGLE-3 drafts train their own head; check that this is intended",
                )
            )
    found += _shape_rules(ctx, canon)
    found += _vocab_rules(ctx, canon)
    found += _context_rule(ctx)
    if ctx.target is not None and ctx.target.hidden is not None and ctx.target.hidden != geo.target_hidden:
        found.append(
            finding(
                "target-hidden-size",
                "error",
                f"the draft expects target hidden states of width {geo.target_hidden}, "
                f"the target ({ctx.target.path}) has hidden_size {ctx.target.hidden}",
                "serve the draft with the target it was trained on, or set target_hidden_size correctly",
            )
        )
    found += _manifest_rules(ctx)
    return found


def _expected_layer_shape(rest: str, layer: int, g: Geometry) -> tuple[int, ...] | None:
    width = 2 * g.hidden if layer == 0 else g.hidden
    q, kv = g.heads * g.head_dim, g.kv_heads * g.head_dim
    return {
        "self_attn.q_proj.weight": (q, width),
        "self_attn.k_proj.weight": (kv, width),
        "self_attn.v_proj.weight": (kv, width),
        "self_attn.o_proj.weight": (g.hidden, q),
        "mlp.gate_proj.weight": (g.intermediate, g.hidden),
        "mlp.up_proj.weight": (g.intermediate, g.hidden),
        "mlp.down_proj.weight": (g.hidden, g.intermediate),
        "input_layernorm.weight": (g.hidden,),
        "hidden_norm.weight": (g.hidden,),
        "post_attention_layernorm.weight": (g.hidden,),
    }.get(rest)


def _shape_rules(ctx: Context, canon: Mapping[str, str]) -> list[Finding]:
    assert ctx.geo is not None
    g, tensors, found = ctx.geo, ctx.files.tensors, []
    bad: list[str] = []
    for name, original in canon.items():
        match = re.match(r"^layers\.(\d+)\.(.+)$", name)
        expected = _expected_layer_shape(match.group(2), int(match.group(1)), g) if match else None
        if name in ("norm.weight", "fc.bias"):
            expected = (g.hidden,)
        if expected is not None and tensors[original].shape != expected:
            bad.append(f"{original} is {list(tensors[original].shape)}, config implies {list(expected)}")
    if bad:
        found.append(
            finding(
                "weight-shape",
                "error",
                "shapes disagree with config.json (SGLang's loader asserts and startup crashes): " + "; ".join(bad),
                "fix hidden_size/intermediate_size/num_attention_heads/num_key_value_heads/head_dim in config.json "
                "to match the checkpoint",
            )
        )
    head = tensors.get(canon.get("lm_head.weight", ""))
    if head is not None and len(head.shape) == 2 and "draft_vocab_size" in ctx.view:
        rows = g.draft_vocab if g.draft_vocab is not None else g.vocab
        if head.shape[0] != rows:
            found.append(
                finding(
                    "lm-head-rows",
                    "error",
                    f"lm_head.weight has {head.shape[0]} rows, draft_vocab_size is {rows}",
                    f'set "draft_vocab_size": {head.shape[0]} in config.json (and check d2t has that length)',
                )
            )
        if head.shape[1] != g.hidden:
            found.append(
                finding("weight-shape", "error", f"lm_head.weight is {list(head.shape)}, hidden_size is {g.hidden}")
            )
    return found


def _vocab_rules(ctx: Context, canon: Mapping[str, str]) -> list[Finding]:
    assert ctx.geo is not None
    g, files, found = ctx.geo, ctx.files, []
    target_vocab = ctx.target.vocab if ctx.target else None
    if target_vocab is not None and target_vocab != g.vocab:
        found.append(
            finding(
                "vocab-mismatch",
                "error",
                f"draft vocab_size is {g.vocab}, the target's vocabulary has {target_vocab} tokens",
                "vocab_size must be the target's; train the draft for this target (its d2t maps into that vocabulary)",
            )
        )
    embed = files.tensors.get(canon.get("embed_tokens.weight", ""))
    if embed is not None and len(embed.shape) == 2 and embed.shape != (g.vocab, g.hidden):
        found.append(
            finding(
                "vocab-mismatch",
                "error",
                f"embed_tokens.weight is {list(embed.shape)}, config says {g.vocab} x {g.hidden} "
                "(vocab_size x hidden_size)",
                "the draft's embedding must be the target's: fix vocab_size/hidden_size or drop the tensor",
            )
        )
    vocab = target_vocab or g.vocab
    d2t_name = next((n for n in files.tensors if facts.HOT_TOKEN_MARK in n), None)
    draft_vocab = g.draft_vocab
    if d2t_name is None:
        if draft_vocab is not None and draft_vocab < vocab:
            found.append(
                finding(
                    "d2t-missing",
                    "error",
                    f"draft_vocab_size {draft_vocab} < vocab_size {vocab} but the checkpoint has no d2t: SGLang "
                    "would read draft token ids as target ids",
                    "export d2t (and t2d) from the trainer's vocabulary mapping into the checkpoint",
                )
            )
        return found
    meta = files.tensors[d2t_name]
    if draft_vocab is not None and meta.shape != (draft_vocab,):
        found.append(
            finding(
                "d2t-length",
                "error",
                f"{d2t_name} has shape {list(meta.shape)}, draft_vocab_size is {draft_vocab}",
                "rebuild d2t with one entry per draft token (pad the vocabulary mapping to draft_vocab_size)",
            )
        )
        return found
    values = files.read_ints(d2t_name) if meta.dtype in INTEGER_DTYPES else None
    if values is None:
        found.append(
            finding(
                "d2t-range",
                "error",
                f"{d2t_name} is {meta.dtype}, not an integer vector SGLang can use as token offsets",
                "save d2t as int64 offsets (target id = draft id + d2t[draft id])",
            )
        )
        return found
    targets = [i + v for i, v in enumerate(values)]
    outside = [i for i, t in enumerate(targets) if not 0 <= t < vocab]
    if outside:
        found.append(
            finding(
                "d2t-range",
                "error",
                f"{d2t_name} maps {len(outside)} draft ids outside the target vocabulary [0, {vocab}) "
                f"(first: draft id {outside[0]} -> {targets[outside[0]]})",
                "d2t must hold offsets (target id - draft id) into this target's vocabulary; rebuild it",
            )
        )
    elif len(set(targets)) != len(targets):
        found.append(
            finding(
                "d2t-range",
                "error",
                f"{d2t_name} maps {len(targets) - len(set(targets))} draft ids onto target ids already taken",
                "d2t must map draft ids one to one; rebuild it from the sorted token set",
            )
        )
    return found


def _context_rule(ctx: Context) -> list[Finding]:
    wanted = ctx.context_length or (ctx.target.context_length if ctx.target else None)
    if wanted is None:
        return []
    draft_len = facts.derived_context_length(ctx.view)
    if wanted <= draft_len:
        return []
    source = "--context-length" if ctx.context_length else "the target's config"
    return [
        finding(
            "context-length",
            "error",
            f"the draft's context length is {draft_len} (max_position_embeddings), {source} asks for {wanted}: "
            "SGLang refuses to start the draft",
            f'set "max_position_embeddings": {wanted} in the draft\'s config.json, or launch with '
            f"{facts.LONGER_CONTEXT_ENV}=1, or a smaller --context-length",
        )
    ]


def _manifest_rules(ctx: Context) -> list[Finding]:
    m, g, t = ctx.manifest, ctx.geo, ctx.target
    if m is None or g is None:
        return []
    problems = []
    if m.hidden_size != g.target_hidden:
        problems.append(f"hidden_size {m.hidden_size} (the draft expects {g.target_hidden})")
    if m.vocab_size != g.vocab:
        problems.append(f"vocab_size {m.vocab_size} (the draft says {g.vocab})")
    if t is not None:
        if t.num_layers is not None and m.num_layers != t.num_layers:
            problems.append(f"num_layers {m.num_layers} (the target has {t.num_layers})")
        if t.architecture is not None and m.architecture != t.architecture:
            problems.append(f"architecture {m.architecture} (the target is {t.architecture})")
    if not problems:
        return []
    return [
        finding(
            "manifest-mismatch",
            "error",
            "the extraction manifest describes another model: " + ", ".join(problems),
            "check that --data and --target belong to this draft's training run",
        )
    ]


def release_rules(ctx: Context, release: facts.ReleaseFacts) -> list[Finding]:
    """Rules whose outcome depends on the SGLang release."""
    found: list[Finding] = []
    view, draft = ctx.view, ctx.files.root
    archs = view.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch not in release.draft_architectures:
        known = ", ".join(sorted(release.draft_architectures))
        fix = (
            convert_fix(draft)
            if ctx.files.format in ("speculators", "eagle-bin")
            else f'set "architectures": ["{facts.LLAMA_DRAFT}"] in config.json'
        )
        found.append(
            finding(
                "architecture",
                "error",
                f"architectures {archs!r}: SGLang {release.version} loads EAGLE-3 drafts only as {known}",
                fix,
            )
        )
    model_type = ctx.files.config.get("model_type")
    if arch == facts.LLAMA_DRAFT and ctx.files.format != "speculators" and model_type != "llama":
        found.append(
            finding(
                "model-type",
                "error" if model_type in (None, "speculators", "eagle3") else "warning",
                f"model_type {model_type!r}: SGLang builds {facts.LLAMA_DRAFT} from a LlamaConfig",
                'set "model_type": "llama" in config.json',
            )
        )
    layers = _positive_int(view.get("num_hidden_layers"))
    too_many = release.max_draft_layers is not None and layers is not None and layers > release.max_draft_layers
    if too_many:
        found.append(
            finding(
                "num-layers",
                "error",
                f"num_hidden_layers is {layers}; SGLang {release.version} supports only "
                f"{release.max_draft_layers} draft layer ('EAGLE3 currently only supports 1 layer')",
                "upgrade SGLang to 0.5.23 or newer for multi-layer drafts, or train a one-layer draft",
            )
        )
    unsupported = sorted(o for o in ctx.options if o not in release.options)
    for name in unsupported:
        option = next(o for o in facts.DRAFT_OPTIONS if o.name == name)
        newer = [v for v, r in facts.RELEASES.items() if name in r.options]
        fix = f"serve with SGLang {newer[-1]} or newer" if newer else "retrain the draft without it"
        found.append(
            finding(
                "unsupported-option",
                "error",
                f"the draft uses {name} ({option.what}); SGLang {release.version} does not implement it, "
                "so it serves different math than was trained",
                fix,
            )
        )
    if ctx.geo is not None and arch != facts.MLA_DRAFT and not too_many:
        found += _weight_name_rules(ctx, release)
    if ctx.geo is not None:
        found += _feature_rules(ctx, release)
    return found


def _option_prefixes(options: Iterable[str]) -> tuple[str, ...]:
    return tuple(p for o in facts.DRAFT_OPTIONS if o.name in options for p in o.weight_prefixes)


def _weight_name_rules(ctx: Context, release: facts.ReleaseFacts) -> list[Finding]:
    """Simulate load_weights: which tensors it skips and which parameters it never fills."""
    assert ctx.geo is not None
    g, view, draft = ctx.geo, ctx.view, ctx.files.root
    tied = view.get("tie_word_embeddings") is True
    params = facts.llama_draft_parameters(
        release,
        num_layers=g.num_layers,
        num_aux=num_aux(release, view),
        fc_bias=bool(view.get("bias")),
        tied=tied,
        options=ctx.options,
    )
    filled: dict[str, set[str | int | None]] = {p: set() for p in params}
    dropped: list[str] = []
    for name in ctx.files.tensors:
        param, shard = facts.sglang_destination(release, name, params)
        if param:
            filled[param].add(shard)
        elif shard is None:
            dropped.append(name)
    # Parameters SGLang fills from the target after loading.
    optional = {"model.embed_tokens.weight"} if g.target_hidden == g.hidden else set()
    if g.draft_vocab is None:
        optional.add("lm_head.weight")
    optional |= {p for p in params if re.match(r"model\.layers\.[1-9]\d*\.input_layernorm", p)}  # unused
    missing = sorted(p for p, shards in filled.items() if p not in optional and set(params[p]) - shards)

    # Tensors already explained by another finding are not reported twice.
    unsupported = [o for o in ctx.options if o not in release.options]
    explained = _option_prefixes(unsupported)
    dropped = [n for n in dropped if not n.removeprefix("model.").startswith(explained)]
    if tied:
        dropped = [n for n in dropped if n.removeprefix("model.") != "lm_head.weight"]
    found: list[Finding] = []
    renamed = [n for n in dropped if _LAYER.match(n)]
    if renamed:
        layout = "layers.N" if release.layer_template == "midlayer" else "midlayer"
        # The layer parameters these tensors were meant for are the same fault.
        missing = [p for p in missing if not _LAYER.match(p.removeprefix("model."))]
        found.append(
            finding(
                "weights-dropped",
                "error",
                f"SGLang {release.version} names the draft layer {release.layer_template.format(i='N')}.*, the "
                f"checkpoint has {layout}.* ({len(renamed)} tensors, e.g. {renamed[0]}): SGLang skips them without "
                "a word and serves an untrained layer (acceptance about 1.0)",
                f"run {convert_fix(draft)}, or upgrade SGLang to 0.5.23 or newer (it also loads layers.0.*)",
            )
        )
    others = [n for n in dropped if not _LAYER.match(n)]
    for name in others:
        hint = _dropped_hint(name)
        found.append(
            finding(
                "weights-dropped",
                "error" if hint else "warning",
                f"SGLang {release.version} skips checkpoint tensor {name}: no parameter has that name"
                + (f" ({hint[0]})" if hint else ""),
                hint[1] if hint else "remove the tensor, or rename it to the SGLang name it was meant for",
            )
        )
    if missing:
        found.append(
            finding(
                "weights-missing",
                "error",
                f"SGLang {release.version} would leave {len(missing)} parameter(s) uninitialised: "
                + ", ".join(_describe_missing(p, params[p], filled[p]) for p in missing),
                "add the tensors to the checkpoint (re-export from the trainer); SGLang never reports them",
            )
        )
    return found


def _dropped_hint(name: str) -> tuple[str, str] | None:
    bare = name.removeprefix("model.")
    if bare.startswith("input_norm."):
        return "trained with norm_before_fc", 'set "norm_before_fc": true in config.json (SGLang 0.5.23 or newer)'
    if bare.startswith(("fc_norm.", "aux_norm_")):
        return "trained with fc_norm", 'set "fc_norm": true in config.json (SGLang 0.5.23 or newer)'
    if bare.startswith("lm_head") and name != bare:
        return "SGLang expects the head as lm_head.weight at top level", "rename it to lm_head.weight"
    return None


def _describe_missing(param: str, shards: tuple[str | int | None, ...], got: set[str | int | None]) -> str:
    name = param.removeprefix("model.")
    if shards == (None,):
        return name
    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", 0: "gate_proj", 1: "up_proj"}
    lacking = [names.get(s, str(s)) for s in shards if s not in got]
    return f"{name} (no {'/'.join(lacking)})"


def _feature_rules(ctx: Context, release: facts.ReleaseFacts) -> list[Finding]:
    """What the target will feed the draft, against what the draft's fc takes."""
    assert ctx.geo is not None
    g, view, found = ctx.geo, ctx.view, []
    canon = {_canonical(n): n for n in ctx.files.tensors}
    fc = ctx.files.tensors.get(canon.get("fc.weight", ""))
    sglang_fc_in = num_aux(release, view) * g.target_hidden
    target_hidden = g.target_hidden  # a target that disagrees is reported as target-hidden-size
    ids = aux_ids(view)
    eagle = view.get("eagle_config")
    flag = eagle.get("use_aux_hidden_state") if isinstance(eagle, dict) else None
    use_aux = not (release.honours_use_aux_flag and flag is False)
    capture = _capture(ctx, release, ids)
    found += capture.findings
    n_features = (capture.count if capture.count is not None else len(ids) if ids else 3) if use_aux else 1
    delivered = n_features * target_hidden
    if fc is None or len(fc.shape) != 2:
        return found
    fc_out, fc_in = fc.shape
    if fc_out != g.hidden:
        found.append(
            finding(
                "fc-width",
                "error",
                f"fc.weight is {list(fc.shape)}: its output must be hidden_size {g.hidden}",
                "fix hidden_size in config.json or re-export fc",
            )
        )
    if delivered == g.hidden and fc_in != g.hidden:
        why = (
            "eagle_config.use_aux_hidden_state is false"
            if not use_aux
            else f"{n_features} aux layer(s) x target hidden {target_hidden}"
        )
        fix = (
            'set "use_aux_hidden_state": true in eagle_config'
            if not use_aux
            else "list the aux layers the draft was trained on in eagle_config.eagle_aux_hidden_state_layer_ids"
            + (f" ({ctx.manifest.aux_layer_ids} per the extraction manifest)" if ctx.manifest else "")
        )
        found.append(
            finding(
                "single-layer-features",
                "error",
                f"SGLang {release.version} will feed features of width {delivered} ({why}) = hidden_size, so it "
                f"skips fc, whose weights expect {fc_in} fused features: the trained fc is never applied "
                "(acceptance about 1.0)",
                fix,
            )
        )
    elif fc_in != sglang_fc_in:
        layers_trained = fc_in / g.target_hidden
        found.append(
            finding(
                "fc-width",
                "error",
                f"fc.weight takes {fc_in} features ({layers_trained:g} x target hidden {g.target_hidden}); SGLang "
                f"{release.version} builds fc for {sglang_fc_in} ({num_aux(release, view)} aux layers): the loader "
                "asserts and startup crashes",
                "make eagle_config.eagle_aux_hidden_state_layer_ids list the layers fc was trained on"
                if release.num_aux_from_config and fc_in % g.target_hidden == 0
                else "fc must be trained on 3 aux layers for this SGLang release; check target_hidden_size",
            )
        )
    elif delivered != fc_in:
        found.append(
            finding(
                "aux-count-mismatch",
                "error",
                f"the target will deliver {n_features} x {target_hidden} = {delivered} features, fc takes {fc_in}",
                "make the captured aux layers and target_hidden_size match what the draft was trained on",
            )
        )
    return found


@dataclass
class Capture:
    count: int | None  # distinct in-range capture points, None when unknown
    findings: list[Finding]


def _capture(ctx: Context, release: facts.ReleaseFacts, ids: list[int] | None) -> Capture:
    """Which target layers SGLang captures, against the manifest and the draft config."""
    found: list[Finding] = []
    t, m = ctx.target, ctx.manifest
    if t is None or t.architecture is None or t.num_layers is None:
        if m is not None and ids is not None and ids != m.aux_layer_ids:
            found.append(_mismatch(release, ids, m.aux_layer_ids, "the draft config lists"))
        return Capture(None, found)
    if t.architecture not in release.capture_classes:
        found.append(
            finding(
                "target-no-capture",
                "error",
                f"{t.architecture} has no set_eagle3_layers_to_capture in SGLang {release.version}: the scheduler "
                "fails at startup",
                "use a newer SGLang that implements EAGLE-3 capture for this model, or another target",
            )
        )
        return Capture(None, found)
    rule = release.capture_rules.get(t.architecture, "plus_one")
    points = facts.capture_points(rule, t.num_layers, ids)
    reachable = facts.capturable(rule, t.num_layers)
    outputs = [p - 1 for p in points]
    found.append(
        finding(
            "aux-layers",
            "info",
            f"draft config aux ids: {ids if ids is not None else 'none (SGLang defaults)'}; manifest: "
            f"{m.aux_layer_ids if m else 'not given'}; SGLang {release.version} captures {t.architecture} at the "
            f"inputs of layers {points} = outputs of layers {outputs} ({facts.CAPTURE_RULES[rule]})",
        )
    )
    outside = [p for p in points if p not in reachable]
    count: int | None = len(set(points))
    if outside:
        count = None  # the width consequence is this same fault
        found.append(
            finding(
                "aux-layers-out-of-range",
                "error",
                f"SGLang would capture at the inputs of layers {outside}, which {t.architecture} with "
                f"{t.num_layers} layers never reaches: those features are silently missing",
                "aux ids count outputs of layers 0..N-1; fix eagle_config.eagle_aux_hidden_state_layer_ids",
            )
        )
    elif len(set(points)) != len(points):
        count = None
        found.append(
            finding(
                "aux-layers-out-of-range",
                "error",
                f"aux ids {ids} repeat a layer; SGLang captures it once, so the features are too narrow",
                "list each aux layer once",
            )
        )
    trained = m.aux_layer_ids if m is not None else ids
    if trained is not None and outputs != trained:
        source = "the extraction manifest says the draft was trained on" if m else "the draft config lists"
        found.append(_mismatch(release, outputs, trained, source, t.architecture))
    default_points = facts.capture_points(rule, t.num_layers, None)
    if release.custom_ids_after_graph_capture and ids is not None and points != default_points:
        found.append(
            finding(
                "aux-layers-cuda-graph",
                "warning",
                f"SGLang {release.version} captures the target's CUDA graphs with the default layers "
                f"{default_points} before it applies the draft's {points}; graph replays (decode, verify) feed "
                "the defaults",
                "launch with --disable-cuda-graph, upgrade SGLang to 0.5.23 or newer, "
                "or train the draft on the default layers",
            )
        )
    return Capture(count, found)


def _mismatch(
    release: facts.ReleaseFacts, captured: list[int], trained: list[int], source: str, arch: str | None = None
) -> Finding:
    what = f"SGLang {release.version} captures outputs of layers {captured}" + (f" for {arch}" if arch else "")
    if arch is None:
        what = f"the draft config lists {captured}"
    return finding(
        "aux-layers-mismatch",
        "error",
        f"{what}, but {source} {trained}: the draft sees other layers than it was trained on",
        "write the trained ids (output-of-layer convention) into eagle_config.eagle_aux_hidden_state_layer_ids"
        + (" as this target family expects them" if arch and release.capture_rules.get(arch) else ""),
    )


# --- putting it together ----------------------------------------------------------------------


def _versions(requested: str | None) -> tuple[list[str], list[Finding]]:
    source = "--sglang-version"
    if requested is None:
        requested = facts.installed_version()
        source = "the installed sglang"
    if requested is None:
        versions = list(facts.KNOWN_VERSIONS)
        msg = f"no --sglang-version and no sglang installed here: checked against {', '.join(versions)}"
        fix = "pass --sglang-version, or run doctor on the host that serves"
        return versions, [finding("sglang-version", "info", msg, fix)]
    nearest = facts.nearest_known(requested)
    if nearest is None:
        versions = list(facts.KNOWN_VERSIONS)
        return versions, [
            finding("sglang-version", "warning", f"{source} {requested!r} is not a version; checked all known")
        ]
    if nearest != requested:
        msg = f"SGLang {requested} ({source}) is not one doctor knows; applied the rules of {nearest}"
        return [nearest], [finding("sglang-version", "info", msg)]
    return [nearest], [finding("sglang-version", "info", f"checked against SGLang {nearest} ({source})")]


def _merge(per_version: Mapping[str, list[Finding]]) -> list[Finding]:
    """One finding where all releases agree; otherwise each tagged with its release."""
    versions = list(per_version)
    keys = [[(f["code"], f["severity"], f["message"], f["fix"]) for f in per_version[v]] for v in versions]
    merged: list[Finding] = []
    for version, findings, own in zip(versions, per_version.values(), keys, strict=True):
        for item, key in zip(findings, own, strict=True):
            if all(key in other for other in keys):
                if version == versions[0]:
                    merged.append(item)
            else:
                message = item["message"]
                if f"SGLang {version}" not in message:
                    message = f"[SGLang {version}] {message}"
                merged.append({**item, "message": message})
    return merged


def diagnose(
    draft: Path,
    *,
    target: Path | None = None,
    data: Path | None = None,
    sglang_version: str | None = None,
    context_length: int | None = None,
) -> DoctorResult:
    """Every finding about `draft` (and its target and extraction data) for the SGLang release(s) that serve it."""
    versions, findings = _versions(sglang_version)
    fmt = "unknown"
    try:
        fmt = _diagnose(draft, target, data, versions, context_length, findings)
    except Exception as exc:  # the promise is findings, never a traceback
        findings.append(finding("doctor-failed", "error", f"doctor failed: {type(exc).__name__}: {exc}"))
    return {
        "draft": str(draft),
        "format": fmt,
        "sglang_versions": versions,
        "findings": findings,
        "errors": sum(f["severity"] == "error" for f in findings),
        "warnings": sum(f["severity"] == "warning" for f in findings),
    }


_FORMAT_NAMES = {
    "sglang": "SpecForge/SGLang layout",
    "speculators": "speculators layout (layers.0.*, speculators_config)",
    "eagle-bin": "original EAGLE pytorch_model.bin",
    "unknown": "unrecognised layout",
}


def _diagnose(
    draft: Path,
    target_path: Path | None,
    data: Path | None,
    versions: list[str],
    context_length: int | None,
    findings: list[Finding],
) -> str:
    files, problems = read_draft(draft)
    findings += problems
    if files is None:
        return "unknown"
    spellings = sorted({s for s in map(_layer_spelling, files.tensors) if s})
    findings.append(
        finding(
            "draft-format",
            "warning" if files.format == "unknown" else "info",
            f"{_FORMAT_NAMES[files.format]}: {len(files.tensors)} tensors in {files.weights}"
            + (f", decoder layer named {' and '.join(spellings)}" if spellings else ", no decoder layer tensors"),
            convert_fix(files.root) if files.format in ("speculators", "eagle-bin") else None,
        )
    )
    view = sglang_view(files)
    geo, problems = geometry(view)
    findings += problems
    target, manifest = None, None
    if target_path is not None:
        target, problems = read_target(target_path)
        findings += problems
    if data is not None:
        manifest, problems = read_data(data)
        findings += problems
    ctx = Context(files, view, geo, target, manifest, context_length, enabled_options(view))
    if files.format != "speculators" and aux_ids(view) is None and "eagle_aux_hidden_state_layer_ids" in files.config:
        findings.append(
            finding(
                "aux-ids-ignored",
                "warning",
                "config.json has eagle_aux_hidden_state_layer_ids at top level; SGLang reads them only from "
                "eagle_config, so it captures its default layers",
                'move them to "eagle_config": {"eagle_aux_hidden_state_layer_ids": [...]} (output-of-layer convention)',
            )
        )
    findings += version_independent_rules(ctx)
    findings += _merge({v: release_rules(ctx, facts.RELEASES[v]) for v in versions})
    return files.format


def _layer_spelling(name: str) -> str:
    """ "midlayer.*" or "layers.N.*" for a decoder-layer tensor, "" for any other."""
    match = _LAYER.match(name)
    if not match:
        return ""
    return "layers.N.*" if match.group(1) is not None else "midlayer.*"


# --- command line -----------------------------------------------------------------------------


def format_result(result: DoctorResult) -> str:
    lines = [
        f"draft {result['draft']} ({result['format']}), SGLang {', '.join(result['sglang_versions'])}",
    ]
    for item in result["findings"]:
        lines.append(f"{item['severity'].upper()} {item['code']}: {item['message']}")
        if item["fix"]:
            lines.append(f"  fix: {item['fix']}")
    lines.append(f"{result['errors']} error(s), {result['warnings']} warning(s)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="doctor", description="Check an EAGLE-3 draft against SGLang before a launch.")
    p.add_argument("draft", type=Path)
    p.add_argument("--target", type=Path, help="the target model folder (config.json, safetensors)")
    p.add_argument("--data", type=Path, help="the extraction folder the draft was trained from")
    p.add_argument("--sglang-version", help="the SGLang release that will serve (default: the installed one)")
    p.add_argument("--context-length", type=int, help="the --context-length the server will get")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--dry-load", action="store_true", help="also load the draft with the installed SGLang's loader")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    from backends.preflight import full_diagnosis  # preflight builds on this module

    result = full_diagnosis(
        args.draft,
        target=args.target,
        data=args.data,
        sglang_version=args.sglang_version,
        context_length=args.context_length,
        dry_load=args.dry_load,
    )
    print(json.dumps(result, indent=2) if args.json else format_result(result))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
