"""Several hosts behind one client, for the terminal console opened over `a,b` or a group.

Every host keeps its own connection, reconnected on its own in the background: a host down never blocks the
others. `status` answers at once with every host's last known runs and GPUs, marked with their host, and says
which links are down (`links`). A run is named `HOST/RUN` here, so that two hosts' runs never mix and every
request about a run goes to its host, with the host's own id; replies come back with their ids named the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any, TypedDict, cast

from backends.protocol import GpuInfo, HelloResult, RunInfo, StatusResult
from console.errors import AgentError, TransportError
from console.fleet.names import SEPARATOR, key, split
from console.link.client import AgentClient, Subscription
from console.link.ops import AgentOps

RUN_FIELDS = ("run", "parent", "id", "served_run")  # reply fields that name a run of the host


class _Links(TypedDict, total=False):
    links: dict[str, str | None]  # each host: None when its link is up, else why not
    down_since: dict[str, float]  # each host whose link is down: since when (time.time())


class HostsStatus(StatusResult, _Links):
    """The status of every host at once: runs and GPUs marked with their host (`host`), links by host."""


def marked_run(host: str, run: RunInfo) -> RunInfo:
    own = cast(RunInfo, dict(run))
    own["id"], own["host"] = key(host, run["id"]), host
    if run["parent"]:
        own["parent"] = key(host, run["parent"])
    return own


def marked_processes(host: str, processes: list[Any]) -> list[Any]:
    """GPU processes with the run each belongs to named HOST/RUN (None stays None: not a run's)."""
    return [{**process, "run_id": process["run_id"] and key(host, process["run_id"])} for process in processes]


def marked_gpu(host: str, gpu: GpuInfo) -> GpuInfo:
    own = cast(GpuInfo, dict(gpu))
    own["host"] = host
    own["processes"] = marked_processes(host, gpu["processes"])
    if "inferred" in gpu:
        own["inferred"] = [{**h, "run_id": key(host, h["run_id"])} for h in gpu["inferred"]]
    return own


class HostsClient(AgentOps):
    def __init__(self, clients: Mapping[str, AgentClient]) -> None:
        self.clients = dict(clients)
        self.description = ", ".join(self.clients)
        self.down: dict[str, str] = dict.fromkeys(self.clients, "not reached yet")
        self.down_since: dict[str, float] = dict.fromkeys(self.clients, time.time())
        self.failed: dict[str, str] = {}  # hosts that retrying cannot help (a refused host key)
        self.last: dict[str, StatusResult] = {}  # each host's last answer: shown while its link is down
        self._retrying: dict[str, asyncio.Task[None]] = {}
        self._hello: HelloResult | None = None

    def _retry(self, host: str) -> None:
        """Reach the host in the background, with the client's backoff, unless it is being reached already."""
        if host in self._retrying and not self._retrying[host].done():
            return

        async def reach() -> None:
            def failed(exc: TransportError) -> None:
                self.down[host] = str(exc)
                self.down_since.setdefault(host, time.time())

            try:
                hello = await self.clients[host].reconnect_until_back(failed)
            except TransportError as exc:  # for good: said in its link, never retried
                self.down[host] = self.failed[host] = str(exc)
                return
            self._hello = self._hello or hello
            self.down.pop(host, None)
            self.down_since.pop(host, None)

        self._retrying[host] = asyncio.create_task(reach())

    async def reconnect_until_back(self, on_failure: Callable[[TransportError], None]) -> HelloResult:
        """Every host reached on its own; returns once one answers (the others go on in the background), raises
        when none ever can."""
        for host in self.clients:
            if host in self.down and host not in self.failed:
                self._retry(host)
        told: set[str] = set()
        while self._hello is None or len(self.down) == len(self.clients):
            if len(self.failed) == len(self.clients):
                raise TransportError("; ".join(f"{h}: {why}" for h, why in self.failed.items()), transient=False)
            for host, why in self.down.items():
                if why != "not reached yet" and f"{host}{why}" not in told:
                    told.add(f"{host}{why}")
                    on_failure(TransportError(f"{host}: {why}"))
            await asyncio.sleep(0.1)
        return self._hello

    @property
    def generation(self) -> int:
        """Links made, over every host: a follower subscribes again when it grows."""
        return sum(client.generation for client in self.clients.values())

    async def close(self) -> None:
        for task in self._retrying.values():
            task.cancel()
        for task in self._retrying.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.gather(*(client.close() for client in self.clients.values()), return_exceptions=True)

    async def request(self, op: str, **args: Any) -> Any:
        if op == "status":
            return await self._status(args)
        if op == "free_gpus":
            return await self._free_gpus(args)
        run = args.get("run")
        if not isinstance(run, str) or SEPARATOR not in run:
            raise AgentError("bad_args", f"{op} over several hosts needs a run named HOST{SEPARATOR}RUN")
        host, run_id = split(run)
        if host not in self.clients:
            raise AgentError("not_found", f"no host {host} in this console")
        return self._marked(host, await self._ask(host, op, {**args, "run": run_id}))

    async def _ask(self, host: str, op: str, args: dict[str, Any]) -> Any:
        if host in self.down:
            raise TransportError(f"{host}: {self.down[host]}")
        try:
            return await self.clients[host].request(op, **args)
        except TransportError as exc:
            self.down[host] = str(exc)
            self.down_since.setdefault(host, time.time())
            self._retry(host)
            raise TransportError(f"{host}: {exc}") from None

    def _marked(self, host: str, result: Any) -> Any:
        if not isinstance(result, dict):
            return result
        marked = dict(result)
        for name in RUN_FIELDS:
            if isinstance(marked.get(name), str):
                marked[name] = key(host, marked[name])
        if isinstance(marked.get("stopped_parent"), dict):
            marked["stopped_parent"] = self._marked(host, marked["stopped_parent"])
        return marked

    async def _status(self, args: dict[str, Any]) -> HostsStatus:
        up = [host for host in self.clients if host not in self.down]
        answers = await asyncio.gather(*(self._ask(host, "status", args) for host in up), return_exceptions=True)
        problems: dict[str, str] = {}
        for host, answer in zip(up, answers, strict=True):
            if isinstance(answer, AgentError):
                problems[host] = f"status failed: {answer.message}"
            elif isinstance(answer, BaseException):
                if not isinstance(answer, TransportError):
                    raise answer
            else:
                self.last[host] = answer
        known = [(host, self.last[host]) for host in self.clients if host in self.last]
        runs = [marked_run(host, run) for host, status in known for run in status["runs"]]
        gpus = [marked_gpu(host, gpu) for host, status in known for gpu in status["gpus"]]
        errors = [f"{host}: {status['gpu_error']}" for host, status in known if status["gpu_error"]]
        return {
            "host": self.description,
            "gpu_source": known[0][1]["gpu_source"] if known else "none",
            "gpu_error": "; ".join(errors) or None,
            "runs": runs,
            "gpus": gpus,
            "omitted": sum(status["omitted"] for _, status in known),
            "links": {host: self.down.get(host) or problems.get(host) for host in self.clients},
            "down_since": {host: since for host, since in self.down_since.items() if host in self.down},
        }

    async def _free_gpus(self, args: dict[str, Any]) -> Any:
        """Every reachable host's plan (or what was done), each GPU marked with its host."""
        up = [host for host in self.clients if host not in self.down]
        answers = await asyncio.gather(*(self._ask(host, "free_gpus", args) for host in up))
        gpus = []
        for host, answer in zip(up, answers, strict=True):
            for gpu in answer["gpus"]:
                for name in ("processes", "still_held"):
                    gpu[name] = marked_processes(host, gpu[name])
                gpus.append({**gpu, "host": host})
        return {"dry_run": args["dry_run"], "gpu_source": answers[0]["gpu_source"] if answers else "none", "gpus": gpus}

    async def subscribe(
        self, *, run: str | None = None, offsets: Mapping[str, int] | None = None, gpu_interval: float | None = None
    ) -> Subscription:
        """The run's streams, from its host."""
        if run is None or SEPARATOR not in run:
            raise AgentError("bad_args", f"a subscription over several hosts names its run as HOST{SEPARATOR}RUN")
        host, run_id = split(run)
        if host in self.down:
            raise TransportError(f"{host}: {self.down[host]}")
        return await self.clients[host].subscribe(run=run_id, offsets=offsets, gpu_interval=gpu_interval)
