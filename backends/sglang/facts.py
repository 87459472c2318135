"""What eagle3-console knows about specific SGLang releases, as plain data.

Read from the Python sources of SGLang 0.5.5 and 0.5.23 (llama_eagle3.py, the
target models' `set_eagle3_layers_to_capture`, model_runner and model_config).
When SGLang changes, this file changes; `doctor` and `dryload` hold the rules
that use it. Nothing here imports sglang: the installed version is read from
the package metadata, of this interpreter or, in a child, of a serve command's.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KNOWN_VERSIONS: tuple[str, ...] = ("0.5.5", "0.5.23")

LLAMA_DRAFT = "LlamaForCausalLMEagle3"
MLA_DRAFT = "Eagle3DeepseekV2ForCausalLM"

# SGLang reads the draft config through transformers' LlamaConfig, so a field the
# file leaves out takes these values (transformers 4.4x-5.x).
LLAMA_CONFIG_DEFAULTS: Mapping[str, Any] = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "max_position_embeddings": 2048,
    "vocab_size": 32000,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}

# Config keys SGLang consults, in order, for a model's context length; with none
# of them it assumes 2048. A rope `factor` multiplies it unless the rope type is
# llama3 or the scaling names `original_max_position_embeddings`.
CONTEXT_LENGTH_KEYS: tuple[str, ...] = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
DEFAULT_CONTEXT_LENGTH = 2048
LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


@dataclass(frozen=True)
class DraftOption:
    """A draft-config option that changes the draft's math."""

    name: str
    config_keys: tuple[str, ...]  # any of these true (top level, or in eagle_config where noted) turns it on
    in_eagle_config: bool  # SGLang also reads it from eagle_config
    weight_prefixes: tuple[str, ...]  # checkpoint names that exist only with the option
    what: str


DRAFT_OPTIONS: tuple[DraftOption, ...] = (
    DraftOption(
        "norm_before_fc",
        ("norm_before_fc",),
        True,
        ("input_norm.",),
        "one RMSNorm over the concatenated aux states before fc (weights input_norm.*)",
    ),
    DraftOption(
        "fc_norm",
        ("fc_norm", "use_aux_norm"),
        False,
        ("fc_norm.", "aux_norm_low.", "aux_norm_mid.", "aux_norm_high."),
        "one RMSNorm per aux state before fc (weights fc_norm.*)",
    ),
    DraftOption("norm_output", ("norm_output",), False, (), "the draft feeds its normed output to the next step"),
    DraftOption(
        "norm_before_residual",
        ("norm_before_residual",),
        False,
        (),
        "hidden_norm applied before the residual is stored",
    ),
)


@dataclass(frozen=True)
class ReleaseFacts:
    """How one SGLang release loads an EAGLE-3 draft and captures the target's features."""

    version: str
    draft_architectures: frozenset[str]
    # Module path of decoder layer i inside the draft ("{i}" is the layer index).
    layer_template: str
    # Substring replacements SGLang applies to every checkpoint name before matching.
    legacy_renames: tuple[tuple[str, str], ...]
    max_draft_layers: int | None  # None: any number
    # True: fc width follows the config (num_aux_hidden_states, else the length of
    # eagle_config.eagle_aux_hidden_state_layer_ids, else 3); False: always 3.
    num_aux_from_config: bool
    options: frozenset[str]  # DRAFT_OPTIONS this release implements
    honours_use_aux_flag: bool  # eagle_config.use_aux_hidden_state false switches to single-layer features
    # Custom aux ids are applied after the target's CUDA graphs were captured with
    # the default layers, so graph replays (decode/verify) use the defaults.
    custom_ids_after_graph_capture: bool
    capture_classes: frozenset[str]  # target classes with set_eagle3_layers_to_capture
    capture_rules: Mapping[str, str]  # target class -> rule name in CAPTURE_RULES; others: "plus_one"


_CAPTURE_0_5_5 = frozenset(
    {
        "ApertusForCausalLM",
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "Glm4MoeForCausalLM",
        "GptOssForCausalLM",
        "InternLM3ForCausalLM",
        "Llama4ForCausalLM",
        "Llama4ForConditionalGeneration",
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Phi3ForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
    }
)

