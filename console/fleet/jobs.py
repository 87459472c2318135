"""Multi-node jobs as the console sees them: the runs of several hosts that carry the same job id, gathered into
one job whose state comes from its nodes (failed when any node failed, naming it; stalled when node 0 is, since
it alone speaks: a server's other nodes are not watched, a training's are silent by design; ready when node 0 is;
unknown while a host of it cannot be reached), with the odd rank out named first.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.protocol import TERMINAL_STATES, RunInfo, StalledProcess

UNKNOWN = "unknown"  # a job one of whose hosts cannot be reached: none of its live states can be vouched for


@dataclass(frozen=True)
class Node:
    host: str
    run: RunInfo

    @property
    def rank(self) -> int:
        return self.run["job"]["node_rank"]

    @property
    def label(self) -> str:
        return f"node {self.rank} ({self.host})"


@dataclass(frozen=True)
class Job:
    id: str
    nnodes: int
    nodes: list[Node]  # the newest run of each node seen, by node rank

    @property
    def missing(self) -> list[int]:
        seen = {node.rank for node in self.nodes}
        return [rank for rank in range(self.nnodes) if rank not in seen]

    def state(self, unreachable: Mapping[str, float] | None = None) -> tuple[str, str]:
        """The job's state and what it rests on (which node failed, who is stalled where). `unreachable`: the hosts
        that cannot be reached, each since when; a job with a node there (or a node not seen while one is) is
        `unknown`, with what was last seen of it."""
        down = {host: since for host, since in (unreachable or {}).items() if self.missing or host in self.hosts}
        if down:
            last, _ = self.seen_state()
            hosts = ", ".join(f"{host} unreachable since {hms(since)}" for host, since in sorted(down.items()))
            return UNKNOWN, f"{hosts}; last seen: {last}"
        return self.seen_state()

    @property
    def hosts(self) -> set[str]:
        return {node.host for node in self.nodes}

    def seen_state(self) -> tuple[str, str]:
        """The job's state as its nodes in view show it."""
        states = [node.run["state"] for node in self.nodes]
        bad = [node for node in self.nodes if node.run["state"] in ("failed", "lost", "corrupt")]
        missing = f"; {', '.join(f'node {r}' for r in self.missing)} not seen" if self.missing else ""
        if bad:
            return "failed", "; ".join(f"{node.label} {node.run['state']}{ending(node.run)}" for node in bad) + missing
        if states and all(state in TERMINAL_STATES for state in states):  # every node seen has ended
            return ("exited" if all(s == "exited" for s in states) else "killed"), missing.lstrip("; ")
        first = next((node for node in self.nodes if node.rank == 0), None)
        if states and all(state == "stalled" for state in states) and not self.missing:
            return "stalled", stall_story(self.nodes)
        if first is not None and first.run["state"] == "stalled":  # node 0 speaks for the job (its others are silent)
            return "stalled", stall_story([node for node in self.nodes if node.run["state"] == "stalled"])
        if first is not None and first.run["state"] == "ready":
            return "ready", missing.lstrip("; ")
        others = [f"{node.label} {node.run['state']}" for node in self.nodes if node.run["state"] != "running"]
        state = "starting" if all(s == "starting" for s in states) else "running"
        return state, "; ".join(others) + missing if others else missing.lstrip("; ")


