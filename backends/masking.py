"""Masking of secrets in anything displayed or logged.

The rule, by the words of a name (its parts between `-`, `_` and `.`, in any case):

- A word names a secret when it ends with token, key, secret, password, passwd, auth or credential (`apikey`,
  `hftoken`, `oauth`), or is a plural of secret, password or credential, or begins with auth (`authorization`,
  `authtoken`; not `author`). `tokens` is a count and `tokenizer` a tool, so neither is one.
- An environment name, a `NAME=value` word of a command line and a key of a JSON object written in one
  (`--model-loader-extra-config '{"hf_token": "..."}'`) hide their value when any of their words names a secret:
  `HF_TOKEN`, `AWS_ACCESS_KEY_ID`, `SSH_AUTH_SOCK`, `MY_CREDENTIALS`.
- A long flag (`--flag value`, `--flag=value`) hides its value when any word but the last is secret, password,
  auth or credential (`--credential-file`, `--hf-auth`), or its last word names a secret (`--api-key`,
  `--hf-token`, `--ssl-keyfile-password`), unless that last word is token after per, first, last or next (a
  number of tokens: `--kt-max-deferred-experts-per-token`, `--bucket-time-to-first-token`). A token or key word
  before the last one says what a setting is about, and its value is no secret: `--speculative-token-map`,
  `--key-cache-dtype`, `--ssl-keyfile`. Of SGLang 0.5.23's 561 flags, --api-key, --admin-api-key and
  --ssl-keyfile-password hide their value; --max-prefill-tokens, --tokenizer-path, --speculative-num-draft-tokens
  and the other 30 that hold such a word do not.
- A short flag (`-k X`, `-p X`) hides nothing: each program gives its letters its own meaning (curl's -k,
  mysql's -p), so a letter says nothing of a secret.
"""

from __future__ import annotations

import re
import shlex

from backends import shellwords

MASK = "***"
_ENDINGS = ("token", "key", "secret", "password", "passwd", "auth", "credential")
_PLURALS = ("secrets", "passwords", "credentials")
_STRONG = ("secret", "password", "passwd", "auth", "credential")  # a secret wherever they stand in a flag
_COUNTING = ("per", "first", "last", "next")  # `per token`, `first token`: a number of tokens, not a token
_WORD_SPLIT = re.compile(r"[-_.]+")


def _words(name: str) -> list[str]:
    return [word for word in _WORD_SPLIT.split(name.lower()) if word]


def _names_a_secret(word: str) -> bool:
    return (
        word.endswith(_ENDINGS) or word in _PLURALS or (word.startswith("auth") and word not in ("author", "authors"))
    )


def is_secret_name(name: str) -> bool:
    """Whether an environment name (or a `NAME=` word, a JSON key) names a secret: any of its words does."""
    return any(_names_a_secret(word) for word in _words(name))


def mask_env(env: dict[str, str]) -> dict[str, str]:
    return {name: (MASK if is_secret_name(name) else value) for name, value in env.items()}


def _is_secret_flag(flag: str) -> bool:
    words = _words(flag.lstrip("-"))
    if not words:
        return False
    *before, last = words
    if any(word.endswith(_STRONG) or word in _PLURALS for word in before):
        return True
    counted = last == "token" and bool(before) and before[-1] in _COUNTING
    return _names_a_secret(last) and not counted


# What follows a secret flag is its value unless it is shaped like the next option
# ("--port", "--port=80"); "--", "--00" or "-x" may well be the secret itself.
_OPTION = re.compile(r"--[A-Za-z][\w-]*(=.*)?", re.DOTALL)


def mask_argv(argv: list[str]) -> list[str]:
    """argv with the values of secret-named flags and NAME=value pairs masked
    (`--api-key X`, `--hf-token=X`, `env HF_TOKEN=X ...`, `docker -e HF_TOKEN=X`), inside a word that is a
    command line itself too (`bash -c 'HF_TOKEN=X python -m ... --api-key X'`)."""
    masked: list[str] = []
    hide_next = False
    for arg in argv:
        name, sep, _ = arg.partition("=")
        if hide_next and not _OPTION.fullmatch(arg):
            masked.append(MASK)
            hide_next = False
        elif sep and not _spaced(name) and (_is_secret_flag(name) if name.startswith("-") else is_secret_name(name)):
            masked.append(f"{name}={MASK}")
            hide_next = False
        elif (in_json := _mask_json_values(arg)) != arg:
            masked.append(in_json)
            hide_next = False
        else:
            masked.append(_mask_command_string(arg) if _spaced(arg) else arg)
            hide_next = arg.startswith("--") and _is_secret_flag(arg)
    return masked


