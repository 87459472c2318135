"""Metrics from other trainers, turned into the rows of our metrics.jsonl.

A `train` run may name where its metrics come from (`--metrics-from`):

    jsonl            JSON objects the run prints, one a line: passed through as they are
    specforge        SpecForge stdout: `step N: {dict}` (2026 layout, keys with or without
                     `train/`), per-position `Acc:`/`pLoss:` lines and the tqdm postfix
                     `loss=…, acc=…` (v0.2.0)
    speculators      speculators' log lines `train/loss_0=1.980, …, global_step=12`, which
                     rich wraps over several lines when the output is a file
    eagle            SafeAILab EAGLE's `Train Epoch [e/N], position i,  Acc: x` lines
    tensorboard:DIR  event files under DIR (relative to the run's folder of work), read with
                     TensorBoard's own event loader, one row per step

The line parsers are pure apart from joining lines that belong together (the
per-position lines of one epoch, one wrapped log record). Names are mapped onto
our schema by `canonical_name`; a name we do not know keeps its own, less a
`train/` prefix. Every row says where it came from (`"source"`) and has `step`
when the trainer gave one. Epochs are counted from 0, as the trainers count
them in their own code (their `[e/N]` lines print e + 1).

The supervisor runs a `MetricsFollower` while the child lives. It tails
output.log (or the event files), appends rows to metrics.jsonl, and keeps how
far it got in metrics_source.json, so that a second supervisor resumes there
instead of writing every row again.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.fileio import append_jsonl, atomic_write_json, read_json
from backends.protocol import Metric, MetricRow, not_metric_values, parse_source
from backends.runs.store import METRICS, METRICS_SOURCE, OUTPUT, RunDir

LINE_SOURCES: frozenset[str] = frozenset({"jsonl", "specforge", "speculators", "eagle"})

# Bytes read from output.log at a time; a longer line is taken in pieces.
READ_CHUNK = 1024 * 1024
# A `step N: {` record that rich wrapped gets this many lines to close its brace.
MAX_WRAPPED_LINES = 64
# Dicts longer than this are not metrics; ast.literal_eval on them would only cost time.
MAX_DICT_CHARS = 256 * 1024
# Metrics nest a level or two; deeper is not metrics, and recursing into it could exhaust the stack.
MAX_NESTING = 8
POLL_S = 0.5


# --- names --------------------------------------------------------------------------------------

_EXACT_NAMES: dict[str, str] = {
    "global_step": Metric.STEP,
    "train/global_step": Metric.STEP,
    "train/step": Metric.STEP,
    "eval/avg_loss": Metric.VAL_LOSS,
    "eval/loss": Metric.VAL_LOSS,
    "eval/avg_acc": Metric.VAL_ACC,
    "eval/simulated_acc_len": Metric.VAL_SIM_ACCEPT_LEN,
}
_PATTERN_NAMES: tuple[tuple[re.Pattern[str], str], ...] = (
    # EAGLE `train/epochacc_i`, SpecForge `train/epoch_acc_i`: averages over an epoch.
    (re.compile(r"(?:train/)?epoch_?(acc|ploss)_(\d+)"), r"epoch_\1_\2"),
    # SpecForge `eval/acc_i`, `eval/epoch_acc_i`; EAGLE `test/epochacc_i`.
    (re.compile(r"(?:eval|test)/(?:epoch_?)?(acc|ploss)_(\d+)"), r"val_\1_\2"),
    (re.compile(r"eval/per_position_acc_(\d+)"), r"val_acc_\1"),
    (re.compile(r"eval/(acceptance_rate_\d+)"), r"val_\1"),
    # speculators: `train/loss_k` is the loss at position k; `val/*_epoch` its validation pass.
    (re.compile(r"train/loss_(\d+)"), r"ploss_\1"),
    (re.compile(r"val/loss_(\d+)_epoch"), r"val_ploss_\1"),
    (re.compile(r"val/(.+)_epoch"), r"val_\1"),
)


def canonical_name(key: str) -> str:
    """Our schema's name for a trainer's metric name; unknown names keep theirs, less `train/`."""
    if key in _EXACT_NAMES:
        return _EXACT_NAMES[key]
    for pattern, replacement in _PATTERN_NAMES:
        if pattern.fullmatch(key):
            return pattern.sub(replacement, key)
    return key.removeprefix("train/")


# --- values and rows ----------------------------------------------------------------------------

_INT_RE = re.compile(r"[-+]?\d{1,18}")


def scalar(text: str) -> int | float | str:
    """A value as printed: a number when it reads as one, else the text without quotes."""
    value = text.strip()
    if _INT_RE.fullmatch(value):
        return int(value)
    try:
        return float(value)
    except ValueError:
        return value.strip("'\"")


def _flatten(key: str, value: object, depth: int = 0) -> Iterator[tuple[str, object]]:
    """Nested dicts as `a/b` names (as the trackers flatten them), numeric lists as `name_i`."""
    if isinstance(value, Mapping):
        if depth < MAX_NESTING:
            for sub, item in value.items():
                yield from _flatten(f"{key}/{sub}" if key else str(sub), item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if _is_number(item):
                yield f"{key}_{i}", item
    elif isinstance(value, str):
        yield key, scalar(value)
    elif isinstance(value, (int, float)):  # bool included: a flag is kept as the trainer wrote it
        yield key, value


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_step(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    return None


def make_row(
    source: str, pairs: Iterable[tuple[str, object]], *, step: int | None = None, epoch: int | None = None
) -> MetricRow | None:
    """One row from a trainer's (name, value) pairs; None when it holds no metric at all."""
    row: MetricRow = {}
    if step is not None:
        row[Metric.STEP] = step
    if epoch is not None:
        row[Metric.EPOCH] = epoch
    for raw_key, raw_value in pairs:
        for key, value in _flatten(str(raw_key), raw_value):
            name = canonical_name(key)
            if name == Metric.STEP:
                as_step = _as_step(value)
                if as_step is None:
                    row[key] = value  # not a step number: keep it, under its own name
                else:
                    row.setdefault(Metric.STEP, as_step)  # a step named by the line itself wins
            else:
                row[name] = value
    if not row.keys() - {Metric.STEP, Metric.EPOCH}:
        return None
    # step and epoch first, where a reader of the file looks for them.
    ordered: MetricRow = {key: row.pop(key) for key in (Metric.STEP, Metric.EPOCH) if key in row}
    ordered.update(row)
    ordered[Metric.SOURCE] = source
    return ordered


