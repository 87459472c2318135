"""Secrets must never reach the console's screen or logs; everything else must stay readable."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from backends.masking import MASK, is_secret_name, mask_argv, mask_env, mask_text
from tests.sglang_tier import in_tier


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


# ----- secrets by pattern: the shapes a secret is passed in, and the names that must stay readable -----


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["serve", "--auth", "X"], ["serve", "--auth", MASK]),
        (["serve", "--hf-auth=X"], ["serve", f"--hf-auth={MASK}"]),
        (["serve", "--credential-file", "X"], ["serve", "--credential-file", MASK]),
        (["serve", "--credentials=X"], ["serve", f"--credentials={MASK}"]),
        (["serve", "--oauth", "X"], ["serve", "--oauth", MASK]),
        (["serve", "--authorization", "Bearer X"], ["serve", "--authorization", MASK]),
        (["serve", "--ssl-keyfile-password", "X"], ["serve", "--ssl-keyfile-password", MASK]),
        (["serve", "--admin-api-key", "X"], ["serve", "--admin-api-key", MASK]),
        (["serve", "--db-passwd", "X"], ["serve", "--db-passwd", MASK]),
        (["env", "MY_CREDENTIALS=X", "serve"], ["env", f"MY_CREDENTIALS={MASK}", "serve"]),
        (["env", "AWS_ACCESS_KEY_ID=X", "serve"], ["env", f"AWS_ACCESS_KEY_ID={MASK}", "serve"]),
        (["env", "BASIC_AUTH=X", "serve"], ["env", f"BASIC_AUTH={MASK}", "serve"]),
        (
            ["serve", "--model-loader-extra-config", '{"hf_token": "X", "revision": "main"}'],
            ["serve", "--model-loader-extra-config", '{"hf_token": "***", "revision": "main"}'],
        ),
        (
            ["serve", '--json-model-override-args={"api_key":"X"}'],
            ["serve", '--json-model-override-args={"api_key":"***"}'],
        ),
        (
            ["serve", "--extra", "{'password': 'X', 'nested': {'client_secret': 'X'}}"],
            ["serve", "--extra", "{'password': '***', 'nested': {'client_secret': '***'}}"],
        ),
        # A letter means what each program says (curl -k, mysql -p): short flags hide nothing.
        (["curl", "-k", "https://x"], ["curl", "-k", "https://x"]),
        (["mysql", "-p", "3306"], ["mysql", "-p", "3306"]),
    ],
)
def test_a_secret_is_hidden_in_every_shape_it_is_passed(argv: list[str], expected: list[str]) -> None:
    assert mask_argv(argv) == expected
    assert "X" not in mask_text(" ".join(argv), argv).replace("https://x", "")


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--speculative-token-map", "/models/freq_32768.pt"],
        ["serve", "--max-total-tokens", "65536"],
        ["serve", "--max-prefill-tokens", "16384"],
        ["serve", "--speculative-num-draft-tokens", "8"],
        ["serve", "--kt-max-deferred-experts-per-token", "2"],
        ["serve", "--bucket-time-to-first-token", "0.1", "0.5"],
        ["serve", "--tokenizer-path", "/models/tok", "--skip-tokenizer-init"],
        ["serve", "--ssl-keyfile", "/etc/ssl/server.key"],
        ["serve", "--kv-cache-dtype", "fp8_e5m2", "--disable-radix-cache"],
        ["serve", "--author", "alice"],
        ["env", "TOKENIZERS_PARALLELISM=false", "MAX_TOKENS=4096", "serve"],
        ["serve", "--extra", '{"max_tokens": 8, "tokenizer": "t"}'],
    ],
)
def test_a_setting_that_only_mentions_tokens_or_keys_stays_readable(argv: list[str]) -> None:
    assert mask_argv(argv) == argv


def test_of_sglang_s_own_flags_only_the_keys_and_the_password_are_hidden(sglang_python: Path) -> None:
    """Every flag of SGLang 0.5.23's server (its real parser, in the tier) given a value: those hidden are exactly
    the two API keys and the SSL key file's password."""
    flags: list[str] = in_tier(sglang_python, "-c", SGLANG_FLAGS)["flags"]
    assert len(flags) > 500 and "--speculative-token-map" in flags
    hidden = {flag for flag in flags if mask_argv([flag, "v"])[1] == MASK}
    assert hidden == {"--api-key", "--admin-api-key", "--ssl-keyfile-password"}
    assert {flag for flag in flags if mask_argv([f"{flag}=v"])[0] != f"{flag}=v"} == hidden


SGLANG_FLAGS = (
    "import argparse, json; from sglang.srt.server_args import ServerArgs; parser = argparse.ArgumentParser(); "
    "ServerArgs.add_cli_args(parser); "
    "print(json.dumps({'flags': sorted(o for a in parser._actions for o in a.option_strings if o[:2] == '--')}))"
)
secret_words = st.sampled_from(["token", "key", "secret", "password", "auth", "credential", "apikey", "hftoken"])
strong_words = st.sampled_from(["secret", "password", "passwd", "auth", "credential", "credentials"])
plain_name_words = st.sampled_from(["hf", "api", "model", "path", "file", "my", "db", "client", "x2", "ssl"])
values = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=16).filter(
    lambda s: not re.match(r"--[A-Za-z]", s) and " " not in s and "=" not in s and "{" not in s and MASK not in s
)


@settings(max_examples=200, deadline=None)
@given(
    before=st.lists(plain_name_words, max_size=3),
    after=st.lists(plain_name_words, max_size=2),
    last=secret_words,
    strong=strong_words,
    sep=st.sampled_from(["-", "_"]),
    value=values,
    upper=st.booleans(),
)
def test_a_flag_or_name_with_a_secret_word_never_shows_its_value(
    before: list[str], after: list[str], last: str, strong: str, sep: str, value: str, upper: bool
) -> None:
    """A secret word ending a flag, a strong one anywhere in it, any of them anywhere in an env name: the value,
    given as the next word, after `=` or in a JSON object, is replaced and nothing else is."""
    ending = sep.join([*before, last])
    anywhere = sep.join([*before, strong, *after])
    for flag in (f"--{ending}", f"--{anywhere}"):
        flag = flag.upper() if upper else flag
        assert mask_argv(["serve", flag, value, "--port", "8"]) == ["serve", flag, MASK, "--port", "8"]
        assert mask_argv(["serve", f"{flag}={value}"]) == ["serve", f"{flag}={MASK}"]
    name = sep.join([*before, last, *after]).upper()
    assert mask_argv(["env", f"{name}={value}", "serve"]) == ["env", f"{name}={MASK}", "serve"]
    assert mask_env({name: value}) == {name: MASK}
    document = json.dumps({name.lower(): value, "port": 8})
    assert mask_argv(["serve", "--extra-config", document]) == [
        "serve",
        "--extra-config",
        json.dumps({name.lower(): MASK, "port": 8}),
    ]
