"""A multi-node job as each host sees it: one run per node, each carrying the job's id, its node rank and the node
count (`JobNode` in its spec); the nodes meet through the engines' own mechanisms, never a scheduler of ours.

For our stages that is torchrun's rendezvous at node 0's address and a port free there (the `rendezvous` op).
Its static backend, not c10d: c10d ignores --node-rank and numbers the nodes by host name, so global rank 0 (the
one that writes metrics and checkpoints) could land on any host; static keeps node ranks in host order (global
rank = node rank x processes per node + local rank) and hosts the store on node 0.
"""

from __future__ import annotations

import re
import socket

from backends.protocol import JobNode

JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RDZV_BACKEND = "static"
JOIN_TIMEOUT_S = 300  # how long a node waits for the others before its torchrun gives up


def node_problem(data: object) -> str | None:
    """Why `data` is not a JobNode, or None."""
    if not isinstance(data, dict) or set(data) != {"id", "node_rank", "nnodes"}:
        return "job must be an object of id, node_rank and nnodes"
    job_id, rank, count = data["id"], data["node_rank"], data["nnodes"]
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        return "a job id is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (rank, count)) or count < 1:
        return "a job's nnodes is a count of nodes, 1 or more"
    if not 0 <= rank < count:
        return f"a job's node_rank is 0 to {count - 1} for {count} nodes, not {rank}"
    return None


def node_of(job: str | None, node_rank: int | None, nnodes: int | None, rendezvous: str | None) -> JobNode | None:
    """The node a launch's arguments name (ValueError when they name one badly); None for a run of one node."""
    if job is None and node_rank is None and nnodes is None:
        if rendezvous is not None:
            raise ValueError("rendezvous goes with a job: give job, node_rank and nnodes too")
        return None
    if job is None or node_rank is None or nnodes is None:
        raise ValueError("a node of a job needs job, node_rank and nnodes together")
    node: JobNode = {"id": job, "node_rank": node_rank, "nnodes": nnodes}
    problem = node_problem(node)
    if problem is not None:
        raise ValueError(problem)
    return node


def torchrun_args(node: JobNode, rendezvous: str) -> list[str]:
    """torchrun's options that make this node one of the job's: same id and endpoint on every node."""
    host, _, port = rendezvous.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"rendezvous {rendezvous!r} is not HOST:PORT")
    return [
        f"--nnodes={node['nnodes']}",
        f"--node-rank={node['node_rank']}",
        f"--rdzv-backend={RDZV_BACKEND}",
        f"--rdzv-endpoint={rendezvous}",
        f"--rdzv-id={node['id']}",
        f"--rdzv-conf=timeout={JOIN_TIMEOUT_S}",
    ]


def free_port() -> int:
    """A TCP port free on this host now, for a job's rendezvous (torchrun binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def reachable_address(ssh_connection: str | None) -> str:
    """This host's address as the console reached it (SSH_CONNECTION's server side): the address the job's other
    nodes are most likely to reach too; 127.0.0.1 for a console on this host."""
    fields = (ssh_connection or "").split()
    address = fields[2] if len(fields) == 4 else "127.0.0.1"
    return f"[{address}]" if ":" in address else address  # IPv6: HOST:PORT needs the brackets