# --- lines --------------------------------------------------------------------------------------

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# rich's log layout: `[20:17:13] INFO     message     trainer.py:191`; the time is left out when it repeats.
_LOG_HEAD_RE = re.compile(r"^\s*(?:\[[^\[\]]*\]\s*)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+")
_LOG_TAIL_RE = re.compile(r"\s+[\w.\-]+\.py:\d+\s*$")
_STEP_DICT_RE = re.compile(r"(?:^|[\s\]|:>])step\s+(\d{1,18})\s*:\s*(\{.*)$", re.IGNORECASE)
_POSITION_RE = re.compile(
    r"\b(?P<phase>Train|Eval|Test)\s*"
    r"(?:Epoch\s*\[\s*(?P<epoch>\d{1,18})\s*/\s*\d+\s*\]"  # Train Epoch [1/3]
    r"|-?\s*Step\s*\[?\s*(?P<step>\d{1,18})\s*\]?(?:\s*\[[^\[\]]*\])?"  # Eval - Step 500 [...], Train Step [500]
    r"|in\s+(?P<where>.*?))"  # Eval in /data/eval.jsonl
    r"\s*,\s*position\s+(?P<pos>\d{1,18})\s*,\s*(?P<what>Acc|pLoss)\s*:\s*(?P<value>\S+)\s*$"
)
# A tqdm bar ends `| n/total [elapsed<left, rate, k=v, ...]` (or `n it [...]` without a total).
_TQDM_RE = re.compile(r"(?P<n>\d{1,18})(?:/\d+|it)\s*\[(?P<info>[^\[\]]*)\]\s*$")
_TQDM_EPOCH_RE = re.compile(r"\bEpoch\s+(\d{1,18})\b")
_PAIR_RE = re.compile(r"([A-Za-z_][\w./\-]*)=(\S+)")
# Python reprs inside a printed dict: tensor(0.52, device='cuda:0'), np.float64(0.52), nan, inf.
_WRAPPED_NUMBER_RE = re.compile(
    r"\b(?:tensor|torch\.\w+|np\.\w+|numpy\.\w+)\(\s*([-+]?(?:[\d.]+(?:[eE][-+]?\d+)?|nan|inf))\s*(?:,[^()]*)?\)"
)
_BARE_SPECIAL_RE = re.compile(r"(?<![\w'\"])([-+]?)(nan|inf)(?![\w'\"])")


