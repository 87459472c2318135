"""One beat for the widgets that redraw as data streams in (the log, the charts).

Each redraw of a widget costs a pass of Textual's compositor; widgets that wait for the same beat are drawn in
one pass instead of one each. A beat every BEAT_S keeps the log and the curves live to the eye (as `watch`'s
default 2 s and htop's 1.5 s do) while the console stays under 3% of a core at 10 rows and lines a second:
every redraw of the log draws all its rows again, and at a half-second beat that was most of the console's work.
"""

from __future__ import annotations

import math
import time

BEAT_S = 1.0


def until_beat(earliest: float | None = None) -> float:
    """Seconds from now to the first beat at or after `earliest` (a time.monotonic() value; None: now)."""
    now = time.monotonic()
    at = now if earliest is None else max(earliest, now)
    return math.ceil(at / BEAT_S) * BEAT_S - now
