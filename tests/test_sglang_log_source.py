"""SGLang's log lines held to the installed SGLang's source: the real-SGLang tier's 0.5.23 (and the uvicorn and
Triton beside it), its modules read as text and never imported (tests/source_strings.py).

What the stand-in reconstructs (GPU-only output: CUDA graph capture, speculative decode figures) is a line the
source prints; each line `backends/sglang/log.py` looks for is one the source prints; and every CUDA-graph
capture the source can begin starts a phase.
"""

from __future__ import annotations

import ast
import errno
import os
import re
import subprocess
from pathlib import Path

import pytest

from backends.sglang import log
from tests.conftest import REPO
from tests.source_strings import Source

STANDIN = REPO / "tests" / "sglang_standin.py"
REAL_LOGS = sorted((REPO / "tests" / "sglang_output").glob("*_0.5.23.log"))
# Folders that print none of the server's startup and failure lines: SGLang's tests, its diffusion server,
# benchmarks, kernels, model classes and layers, other hardware, LoRA, tool-call and reasoning parsers.
SKIP = ("test", "multimodal_gen", "benchmark", "kernels", "layers", "models", "hardware_backend", "lora", "parser")

# The package that prints each of log.py's lines, where it is not SGLang.
ORIGIN = {"http": "uvicorn", "triton-no-driver": "triton"}
FIGURES = {str(metric) for metric in log.DECODE_FIGURES}  # parts of the decode line: looked up with it
# Lines no installed source prints, and why.
NOT_IN_SOURCE = {
    "cuda-oom": "PyTorch's CUDA allocator (C++): the tier's torch is a CPU build",
    "nccl-timeout": "PyTorch's NCCL process group (C++): the tier's torch is a CPU build",
    "port-in-use": "Python's OSError for EADDRINUSE: held to this system's strerror below",
}
# The words log.py looks for in SGLang 0.5.5's lines, which 0.5.23 prints no more, and where 0.5.5 prints each (read
# in the sglang 0.5.5 wheel's source; the tier installs 0.5.23 only).
RELEASE_0_5_5 = {
    "Init torch distributed begin": "srt/model_executor/model_runner.py",
    "Capture cuda graph begin": "srt/model_executor/model_runner.py (cpu graph on CPU)",
    "Capture cpu graph begin": "srt/model_executor/model_runner.py",
    "Watchdog timeout (": "srt/managers/scheduler_runtime_checker_mixin.py",
    "scheduler is dead": "srt/entrypoints/engine.py",
}
TRACEBACK = "Traceback (most recent call last):"
FRAME = re.compile(r'  File "[^"]*/sglang/([\w/]+\.py)", line \d+, in (\w+)')
EXCEPTION = re.compile(r"^[\w.]+: (.*)", re.MULTILINE | re.DOTALL)  # after the frames: the exception's message