def parse_mapping(text: str) -> dict[Any, Any] | None:
    """A printed dict, as JSON or as Python's repr of one; None when it is neither."""
    if len(text) > MAX_DICT_CHARS:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        try:
            value = ast.literal_eval(_BARE_SPECIAL_RE.sub(r'"\1\2"', _WRAPPED_NUMBER_RE.sub(r"\1", text)))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    return value if isinstance(value, dict) else None


def _pairs_only(text: str) -> list[tuple[str, str]] | None:
    """`k=v, k=v` pairs when the text is nothing else (a log message with words is not metrics)."""
    pairs = []
    for token in text.split(","):
        token = token.strip()
        if not token:
            continue
        match = _PAIR_RE.fullmatch(token)
        if match is None:
            return None
        pairs.append((match.group(1), match.group(2)))
    return pairs or None


@dataclass
class _Pending:
    """Lines read but not yet a row: they may continue on the next line."""

    kind: str  # "group" (per-position lines), "pairs" (a wrapped log record), "dict" (a wrapped `step N: {`)
    key: tuple[object, ...]
    mark: int
    fields: dict[str, object] = field(default_factory=dict)
    step: int | None = None
    epoch: int | None = None
    parts: list[str] = field(default_factory=list)


class LineParser:
    """Rows from the lines of one source's output, fed in order.

    Lines that belong together (one epoch's per-position lines, a log record
    wrapped over several lines) stay pending until a line that is not part of
    them arrives, or until `flush`. `mark` is the caller's tag for a line (the
    follower passes its byte offset): `pending_mark` is the mark of the first
    pending line, where a re-read has to start so as to rebuild what is pending.
    """

    def __init__(self, source: str, state: Mapping[str, object] | None = None) -> None:
        if source not in LINE_SOURCES:
            raise ValueError(f"{source!r} is not a line source; use one of {', '.join(sorted(LINE_SOURCES))}")
        self.source = source
        self.malformed = 0
        self.last_malformed: str | None = None
        self._pending: _Pending | None = None
        last = (state or {}).get("last_progress")
        # The last tqdm postfix turned into a row: a redrawn bar with the same values is no new row.
        self._last_progress: str | None = last if isinstance(last, str) else None
        self._handlers: dict[str, Callable[[str, int], list[MetricRow]]] = {
            "jsonl": self._jsonl,
            "specforge": self._specforge,
            "speculators": self._speculators,
            "eagle": self._eagle,
        }

    @property
    def pending_mark(self) -> int | None:
        return None if self._pending is None else self._pending.mark

    def state(self) -> dict[str, object]:
        """What a parser resumed at `pending_mark` (or at the end) needs to carry on without repeats."""
        return {"last_progress": self._last_progress}

    def feed(self, line: str, mark: int = 0) -> list[MetricRow]:
        line = _ANSI_RE.sub("", line)
        if not line.strip():
            return []
        pending = self._pending
        if pending is not None and pending.kind == "dict":
            return self._continue_dict(pending, line, mark)
        return self._handlers[self.source](line, mark)

    def flush(self) -> list[MetricRow]:
        """Whatever is pending, as a row: no more lines are coming for it."""
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        if pending.kind == "dict":
            self.note_malformed(" ".join(pending.parts))
            return []
        row = make_row(self.source, pending.fields.items(), step=pending.step, epoch=pending.epoch)
        return [row] if row is not None else []

    def note_malformed(self, line: str) -> None:
        self.malformed += 1
        self.last_malformed = line[:200]

    # jsonl: our own schema, passed through.
    def _jsonl(self, line: str, mark: int) -> list[MetricRow]:
        text = line.strip()
        if not text.startswith("{"):
            return []
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            value = None
        if not isinstance(value, dict):
            self.note_malformed(line)
            return []
        return [{**value, Metric.SOURCE: value.get(Metric.SOURCE, self.source)}]

    # specforge: step dicts, per-position lines, tqdm postfixes.
    def _specforge(self, line: str, mark: int) -> list[MetricRow]:
        match = _STEP_DICT_RE.search(line)
        if match is not None:
            text = _LOG_TAIL_RE.sub("", match.group(2))
            out = self.flush()
            mapping = parse_mapping(text)
            if mapping is not None:
                row = make_row(self.source, mapping.items(), step=int(match.group(1)))
                return out + ([row] if row is not None else [])
            if text.count("{") > text.count("}"):
                # rich wrapped the record: the rest of the dict is on the next lines.
                self._pending = _Pending("dict", (), mark, step=int(match.group(1)), parts=[text])
            else:
                self.note_malformed(line)
            return out
        if _POSITION_RE.search(line):
            return self._position(line, mark)
        return self._progress(line)

    def _continue_dict(self, pending: _Pending, line: str, mark: int) -> list[MetricRow]:
        if not line[:1].isspace() or len(pending.parts) >= MAX_WRAPPED_LINES:
            out = self.flush()  # the record never closed: counted as malformed
            return out + self.feed(line, mark)
        pending.parts.append(_LOG_TAIL_RE.sub("", line).strip())
        text = " ".join(pending.parts)
        mapping = parse_mapping(text)
        if mapping is None:
            if text.count("{") <= text.count("}"):
                self._pending = None
                self.note_malformed(text)
            return []
        self._pending = None
        row = make_row(self.source, mapping.items(), step=pending.step)
        return [row] if row is not None else []

    def _position(self, line: str, mark: int) -> list[MetricRow]:
        match = _POSITION_RE.search(line)
        if match is None:
            return []
        value = scalar(match.group("value"))
        if not _is_number(value):
            self.note_malformed(line)
            return []
        phase = match.group("phase")
        epoch = max(int(match.group("epoch")) - 1, 0) if match.group("epoch") is not None else None
        step = int(match.group("step")) if match.group("step") is not None else None
        key = (phase, epoch, step, match.group("where"))
        if phase == "Train":
            named = Metric.epoch_acc if match.group("what") == "Acc" else Metric.epoch_ploss
        else:
            named = Metric.val_acc if match.group("what") == "Acc" else Metric.val_ploss
        name = named(int(match.group("pos")))
        out: list[MetricRow] = []
        pending = self._pending
        if pending is None or pending.kind != "group" or pending.key != key or name in pending.fields:
            out = self.flush()
            pending = self._pending = _Pending("group", key, mark, step=step, epoch=epoch)
        pending.fields[name] = value
        return out

    def _progress(self, line: str) -> list[MetricRow]:
        match = _TQDM_RE.search(line)
        if match is None:
            return []
        pairs: list[tuple[str, object]] = []
        for key, value in _PAIR_RE.findall(match.group("info")):
            value = value.rstrip(",")  # the comma between pairs, which \S+ takes in
            if value:
                pairs.append((key, scalar(value)))
        if not pairs:
            return []
        epoch_match = _TQDM_EPOCH_RE.search(line, 0, match.start())
        epoch = int(epoch_match.group(1)) if epoch_match else None
        seen = json.dumps([epoch, pairs])
        if seen == self._last_progress:
            return []
        out = self.flush()
        self._last_progress = seen
        row = make_row(self.source, [(Metric.BATCH, int(match.group("n"))), *pairs], epoch=epoch)
        return out + ([row] if row is not None else [])

    # speculators: `k=v, ...` log records, wrapped by rich over indented lines.
    def _speculators(self, line: str, mark: int) -> list[MetricRow]:
        head = _LOG_HEAD_RE.match(line)
        message = _LOG_TAIL_RE.sub("", line[head.end() :] if head else line)
        pairs = _pairs_only(message)
        pending = self._pending
        if (
            pairs is not None
            and head is None
            and line[:1].isspace()
            and pending is not None
            and pending.kind == "pairs"
            and not pending.fields.keys() & {k for k, _ in pairs}
        ):
            pending.fields.update((k, scalar(v)) for k, v in pairs)
            return []
        out = self.flush()
        if pairs is not None:
            self._pending = _Pending("pairs", (), mark, fields={k: scalar(v) for k, v in pairs})
        return out

    # eagle: per-position epoch lines only.
    def _eagle(self, line: str, mark: int) -> list[MetricRow]:
        if _POSITION_RE.search(line):
            return self._position(line, mark)
        return []


