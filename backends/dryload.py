"""Dry-load: feed the draft to the installed SGLang's own EAGLE-3 class and loader, on CPU.

The only check that is exact for whatever SGLang is installed: the draft class is
built for the draft config (single-process gloo group, SGLang's runtime published
with a CPU ServerArgs), every parameter is filled with NaN, and the checkpoint is
fed through the class's own `load_weights` one tensor at a time. A tensor after
which no parameter changed was not consumed; a parameter still holding NaN was
never written. The work runs in a child process (`python -m backends.dryload
DRAFT`), so the caller's process never imports sglang nor joins a process group;
without sglang the result is one info finding. `doctor`'s static rules are the
fallback.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends import sglang_facts as facts
from backends.doctor import DraftFiles, finding, read_draft
from backends.protocol import Finding

if TYPE_CHECKING:
    import torch

# Import, process-group setup and building the class, before any tensor is read.
STARTUP_S = 25.0
READ_BYTES_PER_S = 400e6


def sglang_importable() -> bool:
    """Whether this interpreter can import sglang (found without importing it)."""
    return importlib.util.find_spec("sglang") is not None


def estimate_seconds(draft: Path) -> float:
    """A rough duration of `dry_load`, for a caller that runs it only when quick enough."""
    root = draft.parent if draft.is_file() else draft
    size = sum(p.stat().st_size for p in root.glob("*") if p.suffix in (".safetensors", ".bin"))
    return STARTUP_S + size / READ_BYTES_PER_S


def dry_load(draft: Path, *, timeout_s: float = 600.0) -> list[Finding]:
    """Findings of the dry-load (in a child process), or why it did not run."""
    if not sglang_importable():
        return [
            finding(
                "dry-load-skipped",
                "info",
                "dry-load skipped: sglang not importable by this interpreter",
                "run doctor --dry-load with the Python that serves SGLang for the exact check",
            )
        ]
    argv = [sys.executable, "-m", "backends.dryload", str(draft)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return [finding("dry-load-skipped", "warning", f"dry-load skipped: it took longer than {timeout_s:.0f} s")]
    try:
        found: list[Finding] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return [finding("dry-load-failed", "error", f"dry-load crashed (exit {proc.returncode}): {' | '.join(tail)}")]
    return found


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
    for name, tensor in tensors:
        try:
            model.load_weights([(name, tensor)])
        except Exception as exc:  # the loader's assertion is the finding
            audit.errors[name] = f"{type(exc).__name__}: {exc}".strip()
            continue
        after = _probe(params)
        new_hot = getattr(model, "hot_token_id", None)
        # t2d is ignored by design; everything else must land somewhere.
        if after == before and new_hot is hot and facts.IGNORED_MARK not in name:
            audit.unconsumed.append(name)
        before, hot = after, new_hot
    for name, p in params.items():
        left = int(torch.isnan(p.detach()).sum())
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
        counts[name] = int(torch.isnan(view).sum())
    return counts


def findings_of(audit: LoadAudit, files: DraftFiles, config: Any, version: str | None) -> list[Finding]:
    """Turn an audit into findings; parameters SGLang takes from the target later are info."""
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
                "error",
                f"{release}'s loader did not consume {len(audit.unconsumed)} tensor(s): {', '.join(audit.unconsumed)}",
                f"rename them to the names this SGLang loads (eagle3-console HOST convert {files.root} DST), "
                "or upgrade SGLang",
            )
        )
    hidden = getattr(config, "hidden_size", None)
    from_target = {"model.embed_tokens.weight"} if getattr(config, "target_hidden_size", hidden) == hidden else set()
    if getattr(config, "draft_vocab_size", 0) is None:
        from_target.add("lm_head.weight")
    later = sorted(n for n in audit.unwritten if n in from_target)
    unwritten = {n: f for n, f in audit.unwritten.items() if n not in from_target}
    if later:
        found.append(finding("dry-load-unwritten", "info", f"taken from the target at startup: {', '.join(later)}"))
    if unwritten:
        listed = ", ".join(f"{n} ({f:.0%})" for n, f in sorted(unwritten.items()))
        found.append(
            finding(
                "dry-load-unwritten",
                "error",
                f"{release}'s loader left {len(unwritten)} parameter(s) unwritten (never initialised): {listed}",
                "add the missing tensors to the checkpoint; SGLang serves whatever memory held",
            )
        )
    if not found:
        clean = f"{release}'s loader consumed every tensor and wrote every parameter"
        found.append(finding("dry-load-unwritten", "info", clean))
    return found


# --- in the child process ----------------------------------------------------------------------


def _iter_tensors(files: DraftFiles) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint as SGLang's default loader yields it: name, tensor, file by file."""
    import torch

    if files.weights == "bin":
        state = torch.load(files.root / "pytorch_model.bin", map_location="cpu", mmap=True, weights_only=True)
        yield from state.items()
        return
    from safetensors import safe_open

    for file in sorted(files.root.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                yield name, fh.get_tensor(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start_sglang_on_cpu(model_path: str) -> None:
    """Publish a CPU ServerArgs and a one-process gloo group, as a scheduler would."""
    import inspect

    # import_module: sglang is optional, and mypy must not need it.
    parallel_state = importlib.import_module("sglang.srt.distributed.parallel_state")
    server_args = importlib.import_module("sglang.srt.server_args")
    server_args.set_global_server_args_for_scheduler(server_args.ServerArgs(model_path=model_path, device="cpu"))
    parallel_state.init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
        backend="gloo",
    )
    # 0.5.5 takes the sizes as arguments; later releases read them from the published args.
    if "tensor_model_parallel_size" in inspect.signature(parallel_state.initialize_model_parallel).parameters:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    else:
        parallel_state.initialize_model_parallel()


def run_in_process(draft: Path) -> list[Finding]:
    files, problems = read_draft(draft)
    if files is None:
        return problems
    try:
        import torch
        from transformers import AutoConfig

        registry = importlib.import_module("sglang.srt.models.registry")

        config = AutoConfig.from_pretrained(str(files.root))
        _start_sglang_on_cpu(str(files.root))
    except Exception as exc:  # an environment SGLang cannot start in is not a fault of the draft
        return [finding("dry-load-skipped", "warning", f"dry-load could not start SGLang on CPU: {exc}")]
    try:
        cls, _ = registry.ModelRegistry.resolve_model_cls(config.architectures)
        with torch.device("cpu"):
            model = cls(config, quant_config=None)
    except Exception as exc:
        msg = f"SGLang could not build the draft class for config.json: {type(exc).__name__}: {exc}"
        return [finding("dry-load-failed", "error", msg, "fix config.json (see doctor's other findings)")]
    return findings_of(audit_load(model, _iter_tensors(files)), files, config, facts.installed_version())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m backends.dryload DRAFT", file=sys.stderr)
        return 2
    print(json.dumps(run_in_process(Path(args[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