def hms(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def ending(run: RunInfo) -> str:
    if run.get("error"):
        return f": {run['error']}"
    if run.get("signal"):
        return f" (signal {run['signal']})"
    return f" (exit {run['exit_code']})" if run.get("exit_code") is not None else ""


def stall_story(nodes: Sequence[Node]) -> str:
    """Who sits where, the odd ones first: stopped processes, then the smaller groups of a place."""
    groups: list[tuple[Node, str, list[StalledProcess]]] = []
    for node in nodes:
        found = node.run.get("stalled_processes") or []
        ranked = [p for p in found if p["rank"] is not None] or found
        places: dict[str, list[StalledProcess]] = {}
        for process in ranked:
            places.setdefault(process["where"] or f"{process['state']}, no frame in its dump (s shows it)", []).append(
                process
            )
        groups += [(node, where, members) for where, members in places.items()]
        if not found:
            groups.append((node, node.run.get("stall_kind") or "silent", []))
    groups.sort(key=lambda g: (not any(p["state"] == "T" for p in g[2]), len(g[2]), g[0].rank))
    return "; ".join(f"{node.label}: {who(members)}{where}" for node, where, members in groups)


def who(members: list[StalledProcess]) -> str:
    if not members:
        return ""
    ranks = sorted(p["rank"] for p in members if p["rank"] is not None)
    if ranks:
        return f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))} "
    return f"pid {', '.join(str(p['pid']) for p in members)} "


def gather(answers: Iterable[tuple[str, Sequence[RunInfo]]]) -> list[Job]:
    """The jobs among each host's runs; of a node relaunched, its newest run."""
    newest: dict[str, dict[int, Node]] = {}
    counts: dict[str, int] = {}
    for host, runs in answers:
        for run in runs:
            node = run.get("job")
            if node is None:
                continue
            counts[node["id"]] = max(counts.get(node["id"], 0), node["nnodes"])
            held = newest.setdefault(node["id"], {}).get(node["node_rank"])
            if held is None or held.run["id"] < run["id"]:
                newest[node["id"]][node["node_rank"]] = Node(host, run)
    return [Job(job_id, counts[job_id], [nodes[r] for r in sorted(nodes)]) for job_id, nodes in newest.items()]


def in_view(run: RunInfo, runs: Iterable[RunInfo]) -> Job | None:
    """The job `run` is a node of, as the runs in view show it (each marked with its host, where several are);
    None for a run of one node."""
    node = run.get("job")
    if node is None:
        return None
    return next(job for job in gather((r.get("host", ""), [r]) for r in runs) if job.id == node["id"])


def shown_state(state: str, detail: str) -> str:
    """`unknown (b unreachable since 12:00:03; last seen: exited)`: an unknown state says why in the same words."""
    return f"{state} ({detail})" if state == UNKNOWN else state


def node_line(run: RunInfo, runs: Iterable[RunInfo], unreachable: Mapping[str, float] | None = None) -> str | None:
    """`job J: node 1 of 2 · stalled: node 1 (b): rank 1 stopped ...`, of a run that is a node of a job."""
    found = in_view(run, runs)
    if found is None or "job" not in run:
        return None
    state, detail = found.state(unreachable)
    if state == UNKNOWN:
        return f"job {found.id}: node {run['job']['node_rank']} of {found.nnodes} · {shown_state(state, detail)}"
    return f"job {found.id}: node {run['job']['node_rank']} of {found.nnodes} · {state}" + (
        f": {detail}" if detail else ""
    )


def jobs_text(jobs: Sequence[Job], unreachable: Mapping[str, float] | None = None) -> str:
    """A line per job, then one per node: its host, run and state."""
    lines = []
    for job in jobs:
        state, detail = job.state(unreachable)
        nodes = f"{len(job.nodes)}/{job.nnodes} nodes"
        if state == UNKNOWN:
            lines.append(f"job {job.id}  {shown_state(state, detail)}  {nodes}")
        else:
            lines.append(f"job {job.id}  {state}  {nodes}" + (f"  {detail}" if detail else ""))
        for node in job.nodes:
            lines.append(f"  node {node.rank}  {node.host}  {node.run['id']}  {node.run['state']}")
    return "\n".join(lines)


def jobs_json(jobs: Sequence[Job], unreachable: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    found = []
    for job in jobs:
        state, detail = job.state(unreachable)
        nodes = [{"node_rank": n.rank, "host": n.host, "run": n.run["id"], "state": n.run["state"]} for n in job.nodes]
        found.append({"id": job.id, "nnodes": job.nnodes, "state": state, "detail": detail, "nodes": nodes})
    return found
