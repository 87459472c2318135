"""Dry-load: feed the draft to the serving SGLang's own EAGLE-3 class and loader, on CPU.

The only check that is exact for the SGLang that will serve: the draft class is
built for the draft config (SGLang's runtime set up as its scheduler does for
one rank: `sglang_runtime`), every parameter is filled with NaN, and the
checkpoint is fed through the class's own `load_weights` one tensor at a time.
A tensor after which no parameter changed was not consumed; a parameter still
holding NaN was never written. No forward runs: on a machine without CUDA, a
kernel module a layer only references while it is built (0.5.23's rotary
embedding takes vllm's there) is stood in for, and only then.

The work runs in a child process of the interpreter that will serve (`PYTHON
-m backends.doctor.dryload DRAFT`, our package first on its PYTHONPATH, the serve
command's environment and folder), so the caller never imports sglang nor
joins a process group. Only findings about the draft are errors: when the
dry-load itself cannot run (no sglang there, a module SGLang's layers need on
this machine, a crash, a timeout) it is `dry-load-skipped` with the reason, a
warning at most, and `doctor`'s static rules stand alone.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends import PACKAGE_ROOT
from backends.doctor.codes import finding
from backends.doctor.reading import DraftFiles, read_draft
from backends.doctor.weight_files import WeightFilesError, weight_files
from backends.protocol import Finding, Severity
from backends.sglang import facts

if TYPE_CHECKING:
    import torch

# Import, runtime setup and building the class, before any tensor is read: about 7 s in the CPU tier (2 cores),
# most of it SGLang's import; more on a first run or a busy host.
STARTUP_S = 25.0
READ_BYTES_PER_S = 400e6
TIMEOUT_S = 600.0
# The folder that holds `backends`: the child imports our package from there, whatever the serve's PYTHONPATH.


def estimate_seconds(draft: Path) -> float:
    """A rough duration of `dry_load` (the files SGLang would load), for a caller that runs it only when quick
    enough."""
    try:
        files = weight_files(draft).files
    except WeightFilesError:
        return STARTUP_S  # it stops at reading the files, as the static rules do
    return STARTUP_S + sum(p.stat().st_size for p in files) / READ_BYTES_PER_S


def skipped(severity: Severity, why: str) -> Finding:
    return finding(
        "dry-load-skipped",
        severity,
        f"dry-load skipped: {why}",
        "doctor's static rules stand alone; name the Python that serves SGLang (--sglang-python) for the exact check",
    )


def child_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """Our environment with the serve command's on top, and our package first on PYTHONPATH."""
    merged = {**os.environ, **(env or {})}
    merged["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), merged.get("PYTHONPATH")]))
    return merged


def dry_load(
    draft: Path,
    *,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout_s: float = TIMEOUT_S,
) -> list[Finding]:
    """Findings of the dry-load in `python` (default: this interpreter), or why it did not run."""
    python = python or sys.executable
    try:
        proc = facts.run_python(python, ["-m", "backends.doctor.dryload", str(draft)], child_env(env), cwd, timeout_s)
    except OSError as exc:
        return [skipped("warning", f"{python} could not be run: {exc.strerror or exc}")]
    except subprocess.TimeoutExpired:
        return [skipped("warning", f"it took longer than {timeout_s:.0f} s in {python}")]
    lines = proc.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1])
    except (ValueError, IndexError):
        found = None
    if not isinstance(found, list):
        tail = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        return [skipped("warning", f"it ended without a verdict in {python} (exit {proc.returncode}): {tail}")]
    result: list[Finding] = found
    return result


@dataclass
class LoadAudit:
    """What `load_weights` did with each tensor and to each parameter."""

    unconsumed: list[str] = field(default_factory=list)
    unwritten: dict[str, float] = field(default_factory=dict)  # parameter -> fraction never written
    errors: dict[str, str] = field(default_factory=dict)  # tensor -> what the loader raised