_CAPTURE_0_5_23 = _CAPTURE_0_5_5 | frozenset(
    {
        "BailingMoEForCausalLM",
        "BailingMoeForCausalLM",
        "BailingMoeV2ForCausalLM",
        "Cosmos3ForConditionalGeneration",
        "ExaoneMoEForCausalLM",
        "ExaoneMoeForCausalLM",
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "Glm4MoeLiteForCausalLM",
        "Glm5NextForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "IQuestCoderForCausalLM",
        "InternS1ProForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration",
        "KimiK25ForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "MellumForCausalLM",
        "MiniMaxM2ForCausalLM",
        "MiniMaxM3SparseForCausalLM",
        "MiniMaxM3SparseForConditionalGeneration",
        "Ministral3ForCausalLM",
        "MistralLarge3ForCausalLM",
        "Qwen3NextForCausalLM",
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration",
        "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
        "SarvamMoEForCausalLM",
        "TeleFLMForCausalLM",
    }
)

# 0.5.23: the DeepSeek-V2 family (and classes built on it) and GLM-4-MoE-lite
# add +1 only when the first id is 1; gpt-oss keeps ids whose max is the layer
# count; MiniMax-M3 VL adds +1 to its defaults too.
_DEEPSEEK_RULE_0_5_23 = (
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "GlmMoeDsaForCausalLM",
    "MistralLarge3ForCausalLM",
    "KimiK25ForConditionalGeneration",
)

RELEASES: Mapping[str, ReleaseFacts] = {
    "0.5.5": ReleaseFacts(
        version="0.5.5",
        draft_architectures=frozenset({LLAMA_DRAFT}),
        layer_template="midlayer",
        legacy_renames=(),
        max_draft_layers=1,
        num_aux_from_config=False,
        options=frozenset(),
        honours_use_aux_flag=False,
        custom_ids_after_graph_capture=True,
        capture_classes=_CAPTURE_0_5_5,
        capture_rules={},
    ),
    "0.5.23": ReleaseFacts(
        version="0.5.23",
        draft_architectures=frozenset({LLAMA_DRAFT, MLA_DRAFT}),
        layer_template="layers.{i}",
        legacy_renames=(
            ("midlayer", "layers.0"),
            ("aux_norm_low", "fc_norm.0"),
            ("aux_norm_mid", "fc_norm.1"),
            ("aux_norm_high", "fc_norm.2"),
        ),
        max_draft_layers=None,
        num_aux_from_config=True,
        options=frozenset({"norm_before_fc", "fc_norm", "norm_output"}),
        honours_use_aux_flag=True,
        custom_ids_after_graph_capture=False,
        capture_classes=_CAPTURE_0_5_23,
        capture_rules={
            **dict.fromkeys(_DEEPSEEK_RULE_0_5_23, "plus_one_if_first_is_1"),
            "GptOssForCausalLM": "keep_if_max_is_num_layers",
            "MiniMaxM3SparseForConditionalGeneration": "plus_one_with_defaults",
        },
    ),
}

CAPTURE_RULES: Mapping[str, str] = {
    "plus_one": "captures at the input of layer id+1 (the output of layer id); default inputs [2, N//2, N-3]",
    "plus_one_if_first_is_1": "adds +1 only when the first id is 1, else captures at the inputs of the ids as given",
    "keep_if_max_is_num_layers": "keeps the ids as capture points when their max equals the layer count, else +1",
    "plus_one_with_defaults": "adds +1 to the ids and to its defaults [2, N//2, N-3]",
}