def parse_text(source: str, text: str) -> list[MetricRow]:
    """Every row in a finished output (lines end at `\\n` or `\\r`), for one line source."""
    parser = LineParser(source)
    rows: list[MetricRow] = []
    for line in re.split(r"[\r\n]", text):
        rows += parser.feed(line)
    return rows + parser.flush()


# --- following a run ----------------------------------------------------------------------------


class _LogReader:
    """Complete lines of output.log from a byte offset; `\\r` ends a line too (progress bars)."""

    def __init__(self, path: Path, source: str, state: Mapping[str, object]) -> None:
        self.path = path
        offset = state.get("offset")
        parser_state = state.get("parser")
        self.parser = LineParser(source, parser_state if isinstance(parser_state, dict) else None)
        self.pos = offset if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0 else 0
        # Counted over the run's whole output, by every follower of it: the first one is said once.
        malformed, last = state.get("malformed_lines"), state.get("last_malformed")
        self.parser.malformed = malformed if isinstance(malformed, int) and not isinstance(malformed, bool) else 0
        self.parser.last_malformed = last if isinstance(last, str) else None

    @property
    def malformed(self) -> int:
        return self.parser.malformed

    @property
    def last_malformed(self) -> str | None:
        return self.parser.last_malformed

    def read(self, final: bool) -> Iterator[MetricRow]:
        """The rows of the lines written since the last read, each as soon as it is found: those found before a
        read of the log fails are the caller's to keep, and the position is past them."""
        got_lines = False
        while True:
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self.pos)
                    data = fh.read(READ_CHUNK)
            except FileNotFoundError:
                break
            if not data:
                break
            at_end = len(data) < READ_CHUNK
            cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            if (final and at_end) or (cut == 0 and not at_end):
                cut = len(data)  # the last line, unterminated, once the child is gone; or a huge line
            if cut == 0:
                break  # a line still being written
            for match in re.finditer(rb"[^\r\n]+", data[:cut]):
                yield from self._feed(match.group().decode("utf-8", "replace"), self.pos + match.start())
                got_lines = True
            self.pos += cut
            if at_end:
                break
        if final or not got_lines:
            # Quiet since the last read: what is pending is complete.
            yield from self.parser.flush()

    def _feed(self, line: str, mark: int) -> list[MetricRow]:
        try:
            return self.parser.feed(line, mark)
        except Exception:  # a parser bug costs the line it met, never the lines around it
            self.parser.note_malformed(line)
            return []

    def state(self) -> dict[str, object]:
        mark = self.parser.pending_mark
        return {
            "offset": self.pos if mark is None else mark,
            "parser": self.parser.state(),
            "malformed_lines": self.parser.malformed,
            "last_malformed": self.parser.last_malformed,
        }


