"""SGLang as a serving engine: what the serving seam (`backends.serving`) asks of it, answered from this package.

Everything here delegates to the modules that hold the knowledge (`facts`, `flags`, `launch`, `log`); this class
is the one door to them for the run engine, the gate and the console.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from backends.protocol import Finding, RelaunchPresetsResult, ServeNode
from backends.sglang import facts, flags, launch, log, server_metrics
from backends.sglang.launch import ServerLaunch


class SGLangEngine:
    name = "SGLang"
    default_port = facts.DEFAULT_PORT
    draft_flags = facts.DRAFT_PATH_FLAGS
    target_flags = facts.TARGET_PATH_FLAGS
    context_length_flag = facts.CONTEXT_LENGTH_FLAG
    # Offered when the host cannot say which release it serves: the spelling every release accepts.
    fallback_presets = facts.RELAUNCH_PRESETS

    def launch(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, sglang_python: str | None = None
    ) -> ServerLaunch | None:
        """What argv launches when it starts SGLang's server in any shape `launch` reads; None otherwise."""
        return launch.read(argv, env, sglang_python)

    def wrapper(self, argv: Sequence[str], sglang_python: str | None) -> ServerLaunch:
        """A serve command none of the shapes: a wrapper whose flags cannot be seen."""
        return launch.wrapper(argv, sglang_python)

    def serve_command(
        self,
        python: str,
        target: str,
        draft: str,
        *,
        port: int,
        gpus: int,
        extra: list[str],
        metrics: bool = True,
        node: ServeNode | None = None,
    ) -> list[str]:
        """The server command for a target and its EAGLE-3 draft on `gpus` GPUs (of each node), with its /metrics
        on unless `metrics` is False; one node of SGLang's own multi-node with `node`; `extra` flags come last
        and win."""
        argv = [python, "-m", facts.SERVER_MODULES[0], facts.TARGET_PATH_FLAGS[0], target, *facts.EAGLE3_ALGORITHM]
        argv += [facts.DRAFT_PATH_FLAGS[0], draft, facts.PORT_FLAG, str(port)]
        total = gpus * (node.nnodes if node else 1)  # tensor parallelism spans the nodes
        if total > 1 and not any(f.split("=")[0] in facts.TP_SIZE_FLAGS for f in extra):
            argv += [facts.TP_SIZE_FLAGS[0], str(total)]
        if node is not None:
            argv += [facts.NNODES_FLAG, str(node.nnodes), facts.NODE_RANK_FLAG, str(node.rank)]
            argv += [facts.DIST_INIT_ADDR_FLAG, node.dist_init_addr]
        if metrics and not any(f.split("=")[0] == server_metrics.ENABLE_FLAG for f in extra):
            argv.append(server_metrics.ENABLE_FLAG)
        return argv + extra

    def health_url(self, found: ServerLaunch) -> str | None:
        """SGLang's /health on the host and port the command names, as the host reaches it; None when it cannot be
        known (see `launch.health_url`), or for a node of rank 1 and up (node 0 alone serves HTTP)."""
        return launch.health_url(found)

    def check_flags(self, found: ServerLaunch, env: Mapping[str, str] | None, cwd: str | None) -> Finding | None:
        return flags.check(found, env, cwd)

    def relaunch_presets(
        self, found: ServerLaunch | None, env: Mapping[str, str] | None, cwd: str | None
    ) -> RelaunchPresetsResult:
        return flags.relaunch_presets(found, env, cwd)

    def output_reader(self) -> log.OutputReader:
        return log.OutputReader()

    def metrics_url(self, found: ServerLaunch, health_url: str) -> str | None:
        """/metrics beside the health URL when the command turns SGLang's metrics on (--enable-metrics)."""
        return server_metrics.metrics_url(list(found.flags or ()), health_url)

    def server_metrics(self) -> server_metrics.ServerMetrics:
        return server_metrics.ServerMetrics()


SGLANG = SGLangEngine()
