"""One host or several behind one client: every command of the CLI and the terminal console goes through a Fleet.

Each host is a Member with its own connection and settings. A host given alone (`gpu1`) is a fleet of one: its
runs keep their own ids and its errors are the command's. A list or a group (`a,b`, `lab`; a group of one too, so
a script gets one shape of answer whatever the size) names each run HOST/RUN, so that two hosts' runs never mix
and every request about a run goes to its host with the host's own id; replies come back named the same way.
`status` then answers at once with every host's last known runs and GPUs, marked with their host, and says which
links are down (`links`); each host is reconnected on its own in the background, and one host down never blocks
the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar, cast

from backends.protocol import GpuInfo, HelloResult, RunInfo, StatusResult
from console.fleet.names import SEPARATOR, key, split
from console.link.client import AgentClient, Subscription
from console.link.transport import AgentError, AgentOps, NoAnswer, Transport, TransportError

T = TypeVar("T")
RUN_FIELDS = ("run", "parent", "id", "served_run")  # reply fields that name a run of the host


@dataclass
class Member:
    """One host of the fleet: its name as given, its client, the stall setting of runs launched there (the
    command's, else the host's in config.toml), and, once a command found it so, why it could not answer."""

    name: str
    client: AgentClient
    stall_after: float | None = None
    tell: Callable[[str], None] = field(default=lambda _text: None, repr=False)  # where `say` goes
    error: str | None = None
    error_at: float | None = None  # when it was found unreachable (time.time())
    silent: bool = False  # reached, but it did not answer in time (the error says which call)

    def say(self, text: str) -> None:
        self.tell(f"{self.name}: {text}")


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


class Fleet(AgentOps):
    def __init__(self, members: Sequence[Member], named: bool | None = None) -> None:
        """`named`: runs are named HOST/RUN (default: when there are several hosts)."""
        self.members = list(members)
        self.named = len(self.members) > 1 if named is None else named
        self.clients = {member.name: member.client for member in self.members}
        lone = self.members[0].client.transport.description if len(self.members) == 1 else None
        self.description = lone if lone is not None and not self.named else ", ".join(self.clients)
        self.down: dict[str, str] = dict.fromkeys(self.clients, "not reached yet")
        self.down_since: dict[str, float] = dict.fromkeys(self.clients, time.time())
        self.failed: dict[str, str] = {}  # hosts that retrying cannot help (a refused host key)
        self.last: dict[str, StatusResult] = {}  # each host's last answer: shown while its link is down
        self._retrying: dict[str, asyncio.Task[None]] = {}
        self._hello: HelloResult | None = None

    @classmethod
    def of(cls, clients: Mapping[str, AgentClient], named: bool | None = None) -> Fleet:
        return cls([Member(name, client) for name, client in clients.items()], named)

    @classmethod
    def one(cls, transport: Transport, timeout: float | None = None) -> Fleet:
        """A fleet of one host given alone, over `transport`; `timeout`: every request's deadline (None: each
        request's own)."""
        return cls([Member(transport.description, AgentClient(transport, timeout))], named=False)

    @property
    def only(self) -> Member:
        """The host of a fleet of one (the CLI refuses a command of one host given several first)."""
        assert len(self.members) == 1, "a command of one host given several"
        return self.members[0]

    @property
    def alone(self) -> AgentClient | None:
        """The client of a fleet of one host given alone: it is the whole fleet, its errors the command's."""
        return None if self.named else self.only.client

    async def each(self, ask: Callable[[AgentClient], Awaitable[T]]) -> list[T | None]:
        """Every host's answer, asked at once; None where it could not give one, with the member's `error` said.
        A host given alone has nothing else to show: its error is raised."""
        if self.alone is not None:
            return [await ask(self.alone)]
        for member in self.members:
            member.error, member.error_at, member.silent = None, None, False
        return list(await asyncio.gather(*(self._answer(member, ask) for member in self.members)))

    @staticmethod
    async def _answer(member: Member, ask: Callable[[AgentClient], Awaitable[T]]) -> T | None:
        try:
            await member.client.start()
            return await ask(member.client)
        except (TransportError, AgentError) as exc:
            member.error, member.error_at, member.silent = str(exc), time.time(), isinstance(exc, NoAnswer)
            return None

    @property
    def unreached(self) -> list[Member]:
        return [member for member in self.members if member.error]

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
        if self.alone is not None:
            return await self.alone.reconnect_until_back(on_failure)
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
        if self.alone is not None:
            return await self.alone.request(op, **args)
        if op == "status":
            return await self._status(args)
        if op == "free_gpus":
            return await self._free_gpus(args)
        host, run_id = self._route(op, args.get("run"))
        return self._marked(host, await self._ask(host, op, {**args, "run": run_id}))

    def _route(self, op: str, run: object) -> tuple[str, str]:
        if not isinstance(run, str) or SEPARATOR not in run:
            raise AgentError("bad_args", f"{op} over several hosts needs a run named HOST{SEPARATOR}RUN")
        host, run_id = split(run)
        if host not in self.clients:
            raise AgentError("not_found", f"no host {host} in this console")
        return host, run_id

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
            "ended_total": sum(status.get("ended_total", 0) for _, status in known),
            "hidden": sum(status.get("hidden", 0) for _, status in known),
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
        if self.alone is not None:
            return await self.alone.subscribe(run=run, offsets=offsets, gpu_interval=gpu_interval)
        if run is None or SEPARATOR not in run:
            raise AgentError("bad_args", f"a subscription over several hosts names its run as HOST{SEPARATOR}RUN")
        host, run_id = split(run)
        if host in self.down:
            raise TransportError(f"{host}: {self.down[host]}")
        return await self.clients[host].subscribe(run=run_id, offsets=offsets, gpu_interval=gpu_interval)


def host_json(member: Member, result: Any) -> dict[str, Any]:
    """One host's part of the JSON: its answer, each run and GPU marked with the host; or why there is none."""
    if result is None:
        return {"host": member.name, "ok": False, "error": member.error}
    for item in (*result.get("runs", ()), *result.get("gpus", ())):
        item["host"] = member.name
    return {"host": member.name, "ok": True, "result": result}
