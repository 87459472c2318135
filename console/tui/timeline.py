"""A run's startup timeline and health history, read from its events (events.jsonl, streamed as they happen).

The watch on the host records each startup phase when the output first shows it (`phase`), each change of
the health poll's answer (`health`), the run's states and its end. From those alone this module tells how
long each phase took, when the server became ready, and what the health poll answered over time; two
attempts of a relaunch chain line up phase by phase.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

LAUNCH = "launch"  # from the launch to the first phase the output names: the interpreter and its imports
READY = "ready"
# The end of a run's startup, whichever comes first: serving, or ending.
ENDED_STATES = frozenset({"exited", "failed", "killed", "lost", "corrupt"})
MAX_EVENTS = 5000  # of a run, kept by the console (see `kept_events`)


@dataclass(frozen=True)
class PhaseSpan:
    name: str
    start: float
    end: float | None  # None: the phase is still going on

    def duration(self, now: float) -> float:
        return (self.end if self.end is not None else now) - self.start


@dataclass(frozen=True)
class HealthMark:
    at: float
    status: str  # "ok", "refused", "http 503", "error: ..."


@dataclass
class Timeline:
    launched_at: float | None = None
    phases: list[PhaseSpan] = field(default_factory=list)
    ready_at: float | None = None
    ended_at: float | None = None
    health: list[HealthMark] = field(default_factory=list)
    # What the host said once of the launch: SGLang's parser on its flags (a warning, or why it was not asked,
    # each with what to do) and what the watch cannot do for it (`unwatched`: no health poll, and why).
    notes: list[tuple[str, str | None]] = field(default_factory=list)

    @property
    def time_to_ready(self) -> float | None:
        if self.ready_at is None or self.launched_at is None:
            return None
        return self.ready_at - self.launched_at

    def health_at(self, at: float) -> str | None:
        """The health poll's answer in force at `at` (None before the first answer, or after the run ended)."""
        if self.ended_at is not None and at >= self.ended_at:
            return None
        answer = None
        for mark in self.health:
            if mark.at > at:
                break
            answer = mark.status
        return answer