@pytest.fixture(scope="module")
def packages(sglang_python: Path) -> Path:
    """The tier's site-packages (its interpreter says where, without importing anything of SGLang's)."""
    where = [str(sglang_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
    return Path(subprocess.run(where, capture_output=True, text=True, check=True, timeout=60).stdout.strip())


@pytest.fixture(scope="module")
def sources(packages: Path) -> dict[str, Source]:
    return {name: Source(packages / name, SKIP) for name in ("sglang", "uvicorn", "triton")}


class _Zero(dict[str, object]):
    """What an f-string of the stand-in names, as 0: its figures (`{2.5 + i / 10:.2f}`) come out as numbers."""

    def __missing__(self, key: str) -> object:
        return 0


def reconstructed() -> list[tuple[int, str]]:
    """Each text the stand-in prints and marks RECONSTRUCTED (on its own lines, or as the first word of its
    function's docstring), with its line number: a say()'s message, a bar()'s label, a text assigned to be said."""
    source = STANDIN.read_text()
    lines = source.splitlines()
    found = []
    for function in (node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)):
        whole = (ast.get_docstring(function) or "").startswith("RECONSTRUCTED")
        for statement in ast.walk(function):
            if not isinstance(statement, (ast.Expr, ast.Assign)):
                continue
            marked = whole or any(
                "# RECONSTRUCTED" in line for line in lines[statement.lineno - 1 : statement.end_lineno]
            )
            text = printed(statement)
            if marked and text is not None:
                code = compile(ast.Expression(text), str(STANDIN), "eval")
                found.append((statement.lineno, str(eval(code, {}, _Zero()))))  # the stand-in's own f-strings
    return found


def printed(statement: ast.Expr | ast.Assign) -> ast.expr | None:
    if isinstance(statement, ast.Assign):
        value = statement.value
        return value if isinstance(value, (ast.JoinedStr, ast.Constant)) else None
    call = statement.value
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ("say", "bar"):
        return call.args[0]
    return None


def unprinted(sglang: Source, text: str) -> str | None:
    """Why SGLang's source cannot print `text`; None when it can. A traceback's frames must name functions of the
    files they name, and its exception's message must be one the source gives."""
    if sglang.printing(text) is None:
        return "no string of the source prints it"
    if TRACEBACK not in text:
        return None
    frames = FRAME.findall(text)
    sources = {path: sglang.texts.get(sglang.root / path, "") for path, _ in frames}
    if not frames or any(f"def {function}(" not in sources[path] for path, function in frames):
        return f"its traceback's frames name no function of those files: {frames}"
    raised = EXCEPTION.search(text.split(TRACEBACK, 1)[1])
    if raised is None or sglang.printing(raised.group(1)) is None:
        return "its exception's message is no string of the source"
    return None


def test_every_line_the_stand_in_reconstructs_is_one_sglang_prints(sources: dict[str, Source]) -> None:
    lines = reconstructed()
    wrong = {f"{STANDIN.name}:{n}: {text!r}": why for n, text in lines if (why := unprinted(sources["sglang"], text))}
    assert wrong == {}
    # the capture's 2 prefill, 2 verify and 4 draft lines, its bar and its failure; the speculative decode figures
    assert len(lines) == 11, lines


def test_every_line_marked_reconstructed_is_one_the_test_above_reads() -> None:
    """A mark on a line the test above cannot read is one nothing checks: only the stand-in's HTTP answers
    (StandinAPI: stream chunks, not log lines) may carry one."""
    source = STANDIN.read_text()
    tree = ast.parse(source)
    api = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "StandinAPI")
    read = {n for n, _ in reconstructed()}
    statements = [node for node in ast.walk(tree) if isinstance(node, (ast.Expr, ast.Assign)) and node.lineno in read]
    marks = [i for i, line in enumerate(source.splitlines(), 1) if "# RECONSTRUCTED" in line]
    unread = [i for i in marks if not any(s.lineno <= i <= (s.end_lineno or s.lineno) for s in statements)]
    assert all(api.lineno <= i <= (api.end_lineno or api.lineno) for i in unread), unread


def log_items() -> list[tuple[str, re.Pattern[str], tuple[str, ...]]]:
    """Each line log.py looks for: its name, its pattern, and the words a line of it holds."""
    figures = [
        (str(metric), pattern, (re.sub(r"\\(.)", r"\1", pattern.pattern.rsplit("(", 1)[0]),))
        for metric, pattern in log.DECODE_FIGURES.items()
    ]
    return [
        *((phase.name, phase.pattern, phase.words) for phase in log.PHASES),
        *((failure.code, failure.pattern, failure.words) for failure in log.FAILURES),
        ("decode", re.compile("^" + re.escape(log.DECODE_LINE)), (log.DECODE_LINE,)),
        *figures,
    ]


def real_events() -> list[log.Event]:
    """What log.py reads in the real 0.5.23's output (on CPU: tests/sglang_output), decode lines aside: SGLang
    builds those piece by piece, so that no one string prints them whole."""
    return [e for path in REAL_LOGS for e in log.OutputReader().feed(path.read_bytes()) if e.kind != "decode"]


def forms(line: str) -> list[str]:
    """A line as its source may have given it: whole, after a logging level's prefix (uvicorn's `INFO:     `), or
    after an exception's name (`RuntimeError: `)."""
    prefixes = (r"[A-Z]+:\s+", r"[\w.]+Error: ")
    return [line, *(m.group(1) for prefix in prefixes if (m := re.match(prefix + "(.*)", line)))]


