"""Online training's tokenized chats kept in --out: a resume reads them instead of tokenizing again, anything they
were not made from tokenizes anew, an unreadable copy is replaced, and the copy is private. Real files, the real
trainer and tokenizer (the demo target's)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from backends.extract.cli import load_chat_tokenizer
from backends.extract.template import ChatTokenizer
from backends.train.__main__ import main
from backends.train.chats import CACHE, cache_key, read_copy
from tests.test_train_online import losses, online

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def tokenize_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many chats each call of the chat tokenizer was given."""
    calls: list[int] = []
    tokenize = ChatTokenizer.tokenize

    def counted(self: ChatTokenizer, chats: list[Any], max_length: int) -> list[Any]:
        calls.append(len(chats))
        return tokenize(self, chats, max_length)

    monkeypatch.setattr(ChatTokenizer, "tokenize", counted)
    return calls


def test_a_resume_reads_the_chats_its_first_start_tokenized(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenize_calls: list[int]
) -> None:
    out = tmp_path / "run"
    assert main(online(target, out, "--steps", "4", "--save-every", "2", "--eval-every", "0")) == 0
    printed = capsys.readouterr().out
    copy = out / CACHE
    assert f"data: tokenized chats kept in {copy}" in printed and sum(tokenize_calls) == 96
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    tokenize_calls.clear()
    assert main(online(target, out, "--steps", "6", "--save-every", "2", "--eval-every", "0", "--resume")) == 0
    printed = capsys.readouterr().out
    assert tokenize_calls == []
    assert f"data: 96 of 96 chats from demo read from {copy}" in printed and "kept in" not in printed
    assert sorted(losses(out)) == [2, 4, 6]


def test_an_unreadable_copy_is_tokenized_again_and_replaced(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenize_calls: list[int]
) -> None:
    out = tmp_path / "run"
    assert main(online(target, out, "--steps", "2", "--save-every", "2", "--eval-every", "0")) == 0
    (out / CACHE).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    capsys.readouterr()
    tokenize_calls.clear()
    assert main(online(target, out, "--steps", "4", "--save-every", "2", "--eval-every", "0", "--resume")) == 0
    printed = capsys.readouterr().out
    assert f"data: {out / CACHE} cannot be read" in printed and "tokenizing again" in printed
    assert sum(tokenize_calls) == 96 and "tokenized chats kept in" in printed
    chat_tokenizer = load_chat_tokenizer(target, None)
    assert read_copy(out / CACHE, cache_key(chat_tokenizer, recorded_sha(out), 2048, 96)) is not None


def recorded_sha(out: Path) -> str:
    import json

    return str(json.loads((out / "final" / "manifest.json").read_text())["data_sha256"])


def test_the_copy_is_named_by_everything_the_chats_were_made_from(target: Path, tmp_path: Path) -> None:
    chat_tokenizer = load_chat_tokenizer(target, None)
    template = tmp_path / "template.jinja"
    template.write_text(chat_tokenizer.template + " ")
    other_template = load_chat_tokenizer(target, template)
    base = cache_key(chat_tokenizer, "a" * 64, 2048, None)
    others = [
        cache_key(chat_tokenizer, "b" * 64, 2048, None),
        cache_key(chat_tokenizer, "a" * 64, 1024, None),
        cache_key(chat_tokenizer, "a" * 64, 2048, 96),
        cache_key(other_template, "a" * 64, 2048, None),
    ]
    assert base == cache_key(load_chat_tokenizer(target, None), "a" * 64, 2048, None)
    assert len({base, *others}) == 5
    assert read_copy(tmp_path / "missing.safetensors", base) is None


def test_a_copy_the_disk_refuses_is_said_in_one_line_and_training_goes_on(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder where the file should go stands for a full or read-only disk (root ignores permission bits)."""
    out = tmp_path / "run"
    (out / CACHE).mkdir(parents=True)
    assert main(online(target, out, "--steps", "2", "--eval-every", "0")) == 0
    printed = capsys.readouterr().out
    assert f"data: cannot keep the tokenized chats in {out / CACHE}" in printed
    assert "a resume will tokenize them again" in printed and (out / "final").is_dir()
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
