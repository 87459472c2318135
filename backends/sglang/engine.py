"""SGLang as a serving engine: what the serving seam (`backends.serving`) asks of it, answered from this package.

Everything here delegates to the modules that hold the knowledge (`facts`, `flags`, `log`); this class is the
one door to them for the run engine, the gate and the console.
"""

from __future__ import annotations

from collections.abc import Mapping

from backends.argv_edit import flag_value
from backends.protocol import Finding, RelaunchPresetsResult, ServeNode
from backends.sglang import facts, flags, log, server_metrics


class SGLangEngine:
    name = "SGLang"
    default_port = facts.DEFAULT_PORT
    draft_flags = facts.DRAFT_PATH_FLAGS
    target_flags = facts.TARGET_PATH_FLAGS
    context_length_flag = facts.CONTEXT_LENGTH_FLAG
    # Offered when the host cannot say which release it serves: the spelling every release accepts.
    fallback_presets = facts.RELAUNCH_PRESETS

    def interpreter(self, argv: list[str]) -> str | None:
        """The Python that runs the server when argv is `PYTHON [OPTIONS] -m sglang.launch_server FLAGS...`."""
        command = flags.server_command(argv)
        return command[0] if command is not None else None

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

    def health_url(self, argv: list[str]) -> str | None:
        """SGLang's /health on the host and port the command names; None when argv starts no SGLang server, or
        a node of rank 1 and up (node 0 alone serves HTTP)."""
        if not any(m in argv for m in facts.SERVER_MODULES):
            return None
        if (flag_value(argv, (facts.NODE_RANK_FLAG,)) or "0") != "0":
            return None
        host = flag_value(argv, (facts.HOST_FLAG,)) or "127.0.0.1"
        port = flag_value(argv, (facts.PORT_FLAG,)) or str(facts.DEFAULT_PORT)
        if host in ("0.0.0.0", "::", "[::]"):
            host = "127.0.0.1"  # listening everywhere: ask on loopback
        return f"http://{host}:{port}/health"

    def check_flags(self, argv: list[str], env: Mapping[str, str] | None, cwd: str | None) -> Finding | None:
        return flags.check(argv, env, cwd)

    def relaunch_presets(
        self, argv: list[str], env: Mapping[str, str] | None, cwd: str | None
    ) -> RelaunchPresetsResult:
        return flags.relaunch_presets(argv, env, cwd)

    def output_reader(self) -> log.OutputReader:
        return log.OutputReader()

    def metrics_url(self, argv: list[str], health_url: str) -> str | None:
        """/metrics beside the health URL when argv starts an SGLang server with --enable-metrics."""
        return server_metrics.metrics_url(argv, health_url) if self.interpreter(argv) is not None else None

    def server_metrics(self) -> server_metrics.ServerMetrics:
        return server_metrics.ServerMetrics()


SGLANG = SGLangEngine()
