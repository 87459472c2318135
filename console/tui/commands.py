"""The command palette's runs: type part of a run's name, id or state to jump to it."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Provider
from textual.markup import escape

from console.render import printable

if TYPE_CHECKING:
    from console.tui.app import ConsoleApp


class RunCommands(Provider):
    def _runs(self) -> list[tuple[str, str]]:
        """Each run's line, as the markup the palette takes: escaped, for a name may hold brackets."""
        app = cast("ConsoleApp", self.app)
        return [
            (escape(printable(f"run {run['name']} ({run['state']}) {run['id']}")), run["id"])
            for run in reversed(list(app.runs.values()))
        ]

    async def discover(self) -> AsyncGenerator[DiscoveryHit, None]:
        app = cast("ConsoleApp", self.app)
        for text, run_id in self._runs():
            yield DiscoveryHit(text, partial(app.select_run, run_id), help="show this run")

    async def search(self, query: str) -> AsyncGenerator[Hit, None]:
        app = cast("ConsoleApp", self.app)
        matcher = self.matcher(query)
        for text, run_id in self._runs():
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), partial(app.select_run, run_id), help="show this run")