class _EventFile:
    """One TensorBoard event file, read with TensorBoard's loader; scalars grouped by step."""

    def __init__(self, loader: Any, skip: int) -> None:
        self.loader = loader
        self.seen = 0  # events read from the file
        self.skip = skip  # events already turned into rows by an earlier follower
        self.committed = skip  # events before the pending step's first one
        self.pending: MetricRow = {}
        self.pending_step: int | None = None

    def read(self, final: bool) -> Iterator[MetricRow]:
        got_events = False
        for event in self.loader.Load():
            self.seen += 1
            if self.seen <= self.skip:
                continue
            got_events = True
            values = list(_scalars(event))
            if not values:
                if self.pending_step is None:
                    self.committed = self.seen
                continue
            if self.pending_step is not None and self.pending_step != event.step:
                yield from self._flush(self.seen - 1)
            if self.pending_step is None:
                self.pending_step = int(event.step)
            self.pending.update(values)
        if final or not got_events:
            yield from self._flush(self.seen)

    def _flush(self, committed: int) -> list[MetricRow]:
        row = None
        if self.pending_step is not None:
            row = make_row("tensorboard", self.pending.items(), step=self.pending_step)
        self.pending, self.pending_step = {}, None
        self.committed = max(self.committed, committed)
        return [row] if row is not None else []


