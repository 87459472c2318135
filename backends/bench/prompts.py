"""The built-in prompts of `bench --prompts builtin`: a small mix of what a served draft meets, from a one-line
question to a page of context, so acceptance is not measured on one kind of text only (code and lists are easy for
a draft, open prose harder)."""

from __future__ import annotations

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
