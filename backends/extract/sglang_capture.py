"""The `sglang` backend: the host's SGLang runs the target and captures the aux layers as it does when serving.

SGLang's own model code computes the states, with the capture switched on by
`set_eagle3_layers_to_capture(aux_ids)`: the same call, with the same ids, that
the server makes when it loads a draft whose config carries those ids, so the
draft trains on exactly the features it will be served. The final normed
hidden state and the captured layers are read where the model hands them to its
logits processor.

This is the only module that touches SGLang's internals. It drives them through
SGLang's in-tree one-batch benchmark (`sglang.benchmark.one_batch`: model
loading and the extend forward), which SGLang keeps working with each release;
a release without it is refused with a one-line message.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import itertools
import json
import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from backends.extract.capture import Captured, to_host
from backends.sglang import facts as sglang_facts
from backends.sglang import runtime as sglang_runtime

if TYPE_CHECKING:
    import torch

# Set before SGLang is imported: its CPU engine (and the sgl_kernel CPU build it needs) is opt-in.
CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"
RUNNER_MODULE = "sglang.benchmark.one_batch"
# SGLang's compiled kernels: the module, and the packages that provide it (0.5.23 pins sglang-kernel).
KERNEL_MODULE = "sgl_kernel"
KERNEL_PACKAGES = ("sglang-kernel", "sgl-kernel")


class SGLangUnavailable(Exception):
    """This SGLang cannot run the extraction (the message says why and what to use instead)."""


@dataclass
class SGLangCapturer:
    """A target loaded by SGLang's model runner, capturing `aux_ids` on every extend forward."""

    runner: Any  # SGLang's ModelRunner
    one_batch: ModuleType
    aux_ids: list[int]
    max_requests: int

    def capture(self, batch: list[list[int]]) -> list[Captured]:
        out: list[Captured] = []
        for start in range(0, len(batch), self.max_requests):
            out.extend(self._extend(batch[start : start + self.max_requests]))
        return out

    def _extend(self, batch: list[list[int]]) -> list[Captured]:
        import torch

        seen: dict[str, Any] = {}

        def grab(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            # LogitsProcessor.forward(input_ids, hidden_states, lm_head, metadata, aux_hidden_states, ...)
            seen["hidden"] = args[1] if len(args) > 1 else kwargs["hidden_states"]
            seen["aux"] = args[4] if len(args) > 4 else kwargs.get("aux_hidden_states")

        handle = self.runner.model.logits_processor.register_forward_pre_hook(grab, with_kwargs=True)
        try:
            reqs = self.one_batch.prepare_synthetic_inputs_for_latency_test(len(batch), None, custom_inputs=batch)
            self.one_batch.extend(reqs, self.runner)
        finally:
            handle.remove()
            self.runner.req_to_token_pool.clear()
            self.runner.token_to_kv_pool_allocator.clear()
        hidden, aux = seen.get("hidden"), seen.get("aux")
        if hidden is None or aux is None or len(aux) == 0:
            raise RuntimeError("SGLang's forward returned no aux hidden states; the capture was not switched on")
        packed: torch.Tensor = aux if isinstance(aux, torch.Tensor) else torch.cat(list(aux), dim=-1)
        expected = len(self.aux_ids) * hidden.shape[-1]
        if packed.shape[-1] != expected:
            # A capture point beyond the model's layers is skipped silently by SGLang.
            raise RuntimeError(
                f"SGLang captured {packed.shape[-1] // hidden.shape[-1]} layers for aux ids {self.aux_ids}; "
                "check --layers against the target"
            )
        hidden_cpu, aux_cpu = to_host(hidden), to_host(packed)
        if hidden.device.type == "cuda":
            torch.cuda.current_stream(hidden.device).synchronize()
        # SGLang packs the batch's tokens one sequence after another, in request order.
        starts = list(itertools.accumulate((len(ids) for ids in batch), initial=0))
        return [Captured(hidden_cpu[a:b], aux_cpu[a:b]) for a, b in itertools.pairwise(starts)]


def check_available(architecture: str) -> None:
    """Refuse, before anything loads, a host whose SGLang cannot capture this target's aux layers."""
    version = sglang_facts.installed_version()
    if version is None:
        raise SGLangUnavailable("--backend sglang: sglang is not installed for this Python; use --backend hf")
    release = sglang_facts.release_facts(version)
    if architecture not in release.capture_classes:
        raise SGLangUnavailable(
            f"--backend sglang: SGLang {version}'s {architecture} has no set_eagle3_layers_to_capture, "
            "so it cannot capture aux layers (nor serve an EAGLE-3 draft for it); use --backend hf"
        )


def text_config(path: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((path / "config.json").read_text())
    text: dict[str, Any] = config.get("text_config") or config
    return text


@dataclass(frozen=True)
class SGLangModules:
    """The SGLang modules the backend drives, imported before anything is written."""

    one_batch: ModuleType
    engine: ModuleType
    server: ModuleType


def import_runner(device: str) -> SGLangModules:
    """SGLang's in-process model runner for `device`; SGLangUnavailable (one line: what is missing, what to do)
    when this SGLang cannot import it."""
    if device == "cpu":
        os.environ[CPU_ENGINE_ENV] = "1"
    # SGLang warns on import about each quantization kernel the device lacks (AWQ, GGUF), and torch logs
    # deprecations of its own when vllm's ops load: not ours to show.
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            # import_module: sglang is optional, and mypy must not need it.
            return SGLangModules(
                one_batch=importlib.import_module(RUNNER_MODULE),
                engine=importlib.import_module("sglang.srt.entrypoints.engine"),
                server=importlib.import_module("sglang.srt.server_args"),
            )
    except ImportError as exc:
        raise SGLangUnavailable(unavailable_message(exc, device)) from None
    finally:
        logging.disable(logging.NOTSET)


def unavailable_message(exc: ImportError, device: str) -> str:
    """Why this SGLang cannot run the extraction, told by what its import missed."""
    version = sglang_facts.installed_version()
    missing = (exc.name or "").partition(".")[0]
    if missing == KERNEL_MODULE:
        kernels = kernel_requirement()
        todo = (
            f"run the extraction on a GPU host that has them (pip install {kernels}), or build sgl-kernel for "
            "CPU from SGLang's source (its CPU engine)"
            if device == "cpu"
            else f"install them on this host (pip install {kernels})"
        )
        return (
            f"--backend sglang: SGLang {version} here has no kernels for {device} (module {KERNEL_MODULE}, "
            f"from {kernels}: a CUDA build, for a GPU host); {todo}, or use --backend hf"
        )
    if missing in ("", "sglang"):
        return (
            f"--backend sglang: SGLang {version} lacks the in-process model runner this backend drives "
            f"({RUNNER_MODULE}, written for SGLang {sglang_facts.EXTRACT_RUNNER_VERSION}: {exc}); use --backend hf"
        )
    return (
        f"--backend sglang: SGLang {version} cannot import its model runner: the package that provides {missing} "
        f"is not installed ({exc}); install SGLang with its dependencies (pip install sglang=={version}), "
        "or use --backend hf"
    )


def kernel_requirement() -> str:
    """The kernel package this SGLang requires, as its metadata pins it (`sglang-kernel==0.4.10` for 0.5.23)."""
    try:
        requirements = importlib.metadata.requires("sglang") or []
    except importlib.metadata.PackageNotFoundError:
        requirements = []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        name = re.split(r"[\s\[<>=!~(]", spec.strip(), maxsplit=1)[0]
        if name.lower().replace("_", "-") in KERNEL_PACKAGES and "extra" not in marker:
            return spec.replace(" ", "")
    return KERNEL_PACKAGES[0]


def load(
    path: Path, sglang: SGLangModules, device: str, dtype: str, aux_ids: list[int], batch_tokens: int, max_length: int
) -> SGLangCapturer:
    """The target loaded by SGLang on `device` with a KV pool sized for one batch of `batch_tokens`."""
    sglang_runtime.rendezvous_without_a_port()
    gpu_id = int(device.partition(":")[2] or 0) if device.startswith("cuda") else 0
    max_requests = min(batch_tokens, 4096)
    server_args = sglang.server.ServerArgs(
        model_path=str(path),
        device="cuda" if device.startswith("cuda") else device,
        dtype=dtype,
        # Room for one batch: the KV pool is sized for it, not for serving.
        context_length=min(max_length, sglang_facts.derived_context_length(text_config(path))),
        max_total_tokens=batch_tokens + max_length,
        max_running_requests=max_requests,
        disable_cuda_graph=True,
        random_seed=0,
        log_level="error",
        **({"attention_backend": "torch_native"} if device == "cpu" else {}),
    )
    server_args.resolve_once()
    sglang.engine._set_envs_and_config(server_args)
    port_args = sglang.server.PortArgs.init_new(server_args)
    sglang_runtime.publish_one_rank(server_args, gpu_id=gpu_id)
    sglang.one_batch._init_process_global_configs()
    bench_runner, _tokenizer = sglang.one_batch.load_model(server_args, port_args, gpu_id, 0)
    runner = bench_runner.torch_runner
    runner.model.set_eagle3_layers_to_capture(list(aux_ids))
    return SGLangCapturer(runner=runner, one_batch=sglang.one_batch, aux_ids=list(aux_ids), max_requests=max_requests)
