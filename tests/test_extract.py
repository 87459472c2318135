"""Extraction on the tiny demo target: shards, manifest, the states themselves, loss mask, resume, errors."""

from __future__ import annotations

import hashlib
import importlib.metadata
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from backends import demo_target
from backends.eagle3_contract import read_manifest, read_shard
from backends.extract import capture
from backends.extract.cli import main
from backends.extract.output import PROGRESS
from backends.protocol import ENV_METRICS_FILE
from tests.conftest import REPO

CHATS: list[object] = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "How long should I boil rice?"},
            {"role": "assistant", "content": "Boil rice for about 12 minutes."},
            {"role": "user", "content": "Any tip for seasoning?"},
            {"role": "assistant", "content": "Taste as you go."},
        ]
    },
    {"prompt": "What is speculative decoding?", "response": "A draft guesses and the target checks."},
]
ASSISTANT_TEXTS = ["Boil rice for about 12 minutes.", "Taste as you go.", "A draft guesses and the target checks."]


@pytest.fixture(scope="module")
def tokenizer(target: Path) -> Any:
    return AutoTokenizer.from_pretrained(target)


def extract(target: Path, out: Path, *extra: str, data: str | Path = "demo") -> int:
    return main(["--target", str(target), "--data", str(data), "--out", str(out), "--device", "cpu", *extra])


