"""The console's relaunch dialog offers presets spelled for the run's SGLang, and its preview shows what SGLang's
parser says of the new command line, warnings included.

SGLang is the real 0.5.23's parser (EAGLE3_SGLANG_PARSER_PATH); its launcher dies at once here (no runtime), so
the run relaunched is an ended one and nothing is stopped.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from textual.widgets import Button, Input

from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.tui.dialogs import ConfirmScreen, RelaunchScreen, preset_rows
from tests.conftest import until
from tests.test_serve_flags import DEPRECATED, NEW_SPELLING
from tests.test_tui import console_on

PARSER_PATH = os.environ.get("EAGLE3_SGLANG_PARSER_PATH")
needs_parser = pytest.mark.skipif(PARSER_PATH is None, reason="EAGLE3_SGLANG_PARSER_PATH unset: run `make test`")


def test_presets_are_laid_in_rows_that_fit_the_dialog() -> None:
    assert preset_rows(["--disable-cuda-graph", "--disable-custom-all-reduce", "--mem-fraction-static=0.8"]) == [
        ["--disable-cuda-graph", "--disable-custom-all-reduce", "--mem-fraction-static=0.8"]
    ]
    assert preset_rows([NEW_SPELLING, "--disable-custom-all-reduce", "--mem-fraction-static=0.8"]) == [
        [NEW_SPELLING],
        ["--disable-custom-all-reduce", "--mem-fraction-static=0.8"],
    ]


@needs_parser
async def test_the_relaunch_dialog_offers_the_runs_sglang_spelling_and_its_preview_shows_the_parsers_warning(
    workdir: Path, nvml_state: Path
) -> None:
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", "/nowhere"]
    async with AgentClient(LocalTransport(workdir)) as client:
        launched = await client.launch("serve", argv, env={"PYTHONPATH": str(PARSER_PATH)}, name="srv")
    async with console_on(LocalTransport(workdir), launched["run"]) as (app, pilot):
        await pilot.press("r")
        dialog = await until(
            pilot, lambda: app.screen if isinstance(app.screen, RelaunchScreen) else None, what="the relaunch dialog"
        )
        presets = [str(button.label) for button in dialog.query("Button.preset").results(Button)]
        assert presets == [NEW_SPELLING, "--disable-custom-all-reduce", "--mem-fraction-static=0.8"]
        await pilot.click("Button.preset")
        await pilot.press("enter")
        confirm = await until(  # SGLang's parser checks the new flags first: 20 s at a load of 10
            pilot, lambda: app.screen if isinstance(app.screen, ConfirmScreen) else None, 90, what="the preview"
        )
        spelled = "--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled"
        assert f"--model-path /nowhere {spelled}" in confirm.details
        assert "SGLang's parser: accepted" in confirm.details
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="the preview to close")
        await pilot.press("r")
        dialog = await until(
            pilot, lambda: app.screen if isinstance(app.screen, RelaunchScreen) else None, what="the relaunch dialog"
        )
        dialog.query_one("#flags", Input).value = "--disable-cuda-graph"
        await pilot.press("enter")
        confirm = await until(  # SGLang's parser checks the new flags first: 20 s at a load of 10
            pilot, lambda: app.screen if isinstance(app.screen, ConfirmScreen) else None, 90, what="the preview"
        )
        assert f"warning: SGLang 0.5.23's argument parser accepts this command line but warns: {DEPRECATED}" in (
            confirm.details
        )
        assert f"fix: write {NEW_SPELLING} instead of --disable-cuda-graph" in confirm.details
        await pilot.press("n")