def capture_points(rule: str, num_layers: int, config_ids: list[int] | None) -> list[int]:
    """Layer indices at whose input SGLang captures, for the draft config's ids (None: defaults)."""
    defaults = [2, num_layers // 2, num_layers - 3]
    if config_ids is None:
        return [i + 1 for i in defaults] if rule == "plus_one_with_defaults" else defaults
    if rule == "plus_one_if_first_is_1" and not (config_ids and config_ids[0] == 1):
        return list(config_ids)
    if rule == "keep_if_max_is_num_layers" and config_ids and max(config_ids) == num_layers:
        return list(config_ids)
    return [i + 1 for i in config_ids]


def capturable(rule: str, num_layers: int) -> range:
    """Capture points the target's forward can reach (a point outside is silently never captured)."""
    return range(num_layers + 1) if rule == "keep_if_max_is_num_layers" else range(num_layers)


def parse_version(text: str) -> tuple[int, ...] | None:
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return None
    return tuple(int(g or 0) for g in match.groups())


def nearest_known(version: str) -> str | None:
    """The known release whose rules best fit `version` (None when it is not a version).

    Same major.minor: the closest patch (ties go to the older, stricter release);
    otherwise the newest release before it, or the oldest known when it predates all.
    """
    wanted = parse_version(version)
    if wanted is None:
        return None
    known = sorted(KNOWN_VERSIONS, key=lambda v: parse_version(v) or ())
    same_minor = [v for v in known if (parse_version(v) or ())[:2] == wanted[:2]]
    if same_minor:
        return min(same_minor, key=lambda v: (abs((parse_version(v) or (0, 0, 0))[2] - wanted[2]), v != same_minor[0]))
    older = [v for v in known if (parse_version(v) or ()) < wanted]
    return older[-1] if older else known[0]


def release_facts(version: str) -> ReleaseFacts:
    """The facts of the known release nearest `version` (the newest known for an unparseable one)."""
    return RELEASES[nearest_known(version) or KNOWN_VERSIONS[-1]]


# The release whose in-process model runner `backends.extract --backend sglang` was written against (from its
# sources: the backend has not yet run end to end, README says what has).
EXTRACT_RUNNER_VERSION = "0.5.23"


# Where a release keeps what its model classes read at construction (see backends/sglang/runtime.py): 0.5.23
# has both; 0.5.5 has neither (server_args.set_global_server_args_for_scheduler, groups built by ModelRunner).
RUNTIME_CONTEXT_MODULE = "sglang.srt.runtime_context"
PARALLEL_BOOTSTRAP_MODULE = "sglang.srt.distributed.bootstrap"
# The module of each EAGLE-3 draft class, imported alone (SGLang's model registry imports every model: seconds).
DRAFT_CLASS_MODULES: Mapping[str, str] = {
    LLAMA_DRAFT: "sglang.srt.models.llama_eagle3",
    MLA_DRAFT: "sglang.srt.models.kimi_k25_eagle3",
}

# A kernel module a layer imports while it is built, on a machine SGLang cannot serve from (no CUDA, no CPU engine):
# 0.5.23's rotary embedding takes its fallback kernel from vllm there. Only a forward would call it.
CONSTRUCTION_ONLY_KERNELS = ("vllm._custom_ops",)

VERSION_PROBE_TIMEOUT_S = 30.0
_VERSION_PROBE = """
import importlib.metadata as metadata
try:
    print(metadata.version("sglang"))
except metadata.PackageNotFoundError:
    pass
"""


def installed_version(
    python: str | None = None, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> str | None:
    """The sglang version installed for this interpreter, or for `python` (run with `env` added to ours, in
    `cwd`, as a serve command runs), read from the package metadata without importing sglang."""
    if python is None:
        import importlib.metadata  # here only: its imports (~15 ms) would slow every command of the CLI

        try:
            return importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            return None
    try:
        done = run_python(python, ["-c", _VERSION_PROBE], {**os.environ, **(env or {})}, cwd, VERSION_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    return lines[-1] if done.returncode == 0 and lines else None


def derived_context_length(config: Mapping[str, Any]) -> int:
    """The context length SGLang derives from a (text) config."""
    scaling = config.get("rope_scaling")
    factor: float = 1
    if isinstance(scaling, dict) and scaling:
        raw = scaling.get("factor", 1)
        factor = raw if isinstance(raw, (int, float)) and not isinstance(raw, bool) else 1
        if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(factor * value)
    return DEFAULT_CONTEXT_LENGTH


# How LlamaForCausalLMEagle3.load_weights maps checkpoint names (same in both
# releases): after the legacy renames, a name containing "d2t" becomes the hot
# token map, one containing "t2d" is ignored, q/k/v and gate/up are stacked into
# one parameter each, and the name matches a parameter as is or with "model."
# in front. Anything else is skipped without a word.
HOT_TOKEN_MARK = "d2t"
IGNORED_MARK = "t2d"
STACKED_PARAMS: tuple[tuple[str, str, str | int], ...] = (
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
)
_LAYER_PARAMS: Mapping[str, tuple[str | int | None, ...]] = {
    "self_attn.qkv_proj.weight": ("q", "k", "v"),
    "self_attn.o_proj.weight": (None,),
    "mlp.gate_up_proj.weight": (0, 1),
    "mlp.down_proj.weight": (None,),
    "input_layernorm.weight": (None,),
    "hidden_norm.weight": (None,),
    "post_attention_layernorm.weight": (None,),
}


def llama_draft_parameters(
    release: ReleaseFacts, *, num_layers: int, num_aux: int, fc_bias: bool, tied: bool, options: frozenset[str]
) -> dict[str, tuple[str | int | None, ...]]:
    """The parameters of LlamaForCausalLMEagle3 (as named by named_parameters), each with
    the shard ids its weight loader expects (None: one unstacked tensor)."""
    params: dict[str, tuple[str | int | None, ...]] = {"model.embed_tokens.weight": (None,), "model.fc.weight": (None,)}
    if fc_bias:
        params["model.fc.bias"] = (None,)
    layers = 1 if release.max_draft_layers == 1 else num_layers
    for i in range(layers):
        prefix = "model." + release.layer_template.format(i=i)
        params.update({f"{prefix}.{name}": shards for name, shards in _LAYER_PARAMS.items()})
    params["model.norm.weight"] = (None,)
    if "norm_before_fc" in options and "norm_before_fc" in release.options:
        params["model.input_norm.weight"] = (None,)
    if "fc_norm" in options and "fc_norm" in release.options:
        params.update({f"model.fc_norm.{k}.weight": (None,) for k in range(num_aux)})
    if not tied:  # a tied head is the embedding itself, listed once
        params["lm_head.weight"] = (None,)
    return params


def sglang_destination(release: ReleaseFacts, name: str, params: Mapping[str, object]) -> tuple[str, str | int | None]:
    """Where load_weights puts checkpoint tensor `name`: (parameter, shard id), or
    ("", "d2t"/"t2d") for the vocabulary maps, or ("", None) when it is skipped."""
    for legacy, new in release.legacy_renames:
        if legacy in name:
            name = name.replace(legacy, new)
    if HOT_TOKEN_MARK in name:
        return "", HOT_TOKEN_MARK
    if IGNORED_MARK in name:
        return "", IGNORED_MARK
    for param_part, shard_part, shard_id in STACKED_PARAMS:
        if shard_part in name:
            name = name.replace(shard_part, param_part)
            target = name if name in params else f"model.{name}"
            return (target, shard_id) if target in params else ("", None)
    target = name if name in params else f"model.{name}"
    return (target, None) if target in params else ("", None)


# Launch flags that name the files doctor checks before a serve run starts.
DRAFT_PATH_FLAGS: tuple[str, ...] = ("--speculative-draft-model-path", "--speculative-draft-model")
TARGET_PATH_FLAGS: tuple[str, ...] = ("--model-path", "--model")
CONTEXT_LENGTH_FLAG = "--context-length"
PORT_FLAG = "--port"
TP_SIZE_FLAGS: tuple[str, ...] = ("--tp-size", "--tp", "--tensor-parallel-size")
EAGLE3_ALGORITHM: tuple[str, ...] = ("--speculative-algorithm", "EAGLE3")
HOST_FLAG = "--host"
DEFAULT_PORT = 30000
# SGLang's own multi-node: every node gets the node count, its rank and node 0's HOST:PORT to meet at. Nodes of
# rank 1 and up serve no HTTP (entrypoints/http_server.py returns after the schedulers start) and ignore SIGTERM,
# waiting for node 0's shutdown broadcast (entrypoints/engine.py, 0.5.23).
NNODES_FLAG = "--nnodes"
NODE_RANK_FLAG = "--node-rank"
DIST_INIT_ADDR_FLAG = "--dist-init-addr"
# Modules that start SGLang's server (`python -m MODULE FLAGS...`).
SERVER_MODULES = ("sglang.launch_server",)

# Flags a release accepts with a deprecation warning, and what replaces each. 0.5.23's parser says: "'--disable-
# cuda-graph' is deprecated and will be removed in a future release. Use '--cuda-graph-backend-{decode,prefill}=
# disabled' instead." (0.5.5 has no --cuda-graph-backend-* flags: --disable-cuda-graph is its spelling.)
DEPRECATED_FLAGS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "0.5.5": {},
    "0.5.23": {
        "--disable-cuda-graph": ("--cuda-graph-backend-decode=disabled", "--cuda-graph-backend-prefill=disabled"),
    },
}
# What a person most often relaunches a misbehaving launch with, in the spelling every release accepts.
RELAUNCH_PRESETS: tuple[str, ...] = ("--disable-cuda-graph", "--disable-custom-all-reduce", "--mem-fraction-static=0.8")


def deprecated_flags(version: str | None) -> Mapping[str, tuple[str, ...]]:
    """The deprecated flags of the known release nearest `version`, each with its replacement ({} for None)."""
    known = nearest_known(version) if version is not None else None
    return DEPRECATED_FLAGS[known] if known is not None else {}


def relaunch_presets(version: str | None) -> tuple[str, ...]:
    """The relaunch presets spelled for `version` (None, an SGLang not known: the spelling every release accepts);
    a preset of several flags is one string, space-separated."""
    renames = deprecated_flags(version)
    return tuple(" ".join(renames.get(preset, (preset,))) for preset in RELAUNCH_PRESETS)


def run_python(
    python: str, args: list[str], env: dict[str, str], cwd: str | os.PathLike[str] | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in the serving interpreter, as a serve command would run (`env` is its whole
    environment), with no stdin and its output as text; OSError or TimeoutExpired as subprocess raises."""
    return subprocess.run(
        [python, *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
