"""Every launch shape against the real SGLang 0.5.23 (the real-SGLang tier, EAGLE3_SGLANG_PYTHON).

Real: SGLang's own argument parser (run by the pre-launch gate in the interpreter each shape resolves to: the
tier's python for `python -m`, the `#!` line of the tier's `sglang` console script for `sglang serve`, the one
`--sglang-python` names for a wrapper), its version read from that interpreter's package metadata, doctor's
rules for that release, the CLI and agent refusing a launch, and once the tier's own `sglang serve` entry point
refusing the typo itself. Not run: the server (no GPU here; tests/test_sglang_real_serve.py starts one on CPU),
numactl/taskset/docker/podman themselves (nothing here starts them: a refused launch starts nothing, and the gate
only reads the command line). The dry-load (SGLang's loader on the draft, ~20 s a draft here) is left to
tests/test_prelaunch_gate.py and tests/test_draft_layouts.py: the rows below judge the draft by the release the
shape resolves to, which is what a shape changes.

Each row is one shape; its columns: the parser's verdict on `--mem-fraction-statik 0.8` (SGLang's own message),
the version doctor used, the gate on a `layers.0.*` draft (0.5.23 loads it; 0.5.5 would drop it) and on a
`single_layer` features draft, the health and metrics URLs. Verdicts are cached per interpreter, flags and
environment (one cache for the module, as one host's agent keeps one), so shapes that resolve to the same
interpreter and environment share SGLang's answer: that they do is part of what a row checks.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from backends import serving
from backends.doctor import full
from backends.protocol import PreflightResult
from backends.runs import preflight
from tests.conftest import CLI
from tests.draft_fixtures import HIDDEN, DraftSpec, good_draft, write_target

TYPO = ["--mem-fraction-statik", "0.8"]
REFUSED = "sglang serve: error: unrecognized arguments: --mem-fraction-statik 0.8"
PORT = 8321
HEALTH = f"http://127.0.0.1:{PORT}/health"
METRICS = f"http://127.0.0.1:{PORT}/metrics"


@dataclass(frozen=True)
class Files:
    target: Path
    good: Path  # layers.0.* names: 0.5.23 renames midlayer to layers.0 and loads it; 0.5.5 drops it
    single: Path  # fc trained on 3 layers' features, one aux layer listed: SGLang skips fc
    python: Path  # the tier's interpreter
    sglang: Path  # the tier's `sglang` console script (#!.../python3)
    wrapper: Path  # a wrapper that runs `python -m sglang.launch_server "$@"`: its flags are its own business
    in_place: Path  # a wrapper given where the interpreter goes: `in_place -m sglang.launch_server FLAGS`


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, sglang_python: Path) -> Files:
    folder = tmp_path_factory.mktemp("shapes")
    wrapper, in_place = folder / "start-server.sh", folder / "with-env.sh"
    wrapper.write_text(f'#!/bin/sh\nexec {sglang_python} -m sglang.launch_server "$@"\n')
    in_place.write_text(f'#!/bin/sh\nexport SGLANG_X=1\nexec {sglang_python} "$@"\n')
    for script in (wrapper, in_place):
        script.chmod(0o755)
    return Files(
        target=write_target(folder / "target"),
        good=good_draft(folder / "good", layer="layers.0"),
        single=DraftSpec(aux_ids=[5], fc_in=3 * HIDDEN).write(folder / "single"),
        python=sglang_python,
        sglang=sglang_python.parent / "sglang",
        wrapper=wrapper,
        in_place=in_place,
    )


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def shared_cache(module_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """One serve-flags cache for the module's rows (this worker's own), and no dry-load (see the docstring)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(module_cache))
    monkeypatch.setattr(full, "AUTO_DRY_LOAD_MAX_S", 0.0)
    yield


def flags(files: Files, draft: Path | None) -> list[str]:
    named = ["--speculative-draft-model-path", str(draft)] if draft is not None else []
    return [
        "--model-path", str(files.target), "--speculative-algorithm", "EAGLE3", *named,
        "--port", str(PORT), "--enable-metrics", *TYPO,
    ]  # fmt: skip


@dataclass(frozen=True)
class Shape:
    argv: list[str]
    sglang_python: str | None = None  # what the user gives with --sglang-python
    checked: bool = True  # SGLang's parser and release can be asked from the host


def shape(name: str, files: Files, draft: Path | None) -> Shape:
    py, sglang, served = str(files.python), str(files.sglang), flags(files, draft)
    module = [py, "-m", "sglang.launch_server", *served]
    serve = [sglang, "serve", *served]
    image = ["-p", f"{PORT}:{PORT}", "-v", f"{files.target.parent}:{files.target.parent}", "lmsysorg/sglang:v0.5.23"]
    return {
        "python -m": Shape(module),
        "sglang serve": Shape(serve),
        "sglang serve MODEL": Shape([sglang, "serve", str(files.target), *served[2:]]),
        "python .../bin/sglang serve": Shape([py, sglang, "serve", *served]),
        "env VAR=...": Shape(["env", "SGLANG_X=1", *serve]),
        "bash -c": Shape(["bash", "-c", f"cd / && exec {shlex.join(module)} > server.log 2>&1"]),
        'sh -c "$@"': Shape(["sh", "-c", f'exec {shlex.quote(sglang)} serve "$@"', "sh", *served]),
        "numactl": Shape(["numactl", "--cpunodebind=0", "--membind=0", *module]),
        "taskset": Shape(["taskset", "-c", "0-7", *serve]),
        "nice": Shape(["nice", "-n", "5", *module]),
        "wrapper -m + --sglang-python": Shape(
            [str(files.in_place), "-m", "sglang.launch_server", *served], sglang_python=py
        ),
        "wrapper script + --sglang-python": Shape([str(files.wrapper), *served], sglang_python=py, checked=False),
        "docker run": Shape(["docker", "run", "--rm", "--gpus", "all", *image, "python3", *module[1:]], checked=False),
        "podman run": Shape(["podman", "run", "--rm", *image, "sglang", "serve", *served], checked=False),
        "docker run + --sglang-python": Shape(["docker", "run", "--rm", *image, "sglang", "serve", *served], py),
    }[name]


