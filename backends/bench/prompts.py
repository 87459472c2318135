"""What a bench sends: the built-in prompts (a small mix of what a served draft meets, from a one-line question to a
page of context, so acceptance is not measured on one kind of text only: code and lists are easy for a draft, open
prose harder), random prompts of an exact length, or a file's (a prompt per line, JSONL, or ShareGPT)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from backends.bench.stream import BenchError

BUILTIN = "builtin"
RANDOM = "random"
# Token ids of random prompts: bench_serving draws from the whole vocabulary; these lie inside every vocabulary of
# the targets EAGLE-3 serves (32,000 tokens and up) and past their special tokens, so no prompt holds an EOS.
RANDOM_IDS = range(1_000, 30_000)

_CONTEXT = (
    "The EAGLE-3 draft model predicts several tokens ahead of the target model from the target's own hidden "
    "states, taken at three depths of the network. The target then verifies the whole guess in one forward pass "
    "and keeps the longest prefix it agrees with, plus one token of its own. When the draft guesses well, each "
    "verification step yields several tokens and decoding runs faster; when it guesses badly, each step yields "
    "one token and the draft's work is wasted. How many tokens a step yields on average is the acceptance length. "
)

PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "List ten fruits in alphabetical order, one per line.",
    "Explain in three short paragraphs why the sky is blue, for a curious ten-year-old.",
    "Translate into French: 'The train leaves at eight o'clock tomorrow morning from platform four.'",
    "Write a haiku about a server that will not start.",
    "Summarise the following text in two sentences.\n\n" + _CONTEXT * 3,
    "Write a SQL query that returns the five customers with the highest total order value, given tables "
    "customers(id, name) and orders(id, customer_id, amount).",
    "Count from 1 to 40, separated by commas.",
    "Describe the steps to make a cup of tea, as a numbered list.",
    "A train travels 120 km in 1.5 hours. What is its average speed? Show your reasoning step by step.",
    _CONTEXT * 6 + "\nGiven the text above, what happens when the draft guesses badly? Answer at length.",
)


def random_prompts(count: int, length: int, seed: int) -> list[list[int]]:
    """`count` prompts of `length` random token ids each, the same for the same seed (sent as token ids, so each
    is exactly `length` tokens without a tokenizer)."""
    draw = random.Random(seed)
    return [[draw.choice(RANDOM_IDS) for _ in range(length)] for _ in range(count)]


def load_prompts(source: str, cwd: str | None = None) -> list[str]:
    """The built-in prompts, or a file's: a .jsonl file holds one JSON string (or object with "prompt" or "text",
    or a ShareGPT row) per line, a .json file ShareGPT's list of rows (each row's first human turn is its prompt);
    any other file one prompt per line. BenchError when it cannot be read or holds none."""
    if source == BUILTIN:
        return list(PROMPTS)
    path = Path(cwd or ".") / Path(source).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchError(f"cannot read the prompt file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if path.suffix == ".json":
        prompts = _sharegpt(path, text)
    elif path.suffix == ".jsonl":
        prompts = [_jsonl_prompt(path, number, line) for number, line in lines]
    else:
        prompts = [line for _, line in lines]
    if not prompts:
        raise BenchError(f"the prompt file {path} holds no prompt; give one per line, or --prompts builtin")
    return prompts


def _jsonl_prompt(path: Path, number: int, line: str) -> str:
    try:
        row = json.loads(line)
    except ValueError:
        row = None
    if isinstance(row, dict):
        row = _first_human(row) if "conversations" in row else row.get("prompt", row.get("text"))
    if not isinstance(row, str) or not row.strip():
        raise BenchError(f'{path} line {number} is not a prompt: give a JSON string or {{"prompt": "..."}}')
    return row


def _first_human(row: dict[str, Any]) -> str | None:
    """A ShareGPT row's first human turn (bench_serving's prompt of the row)."""
    turns = row.get("conversations")
    if not isinstance(turns, list):
        return None
    said = (t.get("value") for t in turns if isinstance(t, dict) and t.get("from") in ("human", "user"))
    return next((text for text in said if isinstance(text, str) and text.strip()), None)


def _sharegpt(path: Path, text: str) -> list[str]:
    try:
        rows = json.loads(text)
    except ValueError as exc:
        raise BenchError(f"{path} is not JSON ({exc}); give ShareGPT's list of conversations") from None
    if not isinstance(rows, list):
        raise BenchError(f"{path} holds no list of conversations; give ShareGPT's JSON, or a .jsonl file")
    found = (_first_human(row) for row in rows if isinstance(row, dict))
    return [prompt for prompt in found if prompt is not None]
