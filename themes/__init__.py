"""Console themes as data: each becomes a Textual theme named `eagle3-<name>`; widgets use its variables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.app import App
from textual.theme import Theme


@dataclass(frozen=True)
class Palette:
    name: str
    primary: str
    accent: str
    background: str
    surface: str
    warning: str
    error: str
    success: str
    dark: bool = True


PALETTES = (
    Palette("night", "#4c9be8", "#56d4dd", "#0f1419", "#1a2028", "#e6b450", "#f07178", "#7fd962"),
    Palette("day", "#1f6feb", "#0a7e8c", "#fafafa", "#eceff1", "#9a6700", "#cf222e", "#1a7f37", dark=False),
)
DEFAULT = "eagle3-night"


def register_themes(app: App[Any]) -> None:
    """Register every palette and switch to the default one."""
    for p in PALETTES:
        app.register_theme(
            Theme(
                name=f"eagle3-{p.name}",
                primary=p.primary,
                accent=p.accent,
                background=p.background,
                surface=p.surface,
                warning=p.warning,
                error=p.error,
                success=p.success,
                dark=p.dark,
            )
        )
    app.theme = DEFAULT


@dataclass(frozen=True)
class Signals:
    """The colours that mean good, take care and bad (and the accent), of a theme or, without one, plain names."""

    success: str = "green"
    warning: str = "yellow"
    error: str = "red"
    accent: str = ""


def signals(theme: Theme | None) -> Signals:
    if theme is None:
        return Signals()
    plain = Signals()
    return Signals(
        theme.success or plain.success, theme.warning or plain.warning, theme.error or plain.error, theme.accent or ""
    )
