"""How long a host has to answer each request, as ssh's ServerAliveInterval bounds a silent link: an agent that
stopped answering (a host swapping to death, a process stopped, a file system hung under it) fails the call
with one line naming the host and the call, instead of holding the command, or every host of it, forever.

`--timeout SECONDS` (or `timeout` in config.toml) is the time every call gets; without it, each call gets its
kind's: a quick look, or the longer checks a launch or a doctor runs first. A call that itself waits (a kill's
grace, free-gpus' wait for memory) gets that wait on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from console.link.ops import TransportError

QUICK_S = 30.0  # status, logs, kill's first signal: the agent answers these in milliseconds
LONG_S = 300.0  # a launch (SGLang's parser and doctor run first), doctor, convert, a fresh stack dump
DRY_LOAD_S = 900.0  # doctor --dry-load: SGLang's own loader reads the draft's weights
LONG_OPS = frozenset({"launch", "relaunch", "bench", "preflight", "doctor", "convert", "relaunch_presets"})
WAITS = {"kill": ("grace",), "relaunch": ("grace",), "free_gpus": ("timeout", "grace")}  # the call's own waits
# What the line calls an operation when the protocol's name is not the command's.
SAID = {"run_info": "status RUN", "list_runs": "list", "free_gpus": "free-gpus", "relaunch_presets": "relaunch"}


class NoAnswer(TransportError):
    """The agent did not answer within the call's deadline: the link is given up (it stays transient: the
    host may answer again on a new one)."""


def seconds_for(op: str, args: Mapping[str, Any], given: float | None) -> float:
    """The deadline of one call: `given` (the --timeout), else its kind's; plus the waits it asks for."""
    if given is not None:
        base = given
    elif op == "doctor" and args.get("dry_load"):
        base = DRY_LOAD_S
    elif op in LONG_OPS or (op == "stacks" and args.get("now")):
        base = LONG_S
    else:
        base = QUICK_S
    waits = [args.get(name) for name in WAITS.get(op, ())]
    return base + sum(w for w in waits if isinstance(w, (int, float)) and not isinstance(w, bool))


def no_answer(host: str, op: str, seconds: float) -> NoAnswer:
    return NoAnswer(
        f"{host}: no answer to {SAID.get(op, op)} in {seconds:g} s (the agent stopped answering); "
        "check the host, or give it longer with --timeout SECONDS"
    )
