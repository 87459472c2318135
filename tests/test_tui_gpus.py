"""The GPU panel: each GPU's utilisation and memory over the last minutes as sparklines beside its bars, gaps
where nothing was known, the selected run's GPUs marked, any width and any number of GPUs. The drawing is tested
as a function of the samples; the last test drives the real console against a real agent whose NVML is the
double (tests/fake_nvml.py), changing the GPU's load between polls."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from rich.text import Text
from textual.app import App, ComposeResult

from backends.protocol import GpuInfo, GpuProcess, RunInfo, StatusResult
from console.fleet.hosts import Fleet
from console.link.local import LocalTransport
from console.tui.app import ConsoleApp
from console.tui.gpu_panel import MARK, MAX_SAMPLES, WINDOW_S, GpuHistory, GpuPanel, Selection, gpu_text
from tests.conftest import until
from tests.fake_nvml import H200_MIB, gpu, write_state

NOW = 99.0  # with a 10 s window in 5 cells, the cells are [90, 92) ... [98, 100)
TOTAL_MIB = 100 * 1024
SPARK_LINE = re.compile(r"util (?P<util>.*?)  mem (?P<mem>.*?) (?P<span>\S+)$")


def gpu_info(index: int, util: int | None = 0, used_mib: int | None = 0, procs: Sequence[str | None] = ()) -> GpuInfo:
    """A GPU as the agent reports it; `procs`: the run id of each of its processes (None: not a run's)."""
    processes = [GpuProcess(pid=1000 + i, user="me", mem_mib=4096, run_id=run) for i, run in enumerate(procs)]
    return GpuInfo(
        index=index,
        name="NVIDIA H200",
        util=util,
        mem_util=0,
        mem_used_mib=used_mib,
        mem_total_mib=TOTAL_MIB,
        temp_c=41,
        power_w=613.0,
        processes=processes,
    )


def polled(polls: Sequence[tuple[float, Sequence[GpuInfo]]]) -> GpuHistory:
    history = GpuHistory()
    for at, gpus in polls:
        history.add(gpus, at)
    return history


def sparks(text: Text, line: int = 1) -> dict[str, str]:
    """The util and mem sparklines and the span of a two-line layout's GPU (its sparklines are its 2nd line)."""
    found = SPARK_LINE.search(text.plain.split("\n")[line])
    assert found is not None, text.plain
    return found.groupdict()


def test_each_cell_of_a_sparkline_shows_its_slice_of_the_window_from_low_to_full() -> None:
    utils = [0, 25, 50, 75, 100]
    history = polled([(90.0 + 2 * i, [gpu_info(0, util, used_mib=TOTAL_MIB * i // 4)]) for i, util in enumerate(utils)])
    # 27 cells leave 5 to each sparkline: one cell per 2 s poll
    drawn = sparks(gpu_text([gpu_info(0, 100, TOTAL_MIB)], history, NOW, width=27, window=10.0))
    assert drawn == {"util": "▁▃▅▆█", "mem": "▁▃▅▆█", "span": "10s"}


def test_the_default_span_is_five_minutes_and_the_newest_poll_is_the_last_cell() -> None:
    history = polled([(1000.0, [gpu_info(0, 100)])])
    drawn = sparks(gpu_text([gpu_info(0, 100)], history, 1000.0, width=60))
    assert drawn["span"] == "5m" and drawn["util"].endswith("█") and drawn["util"].strip() == "█"


def test_a_sample_nvml_could_not_read_is_a_gap_not_a_zero() -> None:
    polls = [(90.0 + 2 * i, [gpu_info(0, None if i == 2 else 50)]) for i in range(5)]
    assert sparks(gpu_text([gpu_info(0, 50)], polled(polls), NOW, width=27, window=10.0))["util"] == "▅▅ ▅▅"


def test_polls_lost_while_the_link_was_down_are_a_gap() -> None:
    # 20 s in 5 cells of 4 s; the polls at 86..92 s never came
    times = [80.0, 82.0, 84.0, 94.0, 96.0, 98.0]
    polls = [(at, [gpu_info(0, 50, used_mib=TOTAL_MIB // 2)]) for at in times]
    drawn = sparks(gpu_text([gpu_info(0, 50)], polled(polls), NOW, width=27, window=20.0))
    assert drawn["util"] == "▅▅ ▅▅" and drawn["mem"] == "▅▅ ▅▅"


def test_before_the_first_poll_there_is_nothing_drawn() -> None:
    history = polled([(96.0, [gpu_info(0, 100)]), (98.0, [gpu_info(0, 100)])])
    assert sparks(gpu_text([gpu_info(0, 100)], history, NOW, width=27, window=10.0))["util"] == "   ██"


def test_a_history_keeps_the_last_window_and_no_more_whatever_the_poll_rate() -> None:
    history = GpuHistory()
    for tick in range(20_000):
        history.add([gpu_info(0, tick % 100)], tick * 0.1)
    kept = history.of(("", 0))
    assert len(kept) <= MAX_SAMPLES and kept[-1].at - kept[0].at <= WINDOW_S + 5


def lines_of(text: Text) -> list[Text]:
    return list(text.split("\n", allow_blank=True))


def bold(line: Text, word: str) -> bool:
    """Whether `word` in `line` is drawn bold."""
    at = line.plain.index(word)
    return any(span.start <= at < span.end and "bold" in str(span.style) for span in line.spans)


def test_the_selected_runs_gpus_and_processes_are_marked_and_bold() -> None:
    # run r1 holds GPU 0, asked for GPU 2 too; run r2 holds GPU 1
    gpus = [gpu_info(0, 90, procs=["r1"]), gpu_info(1, 10, procs=["r2"]), gpu_info(2, 0)]
    history = polled([(98.0, gpus)])
    text = gpu_text(gpus, history, NOW, width=100, selection=Selection("r1", frozenset({("", 2)})))
    lines = {line.plain.split()[1 if line.plain.startswith(MARK) else 0]: line for line in lines_of(text)}
    for marked in ("GPU0", "GPU2"):
        assert lines[marked].plain.startswith(MARK) and bold(lines[marked], marked)
    assert not lines["GPU1"].plain.startswith(MARK) and not bold(lines["GPU1"], "GPU1")
    mine, other = (line for line in lines_of(text) if "pid" in line.plain)
    assert mine.plain.lstrip().startswith(f"{MARK} pid") and "run r1" in mine.plain and bold(mine, "pid")
    assert MARK not in other.plain and "run r2" in other.plain and not bold(other, "pid")


def test_without_a_selection_nothing_is_marked() -> None:
    gpus = [gpu_info(0, 90, procs=["r1"])]
    assert MARK not in gpu_text(gpus, polled([(98.0, gpus)]), NOW, width=100).plain


def test_eight_gpus_fold_their_processes_then_take_one_line_each_as_the_room_shrinks() -> None:
    gpus = [gpu_info(i, 10 * i, procs=[f"r{i}", None]) for i in range(8)]
    history = polled([(98.0, gpus)])
    selection = Selection("r3")

    roomy = lines_of(gpu_text(gpus, history, NOW, width=96, rows=40, selection=selection))
    assert len(roomy) == 8 * 4 and sum("pid" in line.plain for line in roomy) == 16

    folded = lines_of(gpu_text(gpus, history, NOW, width=96, rows=20, selection=selection))
    assert len(folded) == 16 and not any("pid" in line.plain for line in folded)
    assert all("2 procs" in line.plain for line in folded[::2]) and all("util" in line.plain for line in folded[1::2])

    one_each = lines_of(gpu_text(gpus, history, NOW, width=60, rows=12, selection=selection))
    header, *rows = one_each
    assert "util 5m" in header.plain and "mem 5m" in header.plain and len(rows) == 8
    assert [row.plain.startswith(MARK) for row in rows] == [i == 3 for i in range(8)]
    assert all(re.search(rf"GPU{i} .*{10 * i}% ", row.plain) for i, row in enumerate(rows))


samples = st.lists(st.one_of(st.none(), st.integers(0, 100)), min_size=0, max_size=200)


@given(
    width=st.integers(30, 200),
    count=st.integers(1, 8),
    rows=st.one_of(st.none(), st.integers(3, 40)),
    utils=samples,
    procs=st.integers(0, 3),
    selected=st.booleans(),
)
def test_no_line_is_wider_than_the_panel_and_every_gpu_and_the_span_show(
    width: int, count: int, rows: int | None, utils: list[int | None], procs: int, selected: bool
) -> None:
    def gpus(util: int | None) -> list[GpuInfo]:
        runs = [f"run-with-a-long-id-{i}" for i in range(procs)]
        return [gpu_info(i, util, used_mib=None if util is None else util * 1000, procs=runs) for i in range(count)]

    history = polled([(2.0 * i, gpus(util)) for i, util in enumerate(utils)])
    selection = Selection("run-with-a-long-id-0") if selected else None
    now = 2.0 * len(utils)
    text = gpu_text(gpus(utils[-1] if utils else None), history, now, width, rows, selection)
    lines = lines_of(text)
    assert max(line.cell_len for line in lines) <= width
    assert "5m" in text.plain and all(f"GPU{i}" in text.plain for i in range(count))
    if rows is not None and rows > count:
        assert len(lines) <= rows


class PanelApp(App[None]):
    def compose(self) -> ComposeResult:
        yield GpuPanel(id="gpus")


def status_of(gpus: list[GpuInfo]) -> StatusResult:
    return StatusResult(host="h", gpu_source="nvml", gpu_error=None, runs=[], gpus=gpus, omitted=0)


def run_info(run_id: str, gpus: list[int]) -> RunInfo:
    return RunInfo(
        id=run_id, name="n", kind="train", state="running", phase=None, pid=1, argv=[], env={}, gpus=gpus,
        started_at=None, ended_at=None, exit_code=None, signal=None, error=None, parent=None, health=None,
        stalled_since=None, stall_kind=None, stack_dumps=None, diagnoses=[], corrupt=None, truncated=[], progress=None,
    )  # fmt: skip


async def test_the_panel_marks_the_run_it_is_given_and_unmarks_it_when_none_is_selected() -> None:
    app = PanelApp()
    async with app.run_test(size=(80, 20)) as pilot:
        panel = app.query_one(GpuPanel)
        panel.show(status_of([gpu_info(0, 50, procs=["r1"]), gpu_info(1, 50)]))
        await pilot.pause()
        assert MARK not in str(panel.render())
        panel.select(run_info("r9", gpus=[1]))  # a run that asked for GPU 1 and holds none yet
        await pilot.pause()
        assert [line.startswith(MARK) for line in str(panel.render()).splitlines() if "GPU" in line] == [False, True]
        panel.select(None)
        await pilot.pause()
        assert MARK not in str(panel.render())


async def test_a_host_without_gpus_says_why() -> None:
    app = PanelApp()
    async with app.run_test(size=(80, 20)) as pilot:
        panel = app.query_one(GpuPanel)
        panel.show(
            StatusResult(host="h", gpu_source="none", gpu_error="NVML: Driver Not Loaded", runs=[], gpus=[], omitted=0)
        )
        await pilot.pause()
        assert str(panel.render()) == "GPUs: none found: NVML: Driver Not Loaded"


async def test_the_console_draws_each_polls_load_into_the_gpus_history(workdir: Path, nvml_state: Path) -> None:
    """Real: the console, the agent and its status polls; the double: NVML, whose GPU goes from idle to busy."""
    write_state(nvml_state, [gpu(util=0)])
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(160, 50)) as pilot:
        panel = app.query_one(GpuPanel)

        def util_cells() -> str:
            found = SPARK_LINE.search(str(panel.render()).split("\n")[1]) if panel.shown else None
            return found["util"].strip() if found else ""

        await until(pilot, lambda: len(util_cells()) >= 2, timeout=40, what="two cells of idle history")
        assert set(util_cells()) == {"▁"}  # idle is the lowest block, not a gap
        write_state(nvml_state, [gpu(util=100, base_used_mib=H200_MIB)])
        await until(pilot, lambda: util_cells().endswith("█"), timeout=40, what="the busy polls")
        assert util_cells().startswith("▁")  # the idle polls are still there, to the left
        assert panel.shown is not None and sparks(panel.shown)["mem"].endswith("█")
        await pilot.press("q")
