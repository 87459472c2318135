"""Tiny targets and extraction folders for the trainer's tests, built here (not by backends.extract).

The target is a real LlamaForCausalLM with random weights and a peaked lm_head
(as the demo target has), so its next-token distributions are worth learning;
the shards hold its real hidden states for token sequences drawn from a skewed
distribution (some tokens frequent, some never seen, so d2t/t2d mean something).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from backends.eagle3_contract import MANIFEST, SHARD_PATTERN, Manifest, ShardInfo, write_shard


@dataclass(frozen=True)
class TinyShape:
    layers: int = 8
    hidden: int = 32
    intermediate: int = 64
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 64
    used_tokens: int = 56  # tokens that occur in the data; the rest never do
    logit_std: float = 4.0


AUX_LAYERS = [1, 3, 4]  # the default set for 8 layers: outputs of 1, L//2-1, L-4
PROMPT_TOKENS = 4  # leading tokens of each sample with loss_mask 0


def write_target(path: Path, shape: TinyShape = TinyShape(), seed: int = 0) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden // shape.heads,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, shape.logit_std / math.sqrt(shape.hidden))
    model.save_pretrained(path, safe_serialization=True)
    return path


def write_extraction(
    path: Path,
    target: Path,
    samples: int = 48,
    lengths: tuple[int, int] = (20, 40),
    shard_size: int = 16,
    seed: int = 0,
    aux_layers: list[int] | None = None,
) -> Manifest:
    """An extraction folder (manifest.json + shards) of the target's real hidden states, bf16."""
    from transformers import LlamaForCausalLM

    aux_layers = aux_layers or AUX_LAYERS
    model = LlamaForCausalLM.from_pretrained(target)  # loaded in eval mode
    cfg = model.config
    shape = TinyShape()
    gen = torch.Generator().manual_seed(seed)
    weights = 1.0 / (torch.arange(shape.used_tokens, dtype=torch.float64) + 3.0)
    rows = []
    for _ in range(samples):
        length = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=gen))
        ids = torch.multinomial(weights, length, replacement=True, generator=gen)
        with torch.no_grad():
            out = model.model(ids.unsqueeze(0), output_hidden_states=True)
        mask = torch.ones(length, dtype=torch.int8)
        mask[:PROMPT_TOKENS] = 0
        rows.append(
            {
                "input_ids": ids,
                "loss_mask": mask,
                "hidden_state": out.last_hidden_state[0].to(torch.bfloat16),
                "aux_hidden_states": torch.cat([out.hidden_states[i + 1][0] for i in aux_layers], -1).to(
                    torch.bfloat16
                ),
            }
        )
    path.mkdir(parents=True, exist_ok=True)
    shards: list[ShardInfo] = []
    for n, start in enumerate(range(0, samples, shard_size)):
        shards.append(write_shard(path / SHARD_PATTERN.format(index=n), rows[start : start + shard_size]))
    manifest = Manifest(
        target_path=str(target),
        architecture="LlamaForCausalLM",
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size,
        dtype="bfloat16",
        aux_layer_ids=list(aux_layers),
        tokenizer="",
        chat_template=None,
        max_length=lengths[1],
        samples=samples,
        tokens=sum(s.tokens for s in shards),
        shards=shards,
    )
    write_manifest(path, manifest)
    return manifest


def write_manifest(path: Path, manifest: Manifest) -> None:
    (path / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2))


def read_rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def job_words(root: Path, *extra: str) -> list[str]:
    """`train`'s words for a multi-node job of the tiny target on CPU (targets and data written under `root`), one
    process per node, run by this interpreter (the one with torch)."""
    target = write_target(root / "target")
    write_extraction(root / "data", target)
    return [
        "--python", sys.executable, "--env", "OMP_NUM_THREADS=1",
        "--data", str(root / "data"), "--target", str(target), "--out", str(root / "draft"),
        "--draft-vocab-size", "48", "--val-samples", "4", "--batch-size", "4", "--ttt", "2", *extra,
    ]  # fmt: skip


def worker_of(node_run: str, rank: int) -> int:
    """The pid of the torchrun worker with global `rank` under a node's torchrun (the child of its run)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and f"EAGLE3_RUN_ID={node_run}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no rank {rank} worker of run {node_run}")