def write_jsonl(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def all_samples(out: Path) -> list[dict[str, torch.Tensor]]:
    return [s for shard in read_manifest(out).shards for s in read_shard(out / shard.file)]


def layer_outputs(model: Any, input_ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each decoder layer's own output, by hooks (independent of output_hidden_states), and the final state."""
    outputs: list[torch.Tensor] = []

    def keep(_module: Any, _args: Any, out: Any) -> None:
        outputs.append(out[0] if isinstance(out, tuple) else out)

    hooks = [layer.register_forward_hook(keep) for layer in model.model.layers]
    try:
        with torch.no_grad():
            final = model.model(input_ids=input_ids[None]).last_hidden_state
    finally:
        for hook in hooks:
            hook.remove()
    return [o[0] for o in outputs], final[0]


def masked_runs(sample: dict[str, torch.Tensor], tokenizer: Any) -> list[str]:
    """The decoded text of each run of consecutive loss-mask-1 tokens."""
    ids, mask = sample["input_ids"].tolist(), sample["loss_mask"].tolist()
    runs = []
    for on, group in itertools.groupby(zip(ids, mask, strict=True), key=lambda pair: pair[1]):
        if on:
            runs.append(tokenizer.decode([i for i, _ in group]))
    return runs


def test_extraction_writes_shards_and_a_manifest_that_match_the_target(target: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert extract(target, out, "--limit", "10", "--shard-size", "4") == 0
    manifest = read_manifest(out)
    assert manifest.aux_layer_ids == [1, 3, 4]  # [1, L//2-1, L-4] for L = 8
    assert (manifest.num_layers, manifest.hidden_size, manifest.vocab_size) == (8, 64, 1280)
    assert manifest.architecture == "LlamaForCausalLM"
    assert manifest.dtype == "float32"
    assert manifest.target_path == str(target.resolve())
    assert manifest.chat_template == demo_target.CHAT_TEMPLATE
    assert manifest.max_length == 2048
    assert (manifest.backend, manifest.backend_version) == ("hf", importlib.metadata.version("transformers"))
    assert [s.file for s in manifest.shards] == [f"shard-0000{i}.safetensors" for i in range(3)]
    assert [s.samples for s in manifest.shards] == [4, 4, 2]
    samples = all_samples(out)
    assert manifest.samples == len(samples) == 10
    assert manifest.tokens == sum(s.tokens for s in manifest.shards) == sum(len(s["input_ids"]) for s in samples)
    for sample in samples:
        tokens = len(sample["input_ids"])
        assert sample["input_ids"].dtype == torch.int64
        assert sample["loss_mask"].shape == (tokens,)
        assert sample["hidden_state"].shape == (tokens, 64)
        assert sample["aux_hidden_states"].shape == (tokens, 3 * 64)
        assert sample["hidden_state"].dtype == torch.float32
    progress = json.loads((out / PROGRESS).read_text())
    assert [s["sha256"] for s in progress["shards"]] == [
        hashlib.sha256((out / s.file).read_bytes()).hexdigest() for s in manifest.shards
    ]


def test_states_equal_a_direct_forward_pass(target: Path, model: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # A small token budget forces several padded batches per shard.
    assert extract(target, out, "--limit", "6", "--batch-tokens", "150") == 0
    for sample in all_samples(out):
        ids = sample["input_ids"]
        with torch.no_grad():
            direct = model(ids[None], output_hidden_states=True)
        states = direct.hidden_states
        expected_aux = torch.cat([states[2], states[4], states[5]], dim=-1)[0]  # HF index = aux id + 1
        torch.testing.assert_close(sample["aux_hidden_states"], expected_aux, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(sample["hidden_state"], states[-1][0], atol=1e-5, rtol=1e-4)
        # Independently of HF's hidden_states: aux = the layers' own outputs, hidden = the normed last output,
        # which the target's lm_head turns into its logits.
        layers, final = layer_outputs(model, ids)
        torch.testing.assert_close(sample["aux_hidden_states"], torch.cat([layers[1], layers[3], layers[4]], -1))
        torch.testing.assert_close(sample["hidden_state"], model.model.norm(layers[-1]))
        torch.testing.assert_close(model.lm_head(sample["hidden_state"]), direct.logits[0], atol=1e-4, rtol=1e-4)
        assert not torch.allclose(final, layers[-1])


def test_layers_option_sets_the_captured_layers_in_order(target: Path, model: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert extract(target, out, "--limit", "2", "--layers", "0,2,6") == 0
    assert read_manifest(out).aux_layer_ids == [0, 2, 6]
    sample = all_samples(out)[0]
    layers, _ = layer_outputs(model, sample["input_ids"])
    torch.testing.assert_close(sample["aux_hidden_states"], torch.cat([layers[0], layers[2], layers[6]], -1))


def test_loss_mask_covers_exactly_the_assistant_turns(target: Path, tokenizer: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert extract(target, out, data=write_jsonl(tmp_path / "chats.jsonl", CHATS)) == 0
    runs = [run for sample in all_samples(out) for run in masked_runs(sample, tokenizer)]
    # Each turn's text and its end-of-turn token, which the draft must predict too; nothing else.
    assert runs == [text + demo_target.EOT for text in ASSISTANT_TEXTS]


def test_template_that_rewrites_earlier_turns_still_masks_the_assistant_text(
    target: Path, tokenizer: Any, tmp_path: Path
) -> None:
    # The last message is rendered differently, so a prefix rendering is not a prefix of the whole chat.
    template = (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}{% if loop.last %} (end){% endif %}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    )
    template_file = tmp_path / "template.jinja"
    template_file.write_text(template)
    out = tmp_path / "out"
    data = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    assert extract(target, out, "--chat-template", str(template_file), data=data) == 0
    assert read_manifest(out).chat_template == template
    runs = [run.strip() for sample in all_samples(out) for run in masked_runs(sample, tokenizer)]
    assert runs == ASSISTANT_TEXTS


def test_truncation_keeps_max_length_tokens_and_drops_chats_left_without_assistant_tokens(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long_prompt = {"prompt": "Tell me about GPUs. " * 20, "response": "They are fast."}
    data = write_jsonl(tmp_path / "chats.jsonl", [CHATS[0], long_prompt])
    out = tmp_path / "out"
    assert extract(target, out, "--max-length", "40", data=data) == 0
    samples = all_samples(out)
    assert [len(s["input_ids"]) for s in samples] == [40]
    assert "dropped: 1 no assistant token within --max-length" in capsys.readouterr().out
    assert extract(target, tmp_path / "short", "--max-length", "8", data=data) == 1
    assert "no chat kept any assistant token" in capsys.readouterr().err
    assert not (tmp_path / "short" / "manifest.json").exists()


def test_malformed_lines_are_skipped_and_counted_with_line_numbers(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines: list[object] = [
        CHATS[0],
        "{not json",
        {"messages": [{"role": "user", "content": "hi"}]},
        "",
        CHATS[1],
        {"text": "no chat here"},
        "[1, 2]",
        {"messages": [{"role": "user", "content": 5}]},
    ]
    out = tmp_path / "out"
    assert extract(target, out, data=write_jsonl(tmp_path / "mixed.jsonl", lines)) == 0
    printed = capsys.readouterr().out
    assert "data: 2 chats" in printed
    assert "skipped 5 of 8 lines" in printed
    assert "1 not JSON (line 2)" in printed
    assert "1 with no non-empty assistant turn (line 3)" in printed
    assert "1 not a JSON object (line 7)" in printed
    assert read_manifest(out).samples == 2


def test_a_dataset_with_no_usable_chat_is_refused_in_one_line(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_jsonl(tmp_path / "bad.jsonl", ["{oops", {"prompt": "no response"}])
    assert extract(target, tmp_path / "out", data=data) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "holds no usable chat" in err and "\n" not in err
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    assert extract(target, tmp_path / "out2", data=empty) == 1
    assert not (tmp_path / "out2" / "manifest.json").exists()


@pytest.mark.parametrize(
    ("layers", "message"),
    [("7", "aux ids run 0..6"), ("1,3,9", "--layers 9"), ("4,1,3", "must be increasing"), ("-1,2,3", "--layers -1")],
)
def test_bad_layer_ids_are_a_usage_error(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], layers: str, message: str
) -> None:
    assert extract(target, tmp_path / "out", f"--layers={layers}") == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_paths_and_an_unavailable_backend_are_usage_errors(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--target", str(tmp_path / "nope"), "--data", "demo", "--out", str(tmp_path / "o")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["--target", str(tmp_path), "--data", "demo", "--out", str(tmp_path / "o")]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert extract(target, tmp_path / "o", data=tmp_path / "missing.jsonl") == 2
    assert "no such file" in capsys.readouterr().err
    assert extract(target, tmp_path / "o", "--backend", "sglang") == 2
    assert "use --backend hf" in capsys.readouterr().err
    assert extract(target, tmp_path / "o", "--device", "auto") == 2  # CI has no GPU to spread the target over
    assert capsys.readouterr().err == "error: --device auto: no CUDA device is visible to this process\n"
    assert extract(target, tmp_path / "o", "--device", "auto", "--backend", "sglang") == 2
    assert "--device auto goes with --backend hf" in capsys.readouterr().err


def test_usage_errors_print_no_traceback_from_the_command_line(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "backends.extract", "--target", str(tmp_path / "nope"), "--data", "demo"]
    done = subprocess.run([*command, "--out", str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: --target {tmp_path / 'nope'}: no such folder"


def test_resume_after_a_crash_skips_finished_shards_and_matches_a_clean_run(
    target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean = tmp_path / "clean"
    assert extract(target, clean, "--limit", "12", "--shard-size", "4") == 0
    real = capture.capture_states
    calls: list[int] = []

    def crash_on_third_call(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("simulated crash")
        return real(*args, **kwargs)

    out = tmp_path / "out"
    monkeypatch.setattr(capture, "capture_states", crash_on_third_call)
    with pytest.raises(RuntimeError, match="simulated crash"):
        extract(target, out, "--limit", "12", "--shard-size", "4")
    assert not (out / "manifest.json").exists()
    finished = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.safetensors")}
    assert sorted(finished) == ["shard-00000.safetensors", "shard-00001.safetensors"]

    def count(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    calls.clear()
    monkeypatch.setattr(capture, "capture_states", count)
    assert extract(target, out, "--limit", "12", "--shard-size", "4") == 0
    assert len(calls) == 1  # only the third shard ran through the target
    assert "2 finished shards kept" in capsys.readouterr().out
    assert {name: (out / name).stat().st_mtime_ns for name in finished} == finished
    assert read_manifest(out).content_hash == read_manifest(clean).content_hash


def test_a_missing_shard_is_extracted_again_and_a_complete_folder_is_left_alone(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert extract(target, out, "--limit", "8", "--shard-size", "4") == 0
    before = read_manifest(out).content_hash
    first = (out / "shard-00000.safetensors").stat().st_mtime_ns
    assert extract(target, out, "--limit", "8", "--shard-size", "4") == 0
    assert "already complete" in capsys.readouterr().out
    (out / "shard-00001.safetensors").unlink()
    assert extract(target, out, "--limit", "8", "--shard-size", "4") == 0
    assert "shard-00001.safetensors is missing" in capsys.readouterr().out
    assert (out / "shard-00000.safetensors").stat().st_mtime_ns == first
    assert read_manifest(out).content_hash == before


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (["--max-length", "100"], "max_length 2048 -> 100"),
        (["--layers", "0,2,6"], "aux_layer_ids [1, 3, 4] -> [0, 2, 6]"),
        (["--limit", "5"], "limit 4 -> 5"),
        (["--dtype", "bfloat16"], 'dtype "float32" -> "bfloat16"'),
    ],
)
def test_resuming_with_other_settings_is_refused(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], change: list[str], named: str
) -> None:
    out = tmp_path / "out"
    assert extract(target, out, "--limit", "4", "--shard-size", "2") == 0
    shards = sorted(p.name for p in out.iterdir())
    extra = ["--limit", "4"] if change[0] != "--limit" else []
    assert extract(target, out, "--shard-size", "2", *extra, *change) == 2
    err = capsys.readouterr().err
    assert "made with different settings" in err and named in err
    assert sorted(p.name for p in out.iterdir()) == shards


def test_changed_data_is_refused_and_a_foreign_folder_is_not_touched(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    out = tmp_path / "out"
    assert extract(target, out, data=data) == 0
    write_jsonl(data, [*CHATS, CHATS[1]])
    assert extract(target, out, data=data) == 2
    assert "data_sha256" in capsys.readouterr().err
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert extract(target, foreign, data=data) == 2
    assert "holds no extraction progress" in capsys.readouterr().err
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_progress_rows_go_to_the_metrics_file(target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv(ENV_METRICS_FILE, str(metrics))
    # More writer threads than shards in flight: shards are still recorded and reported in order.
    assert extract(target, tmp_path / "out", "--limit", "6", "--shard-size", "2", "--writers", "3") == 0
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["shard"] for r in rows] == [0, 1, 2]
    assert all(r["stage"] == "extract" and r["tokens_per_s"] > 0 for r in rows)
    assert rows[-1]["samples"] == 6 and rows[-1]["eta_s"] == 0
    assert rows[-1]["tokens"] == read_manifest(tmp_path / "out").tokens
    assert rows[0]["tokens"] < rows[1]["tokens"] < rows[2]["tokens"]


def test_aux_states_come_from_hooks_on_the_aux_layers_alone_and_equal_every_hidden_state_path(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hooks give HF's hidden_states[X + 1] for every aux id X without keeping the other layers' outputs,
    leave no hook behind (also when the pass fails), and an architecture without `base_model.layers` falls
    back to output_hidden_states."""
    layers = model.model.layers
    ids, mask = capture.pad_batch([[5, 9, 11, 7, 3], [8, 6]], pad_id=0)
    aux_ids = [0, 2, 3, 6]
    with torch.no_grad():
        every = model.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    hooks_before = [len(layer._forward_hooks) for layer in layers]  # transformers keeps hooks of its own
    hidden, aux = capture.forward_states(model, ids, mask, aux_ids)
    torch.testing.assert_close(aux, torch.cat([every[i + 1] for i in aux_ids], -1))
    torch.testing.assert_close(hidden, every[-1])
    assert [len(layer._forward_hooks) for layer in layers] == hooks_before
    monkeypatch.setattr(capture, "decoder_layers", lambda _: None)
    fallback_hidden, fallback_aux = capture.forward_states(model, ids, mask, aux_ids)
    torch.testing.assert_close(fallback_aux, aux)
    torch.testing.assert_close(fallback_hidden, hidden)
    monkeypatch.undo()
    with pytest.raises(IndexError):
        capture.forward_states(model, ids + 10**6, mask, aux_ids)  # token ids outside the embedding
    assert [len(layer._forward_hooks) for layer in layers] == hooks_before


def test_the_next_shard_is_tokenized_while_the_target_runs_on_this_one(
    target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first shard's forward pass waits until the second shard's chats are being tokenized: in a loop that
    tokenized between forward passes it would wait forever (here, fail after 10 s)."""
    import threading

    from backends.extract.pipeline import ShardExtractor
    from backends.extract.template import ChatTokenizer

    second_tokenized = threading.Event()
    calls: list[str] = []
    tokenize, extract_shard = ChatTokenizer.tokenize, ShardExtractor.extract

    def tokenizing(self: ChatTokenizer, chats: list[Any], max_length: int) -> list[Any]:
        calls.append("tokenize")
        if calls.count("tokenize") == 2:
            second_tokenized.set()
        return tokenize(self, chats, max_length)

    def extracting(self: ShardExtractor, samples: list[Any]) -> Any:
        if not calls.count("forward"):
            assert second_tokenized.wait(10), "shard 2 was not tokenized while shard 1 ran on the target"
        calls.append("forward")
        return extract_shard(self, samples)

    monkeypatch.setattr(ChatTokenizer, "tokenize", tokenizing)
    monkeypatch.setattr(ShardExtractor, "extract", extracting)
    assert extract(target, tmp_path / "out", "--limit", "12", "--shard-size", "4") == 0
    assert calls.count("forward") == 3 and len(read_manifest(tmp_path / "out").shards) == 3
