"""The command palette's runs: type part of a run's name, id or state to jump to it."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from functools import partial
from typing import Protocol, cast

from textual.command import DiscoveryHit, Hit, Provider
from textual.markup import escape

from backends.protocol import RunInfo
from console.visible import printable


class RunPicker(Protocol):
    """What the palette needs of the app: the runs it knows, and showing one."""

    @property
    def runs(self) -> Mapping[str, RunInfo]: ...

    def select_run(self, run_id: str) -> None: ...


class RunCommands(Provider):
    @property
    def picker(self) -> RunPicker:
        return cast(RunPicker, self.app)

    def _runs(self) -> list[tuple[str, str]]:
        """Each run's line, as the markup the palette takes: escaped, for a name may hold brackets."""
        return [
            (escape(printable(f"run {run['name']} ({run['state']}) {run['id']}")), run["id"])
            for run in reversed(list(self.picker.runs.values()))
        ]

    async def discover(self) -> AsyncGenerator[DiscoveryHit, None]:
        for text, run_id in self._runs():
            yield DiscoveryHit(text, partial(self.picker.select_run, run_id), help="show this run")

    async def search(self, query: str) -> AsyncGenerator[Hit, None]:
        matcher = self.matcher(query)
        for text, run_id in self._runs():
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), partial(self.picker.select_run, run_id), help="show this run")
