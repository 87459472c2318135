"""Secrets must never reach the console's screen or logs; everything else must stay readable."""

from __future__ import annotations

import re
import shlex

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from backends.masking import MASK, is_secret_name, mask_argv, mask_env, mask_text


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "hf_token",
        "Hf_Token",
        "HUGGING_FACE_HUB_TOKEN",
        "OPENAI_API_KEY",
        "openai_api_key",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "my_secret",
        "DB_PASSWORD",
        "Password",
        "TOKEN",
        "KEY",
    ],
)
def test_mask_env_masks_secret_names_in_any_case(name: str) -> None:
    assert is_secret_name(name)
    assert mask_env({name: "hf_abcdef123"}) == {name: MASK}


@pytest.mark.parametrize(
    "name", ["CUDA_VISIBLE_DEVICES", "PATH", "HF_HOME", "PYTHONPATH", "NCCL_DEBUG", "OMP_NUM_THREADS", "USER"]
)
def test_mask_env_keeps_ordinary_names(name: str) -> None:
    assert not is_secret_name(name)
    assert mask_env({name: "0,1"}) == {name: "0,1"}


def test_mask_env_keeps_keys_and_order_and_does_not_touch_input() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": "hf_x", "HF_HOME": "/data/hf", "WANDB_API_KEY": "w"}
    original = dict(env)
    masked = mask_env(env)
    assert list(masked) == list(env)
    assert masked == {"CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": MASK, "HF_HOME": "/data/hf", "WANDB_API_KEY": MASK}
    assert env == original
    assert "hf_x" not in masked.values() and "w" not in masked.values()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["python", "-m", "sglang.launch_server", "--api-key", "sk-123", "--port", "30000"],
            ["python", "-m", "sglang.launch_server", "--api-key", MASK, "--port", "30000"],
        ),
        (["train", "--hf-token=hf_abc", "--lr", "1e-4"], ["train", "--hf-token=" + MASK, "--lr", "1e-4"]),
        (["train", "--hf_token", "hf_abc"], ["train", "--hf_token", MASK]),
        (["train", "--HF-TOKEN", "hf_abc"], ["train", "--HF-TOKEN", MASK]),
        (["db", "--password", "hunter2"], ["db", "--password", MASK]),
        (["db", "--password=hunter2"], ["db", "--password=" + MASK]),
        (["x", "--client-secret", "s"], ["x", "--client-secret", MASK]),
        # value containing '=' is masked whole
        (["x", "--api-key=a=b=c"], ["x", "--api-key=" + MASK]),
    ],
)
def test_mask_argv_masks_secret_flag_values(argv: list[str], expected: list[str]) -> None:
    masked = mask_argv(argv)
    assert masked == expected
    assert len(masked) == len(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "serve.py", "--tokenizer-path", "/models/llama/tokenizer"],
        ["python", "serve.py", "--model-path", "/models/llama"],
        ["python", "serve.py", "--tokenizer-path=/models/tok", "--model-path=/models/m"],
        ["vllm", "--key-cache-dtype", "fp8"],
        ["train", "--max-tokens", "4096"],
        ["python", "-c", "print('KEY TOKEN SECRET')"],
    ],
)
def test_mask_argv_keeps_non_secret_flags(argv: list[str]) -> None:
    assert mask_argv(argv) == argv


def test_mask_argv_does_not_touch_input_and_handles_trailing_flag() -> None:
    argv = ["serve", "--api-key"]
    assert mask_argv(argv) == ["serve", "--api-key"]
    assert argv == ["serve", "--api-key"]
    assert mask_argv([]) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--apikey", "sk-live-123"],
        ["env", "HF_TOKEN=hf_secret123", "python", "serve.py"],
        ["docker", "run", "-e", "HF_TOKEN=hf_secret123", "image"],
    ],
)
def test_mask_argv_hides_other_common_secret_forms(argv: list[str]) -> None:
    masked = mask_argv(argv)
    assert len(masked) == len(argv)
    assert not any("sk-live-123" in a or "hf_secret123" in a for a in masked)


flag_words = st.sampled_from(
    [
        "--api-key",
        "--hf-token",
        "--password",
        "--secret",
        "--tokenizer-path",
        "--model-path",
        "--port",
        "-p",
        "--api-key=sk",
        "--hf_token=hf",
        "--model-path=/m",
        "-",
        "--",
        "=",
        "--=x",
    ]
)
argvs = st.lists(flag_words | st.text(max_size=12), max_size=12)


@settings(max_examples=300, deadline=None)
@given(argvs)
def test_mask_argv_only_ever_replaces_values(argv: list[str]) -> None:
    masked = mask_argv(argv)
    assert len(masked) == len(argv)
    for before, after in zip(argv, masked, strict=True):
        if after == before:
            continue
        # Either a whole value was replaced, or the value part of --flag=value.
        assert after == MASK or after == before.split("=", 1)[0] + "=" + MASK
    for i, arg in enumerate(argv[:-1]):
        # A value right after a secret flag is hidden (unless that flag was itself a hidden
        # value, or what follows is the next flag rather than a value).
        secret_flag = arg in ("--api-key", "--hf-token", "--password", "--secret") and masked[i] == arg
        if secret_flag and not re.fullmatch(r"--[A-Za-z][\w-]*(=.*)?", argv[i + 1], re.DOTALL):
            assert masked[i + 1] == MASK


