"""The agent client: the typed operations (`console.link.transport`) over asyncio, and subscriptions that stream.

The CLI and the TUI talk to this, never to a transport. A subscription is an
async iterator of stream messages; its offsets are kept so a new client (after
a reconnect) can resume exactly where the old one stopped.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast

from backends import protocol
from backends.protocol import (
    HelloResult,
    LogChunk,
    SubscribeResult,
    UnsubscribeResult,
)
from console.link.transport import (
    AgentError,
    AgentOps,
    NoAnswer,
    OversizedLine,
    Transport,
    TransportError,
    no_answer,
    reply_result,
    seconds_for,
)

RECONNECT_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)  # seconds between tries to reach a lost agent
# A link lost this many times in a row the same way, each time before any data came over the new one
# (a reply too large to read, an agent that dies on the same request), is not a passing fault.
SAME_LOSS_LIMIT = 3
SETUP_OPS = ("hello", "subscribe", "unsubscribe")  # their replies are no progress: they come before any data
# The requests that start a run: each carries a launch id, the same when asked again after a lost link, so
# that the host returns the run it already started rather than a second (`backends.runs.once`).
LAUNCH_OPS = ("launch", "relaunch", "bench")
LAUNCH_ASKS = 4  # a launch asked this many times over lost links at most, then said and left
# An offset past any file's end: subscribe to a stream from now on, skipping what it already holds.
PAST_END = 1 << 62
# `logs` frames asked for ahead: a long log comes at the link's pace, not at one round trip a frame.
LOGS_AHEAD = 8


class Subscription:
    def __init__(self, client: AgentClient, sub_id: int, offsets: dict[str, int]) -> None:
        self.client = client
        self.id = sub_id
        self.offsets = dict(offsets)
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.behind = False  # stopped by the shared connection for reading too slowly: subscribe again

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            msg = await self.queue.get()
            if msg is None:
                return
            if msg.get("stream") == protocol.BEHIND:
                self.behind = True
                self.client._subs.pop(self.id, None)
                return
            if "next_offset" in msg and msg.get("stream") in self.offsets:
                self.offsets[msg["stream"]] = msg["next_offset"]
            yield msg
            if msg.get("stream") == "end":
                return

    async def close(self) -> None:
        with contextlib.suppress(AgentError, TransportError):
            await self.client.unsubscribe(self.id)
        self.client._subs.pop(self.id, None)


class AgentClient(AgentOps):
    def __init__(self, transport: Transport, timeout: float | None = None) -> None:
        self.transport = transport
        self.timeout = (
            timeout  # --timeout: every call's deadline; None: each call's own (`console.link.transport.seconds_for`)
        )
        self._ids = itertools.count(1)
        self._pending: dict[int | str, asyncio.Future[Any]] = {}
        self._ops: dict[int | str, str] = {}  # each pending request's op, to name it in an error
        self._stopping: set[asyncio.Task[None]] = set()  # streams ended here that the agent is told to stop
        self._subs: dict[int, Subscription] = {}
        self._early: dict[int, list[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.closed_reason: str | None = None
        self._received = False  # a stream message, or a reply with data, since the last connect
        self._last_loss: str | None = None
        self._no_answer = False  # the link was given up for a call not answered in time
        self._same_losses = 0
        self.generation = 0  # links made so far: a follower subscribes again on the next one
        self._opened = False  # the last start reached the agent (its transport opened)
        self._hello: HelloResult | None = None
        self._reconnecting = asyncio.Lock()  # one reconnect at a time, whoever asks for it
        self.say: Callable[[str], None] = lambda _text: None  # told when a launch is asked again

    async def __aenter__(self) -> AgentClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> HelloResult:
        self._opened = False
        await self.transport.open()
        self._opened = True
        self._reader = asyncio.create_task(self._read_loop())
        hello = await self.hello()
        if hello.get("version") != protocol.PROTOCOL_VERSION:
            raise TransportError(
                f"agent speaks protocol {hello.get('version')}, this console {protocol.PROTOCOL_VERSION}; "
                "update eagle3-console on both sides",
                transient=False,
            )
        self.generation += 1
        self._hello = hello
        return hello

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self.transport.close()

    async def reconnect(self) -> HelloResult:
        """A fresh agent over a fresh connection; subscriptions must be made again (from their offsets)."""
        await self.close()
        self._pending.clear()
        self._subs.clear()
        self._early.clear()
        self.closed_reason = None
        self._no_answer = False
        return await self.start()

    async def reconnect_until_back(self, on_failure: Callable[[TransportError], None]) -> HelloResult:
        """`reconnect`, tried at once and then again with backoff while the failure is transient (each one
        told to `on_failure`); a failure that retrying cannot help (a refused host key) is raised.

        A link lost the same way as the one before, with no data received in between (a stream message,
        a reply to anything but hello or subscribe), fails deterministically: each repeat waits longer
        before reconnecting, and the SAME_LOSS_LIMIT-th is raised, not transient, with its reason. So is an agent
        reached that goes before it greets at SAME_LOSS_LIMIT reconnects in a row (one that dies as it starts:
        its last words vary with how fast they came); a host out of reach, or one that does not answer in time,
        is tried for as long as it takes.

        Callers at once (the status poll, a launch asked again) share one reconnect: the second takes the link
        the first made."""
        generation = self.generation
        async with self._reconnecting:
            if self.generation != generation and self.closed_reason is None and self._hello is not None:
                return self._hello
            return await self._reconnect_until_back(on_failure)

    async def _reconnect_until_back(self, on_failure: Callable[[TransportError], None]) -> HelloResult:
        await self._pace_repeated_loss()
        attempt = 0
        died_at_start = 0
        while True:
            try:
                hello = await self.reconnect()
                self._received = False
                return hello
            except TransportError as exc:
                if not exc.transient:
                    raise
                died_at_start = died_at_start + 1 if self._opened and not isinstance(exc, NoAnswer) else 0
                if died_at_start >= SAME_LOSS_LIMIT:
                    raise TransportError(
                        f"{exc}; the agent went before it greeted at each of {died_at_start} reconnects, "
                        "so reconnecting again cannot help",
                        transient=False,
                    ) from None
                on_failure(exc)
            await asyncio.sleep(RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)])
            attempt += 1

    async def _pace_repeated_loss(self) -> None:
        why = self.closed_reason
        # A deadline missed is no deterministic failure: the host may answer again, however often it did not.
        repeated = why is not None and why == self._last_loss and not self._received and not self._no_answer
        self._same_losses = self._same_losses + 1 if repeated else 0
        self._last_loss = why
        if self._same_losses >= SAME_LOSS_LIMIT:
            raise TransportError(
                f"{why}; the same failure came right after each of {self._same_losses} reconnects, "
                "so reconnecting again cannot help",
                transient=False,
            )
        if self._same_losses:
            await asyncio.sleep(RECONNECT_BACKOFF_S[self._same_losses - 1])

    async def request(self, op: str, **args: Any) -> Any:
        if op in LAUNCH_OPS and not args.get("dry_run") and args.get("launch_id") is None:
            return await self._launch_once(op, args)
        if self.closed_reason is not None:
            raise TransportError(self.closed_reason)  # nobody is left to answer
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._ops[request_id] = op
        seconds = seconds_for(op, args, self.timeout)
        try:
            try:
                await self.transport.send(protocol.request_line(request_id, op, args))
            except TransportError as exc:
                # A link that cannot carry a request is gone for every caller: a stream waiting on it would wait
                # for ever where its reader sees no end (a follow's hello found it so, and returned).
                self._pending.pop(request_id, None)
                self._lose_link(exc)
                raise
            # asyncio.wait, not wait_for: Python 3.11's wait_for returns a reply that came as its caller was
            # cancelled and drops the cancel (a console's follow of a run no longer selected went on writing).
            await asyncio.wait((future,), timeout=seconds)
            if not future.done():
                raise self._give_up(no_answer(self.transport.description, op, seconds))
            result = future.result()
            self._received |= op not in SETUP_OPS
            return result
        finally:
            self._pending.pop(request_id, None)
            self._ops.pop(request_id, None)

    async def _launch_once(self, op: str, args: dict[str, Any]) -> Any:
        """A request that starts a run, under a launch id of its own; when the link is lost before the reply
        (the run may have started), asked again with the same id once the link is back, LAUNCH_ASKS times at
        most. An agent that does not answer in time is not asked again: a new one would find the launch still
        under way."""
        import uuid  # a launch's alone: ~2.5 ms of every other command's start

        args = {**args, "launch_id": uuid.uuid4().hex}
        asked = 0
        while True:
            asked += 1
            try:
                if asked > 1:
                    await self._reconnect_once()
                return await self.request(op, **args)
            except NoAnswer:
                raise
            except TransportError as exc:
                if not exc.transient:
                    raise
                if asked == LAUNCH_ASKS:
                    raise TransportError(
                        f"{exc}; {op} was asked {asked} times under one launch id: `status` says whether its run "
                        "started"
                    ) from None
                self.say(
                    f"{self.transport.description}: the link was lost before {op} answered ({exc}); asking again "
                    "once it is back, under the same launch id: a run it started is returned, never started twice"
                )
                await asyncio.sleep(RECONNECT_BACKOFF_S[asked - 1])

    async def _reconnect_once(self) -> None:
        """One try at a new link, unless another caller has just made one."""
        generation = self.generation
        async with self._reconnecting:
            if self.generation == generation or self.closed_reason is not None:
                await self.reconnect()

    def _give_up(self, error: NoAnswer) -> NoAnswer:
        """The link given up, as when it drops, so that each caller reconnects (a new agent) rather than wait on
        one that does not answer."""
        if self.closed_reason is None:
            self._no_answer = True
        self._lose_link(error)
        return error

    def _lose_link(self, error: TransportError) -> None:
        """The link is gone as `error` says: every call waiting on it fails and every stream ends."""
        if self._reader is not None:
            self._reader.cancel()
        if self.closed_reason is None:
            self.closed_reason = str(error)
        self._fail_all(error)

    def _fail_all(self, error: TransportError) -> None:
        """The link is gone: every call waiting on it fails with `error`, every stream ends."""
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        for sub in self._subs.values():
            sub.queue.put_nowait(None)

    async def subscribe(
        self, *, run: str | None = None, offsets: Mapping[str, int] | None = None, gpu_interval: float | None = None
    ) -> Subscription:
        """A run's streams from `offsets` (each from 0 when not given), and GPU samples every `gpu_interval` s."""
        offsets = dict(offsets or {})
        result = cast(
            SubscribeResult, await self.request("subscribe", run=run, offsets=offsets, gpu_interval=gpu_interval)
        )
        sub = Subscription(self, result["sub"], {s: offsets.get(s, 0) for s in protocol.STREAMS})
        self._subs[sub.id] = sub
        for msg in self._early.pop(sub.id, []):
            sub.queue.put_nowait(msg)
        return sub

    async def unsubscribe(self, sub: int) -> UnsubscribeResult:
        return cast(UnsubscribeResult, await self.request("unsubscribe", sub=sub))

    async def _read_loop(self) -> None:
        reason = "the agent closed the connection"
        try:
            while True:
                try:
                    line = await self.transport.receive()
                except OversizedLine as big:
                    self._stand_in(big)
                    continue
                if not line:
                    break
                msg = json.loads(line)
                if not isinstance(msg, dict):
                    raise ValueError(f"a {type(msg).__name__}, not an object")
                self._dispatch(msg)
        except TransportError as exc:
            reason = str(exc)
        except OSError as exc:  # a transport that let its socket's error through: the link is as gone as at EOF
            reason = f"the link to the agent failed ({exc.strerror or exc})"
        except (ValueError, RecursionError) as exc:
            reason = f"the agent sent something that is not a message ({exc})"
        words = self.transport.last_words()
        self.closed_reason = reason + (f": {words.splitlines()[-1]}" if words else "")
        self._fail_all(TransportError(self.closed_reason))

    def _stand_in(self, big: OversizedLine) -> None:
        """A line of the agent's too long to take fails its request, naming it, or ends its stream, saying why;
        the link serves on."""
        head = protocol.message_head(big.head)
        if head is None:
            return  # for nobody
        kind, number, stream = head
        if kind == "id":
            self._dispatch(protocol.too_large_reply(number, self._ops.get(number, "a request"), big.size))
        else:
            self._dispatch(protocol.too_large_end(number, stream, big.size))
            if (sub := self._subs.get(number)) is not None:  # else the agent would go on sending what none reads
                task = asyncio.create_task(sub.close())
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if "sub" in msg and "stream" in msg:
            self._received = True
            sub = self._subs.get(msg["sub"])
            if sub is not None:
                sub.queue.put_nowait(msg)
            else:
                # A stream message can beat the subscribe reply to us.
                self._early.setdefault(msg["sub"], []).append(msg)
            return
        future = self._pending.get(msg.get("id"))  # type: ignore[arg-type]
        if future is None or future.done():
            return
        try:
            future.set_result(reply_result(msg))
        except AgentError as exc:
            future.set_exception(exc)


