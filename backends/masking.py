"""Masking of secrets in anything displayed or logged."""

from __future__ import annotations

import re

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
    (`--api-key X`, `--hf-token=X`, `env HF_TOKEN=X ...`, `docker -e HF_TOKEN=X`)."""
    masked: list[str] = []
    hide_next = False
    for arg in argv:
        name, sep, _ = arg.partition("=")
        if hide_next and not _OPTION.fullmatch(arg):
            masked.append(MASK)
            hide_next = False
        elif sep and (_is_secret_flag(name) if name.startswith("-") else is_secret_name(name)):
            masked.append(f"{name}={MASK}")
            hide_next = False
        else:
            masked.append(arg)
            hide_next = arg.startswith("--") and _is_secret_flag(arg)
    return masked


def mask_text(text: str, argv: list[str]) -> str:
    """`text` (a message that may quote `argv`, like argparse's) with every secret value of `argv` masked."""
    for arg, masked in zip(argv, mask_argv(argv), strict=True):
        if arg != masked:
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
