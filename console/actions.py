"""The launch requests of our own commands (`train`/`extract` and `serve`), for one host or for one node of a
multi-node job: the one place that turns their options into a run's arguments.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from backends.protocol import JobNode, LaunchResult, ServeNode
from console.link.client import AgentClient


def node_fields(node: JobNode | None) -> dict[str, Any]:
    """A node's launch arguments (none for a run of one node)."""
    return {} if node is None else {"job": node["id"], "node_rank": node["node_rank"], "nnodes": node["nnodes"]}


async def launch_stage(
    client: AgentClient,
    ns: argparse.Namespace,
    stage_args: list[str],
    node: JobNode | None = None,
    rendezvous: str | None = None,
) -> LaunchResult:
    """`extract`/`train`: `ns` holds the run options taken out of the stage's words."""
    return await client.launch(
        ns.command,
        stage_args,
        module=f"backends.{ns.command}",
        python=ns.python,
        nproc=ns.nproc,
        name=ns.name or ns.command,
        env=dict(ns.env),
        cwd=ns.cwd or os.getcwd(),
        gpus=ns.gpus,
        stall_after=ns.stall_after,
        rendezvous=rendezvous,
        **node_fields(node),
    )


def serve_argv(ns: argparse.Namespace, flags: list[str], node: ServeNode | None = None) -> list[str]:
    """The serving engine's command for a target and its EAGLE-3 draft; FLAGS come last and win."""
    from backends import serving  # the engine's facts: only a serve command pays for importing them

    if ns.port is None:  # the health poll reads it too
        ns.port = serving.DEFAULT.default_port
    return serving.DEFAULT.serve_command(
        ns.python,
        ns.target,
        ns.draft,
        port=ns.port,
        gpus=len(ns.gpus),
        extra=flags,
        metrics=not ns.no_metrics,
        node=node,
    )


async def launch_serve(
    client: AgentClient,
    ns: argparse.Namespace,
    flags: list[str],
    node: JobNode | None = None,
    dist_init_addr: str | None = None,
) -> LaunchResult:
    """`serve`; a node of the engine's own multi-node with `node` (node 0 alone serves HTTP, so only its health
    is polled)."""
    served = ServeNode(node["node_rank"], node["nnodes"], dist_init_addr) if node and dist_init_addr else None
    argv = serve_argv(ns, flags, served)
    return await client.launch(
        "serve",
        argv,
        name=ns.name or "serve",
        env=dict(ns.env),
        cwd=os.getcwd(),
        gpus=ns.gpus,
        health_url=f"http://127.0.0.1:{ns.port}/health" if not node or node["node_rank"] == 0 else None,
        sglang_python=ns.sglang_python,
        stall_after=ns.stall_after,
        force=ns.force,
        **node_fields(node),
    )
