"""Masking of secrets in anything displayed or logged."""

from __future__ import annotations

import re
import shlex

SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
MASK = "***"


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def mask_env(env: dict[str, str]) -> dict[str, str]:
    return {name: (MASK if is_secret_name(name) else value) for name, value in env.items()}


def _is_secret_flag(flag: str) -> bool:
    # Only the end of the flag's last word counts: "--api-key", "--apikey" and
    # "--hf-token" hide their value, "--tokenizer-path" and "--key-cache-dtype" do not.
    last = flag.lstrip("-").replace("_", "-").split("-")[-1].upper()
    return any(last.endswith(marker) for marker in SECRET_MARKERS)


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
        else:
            masked.append(_mask_command_string(arg) if _spaced(arg) else arg)
            hide_next = arg.startswith("--") and _is_secret_flag(arg)
    return masked


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
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: its words as spaces part them
        return text.split()


def _secret_of(word: str, masked: str) -> str | None:
    """The secret value a masked word hid (`X` of `--api-key=X`, of `HF_TOKEN=X`, or the word itself)."""
    if word == masked:
        return None
    return word.partition("=")[2] if masked.endswith("=" + MASK) and "=" in word else word


def mask_text(text: str, argv: list[str]) -> str:
    """`text` (a message that may quote `argv`, like argparse's) with every secret value of `argv` masked."""
    for arg, masked in zip(argv, mask_argv(argv), strict=True):
        whole = masked in (MASK, f"{arg.partition('=')[0]}={MASK}")  # else a command line's own words were masked
        if arg != masked and not whole:
            text = mask_text(text, _shell_words(arg))
        elif arg != masked:
            secret = arg.partition("=")[2] if "=" in masked else arg
            if secret:
                text = text.replace(secret, MASK)
    return text


def mask_values(text: str, env: dict[str, str]) -> str:
    """`text` with the value of every secret-named variable of `env` masked, wherever it appears."""
    for name, value in env.items():
        if is_secret_name(name) and value:
            text = text.replace(value, MASK)
    return text
