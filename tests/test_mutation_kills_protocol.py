"""What benchmarks/mutation.sh found no test of in protocol.py: the one line a refused request says (its code,
its words and the request it answers), the environment names a launch may set, which values a metric row may
hold, the --metrics-from spellings, and what stands for a stream message too large to send."""

from __future__ import annotations

from typing import Any

import pytest

from backends.protocol import (
    OPS,
    ProtocolError,
    env_name_problem,
    not_metric_values,
    parse_request,
    parse_source,
    request_line,
    too_large_end,
)

NUL = "contains a NUL byte, which no command line, environment or path can hold"


def refused(op: str, args: dict[str, Any], request_id: int | str = 7) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        parse_request(request_line(request_id, op, args))
    return caught.value


def launch(**args: Any) -> dict[str, Any]:
    return {"kind": "command", "argv": ["python", "train.py"], **args}


@pytest.mark.parametrize(
    ("op", "args", "said"),
    [
        ("kill", {"run": "r1", "grace": -1}, "kill: 'grace' must not be negative"),
        ("launch", launch(argv=["python", "a\0b"]), f"launch: argv[1] {NUL}"),
        ("launch", launch(env={"A=B": "1"}), "launch: environment variable name 'A=B' contains '=': give NAME=VALUE"),
        ("launch", launch(env={"": "1"}), "launch: an environment variable needs a name: give NAME=VALUE"),
        ("launch", launch(env={"OK": "1", "X\0": "1"}), f"launch: env name 'X\\x00' {NUL}"),
    ],
)
def test_a_refused_request_says_which_argument_and_why_in_one_line_and_answers_its_request(
    op: str, args: dict[str, Any], said: str
) -> None:
    error = refused(op, args, request_id="req-9")
    assert (error.code, error.message, error.request_id) == ("bad_args", said, "req-9")


def test_a_long_environment_name_is_shown_cut_and_one_of_the_limit_whole() -> None:
    at_limit = "A" * 39 + "="
    assert refused("launch", launch(env={at_limit: "1"})).message == (
        f"launch: environment variable name {at_limit!r} contains '=': give NAME=VALUE"
    )
    longer = "B" * 40 + "=C"
    assert refused("launch", launch(env={longer: "1"})).message == (
        f"launch: environment variable name {'B' * 40 + '…'!r} contains '=': give NAME=VALUE"
    )


def test_environment_names_a_run_spec_refuses() -> None:
    """What RunSpec.validate says of a stored spec's environment, where no request checked it first."""
    assert env_name_problem("CUDA_VISIBLE_DEVICES") is None
    assert env_name_problem("X\0Y") == f"environment variable name 'X\\x00Y' {NUL}"
    assert env_name_problem("X\ud800Y") == (
        "environment variable name 'X\\ud800Y' contains '\\ud800', which no command line, environment or path can hold"
    )
    assert env_name_problem("") == "an environment variable needs a name: give NAME=VALUE"


def test_an_unknown_op_is_refused_naming_every_op_the_agent_knows() -> None:
    error = refused("explode", {})
    assert error.code == "unknown_op" and error.request_id == 7
    assert error.message == f"unknown op 'explode'; known: {', '.join(OPS)}"


def test_a_metric_row_holds_numbers_named_texts_and_flags_only() -> None:
    row = {
        "loss": 1.5,
        "step": 3,
        "lr": "NaN",
        "acc": "-inf",
        "source": "jsonl",
        "stage": "extract",
        "plateau": True,
        "note": "high",
        "eval": [1.0],
        "done": False,
        "gap": None,
    }
    assert not_metric_values(row) == {"note": "high", "eval": [1.0], "done": False, "gap": None}


@pytest.mark.parametrize(
    ("text", "normalised"),
    [("jsonl", "jsonl"), (" SpecForge ", "specforge"), ("tensorboard: runs/a ", "tensorboard:runs/a")],
)
def test_a_metrics_source_is_normalised(text: str, normalised: str) -> None:
    assert parse_source(text) == normalised


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("wandb", "unknown metrics source 'wandb'; use one of jsonl, specforge, speculators, eagle or tensorboard:DIR"),
        ("jsonl:x", "metrics source 'jsonl' takes no argument (got 'jsonl:x'); use one of"),
        ("tensorboard:", "tensorboard needs the folder of its event files: tensorboard:DIR (e.g. tensorboard:runs)"),
        ("tensorboard:a\0b", "the tensorboard folder name contains a NUL byte"),
    ],
)
def test_a_metrics_source_that_is_none_says_what_to_write(text: str, said: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_source(text)
    assert str(caught.value).startswith(said)


def test_a_stream_message_too_large_ends_its_stream_saying_why_without_a_state() -> None:
    end = too_large_end(4, "log", 10**9)
    assert {key: end[key] for key in ("sub", "stream", "run", "state")} == {
        "sub": 4,
        "stream": "end",
        "run": None,
        "state": None,
    }
    assert "a log message of the agent's was 1000000000 bytes" in end["error"]
