"""Warm SGLang parsers: an interpreter per (interpreter, environment, cwd) that has imported SGLang's server
arguments once and parses each flag set in a fork of itself, so that only the first check pays the import.

The warm process runs the parse program with no arguments (flags.py's _PARSE): it answers a first line, either
{"ready": true, "parser": FILE} or the verdict of an SGLang it cannot import (and then exits), then one verdict
line for each JSON argv line it reads, and exits when its stdin closes (the agent is gone). A process that died,
hung or answered nonsense is killed and gives no verdict (None): the caller asks the one-shot way, and the next
check starts a new warm one. One whose parser file changed (SGLang upgraded) is replaced before it is asked.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

IDLE_CLOSE_S = 300.0
MOST_WARM = 4  # each holds SGLang's imports (torch, transformers): hundreds of MB
CLOSE_GRACE_S = 2.0


class _Gone(Exception):
    """The warm process died, hung or answered something that is not a line of JSON."""


def file_stamp(path: object) -> list[int] | None:
    """What tells an edited or reinstalled file from the one seen before; None: no such file."""
    try:
        stat = os.stat(str(path))
    except OSError:
        return None
    return [stat.st_mtime_ns, stat.st_size]


class WarmParser:
    """One warm process (started at its first question); its lock serialises the questions asked of it."""

    def __init__(self, argv: list[str], env: Mapping[str, str], cwd: str | None) -> None:
        self.argv, self.env, self.cwd = argv, dict(env), cwd
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.parser: str | None = None
        self.parser_stamp: list[int] | None = None
        self.used_at = time.monotonic()
        self.idle_timer: threading.Timer | None = None
        self.unread = b""

    def ask(self, argv: list[str], timeout: float) -> dict[str, Any] | None:
        """The verdict on `argv` (PROGRAM FLAGS...); None when the warm process gave none."""
        with self.lock:
            self.used_at = time.monotonic()
            if self.proc is not None and file_stamp(self.parser) != self.parser_stamp:
                self._close(timeout=CLOSE_GRACE_S)  # SGLang changed under it: a fresh import answers
            if self.proc is not None and self.proc.poll() is not None:
                self._close(timeout=0)
                return None
            try:
                if self.proc is None and (unavailable := self._start(timeout)) is not None:
                    return unavailable
                return self._request(argv, timeout)
            except _Gone:
                self._close(timeout=0)
                return None
            finally:
                self._arm_idle_timer()

    def close(self) -> None:
        with self.lock:
            self._close(timeout=CLOSE_GRACE_S)

    def running(self) -> subprocess.Popen[bytes] | None:
        return self.proc

    def _start(self, timeout: float) -> dict[str, Any] | None:
        """Start the process and wait for its import: None once ready, or its verdict when SGLang cannot be
        imported there (the process then exits)."""
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # a failure is told by the one-shot path, which keeps stderr
            )
        except OSError:
            raise _Gone from None
        first = self._read_line(time.monotonic() + timeout)
        if first.get("ready") is True:
            self.parser = str(first.get("parser"))
            self.parser_stamp = file_stamp(self.parser)
            return None
        if "unavailable" in first:
            self._close(timeout=CLOSE_GRACE_S)
            return first
        raise _Gone

    def _request(self, argv: list[str], timeout: float) -> dict[str, Any] | None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(argv).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            raise _Gone from None
        verdict = self._read_line(time.monotonic() + timeout)
        return verdict or None  # {}: the parse gave no verdict (it exited): the one-shot path says how

    def _read_line(self, deadline: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        out = self.proc.stdout.fileno()
        while b"\n" not in self.unread:
            ready, _, _ = select.select([out], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(out, 65536) if ready else b""
            if not chunk:
                raise _Gone  # hung past the deadline, or exited
            self.unread += chunk
        line, _, self.unread = self.unread.partition(b"\n")
        try:
            answer = json.loads(line)
        except ValueError:
            raise _Gone from None
        if not isinstance(answer, dict):
            raise _Gone
        return answer

    def _close(self, timeout: float) -> None:
        """Close its stdin (it exits between parses), killed if it has not within `timeout`."""
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        proc, self.proc, self.unread = self.proc, None, b""
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):  # its end of the pipe is gone already
                proc.stdin.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def _arm_idle_timer(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self.idle_timer = None
        if self.proc is None:
            return
        self.idle_timer = threading.Timer(IDLE_CLOSE_S, self._close_if_idle)
        self.idle_timer.daemon = True
        self.idle_timer.start()

    def _close_if_idle(self) -> None:
        with self.lock:
            # A question asked while this timer was due re-armed another one: this one is stale.
            if time.monotonic() - self.used_at >= IDLE_CLOSE_S:
                self._close(timeout=CLOSE_GRACE_S)


_warm: OrderedDict[tuple[str, str | None, tuple[tuple[str, str], ...]], WarmParser] = OrderedDict()
_warm_lock = threading.Lock()


def ask(
    python: str, program: str, env: Mapping[str, str], cwd: str | None, argv: list[str], timeout: float
) -> dict[str, Any] | None:
    """The verdict of `python -c program` (warm, for `env` and `cwd`) on argv; None when it gave none."""
    key = (python, cwd, tuple(sorted(env.items())))
    with _warm_lock:
        parser = _warm.pop(key, None) or WarmParser([python, "-c", program], env, cwd)
        _warm[key] = parser
        evicted = [_warm.popitem(last=False)[1] for _ in range(len(_warm) - MOST_WARM)]
    for least_recently_used in evicted:
        least_recently_used.close()
    return parser.ask(argv, timeout)


def running() -> list[subprocess.Popen[bytes]]:
    """The warm processes now running, least recently used first."""
    with _warm_lock:
        parsers = list(_warm.values())
    return [proc for proc in (parser.running() for parser in parsers) if proc is not None]


def close_all() -> None:
    with _warm_lock:
        parsers = list(_warm.values())
        _warm.clear()
    for parser in parsers:
        parser.close()


atexit.register(close_all)
