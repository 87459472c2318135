"""The demo target: a tiny, randomly initialised Llama-architecture model, built locally.

`python -m backends.demo_target --out DIR` writes a complete Hugging Face model
folder (config.json, model.safetensors, tokenizer files with a Llama-3-style
chat template, README.txt) with no download, the same bytes for the same seed.
The weights are random: the model says nothing sensible, but it is a real
LlamaForCausalLM whose hidden states a draft can be trained on, which is all the
demo and the tests need.

The tokenizer is a byte-level BPE trained on the built-in demo corpus with the
`tokenizers` trainer, so any text encodes, and the corpus's words are single
tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.demo_corpus import demo_chats

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
EOT = "<|eot_id|>"
PAD = "<|finetune_right_pad_id|>"
SPECIAL_TOKENS = (BOS, EOS, START_HEADER, END_HEADER, EOT, PAD)

# Llama 3's template, less its tool and date handling.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

README = """\
This is a RANDOM model, built by `python -m backends.demo_target` of eagle3-console
(seed {seed}) for demos and tests. Its weights were never trained: its output is
meaningless. Architecture: LlamaForCausalLM, {layers} layers, hidden size {hidden},
vocabulary {vocab}. The tokenizer is a byte-level BPE trained on the project's
built-in demo corpus; the chat template follows Llama 3's.
"""


@dataclass(frozen=True)
class DemoShape:
    """The demo target's size: 8 layers make the default aux ids [1, 3, 4] distinct."""

    num_layers: int = 8
    hidden_size: int = 64
    intermediate_size: int = 192
    num_heads: int = 4
    num_kv_heads: int = 2
    tokenizer_vocab: int = 2048
    max_position_embeddings: int = 2048
    # Standard deviation of the lm_head logits for a unit-RMS hidden state. The
    # default init (0.02) gives logits of std ~0.16 and a nearly uniform
    # next-token distribution that leaves a draft nothing visible to learn;
    # a peaked one gives the demo's loss room to fall.
    logit_std: float = 4.0


def build_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE trained on the demo corpus, wrapped as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [m["content"] for chat in demo_chats() for m in chat["messages"]]
    texts += ["system", "user", "assistant"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    bos_id = tokenizer.token_to_id(BOS)
    # Like Llama 3: a plain `tokenizer(text)` starts with BOS; the chat template adds its own.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOT,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=DemoShape.max_position_embeddings,
    )


def build_model(shape: DemoShape, vocab_size: int, token_ids: dict[str, int], seed: int) -> Any:
    """A LlamaForCausalLM with random weights drawn from `seed` (fp32, CPU)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.hidden_size // shape.num_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=False,
        bos_token_id=token_ids[BOS],
        eos_token_id=token_ids[EOT],
        pad_token_id=token_ids[PAD],
        dtype="float32",
    )
    # Written into config.json, so that nobody mistakes this model for a trained one.
    config.eagle3_console_demo = {"random_weights": True, "seed": seed, "logit_std": shape.logit_std}
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, shape.logit_std / math.sqrt(shape.hidden_size))
    return model.eval()  # type: ignore[no-untyped-call]


def write_demo_target(out: Path, seed: int = 0, shape: DemoShape | None = None) -> Path:
    """Write the demo target folder to `out` (created; files in it overwritten) and return it."""
    shape = shape or DemoShape()
    tokenizer = build_tokenizer(shape.tokenizer_vocab)
    token_ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    # Real models pad the embedding table to a round size; so does this one.
    vocab_size = math.ceil(len(tokenizer) / 64) * 64
    model = build_model(shape, vocab_size, token_ids, seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    text = README.format(seed=seed, layers=shape.num_layers, hidden=shape.hidden_size, vocab=vocab_size)
    (out / "README.txt").write_text(text)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.demo_target", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write the model into")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        print(f"error: {args.out} exists and is not a folder", file=sys.stderr)
        return 2
    write_demo_target(args.out, args.seed)
    config = json.loads((args.out / "config.json").read_text())
    print(
        f"wrote a random {config['num_hidden_layers']}-layer Llama target "
        f"(hidden {config['hidden_size']}, vocab {config['vocab_size']}) to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
