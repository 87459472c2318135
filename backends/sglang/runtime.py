"""SGLang's process runtime for one rank, set up in this process the way SGLang's own scheduler sets it up.

A model class of SGLang reads its rank, its process groups and its server
arguments from process-wide state that the server's scheduler process installs
before it builds a model. 0.5.23 keeps that state in its runtime context
(`sglang.srt.runtime_context`): `run_scheduler_process` publishes the server
arguments with the rank's placement, then `Scheduler.__init__` builds the
process groups (`distributed.bootstrap.init_parallel_runtime`). 0.5.5 has no
runtime context: `ModelRunner` publishes the arguments with
`set_global_server_args_for_scheduler` and builds the groups itself
(`init_distributed_environment`, `initialize_model_parallel`). Both paths are
here, for a single rank (tensor-parallel size 1, rank 0), so `dryload` and
`extract --backend sglang` share them.

The groups meet through a file in a private folder, never a TCP rendezvous
port; gloo's own transport, one socket per group, is held to the loopback
interface. Import this module only in a child process that runs in the
interpreter of the SGLang that serves: it imports sglang.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import tempfile
from types import ModuleType
from typing import Any

from backends.sglang import facts

# SGLang's rendezvous override (0.5.23: read by bootstrap._resolve_dist_init_method, which skips its port checks).
INIT_METHOD_ENV = "SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE"
# Which interface gloo's transport listens on; loopback: nothing off this machine can reach a one-rank group.
GLOO_INTERFACE_ENV = "GLOO_SOCKET_IFNAME"
LOOPBACK_INTERFACE = "lo"

_started = False


def rendezvous_without_a_port() -> str:
    """A file:// init method in a private folder removed at exit, named to SGLang through its override
    (whatever the environment said: an env:// override would open a TCP store)."""
    folder = tempfile.mkdtemp(prefix="eagle3-sglang-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ[INIT_METHOD_ENV] = f"file://{folder}/rendezvous"
    os.environ[GLOO_INTERFACE_ENV] = LOOPBACK_INTERFACE
    return os.environ[INIT_METHOD_ENV]


def _runtime_context() -> ModuleType | None:
    """SGLang's runtime context module, or None for a release that predates it (0.5.5)."""
    try:
        return importlib.import_module(facts.RUNTIME_CONTEXT_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != facts.RUNTIME_CONTEXT_MODULE:
            raise  # the module is there; something it imports is not
        return None


def publish_one_rank(server_args: Any, *, gpu_id: int) -> None:
    """Install `server_args` as the scheduler of tensor-parallel rank 0 does (run_scheduler_process)."""
    runtime = _runtime_context()
    if runtime is None:
        importlib.import_module("sglang.srt.server_args").set_global_server_args_for_scheduler(server_args)
        return
    world_rank = runtime.spawn_world_rank(server_args, tp_rank=0, pp_rank=0)
    runtime.publish(server_args, role="scheduler", ranks=runtime.SpawnRanks(world_rank=world_rank, gpu_id=gpu_id))


def start_one_rank(server_args: Any, *, device: str, gpu_id: int = 0) -> None:
    """Publish `server_args` for rank 0 and build its process groups, as the server does before it builds a model.
    A process has one runtime: a later call only publishes its arguments (SGLang allows re-publishing)."""
    global _started
    if _started:
        publish_one_rank(server_args, gpu_id=gpu_id)
        return
    init_method = rendezvous_without_a_port()
    publish_one_rank(server_args, gpu_id=gpu_id)
    try:
        bootstrap = importlib.import_module(facts.PARALLEL_BOOTSTRAP_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != facts.PARALLEL_BOOTSTRAP_MODULE:
            raise
        bootstrap = None
    if bootstrap is not None:
        # The port is never opened: the override above names the rendezvous.
        bootstrap.init_parallel_runtime(server_args=server_args, device=device, dist_port=0)
    else:
        # 0.5.5: ModelRunner.init_torch_distributed, with the file rendezvous in place of tcp://127.0.0.1:PORT.
        parallel_state = importlib.import_module("sglang.srt.distributed.parallel_state")
        parallel_state.init_distributed_environment(
            backend="gloo", world_size=1, rank=0, local_rank=gpu_id, distributed_init_method=init_method
        )
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    _started = True