def test_each_line_of_real_output_that_the_log_reader_reads_is_one_the_source_prints(
    sources: dict[str, Source],
) -> None:
    """The checks of this file mean something only if what the real server printed is found in its source."""
    events = real_events()
    assert {e.name for e in events} >= {"init", "load-weights", "memory-pool", "http", "ready", "no-accelerator"}
    lost = [e.line for e in events if not any(sources[ORIGIN.get(e.name, "sglang")].printing(m) for m in forms(e.line))]
    assert lost == []


def test_every_line_the_log_reader_looks_for_is_one_its_source_prints(sources: dict[str, Source]) -> None:
    """Each pattern matches a line the source prints (a sample of its strings, or a real line of the test above:
    a pattern that needs a real value, a list's `[...]`, is held to those), and each of its words is printed by
    0.5.23 or listed as 0.5.5's."""
    real = [e.line for e in real_events()]
    wrong = {}
    for name, pattern, words in log_items():
        if name in NOT_IN_SOURCE:
            continue
        source = sources[ORIGIN.get(name, "sglang")]
        lookup = [*words, *(f"{log.DECODE_LINE}, {word}" for word in words if name in FIGURES)]
        lines = [line for text in lookup for sample in source.lines_with(text) for line in sample.split("\n")]
        if not any(pattern.search(line) for line in [*lines, *real]):
            wrong[name] = f"no line {source.root.name} prints matches {pattern.pattern!r}"
        for word in words:
            printed_now = any(word in line for line in lines)
            if printed_now == (word in RELEASE_0_5_5):
                wrong[f"{name}: {word!r}"] = "listed as 0.5.5's, yet 0.5.23 prints it" if printed_now else "unprinted"
    assert wrong == {}
    in_use = str(OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE)))
    assert log.failure("port-in-use").pattern.search(in_use), in_use


CAPTURE_BEGIN = re.compile(r"Capture ((?:target|draft) \w+) \w+ graph begin")


def test_every_cuda_graph_capture_sglang_can_begin_starts_its_phase(sources: dict[str, Source]) -> None:
    begins = {line for line in sources["sglang"].lines_with("Capture graph begin") if CAPTURE_BEGIN.match(line)}
    kinds = {match[1] for line in begins if (match := CAPTURE_BEGIN.match(line))}
    assert {"target prefill", "target verify", "target decode", "draft decode", "draft extend"} <= kinds
    for line in sorted(begins):
        read = log.OutputReader().feed(f"[2026-12-01 10:00:00] {line}\n".encode())
        assert [e.name for e in read if e.kind == "phase"] == [
            "draft-cuda-graph" if line.startswith("Capture draft") else "cuda-graph"
        ], line


GPU_STARTUP_0_5_23 = """\
[2026-12-01 10:00:00] Init parallel begin.
[2026-12-01 10:00:02] Load weight begin. avail mem=139.52 GB
[2026-12-01 10:00:09] Load weight end. elapsed=7.00 s, type=LlamaForCausalLM, avail mem=124.31 GB, mem usage=15.21 GB.
[2026-12-01 10:00:10] Memory pool end. avail mem=20.05 GB
[2026-12-01 10:00:10] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[64], avail mem=20.05 GB
[2026-12-01 10:00:40] Capture target prefill CUDA graph end. elapsed=30.00 s, mem usage=0.10 GB, avail mem=19.95 GB.
[2026-12-01 10:00:40] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=19.95 GB
"""


def test_the_target_graphs_capture_of_0_5_23_is_the_cuda_graph_phase_from_its_first_line() -> None:
    """A server without speculative decoding captures its target's prefill graph, then its decode graph: a hang
    in either is in the cuda-graph phase, not in the memory pool's."""
    events = log.OutputReader().feed(GPU_STARTUP_0_5_23.encode())
    phases = [(e.name, e.line.split(".")[0]) for e in events if e.kind == "phase"]
    assert phases == [
        ("init", "Init parallel begin"),
        ("load-weights", "Load weight begin"),
        ("memory-pool", "Load weight end"),
        ("cuda-graph", "Capture target prefill CUDA graph begin"),
    ]
    decode_only = log.OutputReader().feed(GPU_STARTUP_0_5_23.splitlines()[-1].encode() + b"\n")
    assert [(e.kind, e.name) for e in decode_only] == [("phase", "cuda-graph")]
