"""What benchmarks/mutation.sh found no test of in protocol.py: the one line a refused request says (its code,
its words and the request it answers), the environment names a launch may set, which values a metric row may
hold and what each is as a point of its series, the --metrics-from spellings, what stands for a message too large
to send, and a stream's end for falling behind."""

from __future__ import annotations

import math
from typing import Any

import pytest

from backends.protocol import (
    BEHIND,
    MAX_LINE_BYTES,
    OPS,
    ProtocolError,
    behind_message,
    env_name_problem,
    error_reply,
    metric_number,
    nonfinite_spelled,
    not_metric_values,
    parse_request,
    parse_source,
    request_line,
    too_large_end,
    too_large_reply,
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


def raw_refused(line: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        parse_request(line)
    return caught.value


def test_a_request_that_is_no_request_says_what_it_lacks() -> None:
    assert raw_refused(b"[1, 2]").message == "request must be a JSON object"
    assert raw_refused(b'{"v": 1, "op": "hello"}').message == "request needs an integer or string 'id'"
    wrong = raw_refused(b'{"v": 1, "id": 3, "op": "hello", "args": [1]}')
    assert (wrong.code, wrong.message, wrong.request_id) == ("bad_args", "'args' must be a JSON object", 3)


@pytest.mark.parametrize(
    ("op", "args", "said"),
    [
        ("kill", {"run": "r1", "zeta": 1, "alpha": 2}, "kill: unknown argument(s) alpha, zeta"),
        ("kill", {"run": 5}, "kill: 'run' must be str"),
        ("logs", {"run": "r", "tail": "x"}, "logs: 'tail' must be int/null"),
        ("kill", {"run": "r1", "grace": float("inf")}, "kill: 'grace' must be a finite number, not inf"),
    ],
)
def test_an_argument_of_the_wrong_kind_is_named_with_the_kind_wanted(op: str, args: dict[str, Any], said: str) -> None:
    assert refused(op, args).message == said


def test_an_error_reply_carries_its_details() -> None:
    assert error_reply(3, "not_found", "no run r", details={"runs": ["a"]}) == {
        "v": 1,
        "id": 3,
        "ok": False,
        "error": {"code": "not_found", "message": "no run r", "details": {"runs": ["a"]}},
    }


def test_what_stands_for_a_message_too_large_says_so_whole() -> None:
    reply = too_large_reply(2, "logs", 99)
    assert reply["error"]["message"] == (
        f"logs: the agent's reply was 99 bytes, more than one message may carry ({MAX_LINE_BYTES}); "
        "it was dropped, and nothing else was lost (please report it: no reply should be that large)"
    )
    assert too_large_end(1, "log", 99)["error"] == (
        f"a log message of the agent's was 99 bytes, more than one message may carry ({MAX_LINE_BYTES}); "
        "the stream stopped there (please report it: no message should be that large)"
    )


def test_a_stream_that_fell_behind_ends_with_the_bytes_held_for_it() -> None:
    assert behind_message(6, 1234) == {"v": 1, "sub": 6, "stream": BEHIND, "waiting": 1234}


@pytest.mark.parametrize(
    ("name", "value", "number"),
    [
        ("loss", 1.5, 1.5),
        ("step", 3, 3.0),
        ("loss", " NaN ", math.nan),
        ("loss", "-inf", -math.inf),
        ("loss", "high", None),
        ("loss", None, None),
        ("done", True, None),  # a flag is a point of no series but `plateau`
        ("plateau", True, 1.0),
        ("plateau", False, 0.0),
        ("loss", 10**400, math.inf),  # beyond a double: as far off the chart as it goes
        ("loss", -(10**400), -math.inf),
    ],
)
def test_a_metric_value_is_a_point_or_none(name: str, value: object, number: float | None) -> None:
    got = metric_number(name, value)
    assert (got is None) == (number is None)
    if number is not None:
        assert got is not None and (got == number or (math.isnan(got) and math.isnan(number)))


def test_only_text_spells_a_nonfinite_value() -> None:
    assert nonfinite_spelled(3) is None and nonfinite_spelled(" INF") == math.inf