def audit_load(model: Any, tensors: Iterable[tuple[str, torch.Tensor]]) -> LoadAudit:
    """Feed `tensors` one at a time through `model.load_weights` and account for every write."""
    import torch

    params = {n: p for n, p in model.named_parameters() if p.is_floating_point()}
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan"))
    audit = LoadAudit()
    before = _probe(params)
    hot = getattr(model, "hot_token_id", None)
    fed: set[str] = set()
    for name, tensor in tensors:
        try:
            model.load_weights([(name, tensor)])
        except Exception as exc:  # the loader's assertion is the finding
            audit.errors[name] = f"{type(exc).__name__}: {exc}".strip()
            continue
        after = _probe(params)
        new_hot = getattr(model, "hot_token_id", None)
        # t2d is ignored by design; everything else must land somewhere. A second copy of a name (in two loaded
        # files) overwrites what the first wrote, which the NaN probe cannot see: the first copy was judged.
        if after == before and new_hot is hot and facts.IGNORED_MARK not in name and name not in fed:
            audit.unconsumed.append(name)
        before, hot = after, new_hot
        fed.add(name)
    for name, p in params.items():
        left = int(torch.isnan(p.detach()).count_nonzero())
        if left:
            audit.unwritten[name] = left / p.numel()
    return audit


def _probe(params: dict[str, torch.Tensor]) -> dict[str, int]:
    """NaN count of each parameter's first column: every write at tensor-parallel size 1
    covers whole rows, so it always reaches column 0, and this stays cheap for an embedding."""
    import torch

    counts = {}
    for name, p in params.items():
        view = p.detach() if p.dim() < 2 else p.detach().flatten(1)[:, 0]
        counts[name] = int(torch.isnan(view).count_nonzero())
    return counts


def findings_of(audit: LoadAudit, files: DraftFiles, config: Any, version: str | None) -> list[Finding]:
    """Turn an audit into findings; parameters SGLang takes from the target later are info.

    A tensor the loader ignores is a warning (SGLang skips it without a word, which is harmless
    while every parameter is written); a parameter left unwritten is the error.
    """
    release = f"SGLang {version or '(installed)'}"
    found: list[Finding] = []
    for name, error in audit.errors.items():
        found.append(
            finding(
                "dry-load-failed",
                "error",
                f"{release}'s loader raised on {name}: {error} (the server would crash at startup)",
                "fix the tensor's shape or the config field it depends on",
            )
        )
    if audit.unconsumed:
        found.append(
            finding(
                "dry-load-unconsumed",
                "warning",
                f"{release}'s loader ignored {len(audit.unconsumed)} tensor(s) without a word: "
                f"{', '.join(audit.unconsumed)}",
                "if one holds a draft parameter, rename it to the name this SGLang loads "
                f"(eagle3-console HOST convert {files.root} DST) or upgrade SGLang; otherwise it is harmless",
            )
        )
    hidden = getattr(config, "hidden_size", None)
    from_target = {"model.embed_tokens.weight"} if getattr(config, "target_hidden_size", hidden) == hidden else set()
    if getattr(config, "draft_vocab_size", 0) is None:
        from_target.add("lm_head.weight")
    later = ", ".join(sorted(n for n in audit.unwritten if n in from_target))
    unwritten = {n: f for n, f in audit.unwritten.items() if n not in from_target}
    if unwritten:
        listed = ", ".join(f"{n} ({f:.0%})" for n, f in sorted(unwritten.items()))
        hint = (
            f" (the ignored {', '.join(audit.unconsumed)} may hold them under another name)" if audit.unconsumed else ""
        )
        found.append(
            finding(
                "dry-load-unwritten",
                "error",
                f"{release}'s loader left {len(unwritten)} parameter(s) unwritten (never initialised): {listed}",
                f"add the missing tensors to the checkpoint{hint}; SGLang serves whatever memory held",
            )
        )
    if not found:
        clean = f"{release}'s loader consumed every tensor and wrote every parameter"
        found.append(
            finding("dry-load-unwritten", "info", clean + (f" but {later} (taken from the target)" if later else ""))
        )
    elif later:
        found.append(finding("dry-load-unwritten", "info", f"taken from the target at startup: {later}"))
    return found


# --- in the child process ----------------------------------------------------------------------