async def log_bytes(client: AgentOps, run: str, offset: int, size: int) -> AsyncIterator[bytes]:
    """The run's output from `offset` up to `size` (its length when first asked), in order: one frame
    (`protocol.FRAME_BYTES`) a reply, LOGS_AHEAD of them asked for at once."""
    asked: collections.deque[asyncio.Task[LogChunk]] = collections.deque()
    ahead = offset
    try:
        while offset < size:
            while len(asked) < LOGS_AHEAD and ahead < size:
                asked.append(asyncio.ensure_future(client.logs(run, offset=ahead)))
                ahead += protocol.FRAME_BYTES
            chunk = await asked.popleft()
            if chunk["next_offset"] <= offset:
                return  # the file is shorter than it was: nothing more to give
            yield base64.b64decode(chunk["data_b64"])
            offset = chunk["next_offset"]
            if offset != chunk["offset"] + protocol.FRAME_BYTES:  # a short frame: what was asked ahead is off
                for task in asked:
                    task.cancel()
                asked.clear()
                ahead = offset
    finally:
        for task in asked:
            task.cancel()
        await asyncio.gather(*asked, return_exceptions=True)


async def follow(
    client: AgentClient, run: str, offsets: dict[str, int], notify: Callable[[str], None]
) -> AsyncIterator[dict[str, Any]]:
    """A run's stream messages from `offsets` until its end, across lost connections.

    When the link drops (laptop asleep, network gone, agent killed) it reconnects with backoff and
    subscribes again at the offsets reached, so nothing is delivered twice or lost; `notify` is told
    of the loss and of the recovery. Only transient failures are retried; no request is replayed.
    An agent that stops answering is found as a silent link is by ssh's ServerAliveInterval: after each
    quiet spell as long as a look's deadline, a hello must come back within that deadline, else the link is
    given up and reconnected like a lost one.
    """
    offsets = dict(offsets)
    quiet_s = seconds_for("hello", {}, client.timeout)
    while True:
        try:
            sub = await client.subscribe(run=run, offsets=offsets)
        except TransportError as exc:
            if not exc.transient:
                raise
            # Lost again between the reconnect and the subscribe (a multiplexer greets for an agent killed a
            # moment before): a loss like any other, its repeats paced and bounded by the reconnect.
            await reconnect_and_say(client, notify, str(exc), "resuming where the stream stopped")
            continue
        heard = [time.monotonic()]
        alive = asyncio.create_task(_ask_when_quiet(client, heard, quiet_s))
        try:
            async for msg in sub:
                heard[0] = time.monotonic()
                yield msg
                if msg.get("stream") == "end":
                    return
        finally:
            alive.cancel()
        offsets = dict(sub.offsets)
        if sub.behind:  # the link is fine: this reader fell behind, and reads the rest from where it stopped
            continue
        why = client.closed_reason or "the stream stopped"
        await reconnect_and_say(client, notify, why, "resuming where the stream stopped")


async def _ask_when_quiet(client: AgentClient, heard: list[float], quiet_s: float) -> None:
    """A hello after every `quiet_s` without a message (its deadline ends the streams of an agent that does
    not answer); returns once the link is lost."""
    while True:
        await asyncio.sleep(max(heard[0] + quiet_s - time.monotonic(), 0.0))
        if time.monotonic() - heard[0] < quiet_s:
            continue
        try:
            await client.hello()
        except (AgentError, TransportError):
            return
        heard[0] = time.monotonic()


async def reconnect_and_say(client: AgentClient, notify: Callable[[str], None], why: str, then: str) -> None:
    """Tell of a lost link, reconnect with backoff (each new reason a reconnect fails for told once), then tell how
    long it took and `then` what happens."""
    notify(f"connection lost ({why}); reconnecting")
    lost = time.monotonic()
    told: set[str] = set()

    def failed(exc: TransportError) -> None:
        if str(exc) not in told:
            told.add(str(exc))
            notify(f"cannot reconnect yet ({exc}); trying again, at most {RECONNECT_BACKOFF_S[-1]:g} s apart")

    await client.reconnect_until_back(failed)
    notify(f"reconnected after {time.monotonic() - lost:.0f} s; {then}")
