"""GPU sampling as a user sees it: the numbers, "n/a" for what a GPU cannot tell, and the fallbacks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.host import procinfo
from backends.host.gpus import SMI_APP_FIELDS, SMI_GPU_FIELDS, GpuSampler, parse_smi_apps, parse_smi_gpus
from tests import fake_nvml
from tests.conftest import Spawn
from tests.fake_nvml import gpu, write_state

FAKE_BIN = Path(__file__).resolve().parent / "fake_bin"
ME = procinfo.user_name(os.geteuid())


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake NVML selected, with its state file (the test writes it), and no nvidia-smi on PATH."""
    path = tmp_path / "nvml.json"
    monkeypatch.setenv("EAGLE3_NVML_MODULE", "tests.fake_nvml")
    monkeypatch.setenv(fake_nvml.STATE_ENV, str(path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    return path


@pytest.fixture
def with_fake_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    # The double's `#!/usr/bin/env python3` then finds the interpreter running the tests.
    monkeypatch.setenv("PATH", os.pathsep.join([str(FAKE_BIN), str(Path(sys.executable).parent)]))


def test_nvml_sample_reports_every_field_in_the_protocols_units(state: Path, spawn: Spawn) -> None:
    trainer = spawn()
    write_state(
        state,
        [
            gpu(util=97, mem_util=23, base_used_mib=500, temp_c=61, power_w=612.25, processes=[(trainer.pid, 4600)]),
            gpu(name="NVIDIA H100 80GB HBM3", mem_total_mib=81559),
        ],
    )
    with GpuSampler() as sampler:
        assert sampler.source == "nvml"
        busy, idle = sampler.sample()
    assert busy == {
        "index": 0,
        "name": "NVIDIA H200",
        "util": 97,
        "mem_util": 23,
        "mem_used_mib": 500 + 4600,
        "mem_total_mib": 143771,
        "temp_c": 61,
        "power_w": 612.25,
        "processes": [{"pid": trainer.pid, "user": ME, "mem_mib": 4600, "run_id": None}],
    }
    assert (idle["index"], idle["name"], idle["mem_total_mib"], idle["processes"]) == (
        1,
        "NVIDIA H100 80GB HBM3",
        81559,
        [],
    )


def test_a_process_that_exits_leaves_the_list_and_its_memory_is_released(state: Path, spawn: Spawn) -> None:
    trainer = spawn()
    write_state(state, [gpu(base_used_mib=500, processes=[(trainer.pid, 4600)])])
    with GpuSampler() as sampler:
        assert sampler.sample()[0]["mem_used_mib"] == 5100
        trainer.kill()
        trainer.wait()
        (after,) = sampler.sample()
    assert (after["mem_used_mib"], after["processes"]) == (500, [])


def test_a_failing_field_is_none_and_the_others_are_filled(state: Path, spawn: Spawn) -> None:
    trainer = spawn()
    write_state(state, [gpu(util=40, power_w=300.0, processes=[(trainer.pid, 1000)], fail=["temperature", "power"])])
    with GpuSampler() as sampler:
        (info,) = sampler.sample()
    assert info["temp_c"] is None
    assert info["power_w"] is None
    assert (info["name"], info["util"], info["mem_used_mib"]) == ("NVIDIA H200", 40, 1000)
    assert [p["pid"] for p in info["processes"]] == [trainer.pid]


def test_every_field_failing_still_gives_a_row_per_gpu(state: Path) -> None:
    write_state(state, [gpu(fail=fake_nvml.FIELDS)] * 2)
    with GpuSampler() as sampler:
        rows = sampler.sample()
        assert sampler.last_error is not None  # the process list could not be read
    assert [row["index"] for row in rows] == [0, 1]
    for row in rows:
        assert row["processes"] == []
        assert {row[k] for k in ("name", "util", "mem_util", "mem_used_mib", "mem_total_mib", "temp_c", "power_w")} == {
            None
        }


def test_run_id_comes_from_owner_of(state: Path, spawn: Spawn) -> None:
    ours, stray = spawn(), spawn()
    write_state(state, [gpu(processes=[(ours.pid, 2000), (stray.pid, 3000)])])
    runs = {ours.pid: "train-7f3a"}
    with GpuSampler(owner_of=runs.get) as sampler:
        (info,) = sampler.sample()
    assert {p["pid"]: p["run_id"] for p in info["processes"]} == {ours.pid: "train-7f3a", stray.pid: None}


def test_a_broken_owner_lookup_does_not_break_the_sample(state: Path, spawn: Spawn) -> None:
    child = spawn()
    write_state(state, [gpu(processes=[(child.pid, 10)])])

    def broken(pid: int) -> str | None:
        raise RuntimeError("run store unreadable")

    with GpuSampler(owner_of=broken) as sampler:
        (info,) = sampler.sample()
        assert "run store unreadable" in (sampler.last_error or "")
    assert info["processes"][0]["run_id"] is None


def test_nvml_init_failure_falls_back_to_nvidia_smi_with_the_same_numbers(
    state: Path, spawn: Spawn, with_fake_smi: None
) -> None:
    trainer, server = spawn(), spawn()
    gpus = [
        gpu(
            util=100,
            mem_util=18,
            base_used_mib=9,
            reserved_mib=614,
            temp_c=59,
            power_w=691.09,
            processes=[(trainer.pid, 4906)],
        ),
        gpu(util=3, base_used_mib=1, processes=[(server.pid, None)], fail=["temperature"]),
    ]
    write_state(state, gpus)
    with GpuSampler() as sampler:
        assert sampler.source == "nvml"
        from_nvml = sampler.sample()

    write_state(state, gpus, init_fails=True)
    with GpuSampler() as sampler:
        assert sampler.source == "nvidia-smi"
        assert "Driver Not Loaded" in (sampler.fallback_reason or "")
        from_smi = sampler.sample()
    assert from_smi == from_nvml
    assert from_smi[0]["mem_used_mib"] == 9 + 4906  # the driver's reserved 614 MiB left out, as nvidia-smi does
    assert from_smi[1]["temp_c"] is None
    assert from_smi[1]["processes"][0]["mem_mib"] is None


def test_a_missing_nvml_module_also_falls_back(
    state: Path, with_fake_smi: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EAGLE3_NVML_MODULE", "no_such_nvml_module")
    write_state(state, [gpu()])
    with GpuSampler() as sampler:
        assert sampler.source == "nvidia-smi"
        assert [g["name"] for g in sampler.sample()] == ["NVIDIA H200"]


def test_nvidia_smi_failing_later_gives_an_empty_sample_not_an_exception(state: Path, with_fake_smi: None) -> None:
    write_state(state, [gpu()], init_fails=True)
    with GpuSampler() as sampler:
        assert len(sampler.sample()) == 1
        write_state(state, [gpu()], init_fails=True, smi_fails=True)
        assert sampler.sample() == []
        assert "couldn't communicate with the NVIDIA driver" in (sampler.last_error or "")


def test_neither_nvml_nor_nvidia_smi_gives_source_none_and_no_gpus(state: Path) -> None:
    write_state(state, [gpu()], init_fails=True)
    with GpuSampler() as sampler:
        assert sampler.source == "none"
        assert "nvidia-smi not on PATH" in (sampler.fallback_reason or "")
        assert sampler.sample() == []


def test_an_nvidia_smi_that_cannot_reach_the_driver_counts_as_none(state: Path, with_fake_smi: None) -> None:
    write_state(state, [gpu()], init_fails=True, smi_fails=True)
    with GpuSampler() as sampler:
        assert sampler.source == "none"
        assert sampler.sample() == []


def test_close_shuts_nvml_down(state: Path) -> None:
    write_state(state, [gpu()])
    before = fake_nvml.init_count()
    sampler = GpuSampler()
    assert fake_nvml.init_count() == before + 1
    sampler.close()
    assert fake_nvml.init_count() == before  # its own init undone, whatever a test before left open
    assert sampler.sample() == []


def test_without_a_state_file_the_double_is_eight_idle_h200s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLE3_NVML_MODULE", "tests.fake_nvml")
    monkeypatch.delenv(fake_nvml.STATE_ENV, raising=False)
    with GpuSampler() as sampler:
        rows = sampler.sample()
    assert [(g["index"], g["name"], g["processes"]) for g in rows] == [(i, "NVIDIA H200", []) for i in range(8)]


# nvidia-smi's CSV parser: any line at all is parsed or rejected, never an exception.

NA = st.sampled_from(["[N/A]", "[Not Supported]", "[Unknown Error]", "N/A", ""])
# Pure parsing: no time limit, so a loaded CI machine cannot fail these on a deadline.
PARSING = settings(deadline=None)
UUIDS = st.from_regex(r"GPU-[0-9a-f-]{8,36}", fullmatch=True)


@PARSING
@given(st.text())
def test_the_smi_parsers_never_raise(text: str) -> None:
    gpus, bad_gpus = parse_smi_gpus(text)
    apps, bad_apps = parse_smi_apps(text)
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(gpus) + len(bad_gpus) == len(lines)
    assert len(apps) + len(bad_apps) == len(lines)


@PARSING
@given(
    index=st.integers(0, 1023),
    uuid=UUIDS,
    name=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9 ,.()-]{0,40}[A-Za-z0-9)]", fullmatch=True),
    util=st.integers(0, 100) | st.none(),
    mem_util=st.integers(0, 100) | st.none(),
    used=st.integers(0, 10**7) | st.none(),
    total=st.integers(0, 10**7) | st.none(),
    temp=st.integers(0, 120) | st.none(),
    power=st.decimals(0, 2000, places=2).map(float) | st.none(),
    missing=NA,
)
def test_well_formed_gpu_lines_round_trip(
    index: int,
    uuid: str,
    name: str,
    util: int | None,
    mem_util: int | None,
    used: int | None,
    total: int | None,
    temp: int | None,
    power: float | None,
    missing: str,
) -> None:
    def cell(value: object) -> str:
        return missing if value is None else (f"{value:.2f}" if isinstance(value, float) else str(value))

    line = ", ".join([str(index), uuid, name, *map(cell, [util, mem_util, used, total, temp, power])])
    assert len(line.split(",")) >= len(SMI_GPU_FIELDS)
    (parsed,), rejected = parse_smi_gpus(line + "\n")
    assert rejected == []
    assert parsed.uuid == uuid
    assert parsed.info == {
        "index": index,
        "name": name,
        "util": util,
        "mem_util": mem_util,
        "mem_used_mib": used,
        "mem_total_mib": total,
        "temp_c": temp,
        "power_w": power,
        "processes": [],
    }


@PARSING
@given(
    rows=st.lists(
        st.tuples(
            st.from_regex(r"GPU-[0-9a-f-]{8,36}", fullmatch=True),
            st.integers(1, 2**22),
            st.integers(0, 10**6) | st.none(),
        )
    ),
    missing=NA,
)
def test_well_formed_app_lines_round_trip(rows: list[tuple[str, int, int | None]], missing: str) -> None:
    assert len(SMI_APP_FIELDS) == 3
    text = "".join(f"{uuid}, {pid}, {missing if mem is None else mem}\n" for uuid, pid, mem in rows)
    apps, rejected = parse_smi_apps(text)
    assert rejected == []
    assert [(a.gpu_uuid, a.pid, a.mem_mib) for a in apps] == rows