def _scalars(event: Any) -> Iterator[tuple[str, float | int]]:
    """(tag, value) of each single-number value in an event's summary; images, text and histograms are not."""
    import numpy as np
    from tensorboard.util import tensor_util

    if event.WhichOneof("what") != "summary":
        return
    for value in event.summary.value:
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            array = np.asarray(value.simple_value, dtype=np.float32)
        elif kind == "tensor":
            try:
                array = tensor_util.make_ndarray(value.tensor)
            except (ValueError, TypeError, KeyError):
                continue
        else:
            continue
        if array.size != 1 or array.dtype.kind not in "fiu":
            continue
        item = array.reshape(-1)[0]
        # str() of a float32 is its shortest form: 0.7, not 0.699999988079071.
        yield value.tag, float(str(item)) if array.dtype.kind == "f" else int(item)


class _EventFolder:
    """Every event file under a folder, new files included, each followed as it grows."""

    malformed = 0  # TensorBoard's loader reads records whole or not at all: no line is ever half a row
    last_malformed: str | None = None

    def __init__(self, folder: Path, state: Mapping[str, object]) -> None:
        # Imported here, so that only tensorboard sources need TensorBoard, and it fails once, not at every poll.
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        self.loader_class = EventFileLoader
        self.folder = folder
        files = state.get("files")
        self.resume = {
            str(k): v for k, v in (files.items() if isinstance(files, dict) else []) if isinstance(v, int) and v >= 0
        }
        self.files: dict[str, _EventFile] = {}

    def read(self, final: bool) -> Iterator[MetricRow]:
        paths = sorted(self.folder.rglob("events.out.tfevents.*")) if self.folder.is_dir() else []
        for path in paths:
            name = path.relative_to(self.folder).as_posix()
            if name not in self.files:
                self.files[name] = _EventFile(self.loader_class(str(path)), self.resume.get(name, 0))
            yield from self.files[name].read(final)
        if final and not self.files:
            raise SourceProblem(f"no TensorBoard event files (events.out.tfevents.*) under {self.folder}")

    def state(self) -> dict[str, object]:
        return {"files": {**self.resume, **{name: f.committed for name, f in self.files.items()}}}


class SourceProblem(Exception):
    """Something about the metrics source the user should hear of: recorded as a run event."""