def test_a_secret_flag_followed_by_another_flag_hides_nothing_else() -> None:
    assert mask_argv(["serve", "--api-key", "--port", "80"]) == ["serve", "--api-key", "--port", "80"]


@pytest.mark.parametrize("value", ["--00", "--", "-x", "--=x"])
def test_a_secret_that_starts_with_dashes_is_still_hidden(value: str) -> None:
    assert mask_argv(["serve", "--api-key", value, "--port", "80"]) == ["serve", "--api-key", MASK, "--port", "80"]


def test_env_style_assignments_and_joined_words_are_masked() -> None:
    argv = ["env", "HF_TOKEN=hf_abc", "python", "serve.py", "--apikey", "sk-1", "--tokenizer-path", "t"]
    assert mask_argv(argv) == ["env", "HF_TOKEN=***", "python", "serve.py", "--apikey", "***", "--tokenizer-path", "t"]


def test_a_message_quoting_the_command_line_shows_no_secret_value() -> None:
    argv = ["python", "-m", "sglang.launch_server", "--my-api-key", "sk-123", "--hf-token=hf_abc", "--port", "8"]
    text = "unrecognized arguments: --my-api-key sk-123 --hf-token=hf_abc --port 8"
    assert mask_text(text, argv) == f"unrecognized arguments: --my-api-key {MASK} --hf-token={MASK} --port 8"
    assert mask_text("nothing secret here", argv) == "nothing secret here"


@given(st.text(alphabet="abcdefghijkXYZ0123456789_-", min_size=4, max_size=20))
def test_no_secret_value_survives_in_a_message_that_quotes_it(value: str) -> None:
    assume(not re.match(r"--[A-Za-z]", value))  # that would read as the next option, not a value
    argv = ["serve", "--api-key", value, f"--hf-token={value}x"]
    assert value not in mask_text(f"bad: {' '.join(argv)}", argv)


# ----- secrets inside a command line given as one word: `bash -c '...'` -----

plain_words = st.sampled_from(
    ["python3", "-m", "sglang.launch_server", "--port", "8000", "cd", "/srv", "&&", ";", "exec", ">", "log", "2>&1"]
)
secrets = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=4, max_size=16).filter(
    lambda s: not re.match(r"--[A-Za-z]", s) and s.strip() == s and s != MASK and MASK not in s
)


def shell_words(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


@settings(max_examples=300, deadline=None)
@given(
    before=st.lists(plain_words, max_size=6),
    after=st.lists(plain_words, max_size=6),
    secret=secrets,
    form=st.sampled_from(["--api-key {}", "--hf-token={}", "HF_TOKEN={}", "export OPENAI_API_KEY={};"]),
)
def test_a_shell_string_keeps_its_shape_and_loses_its_secret(
    before: list[str], after: list[str], secret: str, form: str
) -> None:
    """Whatever the secret's characters (quoted as shlex.join quotes them), it leaves the string and only it does."""
    head, _, tail = form.partition("{}")
    quoted = shlex.quote(secret)
    text = " ".join(before) + f" {head}{quoted}{tail} " + " ".join(after)
    assume(secret not in " ".join(before + after) + head + tail)
    [shell, flag, masked] = mask_argv(["bash", "-c", text])
    assert (shell, flag) == ("bash", "-c")
    assert secret not in masked
    # The words around the secret are the same words, in the same places.
    masked_words, words = shell_words(masked), shell_words(text)
    assert len(masked_words) == len(words)
    changed = [(w, m) for w, m in zip(words, masked_words, strict=True) if w != m]
    assert len(changed) == 1 and changed[0][1] == changed[0][0].replace(secret, MASK)


@given(st.lists(plain_words | st.sampled_from(["--tokenizer-path", "/models/tok", "'a b'", '"$PORT"']), max_size=12))
def test_a_shell_string_without_secrets_is_left_exactly_as_written(words: list[str]) -> None:
    text = " ".join(words)
    assert mask_argv(["sh", "-c", text]) == ["sh", "-c", text]


def test_secrets_in_a_shell_string_are_masked_where_written() -> None:
    text = "cd /srv && HF_TOKEN=hf_abc exec python3 -m sglang.launch_server --api-key 'sk 1' --port 8 > log 2>&1"
    assert mask_argv(["bash", "-c", text]) == [
        "bash",
        "-c",
        "cd /srv && HF_TOKEN=*** exec python3 -m sglang.launch_server --api-key '***' --port 8 > log 2>&1",
    ]
    # Inside a container's command too, and in a message that quotes it.
    argv = ["docker", "run", "img", "sh", "-c", "python3 -m sglang.launch_server --api-key sk-9 --port 8"]
    assert "sk-9" not in " ".join(mask_argv(argv))
    assert "sk-9" not in mask_text("refused: --api-key sk-9", argv)


def test_a_spaced_value_of_a_secret_flag_is_hidden_whole_in_a_message() -> None:
    argv = ["serve", "--api-key=two words", "--hf-token", "a b"]
    assert mask_text("got --api-key=two words --hf-token a b", argv) == f"got --api-key={MASK} --hf-token {MASK}"
