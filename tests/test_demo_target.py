"""The demo target and corpus: what `make demo` builds with no download must be a real, usable target."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from backends import demo_corpus, demo_target
from backends.eagle3_contract import default_aux_layers
from backends.extract.data import load_dataset


def test_demo_target_is_a_complete_llama_folder_with_distinct_default_aux_layers(target: Path) -> None:
    names = {p.name for p in target.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.txt"} <= names
    config = AutoConfig.from_pretrained(target)
    assert config.architectures == ["LlamaForCausalLM"]
    aux = default_aux_layers(config.num_hidden_layers)
    assert len(set(aux)) == 3
    assert 64 <= config.hidden_size <= 128
    assert 1000 <= config.vocab_size <= 4096


def test_demo_target_says_it_is_random(target: Path) -> None:
    config = json.loads((target / "config.json").read_text())
    assert config["eagle3_console_demo"]["random_weights"] is True
    assert "RANDOM" in (target / "README.txt").read_text()


def test_same_seed_gives_the_same_files_and_another_seed_other_weights(tmp_path: Path, target: Path) -> None:
    again = demo_target.write_demo_target(tmp_path / "again", seed=0)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (again / name).read_bytes() == (target / name).read_bytes(), name
    other = demo_target.write_demo_target(tmp_path / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != (target / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (target / "tokenizer.json").read_bytes()


def test_tokenizer_renders_a_llama3_style_chat_and_round_trips_any_text(target: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(target)
    messages = [{"role": "user", "content": "How long should I boil rice?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHow long should I boil rice?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = {tokenizer.convert_tokens_to_ids(t) for t in demo_target.SPECIAL_TOKENS}
    assert sum(i in special for i in ids) == 6  # each marker is one token, not spelled out
    for sample in ("Boil rice for about 12 minutes.", "Ünïcödé — 漢字 and emoji 🚀 encode too"):
        assert tokenizer.decode(tokenizer(sample, add_special_tokens=False)["input_ids"]) == sample
    # Corpus words are whole tokens, so the demo's sequences stay short.
    assert len(tokenizer(" minutes", add_special_tokens=False)["input_ids"]) == 1


def test_target_runs_and_its_next_token_distribution_is_peaked(target: Path, model: Any) -> None:
    """A nearly uniform target would leave a draft nothing to learn: the demo loss would not fall."""
    tokenizer = AutoTokenizer.from_pretrained(target)
    chat = demo_corpus.demo_chats(4)
    ids = [tokenizer.apply_chat_template(c["messages"], tokenize=True, return_dict=False) for c in chat]
    with torch.no_grad():
        logits = torch.cat([model(torch.tensor([i])).logits[0] for i in ids])
    assert torch.isfinite(logits).all()
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean().item()
    assert entropy < 0.6 * math.log(model.config.vocab_size)


def test_cli_writes_the_target_and_refuses_a_file_as_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo_target.main(["--out", str(tmp_path / "t")]) == 0
    assert "random 8-layer Llama target" in capsys.readouterr().out
    assert (tmp_path / "t" / "model.safetensors").is_file()
    (tmp_path / "file").write_text("x")
    assert demo_target.main(["--out", str(tmp_path / "file")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_demo_corpus_is_a_few_hundred_distinct_deterministic_chats() -> None:
    chats = demo_corpus.demo_chats()
    assert 200 <= len(chats) <= 1000
    assert chats == demo_corpus.demo_chats()
    assert len({json.dumps(c) for c in chats}) == len(chats)
    assert all(any(m["role"] == "assistant" for m in c["messages"]) for c in chats)
    assert sum(len(c["messages"]) > 3 for c in chats) > 20  # some multi-turn chats
    topics = {c["messages"][-1]["content"].split()[0] for c in chats}
    assert len(topics) > 10


def test_demo_corpus_cli_writes_jsonl_that_extraction_reads(tmp_path: Path) -> None:
    path = tmp_path / "demo.jsonl"
    assert demo_corpus.main(["--out", str(path), "--size", "50"]) == 0
    data = load_dataset(str(path))
    assert len(data.chats) == 50
    assert not data.skipped
    assert data.chats == [c["messages"] for c in demo_corpus.demo_chats(50)]
