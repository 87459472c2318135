"""The request parser is the agent's front door: whatever arrives on stdin must
become either a valid Request or a ProtocolError (an error reply), never a crash."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.protocol import (
    FRAME_BYTES,
    MAX_LINE_BYTES,
    OPS,
    PROTOCOL_VERSION,
    ProtocolError,
    Request,
    encode,
    error_reply,
    message_head,
    ok_reply,
    parse_request,
    request_line,
    stream_message,
    too_large_end,
    too_large_reply,
)

ERROR_CODES = {"bad_json", "bad_request", "bad_version", "unknown_op", "bad_args"}


def line_of(msg: object) -> bytes:
    return json.dumps(msg).encode() + b"\n"


def req(op: str, args: dict[str, Any] | None = None, request_id: int | str = 7, **extra: Any) -> bytes:
    msg: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": request_id, "op": op, **extra}
    if args is not None:
        msg["args"] = args
    return line_of(msg)


def rejected(line: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_request(line)
    err = info.value
    assert err.code in ERROR_CODES
    assert err.message, "an error reply needs a message the user can read"
    assert str(err) == err.message
    return err


# --- malformed lines ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"\n",
        b"hello",
        b"{",
        b'{"v": 1, "id": 1, "op": "hello"',  # truncated mid-object
        b"{'v': 1}",  # Python repr is not JSON
        b'{"v": 1, "id": 1, "op": "hello"} trailing',
    ],
)
def test_not_json_is_bad_json(line: bytes) -> None:
    err = rejected(line)
    assert err.code == "bad_json"
    assert "JSON" in err.message
    assert err.request_id is None


def test_invalid_utf8_is_bad_json() -> None:
    err = rejected(b'{"v": 1, "id": 3, "op": "kill", "args": {"run": "\xff\xfe"}}')
    assert err.code == "bad_json"
    assert err.request_id is None


@pytest.mark.parametrize("line", [b"[]", b'[{"v": 1, "id": 1, "op": "hello"}]', b"1", b'"hello"', b"null", b"true"])
def test_json_that_is_not_an_object_is_bad_request(line: bytes) -> None:
    err = rejected(line)
    assert err.code == "bad_request"
    assert "object" in err.message
    assert err.request_id is None


@pytest.mark.parametrize("bad_id", ["missing", None, True, False, 1.5, [1], {"n": 1}])
def test_request_without_usable_id_is_bad_request(bad_id: object) -> None:
    msg: dict[str, Any] = {"v": 1, "op": "hello"}
    if bad_id != "missing":
        msg["id"] = bad_id
    err = rejected(line_of(msg))
    assert err.code == "bad_request"
    assert "'id'" in err.message
    # An id we could not read must not be echoed back as if it were one.
    assert err.request_id is None


@pytest.mark.parametrize("request_id", [0, 42, -1, 2**70, "", "abc"])
def test_int_and_string_ids_are_accepted(request_id: int | str) -> None:
    assert parse_request(req("hello", request_id=request_id)).id == request_id


@pytest.mark.parametrize("version", ["missing", 0, 2, "1", None, [1]])
def test_wrong_version_is_bad_version_with_the_id(version: object) -> None:
    msg: dict[str, Any] = {"id": "r-9", "op": "hello"}
    if version != "missing":
        msg["v"] = version
    err = rejected(line_of(msg))
    assert err.code == "bad_version"
    assert err.request_id == "r-9"
    assert f"speaks {PROTOCOL_VERSION}" in err.message


@pytest.mark.parametrize("version", [True, 1.0])
def test_version_true_or_float_is_not_version_1(version: object) -> None:
    err = rejected(line_of({"v": version, "id": 5, "op": "hello"}))
    assert err.code == "bad_version"


@pytest.mark.parametrize("op", ["launch_missiles", "", "HELLO", None, 5, ["hello"], {"op": "hello"}])
def test_unknown_op_is_unknown_op_with_the_id(op: object) -> None:
    err = rejected(line_of({"v": 1, "id": 11, "op": op}))
    assert err.code == "unknown_op"
    assert err.request_id == 11
    # The message tells the user what would have worked.
    assert "hello" in err.message and "launch" in err.message


def test_missing_op_is_unknown_op() -> None:
    err = rejected(line_of({"v": 1, "id": 12}))
    assert err.code == "unknown_op"
    assert err.request_id == 12


@pytest.mark.parametrize("args", [[], ["run", "x"], "run=x", 1, None, True])
def test_args_not_an_object_is_bad_args(args: object) -> None:
    err = rejected(line_of({"v": 1, "id": 13, "op": "kill", "args": args}))
    assert err.code == "bad_args"
    assert err.request_id == 13
    assert "'args'" in err.message


def test_unknown_argument_is_named() -> None:
    err = rejected(req("kill", {"run": "r", "sigal": "KILL"}, request_id=14))
    assert err.code == "bad_args"
    assert err.request_id == 14
    assert "sigal" in err.message


def test_arguments_of_an_op_without_arguments_are_rejected() -> None:
    err = rejected(req("hello", {"x": 1}))
    assert err.code == "bad_args"
    assert "x" in err.message


@pytest.mark.parametrize(
    ("op", "args", "bad"),
    [
        ("kill", {"run": 5}, "run"),
        ("kill", {"run": None}, "run"),
        ("kill", {"run": "r", "grace": "10"}, "grace"),
        ("kill", {"run": "r", "grace": None}, "grace"),
        # bool is an int subclass in Python; it must not pass for a number.
        ("kill", {"run": "r", "grace": True}, "grace"),
        ("logs", {"run": "r", "max_bytes": True}, "max_bytes"),
        ("logs", {"run": "r", "max_bytes": 1.5}, "max_bytes"),
        ("logs", {"run": "r", "offset": False}, "offset"),
        ("logs", {"run": "r", "tail": "10"}, "tail"),
        ("metrics", {"run": "r", "offset": True}, "offset"),
        ("unsubscribe", {"sub": True}, "sub"),
        ("unsubscribe", {"sub": "1"}, "sub"),
        ("status", {"gpus": 1}, "gpus"),
        ("status", {"gpus": "yes"}, "gpus"),
        ("free_gpus", {"dry_run": 0}, "dry_run"),
        ("free_gpus", {"gpus": "0,1"}, "gpus"),
        ("launch", {"kind": "train", "argv": "python train.py"}, "argv"),
        ("launch", {"kind": "train", "argv": ["x"], "env": ["A=1"]}, "env"),
        ("launch", {"kind": "train", "argv": ["x"], "stall_after": False}, "stall_after"),
        ("subscribe", {"offsets": []}, "offsets"),
    ],
)
def test_wrong_argument_type_is_bad_args_naming_the_argument(op: str, args: dict[str, Any], bad: str) -> None:
    err = rejected(req(op, args, request_id="w"))
    assert err.code == "bad_args"
    assert err.request_id == "w"
    assert f"'{bad}'" in err.message


@pytest.mark.parametrize(
    ("op", "args", "missing"),
    [
        ("kill", {}, "run"),
        ("kill", {"signal": "KILL"}, "run"),
        ("launch", {"argv": ["x"]}, "kind"),
        ("launch", {"kind": "train"}, "argv"),
        ("unsubscribe", {}, "sub"),
        ("metrics", {"offset": 3}, "run"),
    ],
)
def test_missing_required_argument_is_named(op: str, args: dict[str, Any], missing: str) -> None:
    err = rejected(req(op, args, request_id=21))
    assert err.code == "bad_args"
    assert err.request_id == 21
    assert f"missing argument '{missing}'" in err.message


def test_missing_args_means_empty_args() -> None:
    err = rejected(req("kill"))
    assert err.code == "bad_args"
    assert "'run'" in err.message
    assert parse_request(req("hello")) == Request(7, "hello", {})


def test_deeply_nested_json_is_a_protocol_error() -> None:
    rejected(b"[" * 100_000)


def test_huge_integer_is_a_protocol_error() -> None:
    rejected(b'{"v": 1, "id": ' + b"1" * 5000 + b', "op": "hello"}')


# --- defaults ----------------------------------------------------------------------------------


def test_defaults_are_filled() -> None:
    assert parse_request(req("kill", {"run": "r1"})).args == {"run": "r1", "signal": "TERM", "grace": 10.0}
    assert parse_request(req("status")).args == {"gpus": True, "ended": None, "page": 1}  # every ended run
    metrics = {"run": "r", "offset": 0, "points": None, "coarse": False, "until": None}
    assert parse_request(req("metrics", {"run": "r"})).args == metrics
    logs = parse_request(req("logs", {"run": "r"})).args
    assert logs == {"run": "r", "offset": None, "tail": None, "max_bytes": FRAME_BYTES}
    launch = parse_request(req("launch", {"kind": "serve", "argv": ["python", "-m", "sglang"]})).args
    assert launch == {
        "kind": "serve",
        "argv": ["python", "-m", "sglang"],
        "name": None,
        "env": {},
        "cwd": None,
        "gpus": [],
        "health_url": None,
        "metrics_url": None,
        "sglang_python": None,
        "stall_after": None,
        "module": None,
        "python": None,
        "nproc": None,
        "metrics_from": None,
        "force": False,
        "job": None,
        "node_rank": None,
        "nnodes": None,
        "rendezvous": None,
        "launch_id": None,
    }


def test_free_gpus_is_a_dry_run_unless_asked() -> None:
    # Killing other people's GPU processes must be opt-in.
    args = parse_request(req("free_gpus")).args
    assert args["dry_run"] is True
    assert args["gpus"] is None


def test_given_values_override_defaults() -> None:
    args = parse_request(req("kill", {"run": "r", "signal": "KILL", "grace": 0})).args
    assert args == {"run": "r", "signal": "KILL", "grace": 0}
    status = parse_request(req("status", {"gpus": False, "ended": 20, "page": 3})).args
    assert status == {"gpus": False, "ended": 20, "page": 3}


def test_default_containers_are_not_shared_between_requests() -> None:
    first = parse_request(req("launch", {"kind": "train", "argv": ["x"]}))
    first.args["env"]["HF_TOKEN"] = "leaked"
    first.args["gpus"].append(3)
    second = parse_request(req("launch", {"kind": "train", "argv": ["y"]}))
    assert second.args["env"] == {}
    assert second.args["gpus"] == []


# --- properties --------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=10)
)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=12,
)
arg_names = sorted({name for schema in OPS.values() for name in schema})
requests = st.fixed_dictionaries(
    {},
    optional={
        "v": st.just(PROTOCOL_VERSION) | json_values,
        "id": st.integers() | st.text(max_size=6) | json_values,
        "op": st.sampled_from(sorted(OPS)) | json_values,
        "args": st.dictionaries(st.sampled_from(arg_names) | st.text(max_size=6), json_values, max_size=5)
        | json_values,
        "extra": json_values,
    },
)
# Mostly-valid requests, so that the argument checks are reached and sometimes passed.
near_valid_requests = st.fixed_dictionaries(
    {
        "v": st.just(PROTOCOL_VERSION),
        "id": st.integers() | st.text(max_size=6),
        "op": st.sampled_from(sorted(OPS)),
    },
    optional={
        "args": st.dictionaries(
            st.sampled_from(arg_names), json_values | st.lists(st.text(max_size=3), max_size=2), max_size=3
        )
    },
)


def check_outcome(line: bytes) -> Request | ProtocolError:
    try:
        return parse_request(line)
    except ProtocolError as err:
        assert err.code in ERROR_CODES
        assert err.message
        return err


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_give_a_request_or_protocol_error(data: bytes) -> None:
    check_outcome(data)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_gives_a_request_or_protocol_error(text: str) -> None:
    check_outcome(text.encode("utf-8", "surrogatepass"))


@settings(max_examples=300, deadline=None)
@given(requests | near_valid_requests | st.dictionaries(st.text(max_size=6), json_values, max_size=6))
def test_arbitrary_json_objects_give_a_valid_request_or_protocol_error(msg: dict[str, Any]) -> None:
    outcome = check_outcome(line_of(msg))
    request_id = msg.get("id")
    id_readable = isinstance(request_id, (int, str)) and not isinstance(request_id, bool)
    if isinstance(outcome, ProtocolError):
        if outcome.code == "bad_request":
            assert outcome.request_id is None
        else:
            assert id_readable
            assert outcome.request_id == request_id
        return
    # Accepted: everything a handler relies on holds.
    assert id_readable and outcome.id == request_id
    assert outcome.op in OPS
    schema = OPS[outcome.op]
    assert set(outcome.args) == set(schema)
    for name, (types, _required, _default) in schema.items():
        value = outcome.args[name]
        assert isinstance(value, types)
        assert not (isinstance(value, bool) and bool not in types)


# Text a program can be given: no NUL byte, no lone surrogate (see test_faults_inputs for the others).
def passable_text(min_size: int = 0, max_size: int = 10) -> st.SearchStrategy[str]:
    return st.text(
        st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=min_size, max_size=max_size
    )


def _arg_value(types: tuple[type, ...]) -> st.SearchStrategy[Any]:
    options: list[st.SearchStrategy[Any]] = []
    for t in types:
        if t is bool:
            options.append(st.booleans())
        elif t is int:
            options.append(st.integers(min_value=0))
        elif t is float:
            options.append(st.floats(min_value=0, allow_nan=False, allow_infinity=False))
        elif t is str:
            options.append(passable_text())
        elif t is list:
            options.append(st.lists(passable_text(max_size=5) | st.integers(0, 7), max_size=4))
        elif t is dict:
            names = passable_text(min_size=1, max_size=5).filter(lambda name: "=" not in name)
            options.append(st.dictionaries(names, passable_text(max_size=5), max_size=3))
        elif t is type(None):
            options.append(st.none())
    return st.one_of(options)


@st.composite
def valid_requests(draw: st.DrawFn) -> tuple[int | str, str, dict[str, Any]]:
    op = draw(st.sampled_from(sorted(OPS)))
    args: dict[str, Any] = {}
    for name, (types, required, _default) in OPS[op].items():
        if required or draw(st.booleans()):
            args[name] = draw(_arg_value(types))
    request_id = draw(st.integers() | st.text(max_size=8))
    return request_id, op, args


@settings(max_examples=300, deadline=None)
@given(valid_requests())
def test_request_line_round_trips(case: tuple[int | str, str, dict[str, Any]]) -> None:
    request_id, op, args = case
    line = request_line(request_id, op, args)
    # One request per line, whatever the strings contain.
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    parsed = parse_request(line)
    defaults = {name: default for name, (_t, _r, default) in OPS[op].items()}
    assert parsed == Request(request_id, op, {**defaults, **args})


@given(json_values)
@settings(max_examples=200, deadline=None)
def test_encode_is_one_json_line(value: Any) -> None:
    line = encode({"v": 1, "value": value})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    decoded = json.loads(line)
    # NaN != NaN, so compare through the canonical encoding.
    assert json.dumps(decoded, sort_keys=True) == json.dumps({"v": 1, "value": value}, sort_keys=True)


def test_nan_and_infinity_survive_encode() -> None:
    # A loss that went NaN is exactly what a user must see.
    msg = stream_message(3, "metrics", {"rows": [{"loss": math.nan, "grad_norm": math.inf, "lr": -math.inf}]})
    row = json.loads(encode(msg))["rows"][0]
    assert math.isnan(row["loss"])
    assert row["grad_norm"] == math.inf
    assert row["lr"] == -math.inf
    assert math.isnan(json.loads(encode(ok_reply(1, {"loss": math.nan})))["result"]["loss"])


def test_reply_shapes() -> None:
    assert json.loads(encode(ok_reply("a", {"x": 1}))) == {"v": 1, "id": "a", "ok": True, "result": {"x": 1}}
    err = json.loads(encode(error_reply(None, "bad_json", "request is not JSON")))
    assert err == {"v": 1, "id": None, "ok": False, "error": {"code": "bad_json", "message": "request is not JSON"}}
    assert json.loads(encode(stream_message(2, "log", {"offset": 0}))) == {
        "v": 1,
        "sub": 2,
        "stream": "log",
        "offset": 0,
    }


@pytest.mark.parametrize("args", [{"run": "r", "grace": -1}, {"run": "r", "grace": float("nan")}])
def test_negative_or_nan_numbers_are_bad_args(args: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_request(request_line(3, "kill", args))
    assert err.value.code == "bad_args" and err.value.request_id == 3


# --- frames: whom a message is for, from its first bytes ----------------------------------------

HEAD = 256  # what a reader keeps of a line too long to take (console.link.transport.HEAD_BYTES)


@given(request_id=st.integers(0, 2**63), body=json_values)
@settings(max_examples=200, deadline=None)
def test_a_replys_head_names_its_request(request_id: int, body: Any) -> None:
    for reply in (ok_reply(request_id, body), error_reply(request_id, "x", "y", body)):
        assert message_head(encode(reply)[:HEAD]) == ("id", request_id, "")


@given(sub=st.integers(0, 2**63), stream=st.sampled_from(["log", "metrics", "events", "gpus", "state", "end"]))
def test_a_stream_messages_head_names_its_subscription(sub: int, stream: str) -> None:
    line = encode(stream_message(sub, stream, {"run": "r", "data_b64": "QUJD" * 100_000}))
    assert message_head(line[:HEAD]) == ("sub", sub, stream)


@pytest.mark.parametrize(
    "line",
    [b"", b"not json", b'{"multiplexer": {"pid": 1}}', encode(error_reply(None, "too_long", "x")),
     encode(ok_reply("a-string-id", 1)), b'{"v":1,"id":12'],
)  # fmt: skip
def test_a_head_that_names_no_request_or_stream_is_none(line: bytes) -> None:
    assert message_head(line) is None


def test_what_stands_for_a_message_too_large_says_what_and_how_large_in_one_line() -> None:
    reply = json.loads(encode(too_large_reply(4, "logs", 20_000_000)))
    assert reply["id"] == 4 and reply["ok"] is False and reply["error"]["code"] == "too_large"
    assert reply["error"]["message"].startswith("logs: the agent's reply was 20000000 bytes")
    end = json.loads(encode(too_large_end(9, "log", 20_000_000)))
    assert (end["sub"], end["stream"], end["state"]) == (9, "end", None)
    assert end["error"].startswith("a log message of the agent's was 20000000 bytes")
    assert all("\n" not in text for text in (reply["error"]["message"], end["error"]))


def test_a_frame_of_any_bytes_stays_far_under_what_a_reader_takes() -> None:
    """A log frame is base64 (4/3 of it); rows re-encoded as JSON at worst about six times their bytes
    (\\u escapes of astral characters, 9e15 spelled 9000000000000000.0): either is far under the limit."""
    log = encode(stream_message(1, "log", {"run": "r", "offset": 0, "next_offset": FRAME_BYTES,
                                           "data_b64": "A" * (4 * FRAME_BYTES // 3 + 4)}))  # fmt: skip
    assert len(log) < FRAME_BYTES * 4 // 3 + 1024
    worst = json.loads("[" + ",".join(["9e15"] * (FRAME_BYTES // 5)) + "]")
    assert len(encode(stream_message(1, "metrics", {"rows": [{"v": worst}]}))) < 6 * FRAME_BYTES < MAX_LINE_BYTES / 8
