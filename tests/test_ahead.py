"""Items made ahead in a thread (`backends.ahead.background`): the trainer's shard reads and the extractor's jobs.
Real threads, real time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from backends.ahead import background


def ahead_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "ahead"]


def test_items_come_in_order_and_a_failure_there_is_raised_here() -> None:
    assert list(background(iter(range(50)), depth=3)) == list(range(50))

    def failing() -> Iterator[int]:
        yield 1
        raise ValueError("shard 3 is torn")

    got = background(failing())
    assert next(got) == 1
    with pytest.raises(ValueError, match="shard 3 is torn"):
        next(got)


def test_closing_waits_for_the_item_being_made_and_closes_the_items() -> None:
    """A consumer that stops early (the last step trained) returns from close() only once the thread is done: a
    thread still making a batch in torch as the interpreter exits aborted the trainer (SIGABRT after its save)."""
    made: list[int] = []
    closed = threading.Event()

    def slow() -> Iterator[int]:
        try:
            for i in range(100):
                time.sleep(0.3)  # a shard read
                made.append(i)
                yield i
        finally:
            closed.set()

    got = background(slow(), depth=1)
    assert next(got) == 0
    time.sleep(0.05)  # the thread is inside the next item now
    got.close()
    assert not ahead_threads() and closed.is_set()
    assert len(made) <= 3  # it stopped after the item it was making, not at the end of the items
