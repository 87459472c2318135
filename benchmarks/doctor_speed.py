"""How long `doctor` takes on a 1 TB target and a 1 GB draft (headers only; sparse files).

    .venv/bin/python -m benchmarks.doctor_speed

Builds, in a temporary folder, a 64-shard target whose safetensors headers describe
1 TB in 96,000 tensors (DeepSeek-V3 scale) with no data written, a 1 GB draft
(Llama-3-8B geometry, data sparse except d2t) and an extraction manifest, then
times `diagnose` (the target config complete, and without hidden_size so that the
embedding's header is read), reading and validating all 64 headers, and the CLI as
a fresh process. Target: 1 s wall each.
"""

from __future__ import annotations

import json
import math
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from backends.doctor import diagnose
from backends.eagle3_contract import Manifest, sglang_draft_config
from backends.safetensors_header import read_checkpoint
from benchmarks._common import print_table

SHARDS = 64
TENSORS_PER_SHARD = 1500
TARGET_BYTES = 10**12
LAYERS = 61
HIDDEN = 4096
VOCAB = 128256
DRAFT_VOCAB = 32000
INTERMEDIATE = 20480
LIMIT_S = 1.0
REPEATS = 5


def sparse_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]], data: dict[str, bytes]) -> int:
    """Write a header and only the bytes in `data`; the rest of the file is a hole."""
    sizes = {"BF16": 2, "I64": 8, "BOOL": 1}
    header: dict[str, Any] = {}
    offsets: dict[str, int] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * sizes[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offsets[name] = offset
        offset += size
    raw = json.dumps(header).encode()
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for name, payload in data.items():
            fh.seek(8 + len(raw) + offsets[name])
            fh.write(payload)
        fh.truncate(8 + len(raw) + offset)
    return offset


def build_target(folder: Path, *, with_hidden: bool) -> int:
    folder.mkdir()
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
    }
    if with_hidden:
        config["hidden_size"] = HIDDEN
    (folder / "config.json").write_text(json.dumps(config))
    per_tensor = TARGET_BYTES // (SHARDS * TENSORS_PER_SHARD) // 2 // HIDDEN  # rows of a bf16 [rows, HIDDEN]
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(SHARDS):
        file = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
        tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
        if s == 0:
            tensors["model.embed_tokens.weight"] = ("BF16", (VOCAB, HIDDEN))
        for t in range(TENSORS_PER_SHARD):
            layer, expert = divmod(s * TENSORS_PER_SHARD + t, 1600)
            tensors[f"model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"] = ("BF16", (per_tensor, HIDDEN))
        total += sparse_safetensors(folder / file, tensors, {})
        weight_map |= dict.fromkeys(tensors, file)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


def build_draft(folder: Path) -> int:
    folder.mkdir()
    aux = [1, LAYERS // 2 - 1, LAYERS - 4]
    config = sglang_draft_config(
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=VOCAB,
        draft_vocab_size=DRAFT_VOCAB,
        target_hidden_size=HIDDEN,
        aux_layer_ids=aux,
        max_position_embeddings=131072,
    )
    (folder / "config.json").write_text(json.dumps(config))
    h = HIDDEN
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {
        "fc.weight": ("BF16", (h, 3 * h)),
        "midlayer.self_attn.q_proj.weight": ("BF16", (4096, 2 * h)),
        "midlayer.self_attn.k_proj.weight": ("BF16", (1024, 2 * h)),
        "midlayer.self_attn.v_proj.weight": ("BF16", (1024, 2 * h)),
        "midlayer.self_attn.o_proj.weight": ("BF16", (h, 4096)),
        "midlayer.mlp.gate_proj.weight": ("BF16", (INTERMEDIATE, h)),
        "midlayer.mlp.up_proj.weight": ("BF16", (INTERMEDIATE, h)),
        "midlayer.mlp.down_proj.weight": ("BF16", (h, INTERMEDIATE)),
        "midlayer.input_layernorm.weight": ("BF16", (h,)),
        "midlayer.hidden_norm.weight": ("BF16", (h,)),
        "midlayer.post_attention_layernorm.weight": ("BF16", (h,)),
        "norm.weight": ("BF16", (h,)),
        "lm_head.weight": ("BF16", (DRAFT_VOCAB, h)),
        "d2t": ("I64", (DRAFT_VOCAB,)),
        "t2d": ("BOOL", (VOCAB,)),
    }
    d2t = struct.pack(f"<{DRAFT_VOCAB}q", *(3 * i for i in range(DRAFT_VOCAB)))  # draft id i -> target id 4i
    return sparse_safetensors(folder / "model.safetensors", tensors, {"d2t": d2t})


def build_data(folder: Path) -> None:
    folder.mkdir()
    manifest = Manifest(
        target_path="target",
        architecture="LlamaForCausalLM",
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        vocab_size=VOCAB,
        dtype="bfloat16",
        aux_layer_ids=[1, LAYERS // 2 - 1, LAYERS - 4],
        tokenizer="target",
        chat_template=None,
        max_length=4096,
    )
    (folder / "manifest.json").write_text(json.dumps(manifest.to_json()))


def timed(fn: Any) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(REPEATS):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target_bytes = build_target(root / "target", with_hidden=True)
        build_target(root / "target-headers", with_hidden=False)
        draft_bytes = build_draft(root / "draft")
        build_data(root / "data")
        draft, data = root / "draft", root / "data"
        print(f"target: {SHARDS} shards, {SHARDS * TENSORS_PER_SHARD} tensors, {target_bytes / 1e12:.2f} TB described")
        print(f"draft: {draft_bytes / 1e9:.2f} GB described, median of {REPEATS} runs\n")

        config_s, result = timed(lambda: diagnose(draft, target=root / "target", data=data, sglang_version="0.5.5"))
        assert result["errors"] == 0, result["findings"]
        headers_s, result = timed(
            lambda: diagnose(draft, target=root / "target-headers", data=data, sglang_version="0.5.23")
        )
        assert result["errors"] == 0, result["findings"]
        argv = [sys.executable, "-m", "backends.doctor", str(draft), "--target", str(root / "target")]
        argv += ["--data", str(data), "--sglang-version", "0.5.5"]
        all_s, tensors = timed(lambda: read_checkpoint(root / "target"))
        assert len(tensors) == SHARDS * TENSORS_PER_SHARD + 1
        cli_s, proc = timed(lambda: subprocess.run(argv, capture_output=True, check=False))
        assert proc.returncode == 0, proc.stdout

    rows = [
        ("diagnose: 1 TB target (config) + 1 GB draft", config_s),
        ("diagnose: 1 TB target (embedding header) + 1 GB draft", headers_s),
        ("read + validate all 64 headers of the 1 TB target", all_s),
        ("python -m backends.doctor (fresh process)", cli_s),
    ]
    print_table([(name, f"{s:.3f} s", f"<= {LIMIT_S:.1f} s", f"{s / LIMIT_S:.2f}") for name, s in rows])


if __name__ == "__main__":
    main()