def kept_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run's events as the console keeps them: past MAX_EVENTS, the oldest half of its health answers go (a
    server whose health flaps for days adds one at every change); its launch, phases, states and notes stay, and
    the health history reads from the oldest answer kept."""
    if len(events) <= MAX_EVENTS:
        return events
    health = [i for i, row in enumerate(events) if row.get("type") == "health"]
    gone = set(health[: len(health) // 2] if len(health) > 1 else [])
    if not gone:  # none but health-less rows: the oldest go
        return events[-MAX_EVENTS:]
    return [row for i, row in enumerate(events) if i not in gone]


def timeline(events: Iterable[Mapping[str, Any]]) -> Timeline:
    """The timeline of one run from its event rows, in the order they were written."""
    found = Timeline()
    current: tuple[str, float] | None = None

    def close(at: float) -> None:
        nonlocal current
        if current is not None:
            found.phases.append(PhaseSpan(current[0], current[1], at))
            current = None

    for row in events:
        at, kind = row.get("t"), row.get("type")
        if not isinstance(at, (int, float)) or isinstance(at, bool):
            continue
        if kind == "launch":
            found.launched_at = float(at)
            current = (LAUNCH, float(at))
        elif kind == "phase" and isinstance(name := row.get("phase"), str):
            if found.ready_at is not None:
                continue  # a server that already serves does not start again
            close(float(at))
            if name == READY:
                found.ready_at = float(at)
            else:
                current = (name, float(at))
        elif kind == "flags" and isinstance(message := row.get("message"), str):
            fix = row.get("fix")
            found.notes.append((f"{row.get('severity', 'info')}: {message}", fix if isinstance(fix, str) else None))
        elif kind == "unwatched" and isinstance(message := row.get("message"), str):
            found.notes.append((message, None))
        elif kind == "health" and isinstance(status := row.get("status"), str):
            found.health.append(HealthMark(float(at), status))
        elif kind == "state" and row.get("state") == "ready" and found.ready_at is None:
            close(float(at))
            found.ready_at = float(at)
        elif kind == "state" and row.get("state") in ENDED_STATES:
            close(float(at))
            found.ended_at = float(at)
    if current is not None:
        found.phases.append(PhaseSpan(current[0], current[1], None))
    return found


ARROW = " → "


def seconds(value: float) -> str:
    """`0.4 s`, `41 s`, `2 m 05 s`, `1 h 02 m`: what a person reads at a glance."""
    if value < 10:
        return f"{value:.1f} s"
    if value < 60:
        return f"{value:.0f} s"
    if value < 3600:
        return f"{int(value // 60)} m {int(value % 60):02d} s"
    return f"{int(value // 3600)} h {int(value % 3600 // 60):02d} m"


def steps(line: Timeline, now: float) -> list[str]:
    """Each phase with its duration (an unfinished one counts up to `now`, marked …), then time to ready."""
    done = [f"{span.name} {seconds(span.duration(now))}" + ("…" if span.end is None else "") for span in line.phases]
    if line.ready_at is not None and line.time_to_ready is not None:
        done.append(f"ready in {seconds(line.time_to_ready)}")
    elif line.ended_at is not None:
        done.append("ended before ready")
    return done


def summary(line: Timeline, now: float) -> str:
    """`launch 2.1 s → load-weights 41 s → … → ready in 60 s`."""
    return ARROW.join(steps(line, now)) or "no phase seen yet"


def summary_lines(line: Timeline, now: float, width: int) -> list[str]:
    """The summary in lines of at most `width` cells, broken only between steps (never inside `41 s`)."""
    return wrap_steps(steps(line, now) or ["no phase seen yet"], width)


def wrap_steps(parts: list[str], width: int) -> list[str]:
    """`parts` joined by arrows in lines of at most `width` cells, broken only between parts; a part longer than
    a line gets one to itself."""
    lines: list[str] = []
    for step in parts:
        if lines and len(lines[-1]) + len(ARROW) + len(step) <= width:
            lines[-1] += ARROW + step
        else:
            lines.append(("→ " if lines else "") + step)
    return lines


# One cell per answer class: a person sees "refused, then 503, then 200" as colours and shapes.
HEALTH_CELLS = {"ok": "█", "refused": "·", "http": "▒", "error": "!"}


def health_class(status: str | None) -> str | None:
    if status is None:
        return None
    if status == "ok" or status == "refused":
        return status
    return "http" if status.startswith("http ") else "error"


def health_strip(line: Timeline, start: float, end: float, width: int) -> list[str | None]:
    """The health answer class in force at the end of each of `width` equal slices of [start, end]."""
    if width <= 0:
        return []
    span = max(end - start, 1e-9)
    return [health_class(line.health_at(start + span * (i + 1) / width)) for i in range(width)]


def compare(first: Timeline, second: Timeline, now: float) -> list[tuple[str, float | None, float | None]]:
    """Two attempts phase by phase: (phase, its duration in the first, in the second), in startup order; a phase
    one attempt never reached is None there. Time to ready is the last row."""
    durations = [{span.name: span.duration(now) for span in line.phases} for line in (first, second)]
    names = list(dict.fromkeys([*(s.name for s in first.phases), *(s.name for s in second.phases)]))
    rows: list[tuple[str, float | None, float | None]] = [(n, durations[0].get(n), durations[1].get(n)) for n in names]
    rows.append((f"{READY} in", first.time_to_ready, second.time_to_ready))
    return rows


def comparison_steps(this: Timeline, before: Timeline, now: float) -> list[str]:
    """This attempt beside the one it replaced, phase by phase: `load-weights 41 s (was 44 s)`, `cuda-graph —
    (was 12 s)` for a phase it has not reached; a phase that took as long as before shows no `(was …)`."""

    def shown(value: float | None) -> str:
        return seconds(value) if value is not None else "—"

    parts = []
    for phase, was, now_took in compare(before, this, now):
        if was is None and now_took is None:
            continue
        parts.append(f"{phase} {shown(now_took)}" + ("" if shown(was) == shown(now_took) else f" (was {shown(was)})"))
    return parts