# A quoted key and its quoted value, as JSON (or a Python dict's repr) writes them: `"api_key": "sk-1"`.
_QUOTED_PAIR = re.compile(
    r"""(?P<q>["'])(?P<key>[^"'\\]{1,200})(?P=q)\s*:\s*(?P<vq>["'])(?P<value>(?:\\.|(?!(?P=vq))[^\\])*)(?P=vq)""",
    re.DOTALL,
)


def _json_secrets(arg: str) -> list[tuple[int, int]]:
    """Where the values of secret-named keys stand in an argument that holds a JSON object."""
    if "{" not in arg:
        return []
    return [pair.span("value") for pair in _QUOTED_PAIR.finditer(arg) if is_secret_name(pair["key"])]


def _mask_json_values(arg: str) -> str:
    for start, end in reversed(_json_secrets(arg)):
        arg = arg[:start] + MASK + arg[end:]
    return arg


# Where a secret value may stand as a whole word of a shell string: after a space, `=` or a quote, before a space,
# a quote or an operator.
_WORD_START = r"(?<![^\s='\"])"
_WORD_END = r"(?![^\s'\";&|<>()])"
_PLAIN = re.compile(r"[^\s'\"\\$`]+")  # a value written as it is, wherever it stands in the string
_OPERATOR = re.compile(r"[();<>|&]+")


def _mask_command_string(arg: str) -> str:
    """A word holding a command line (a shell's `-c` string) with its secret values masked where they are written,
    the string's quotes and operators kept; masked word by word when a value cannot be found as written."""
    words = _shell_words(arg)
    secrets = [_secret_of(word, hidden) for word, hidden in zip(words, mask_argv(words), strict=True)]
    text = arg
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        found = 0
        for written, hidden in _spellings(secret):
            text, found = re.subn(_WORD_START + re.escape(written) + _WORD_END, hidden, text)
            if found:
                break
        if not found:  # spelled some other way (escapes): the words themselves, masked, quoted again
            return " ".join(w if _OPERATOR.fullmatch(w) else shlex.quote(w) for w in mask_argv(words))
    return text


def _spellings(secret: str) -> list[tuple[str, str]]:
    """How a shell string may write `secret` as one word, each with what replaces it there."""
    found = [(secret, MASK)] if _PLAIN.fullmatch(secret) else []
    found.append((shlex.quote(secret), f"'{MASK}'"))
    if "'" not in secret:
        found.append((f"'{secret}'", f"'{MASK}'"))
    found.append(('"' + re.sub(r'(["\\$`])', r"\\\1", secret) + '"', f'"{MASK}"'))
    return found


def _spaced(word: str) -> bool:
    return any(space in word for space in " \t\n")


def _shell_words(text: str) -> list[str]:
    """The words of a shell string; as spaces part them when it is one word (`$(cmd --api-key X)`: a secret in
    the command it runs) or cannot be split (an unclosed quote)."""
    try:
        words: list[str] = list(shellwords.split(text))
    except ValueError:
        return text.split()
    return text.split() if len(words) == 1 and words[0] == text.strip() else words


def _secret_of(word: str, masked: str) -> str | None:
    """The secret value a masked word hid (`X` of `--api-key=X`, of `HF_TOKEN=X`, or the word itself)."""
    if word == masked:
        return None
    return word.partition("=")[2] if masked.endswith("=" + MASK) and "=" in word else word


def mask_text(text: str, argv: list[str]) -> str:
    """`text` (a message that may quote `argv`, like argparse's) with every secret value of `argv` masked."""
    for arg, masked in zip(argv, mask_argv(argv), strict=True):
        if arg == masked:
            continue
        if masked in (MASK, f"{arg.partition('=')[0]}={MASK}"):  # the whole value hidden
            secret = arg.partition("=")[2] if "=" in masked else arg
            text = text.replace(secret, MASK) if secret else text
        elif in_json := _json_secrets(arg):
            for value in {arg[start:end] for start, end in in_json} - {""}:
                text = text.replace(value, MASK)
        else:  # a command line's own words were masked
            text = mask_text(text, _shell_words(arg))
    return text


def mask_values(text: str, env: dict[str, str]) -> str:
    """`text` with the value of every secret-named variable of `env` masked, wherever it appears."""
    for name, value in env.items():
        if is_secret_name(name) and value:
            text = text.replace(value, MASK)
    return text
