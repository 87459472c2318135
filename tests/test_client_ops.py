"""Every operation of the protocol has its agent handler and its typed client method, and they agree with
the schema (`protocol.OPS`): the same arguments, the same required ones, and the client's defaults mean the
agent's."""

from __future__ import annotations

import inspect
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


@pytest.mark.parametrize("op", sorted(protocol.OPS))
def test_the_agent_handler_takes_the_schemas_arguments(op: str) -> None:
    handler = getattr(Agent, f"op_{op}")
    takes_any = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(handler).parameters.values())
    assert takes_any or set(arguments(handler)) == set(protocol.OPS[op])


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