SHAPES = [
    "python -m", "sglang serve", "sglang serve MODEL", "python .../bin/sglang serve", "env VAR=...", "bash -c",
    'sh -c "$@"', "numactl", "taskset", "nice", "wrapper -m + --sglang-python", "wrapper script + --sglang-python",
    "docker run", "podman run", "docker run + --sglang-python",
]  # fmt: skip


def gate(launched: Shape) -> PreflightResult:
    return preflight.check_launch("serve", launched.argv, None, {}, launched.sglang_python)


def codes(result: PreflightResult) -> dict[str, str]:
    assert result["doctor"] is not None
    return {f["code"]: f["severity"] for f in result["doctor"]["findings"]}


@pytest.mark.parametrize("name", SHAPES)
def test_each_shape_is_checked_by_the_sglang_that_serves_it(name: str, files: Files, shared_cache: None) -> None:
    good, single = shape(name, files, files.good), shape(name, files, files.single)
    # The gate's doctor half alone on the second draft: its flags are the first's but for the draft's path.
    on_good, on_single = gate(good), preflight.check_serve("serve", single.argv, None, {}, single.sglang_python)
    verdict = on_good["flags"]
    assert verdict is not None
    if good.checked:
        # SGLang's own parser refused the typo, in SGLang's own words.
        assert verdict["severity"] == "error" and verdict["code"] == "launch-flags"
        assert verdict["message"] == f"SGLang's argument parser refuses this command line: {REFUSED}"
        # doctor judged the drafts by the release that serves: 0.5.23.
        assert on_good["doctor"] is not None and on_good["doctor"]["sglang_versions"] == ["0.5.23"]
        assert on_good["doctor"]["errors"] == 0 and "weights-dropped" not in codes(on_good)
    else:
        # Said plainly: what is not checked, why, and (where one does) the option that makes it checkable.
        assert verdict["severity"] == "info" and verdict["message"].startswith("flags not checked: ")
        if "docker" in good.argv or "podman" in good.argv:
            assert verdict["message"].endswith(
                "the Python that runs SGLang is not known: SGLang runs inside the container (lmsysorg/sglang:v0.5.23)"
            )
            assert verdict["fix"] == (
                "give --sglang-python PATH, a host Python with the image's SGLang, to check from the host"
            )
            # Every known release's rules, since the image's is not known: 0.5.5 would drop layers.0.*.
            assert on_good["doctor"] is not None and on_good["doctor"]["sglang_versions"] == ["0.5.5", "0.5.23"]
            assert codes(on_good)["weights-dropped"] == "error"
        else:
            assert verdict["message"].endswith(
                "the command is wrapper script: SGLang's flags are not on its command line"
            )
            assert verdict["fix"] is not None and "sglang serve FLAGS" in verdict["fix"]
            assert on_good["doctor"] is not None and on_good["doctor"]["sglang_versions"] == ["0.5.23"]
            assert on_good["doctor"]["errors"] == 0
    # The single-layer draft is refused whoever serves it.
    assert on_single is not None and on_single["sglang_versions"] == on_good["doctor"]["sglang_versions"]
    assert {f["code"]: f["severity"] for f in on_single["findings"]}["single-layer-features"] == "error"
    # Health and /metrics as the host reaches them (a container through its published port).
    assert serving.health_url(good.argv) == (None if "wrapper script" in name else HEALTH)
    metrics = serving.server_metrics(good.argv, HEALTH)
    assert (metrics[0] if metrics else None) == (None if "wrapper script" in name else METRICS)


def test_the_real_sglang_serve_refuses_the_typo_as_the_gate_said(files: Files, tmp_path: Path) -> None:
    """The tier's own `sglang serve` entry point, run on the very command line: the gate's quote is its last line."""
    argv = shape("sglang serve", files, files.good).argv
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == REFUSED
    verdict = gate(Shape(argv))["flags"]
    assert verdict is not None and verdict["message"].endswith(done.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["sglang serve", "env VAR=...", 'sh -c "$@"', "taskset", "docker run"])
def test_the_cli_launch_of_a_shape_says_what_the_gate_found(
    name: str, files: Files, cli: CLI, module_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the product's entry point: `launch serve -- ARGV` refuses with SGLang's message and starts nothing,
    or (a container) starts and says what it could not check and how to make it checkable."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(module_cache))
    launched = shape(name, files, None)  # no draft: the agent's gate would dry-load it (see the docstring)
    result = cli("launch", "serve", "--", *launched.argv, timeout=120)
    said = result.stderr.decode()
    if launched.checked:
        assert result.returncode == 1 and said.strip().splitlines()[-1].startswith("eagle3-console: SGLang's argument")
        assert REFUSED in said
    else:
        assert result.returncode == 0, said
        cli("kill", result.stdout.decode().strip(), "--grace", "1")
        assert "flags not checked: the Python that runs SGLang is not known: SGLang runs inside the container" in said
        assert "fix: give --sglang-python PATH" in said