def _iter_tensors(files: DraftFiles) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint as SGLang's default loader yields it: name, tensor, file by file, of the files it picks."""
    if files.weights != "safetensors":
        import torch

        for file in files.loaded.files:  # as SGLang's pt_weights_iterator: every entry as torch.load gives it
            yield from torch.load(file, map_location="cpu", mmap=True, weights_only=True).items()
        return
    from safetensors import safe_open

    for file in files.loaded.files:
        with safe_open(str(file), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                yield name, fh.get_tensor(name)


def _draft_class(architectures: list[str] | None) -> Any:
    """The class SGLang builds for the draft: its own module for a known draft, else the model registry's answer."""
    name = (architectures or [""])[0]
    module_name = facts.DRAFT_CLASS_MODULES.get(name)
    if module_name is not None:
        try:
            return getattr(importlib.import_module(module_name), name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise  # the module is there; a module it needs is not
    registry = importlib.import_module("sglang.srt.models.registry")
    cls, _ = registry.ModelRegistry.resolve_model_cls(architectures)
    return cls


def _build(cls: Any, config: Any) -> Any:
    """The draft class built on CPU for `config`. On a machine SGLang cannot serve from (no CUDA: CI, a laptop),
    a layer may import a kernel module only a forward would call; that module is stood in for while it is built."""
    try:
        with _on_cpu_in_dtype_of(config):
            return cls(config, quant_config=None)
    except ModuleNotFoundError as exc:
        kernels = next((k for k in facts.CONSTRUCTION_ONLY_KERNELS if exc.name in (k, k.partition(".")[0])), None)
        if kernels is None:
            raise
        with _stand_in(kernels), _on_cpu_in_dtype_of(config):
            return cls(config, quant_config=None)


@contextlib.contextmanager
def _on_cpu_in_dtype_of(config: Any) -> Iterator[None]:
    """New tensors on CPU, in the config's floating dtype as SGLang's loader builds a model (half the memory of
    float32 for a bf16 draft)."""
    import torch

    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    default = torch.get_default_dtype()
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        torch.set_default_dtype(dtype)
    try:
        with torch.device("cpu"):
            yield
    finally:
        torch.set_default_dtype(default)


@contextlib.contextmanager
def _stand_in(module: str) -> Iterator[None]:
    """`module` (and its package, if absent) in sys.modules while the body runs: any kernel taken from it raises
    when called. Afterwards sys.modules is as it was."""
    package = module.partition(".")[0]
    saved = {name: sys.modules.get(name) for name in (package, module)}

    def kernel(name: str) -> Any:
        def not_here(*_args: Any, **_kwargs: Any) -> None:
            raise RuntimeError(f"{module}.{name} stood in for by the dry-load, which runs no forward")

        return not_here

    stand_in = types.ModuleType(module)
    stand_in.__getattr__ = kernel  # type: ignore[method-assign]
    if saved[package] is None:
        parent = types.ModuleType(package)
        parent.__path__ = []
        sys.modules[package] = parent
    sys.modules[module] = stand_in
    try:
        yield
    finally:
        for name, was in saved.items():
            if was is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = was


def run_in_process(draft: Path) -> list[Finding]:
    if importlib.util.find_spec("sglang") is None:
        return [skipped("info", f"sglang is not importable by {sys.executable}")]
    files, problems = read_draft(draft)
    if files is None:
        return problems
    release = f"SGLang {facts.installed_version() or '(installed)'}"
    try:
        from transformers import AutoConfig

        server_args = importlib.import_module("sglang.srt.server_args")
        from backends.sglang import runtime as sglang_runtime
    except ImportError as exc:
        return [skipped("warning", f"{release} cannot be imported by {sys.executable}: {exc}")]
    try:
        config = AutoConfig.from_pretrained(str(files.root))
    except Exception as exc:
        msg = f"{release} (through transformers) cannot read config.json: {type(exc).__name__}: {exc}"
        return [finding("dry-load-failed", "error", msg, "fix config.json (see doctor's other findings)")]
    try:
        args = server_args.ServerArgs(model_path=str(files.root), device="cpu")
        sglang_runtime.start_one_rank(args, device="cpu")
    except Exception as exc:  # an environment SGLang cannot start in is not a fault of the draft
        return [skipped("warning", f"{release} could not set up its runtime on CPU: {type(exc).__name__}: {exc}")]
    try:
        model = _build(_draft_class(config.architectures), config)
    except ImportError as exc:  # a kernel module this machine lacks, never the draft's doing
        return [skipped("warning", f"{release} cannot build its layers on this machine: {exc}")]
    except Exception as exc:
        msg = f"{release} could not build the draft class for config.json: {type(exc).__name__}: {exc}"
        return [finding("dry-load-failed", "error", msg, "fix config.json (see doctor's other findings)")]
    # The reader's findings on the file set (leftovers, duplicates) come along: this verdict stands alone.
    return problems + findings_of(audit_load(model, _iter_tensors(files)), files, config, facts.installed_version())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m backends.doctor.dryload DRAFT", file=sys.stderr)
        return 2
    print(json.dumps(run_in_process(Path(args[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