class MetricsFollower:
    """Turns a run's metrics source into metrics.jsonl rows while the child lives.

    `start()` drains in a background thread every `interval` seconds; `stop()`,
    called once the child has exited, ends the thread and drains what is left
    (the last, unterminated line included). `drain()` is one such read, for
    callers that want no thread. Problems are recorded as `metrics_error`
    events; they never stop the supervisor.

    No row is lost to a write that fails: rows read wait in memory, in order,
    until each is in metrics.jsonl, and how far the source was read is recorded
    only once every row before that point is. While the disk refuses them,
    nothing more is read: the source keeps what follows.
    """

    def __init__(self, run: RunDir, source: str, *, cwd: Path | None = None, interval: float = POLL_S) -> None:
        self.run = run
        self.source = parse_source(source)
        self.cwd = cwd or Path.cwd()
        self.interval = interval
        self._reader: _LogReader | _EventFolder | None = None
        self._unreadable = False
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._last_state: object = None
        self._last_error: str | None = None
        self._unwritten: collections.deque[MetricRow] = collections.deque()  # read, not yet in metrics.jsonl
        self._malformed_told = False
        self.left_out = 0  # values read that are not metric values (text, lists...), never written as metrics
        self.unwritable = 0  # rows JSON cannot write (none of ours should be): each left out alone

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="metrics-follower", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread, then read everything that is left: the child has exited."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.drain(final=True)
        if self._unwritten:
            self._report(
                f"{len(self._unwritten)} metric rows from {self.source}, and whatever it printed after them, are "
                f"not in {METRICS}: the disk still refused them when the run ended"
            )

    def drain(self, final: bool = False) -> int:
        """Write the rows an earlier drain could not, then read what is new and write its rows; record how far
        the source was read once all of them are written. The number of rows written."""
        reader = self._open()
        if reader is None:
            return 0
        written = self._write()
        if self._unwritten:
            return written  # the disk still refuses: read no more until it takes these
        self._read(reader, final)
        written += self._write()
        if not self._unwritten:
            self._commit(reader)
        return written

    def _read(self, reader: _LogReader | _EventFolder, final: bool) -> None:
        """Rows from the source onto the unwritten ones; those found before a failure are kept."""
        try:
            for row in reader.read(final):
                kept = self._numbers_only(row)
                if kept is not None:
                    self._unwritten.append(kept)
        except SourceProblem as exc:
            self._report(str(exc))
        except Exception as exc:  # a reader bug must not take the supervisor down with it
            self._report(f"reading metrics from {self.source} failed: {type(exc).__name__}: {exc}")
        if reader.malformed and not self._malformed_told:
            self._malformed_told = True
            self._report(
                f"{self.source}: {reader.malformed} line(s) that read as no metrics row left out, the rows around "
                f"them kept ({METRICS_SOURCE} counts any more); the last: {reader.last_malformed}"
            )

    def _write(self) -> int:
        """Append the unwritten rows in order, each once, up to the first the disk refuses; how many were."""
        written = 0
        while self._unwritten:
            try:
                append_jsonl(self.run.file(METRICS), self._unwritten[0])
            except OSError as exc:  # append_jsonl writes a line whole or not at all: this row is tried again
                self._report(
                    f"cannot write metrics for {self.source}: {exc.strerror or exc}; the rows are kept and "
                    f"written again every {self.interval:g} s while the run runs"
                )
                break
            except (ValueError, RecursionError) as exc:  # a row JSON cannot write: it alone is left out
                self.unwritable += 1
                if self.unwritable == 1:
                    self._report(f"cannot write a metrics row from {self.source}: {exc}; left out, the others kept")
            else:
                written += 1
            self._unwritten.popleft()
        return written

    def _commit(self, reader: _LogReader | _EventFolder) -> None:
        """How far the source was read, for a later follower to resume there: every row before it is written."""
        state = {"source": self.source, **reader.state()}
        if state == self._last_state:
            return
        try:
            atomic_write_json(self.run.file(METRICS_SOURCE), state)
        except OSError as exc:  # tried again at the next drain: the state still differs
            self._report(f"cannot record how far metrics from {self.source} were read: {exc.strerror or exc}")
            return
        self._last_state = state

    def _numbers_only(self, row: MetricRow) -> MetricRow | None:
        """The row without its values that are not metric values (None when they were all it had); the first one
        left out is said once."""
        bad = not_metric_values(row)
        if not bad:
            return row
        if bad and not self.left_out:
            name, value = next(iter(bad.items()))
            # Text as JSON writes it (escapes visible); a list or an object by its kind: it may nest deep.
            shown = f"a {type(value).__name__}" if isinstance(value, list | dict) else json.dumps(value)[:80]
            self._report(f"{self.source} gives values that are not numbers; left out of the metrics: {name} = {shown}")
        self.left_out += len(bad)
        kept = {name: value for name, value in row.items() if name not in bad}
        return kept if kept.keys() - {Metric.STEP, Metric.EPOCH, Metric.SOURCE} else None

    def _open(self) -> _LogReader | _EventFolder | None:
        """The reader, resumed where an earlier follower of this run stopped."""
        if self._reader is not None or self._unreadable:
            return self._reader
        saved = read_json(self.run.file(METRICS_SOURCE))
        state = saved if isinstance(saved, dict) and saved.get("source") == self.source else {}
        try:
            if self.source in LINE_SOURCES:
                self._reader = _LogReader(self.run.file(OUTPUT), self.source, state)
            else:
                folder = Path(self.source.partition(":")[2]).expanduser()
                self._reader = _EventFolder(folder if folder.is_absolute() else self.cwd / folder, state)
        except ImportError as exc:
            self._unreadable = True
            self._report(f"cannot read metrics from {self.source}: {exc}; install tensorboard on this host")
            return None
        self._malformed_told = self._reader.malformed > 0  # told by the follower that met the first
        return self._reader

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval):
            self.drain()

    def _report(self, message: str) -> None:
        if message == self._last_error:
            return
        self._last_error = message
        # An unwritable run folder leaves nothing to tell it with.
        with contextlib.suppress(OSError):
            self.run.append_event("metrics_error", source=self.source, error=message)
