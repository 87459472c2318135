"""A generator's items produced ahead in a thread: shard reads and tokenization overlap the GPU's work."""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterable
from typing import TypeVar, cast

T = TypeVar("T")


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_END = object()
JOIN_S = 120.0  # how long closing waits for the item being made: more than a slow shard read takes


def background(items: Iterable[T], depth: int = 2) -> Generator[T, None, None]:
    """`items`, produced in a thread `depth` ahead; an exception there is raised here, and closing this
    generator stops the thread (and closes `items`) once it has made the item it was making."""
    slots: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(value: object) -> bool:
        while not stop.is_set():
            try:
                slots.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer(item):
                    return
            offer(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            offer(_Failure(exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="ahead", daemon=True)
    thread.start()
    try:
        while True:
            value = slots.get()
            if value is _END:
                return
            if isinstance(value, _Failure):
                raise value.exc
            yield cast(T, value)
    finally:
        stop.set()
        # The item being made (a shard read, tensors built) is finished before this returns: a thread still in
        # torch when the interpreter exits aborts the process ("terminate called without an active exception",
        # a trained run reported failed by SIGABRT after its last save).
        thread.join(timeout=JOIN_S)
