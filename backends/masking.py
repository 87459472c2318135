"""Masking of secrets in anything displayed or logged."""

from __future__ import annotations

SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
MASK = "***"


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def mask_env(env: dict[str, str]) -> dict[str, str]:
    return {name: (MASK if is_secret_name(name) else value) for name, value in env.items()}


def _is_secret_flag(flag: str) -> bool:
    # Only the flag's last word counts: "--api-key" and "--hf-token" hide their
    # value, "--tokenizer-path" and "--key-cache-dtype" do not.
    words = flag.lstrip("-").replace("_", "-").split("-")
    return words[-1].upper() in SECRET_MARKERS


def mask_argv(argv: list[str]) -> list[str]:
    """argv with the values of secret-named flags replaced by the mask."""
    masked: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            masked.append(MASK)
            hide_next = False
        elif arg.startswith("-") and "=" in arg and _is_secret_flag(arg.split("=", 1)[0]):
            masked.append(arg.split("=", 1)[0] + "=" + MASK)
        else:
            masked.append(arg)
            hide_next = arg.startswith("--") and _is_secret_flag(arg)
    return masked
