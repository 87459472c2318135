"""Every operation of the protocol has its agent handler and its typed client method, and they agree with
the schema (`protocol.OPS`): the same arguments, the same required ones, and the client's defaults mean the
agent's."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from backends import protocol, serving
from backends.agent import Agent
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.link.transport import AgentError, TransportError

# A value of each accepted type, for the required arguments.
SAMPLES: dict[type, object] = {str: "x", list: [], dict: {}, int: 1, float: 1.0, bool: True}


def arguments(function: Any) -> dict[str, inspect.Parameter]:
    """The arguments a method takes by name (not self, not **rest)."""
    return {
        name: param
        for name, param in inspect.signature(function).parameters.items()
        if name != "self" and param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL)
    }


class Recorder(AgentClient):
    """A client whose requests go nowhere: each is kept, and answered with a reply any method can read (or with
    `failure`)."""

    def __init__(self, failure: Exception | None = None) -> None:
        super().__init__(LocalTransport(None))  # never opened
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.failure = failure

    async def request(self, op: str, **args: Any) -> Any:
        self.sent.append((op, args))
        if self.failure is not None:
            raise self.failure
        return {"sub": 1, "run": None, "presets": []}


def test_every_agent_handler_is_an_operation_of_the_protocol() -> None:
    handlers = {name.removeprefix("op_") for name in dir(Agent) if name.startswith("op_")}
    assert handlers == set(protocol.OPS)


OURS = ("backends.", "console.")  # the modules whose functions are followed


def unread(function: Callable[..., Any], names: set[str], seen: frozenset[object] = frozenset()) -> set[str]:
    """Of `names` (parameters of `function`), those it never reads. A parameter passed on by keyword to a
    function of ours is read only where that function reads it in turn; anything else it is used for reads it."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    passed_on: dict[str, list[tuple[Callable[..., Any], str]]] = {}
    passed_nodes: set[int] = set()
    for call in (node for node in ast.walk(tree) if isinstance(node, ast.Call)):
        callee = named(call.func, function.__globals__)
        if not inspect.isfunction(callee) or not callee.__module__.startswith(OURS) or callee in seen:
            continue
        for keyword in call.keywords:
            if keyword.arg is not None and isinstance(keyword.value, ast.Name) and keyword.value.id in names:
                passed_on.setdefault(keyword.value.id, []).append((callee, keyword.arg))
                passed_nodes.add(id(keyword.value))
    loaded = {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in passed_nodes
    }
    return {
        name
        for name in names - loaded
        if all(unread(callee, {arg}, seen | {function}) for callee, arg in passed_on.get(name, []))
    }


def named(expr: ast.expr, scope: dict[str, Any]) -> Any:
    """What `expr` names in `scope`, when it is a name or names joined by dots; else None."""
    if isinstance(expr, ast.Name):
        return scope.get(expr.id)
    if isinstance(expr, ast.Attribute):
        owner = named(expr.value, scope)
        return getattr(owner, expr.attr, None) if owner is not None else None
    return None


@pytest.mark.parametrize("op", sorted(protocol.OPS))
def test_the_agent_handler_takes_the_schemas_arguments_by_name(op: str) -> None:
    handler = getattr(Agent, f"op_{op}")
    rest = [p.name for p in inspect.signature(handler).parameters.values() if p.kind is p.VAR_KEYWORD]
    assert not rest, f"op_{op} takes **{rest[0]}: name each argument, or one no code reads passes unseen"
    assert set(arguments(handler)) == set(protocol.OPS[op])


@pytest.mark.parametrize("op", sorted(protocol.OPS))
def test_every_argument_of_the_schema_is_read_by_its_handler(op: str) -> None:
    assert unread(getattr(Agent, f"op_{op}"), set(protocol.OPS[op])) == set()


@pytest.mark.parametrize("op", sorted(protocol.OPS))
def test_the_client_method_takes_the_schemas_arguments_and_requires_the_same(op: str) -> None:
    method = getattr(AgentClient, op, None)
    assert method is not None and inspect.iscoroutinefunction(method), f"AgentClient has no method for {op!r}"
    params = arguments(method)
    assert set(params) == set(protocol.OPS[op])
    required = {name for name, (_types, needed, _default) in protocol.OPS[op].items() if needed}
    assert {name for name, p in params.items() if p.default is p.empty} == required


@pytest.mark.parametrize("op", sorted(protocol.OPS))
async def test_the_client_methods_defaults_are_the_agents(op: str) -> None:
    schema = protocol.OPS[op]
    given = {name: SAMPLES[types[0]] for name, (types, needed, _default) in schema.items() if needed}
    client = Recorder()
    await getattr(client, op)(**given)
    [(sent_op, sent)] = client.sent
    assert sent_op == op

    def as_agent_reads(args: dict[str, Any]) -> dict[str, Any]:
        return protocol.parse_request(protocol.request_line(1, op, args)).args

    assert as_agent_reads(sent) == as_agent_reads(given)


@pytest.mark.parametrize("failure", [AgentError("unknown_op", "unknown op"), TransportError("the link is down")])
async def test_relaunch_presets_are_the_spelling_every_release_accepts_when_the_host_cannot_say(
    failure: Exception,
) -> None:
    presets = await Recorder(failure).relaunch_presets("20261130-000000-000-0000")
    assert presets == {"version": None, "presets": list(serving.DEFAULT.fallback_presets)}
