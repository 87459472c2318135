"""A stand-in for SGLang's server (`python -m tests.sglang_standin [--port P] [--hang-in PHASE | --fail-in PHASE]`;
`tests/fake_sglang` puts it under `python -m sglang.launch_server` too).

It replays SGLang 0.5.23's startup output (scheduler lines with a timestamp
prefix, progress bars ended by carriage returns, target then draft), starts a
scheduler subprocess as SGLang does, and serves /health on 127.0.0.1 only once
the CUDA graphs are "captured": 503 during warmup, 200 when ready (connection
refused before). `--hang-in` stops in that phase with both processes asleep, as
a hung launch does; `--fail-in cuda-graph` prints SGLang's capture failure and
exits 1.

Once ready it also answers what `bench` asks: /v1/models, and streamed
/v1/chat/completions and /v1/completions (`StandinAPI`), each token a chunk, with
SGLang's speculative figures (`--accept-len`); `--error-every N` answers every
N-th completion with HTTP 500 and `--cut-every N` cuts every N-th stream mid-way.

With `--enable-metrics` it also serves /metrics as SGLang does (tests/standin_metrics.py: the real names,
labels and buckets) and prints its decode lines only once /metrics has been read, so that a test knows which
source each metric row came from; `--no-metrics-endpoint` is a server without it (404), as an old one is.

Each line says where it comes from. REAL: printed by the real 0.5.23 on CPU
(tests/sglang_output/serve_cpu_0.5.23.log, serve_eagle3_cpu_0.5.23.log), figures
(memory, times, shard counts) aside. RECONSTRUCTED: GPU-only output that cannot
run here (CUDA graph capture, `accept len` in decode lines), written from
SGLang's source and sglang.md.
"""

from __future__ import annotations

import argparse
import http.server
import itertools
import json
import multiprocessing
import signal
import socket
import sys
import threading
import time

from tests.standin_metrics import StandinMetrics

PHASES = ("init", "load-weights", "draft-load-weights", "cuda-graph", "warmup")


def say(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stdout.write(f"[{stamp}] {message}\n")
    sys.stdout.flush()


def bar(label: str, done: int, total: int) -> None:
    """REAL format: SGLang's bar, each state led by a carriage return, the line ended once it is full."""
    percent = 100 * done // total
    sys.stdout.write(f"\r{label}: {percent:3d}% Completed | {done}/{total} [00:0{done}<00:0{total - done}, 1.5it/s]")
    sys.stdout.flush()


def hang_forever() -> None:
    """Asleep in a call that never returns: no output, no CPU (what py-spy finds in a hung launch)."""
    while True:
        time.sleep(3600)


def meet(nnodes: int, rank: int, address: str | None) -> list[socket.socket]:
    """The nodes meet at node 0's --dist-init-addr (RECONSTRUCTED: torch.distributed's TCP store, reduced to a
    connection per follower): node 0 waits for every other node, a follower retries until node 0 listens."""
    if nnodes == 1:
        return []
    assert address is not None, "--dist-init-addr is required with --nnodes > 1 (as SGLang says)"
    host, port = address.rsplit(":", 1)
    if rank == 0:
        listener = socket.create_server((host, int(port)))
        return [listener.accept()[0] for _ in range(nnodes - 1)]
    while True:
        try:
            return [socket.create_connection((host, int(port)))]
        except OSError:
            time.sleep(0.2)


def follow_node_0(rank: int, peers: list[socket.socket]) -> None:
    """A follower node: no HTTP; SIGTERM is ignored (REAL warning, entrypoints/engine.py 0.5.23) until node 0 goes,
    which ends the follower as node 0's shutdown broadcast does."""

    said = f"SIGTERM received on node_rank {rank}; waiting for the rank-0 ShutdownReq broadcast to stop the schedulers."

    def refuse(_signum: int, _frame: object) -> None:
        say(said)

    signal.signal(signal.SIGTERM, refuse)
    peers[0].recv(1)  # node 0 gone: its end of the connection closes
    sys.exit(0)


def scheduler() -> None:
    """SGLang's scheduler subprocess: here it only waits, as the server does between requests."""
    hang_forever()


class Health(http.server.BaseHTTPRequestHandler):
    ready = False
    metrics: StandinMetrics | None = None  # --enable-metrics: /metrics as SGLang serves it
    scraped = threading.Event()  # /metrics has been read
    protocol_version = "HTTP/1.1"  # REAL: uvicorn's; a stream goes in chunks of its transfer encoding

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # REAL: uvicorn sends each chunk now

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self.serve_metrics()
            return
        if self.path == "/v1/models" and Health.ready:
            model = {"id": "/models/standin", "object": "model", "created": int(time.time()), "owned_by": "sglang",
                     "root": "/models/standin", "parent": None, "max_model_len": 2048}  # fmt: skip
            self.answer(200, {"object": "list", "data": [model]})  # REAL shape
            return
        code = 200 if self.path == "/health" and Health.ready else 503 if self.path == "/health" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        api = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(self.path)
        if api is None or not Health.ready:
            self.answer(404 if api is None else 503, {"detail": "Not Found"})
            return
        number = next(StandinAPI.served)
        if StandinAPI.error_every and number % StandinAPI.error_every == 0:
            # REAL shape: 0.5.23's error answer (tests/sglang_output/README.md), for a request it could not serve
            self.answer(500, {"object": "error", "message": "stand-in: internal error", "type": "Internal Server Error",
                              "param": None, "code": 500})  # fmt: skip
            return
        cut = bool(StandinAPI.cut_every and number % StandinAPI.cut_every == 0)
        StandinAPI(self, api, body, number).stream(cut)

    def serve_metrics(self) -> None:
        if Health.metrics is None:  # started without --enable-metrics, or an old server
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = Health.metrics.exposition()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        Health.scraped.set()

    def answer(self, code: int, obj: object) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


class StandinAPI:
    """One streamed completion as SGLang 0.5.23 writes it. REAL, chunk by chunk, field by field: the real server's
    streams on CPU (tests/sglang_output/bench_*_0.5.23.sse), token text aside. RECONSTRUCTED: the chunk with
    `sglext.spec_tokens_details`, which only speculative decoding sends (GPU only), from serving_chat.py,
    serving_completions.py and protocol.py (SglExt, SpecTokensDetails)."""

    served = itertools.count(1)  # completions asked for, errors and cuts included
    accept_len = 3.0
    error_every = 0
    cut_every = 0

    def __init__(self, handler: Health, api: str, body: dict[str, object], number: int) -> None:
        self.handler, self.api = handler, api
        self.id, self.created, self.model = f"standin{number}", int(time.time()), str(body["model"])
        self.tokens = int(str(body.get("max_tokens") or 16))

    def send(self, payload: str) -> None:
        data = f"data: {payload}\n\n".encode()
        self.handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.handler.wfile.flush()

    def chunk(self, choices: list[object], **rest: object) -> str:
        kind = "chat.completion.chunk" if self.api == "chat" else "text_completion"
        head = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}
        return json.dumps({**head, **rest}, separators=(",", ":"))

    def choice(self, text: str | None, finish: str | None = None, role: str | None = None) -> dict[str, object]:
        if self.api == "completions":
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "matched_stop": None}
        delta: dict[str, object] = {"reasoning_content": None, **({"role": role} if role else {})}
        delta.update({"content": text} if text is not None else {})
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}

    def stream(self, cut: bool) -> None:
        started = time.monotonic()
        self.handler.send_response(200)
        self.handler.send_header("Content-Type", "text/event-stream")
        self.handler.send_header("Transfer-Encoding", "chunked")
        self.handler.end_headers()
        # REAL: completions carry `usage: null` in every chunk, chat chunks none; chat begins with the role
        extra = {"usage": None} if self.api == "completions" else {}
        if self.api == "chat":
            self.send(self.chunk([self.choice("", role="assistant")]))
        for i in range(self.tokens):
            if cut and i == self.tokens // 2:
                self.handler.close_connection = True  # the server died mid-stream: no last chunk, no [DONE]
                return
            last = i == self.tokens - 1
            if last and self.api == "completions":  # REAL: a completion's last token comes with its finish
                self.send(self.chunk([self.choice(f" tok{i}", finish="length")], **extra))
            else:
                self.send(self.chunk([self.choice(f" tok{i}")], **extra))
            time.sleep(0.002)
        if self.api == "chat":
            self.send(self.chunk([self.choice(None, finish="length")]))
        verify = max(1, round(self.tokens / StandinAPI.accept_len))
        details = {"spec_accept_rate": 0.5, "spec_accept_length": self.tokens / verify, "spec_cap_length": 0.0,
                   "spec_block_accept_length": 0.0, "spec_num_correct_drafts": 0, "spec_num_proposed_drafts": 0,
                   "spec_verify_ct": verify, "spec_correct_drafts_histogram": [],
                   "spec_cap_lens_histogram": []}  # fmt: skip
        self.send(self.chunk([], usage=None, sglext={"spec_tokens_details": details}))  # RECONSTRUCTED (GPU only)
        usage: dict[str, object] = {"prompt_tokens": 9, "total_tokens": 9 + self.tokens,
                                    "completion_tokens": self.tokens, "reasoning_tokens": 0}  # fmt: skip
        if self.api == "chat":
            usage = {**usage, "prompt_tokens_details": None, "completion_tokens_details": None}
        self.send(self.chunk([], usage=usage))  # REAL
        self.send("[DONE]")  # REAL
        self.handler.wfile.write(b"0\r\n\r\n")
        if Health.metrics is not None:  # a server's gauges and histograms move with the requests it serves
            rate = self.tokens / max(time.monotonic() - started, 1e-3)
            Health.metrics.decoded(
                running=1, token_usage=0.01, accept_len=self.tokens / verify, accept_rate=0.5, gen=rate
            )


def load_weights(model: str, shards: int, hang: bool) -> None:
    say("Memory baseline taken. mem usage=0.00 GB")  # REAL
    say("Load weight begin. avail mem=139.52 GB")  # REAL
    bar("Multi-thread loading shards", 0, shards)  # REAL
    for done in range(1, shards + 1):
        bar("Multi-thread loading shards", done, shards)
        if hang and done == shards // 2:
            hang_forever()
        time.sleep(0.05)
    sys.stdout.write("\n")
    say(f"Load weight end. elapsed=0.42 s, type={model}, avail mem=124.31 GB, mem usage=15.21 GB.")  # REAL


def capture_cuda_graphs(fail: bool, hang: bool) -> None:
    """RECONSTRUCTED, all of it: CUDA graphs are captured on GPUs only (0.5.23's cuda_graph_setup.py,
    eagle_worker_v2.py; tests/test_sglang_log_source.py holds each line to them)."""
    say("Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[64, 128, 256], avail mem=20.05 GB")
    say("Capture target prefill CUDA graph end. elapsed=0.12 s, mem usage=0.10 GB, avail mem=19.95 GB.")
    say("Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=8, avail mem=19.95 GB")
    if fail:
        say(
            "Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 6364, '
            "in run_scheduler_process\n"
            "    scheduler = Scheduler(server_args, port_args)\n"
            '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/runner/'
            'decode_cuda_graph_runner.py", line 602, in __init__\n'
            "    raise Exception(\n"
            "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
            "Possible solutions:\n"
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
            "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
            "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
            "(Not recommended. Huge performance loss)\n"
            "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
        )
        sys.exit(1)
    for done in range(1, 5):
        bar("Capturing batches (bs=8 avail_mem=19.80 GB)", done, 4)
        if hang and done == 2:
            hang_forever()
    sys.stdout.write("\n")
    say("Capture target verify CUDA graph end. bs=[1, 2, 4, 8], elapsed=0.21 s, mem usage=0.15 GB, avail mem=19.80 GB.")
    say(
        "Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2, 4, 8], avail mem=19.80 GB"
    )
    say("Capture draft decode CUDA graph end. elapsed=0.10 s, mem usage=0.05 GB, avail mem=19.75 GB.")
    say(
        "Capture draft extend CUDA graph begin. backend=full, num_tokens_per_req=8, bs=[1, 2, 4, 8], avail mem=19.75 GB"
    )
    say("Capture draft extend CUDA graph end. elapsed=0.10 s, mem usage=0.05 GB, avail mem=19.70 GB.")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--hang-in", choices=PHASES)
    parser.add_argument("--fail-in", choices=("cuda-graph",))
    parser.add_argument("--decode-lines", type=int, default=0, help="decode log lines to print once ready")
    parser.add_argument("--enable-metrics", action="store_true", help="serve /metrics, as SGLang's flag does")
    parser.add_argument("--no-metrics-endpoint", action="store_true", help="an old server: no /metrics (404)")
    parser.add_argument("--accept-len", type=float, default=3.0, help="the acceptance length completions report")
    parser.add_argument("--error-every", type=int, default=0, help="answer every N-th completion with HTTP 500")
    parser.add_argument("--cut-every", type=int, default=0, help="cut every N-th completion's stream mid-way")
    parser.add_argument("--nnodes", type=int, default=1, help="SGLang's own multi-node: the node count")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank (1 and up: no HTTP)")
    parser.add_argument("--dist-init-addr", help="node 0's HOST:PORT, where the nodes meet")
    args, _sglang_flags = parser.parse_known_args()  # a real server command line carries many more flags
    StandinAPI.accept_len, StandinAPI.error_every, StandinAPI.cut_every = (
        args.accept_len,
        args.error_every,
        args.cut_every,
    )
    hang = args.hang_in
    if args.enable_metrics and not args.no_metrics_endpoint:
        Health.metrics = StandinMetrics()
    worker = multiprocessing.get_context("spawn").Process(target=scheduler, daemon=True)
    worker.start()
    say("Failed to import from vllm._C: ModuleNotFoundError(\"No module named 'vllm._C'\")")  # REAL, harmless
    say("Init parallel begin.")  # REAL
    if hang == "init":
        hang_forever()
    peers = meet(args.nnodes, args.node_rank, args.dist_init_addr)
    time.sleep(2)  # distributed init takes seconds: the health URL is polled (refused) meanwhile
    say("Init parallel ends. elapsed=2.00 s")  # REAL
    say("Cannot detect CUDA architecture.")  # REAL, harmless
    say("Ignore import error when loading sglang.srt.models.midashenglm: No module named 'torchaudio'")  # REAL
    load_weights("LlamaForCausalLM", 8, hang == "load-weights")
    # REAL order: 0.5.23 loads the draft's weights before it allocates the target's KV cache.
    load_weights("LlamaForCausalLMEagle3", 2, hang == "draft-load-weights")
    say("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 500000, K size: 30.52 GB, V size: 30.52 GB")  # REAL
    say("Memory pool end. avail mem=20.05 GB")  # REAL
    capture_cuda_graphs(args.fail_in == "cuda-graph", hang == "cuda-graph")
    if args.node_rank > 0:
        follow_node_0(args.node_rank, peers)
    say(  # REAL (available_cpu_mem on CPU)
        "max_total_num_tokens=500000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, "
        "context_len=131072, available_gpu_mem=20.05 GB"
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    say("INFO:     Application startup complete.")  # REAL
    say(f"INFO:     Uvicorn running on http://127.0.0.1:{args.port} (Press CTRL+C to quit)")  # REAL
    say(  # REAL (cpu graph on CPU): SGLang's own warmup request
        "Prefill batch, #new-seq: 1, #new-token: 14, #cached-token: 0, token usage: 0.00, #running-req: 0, "
        "#queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 13.09"
    )
    if hang == "warmup":
        hang_forever()
    Health.ready = True
    say("The server is fired up and ready to roll!")  # REAL
    if Health.metrics is not None and args.decode_lines:
        Health.scraped.wait()
    for i in range(args.decode_lines):
        speculative = f"accept len: {2.5 + i / 10:.2f}, accept rate: 0.50, "  # RECONSTRUCTED: 0.5.23's metrics_reporter
        say(  # REAL, but for `speculative` (only speculative decoding prints it) and cuda for cpu
            f"Decode batch, #running-req: {i + 1}, #token: {900 + i}, token usage: 0.01, {speculative}"
            f"cuda graph: True, gen throughput (token/s): {400.0 + 10 * i:.2f}, #queue-req: 0"
        )
        if Health.metrics is not None:
            Health.metrics.decoded(
                running=i + 1, token_usage=0.01, accept_len=3.0 + i / 10, accept_rate=0.5, gen=400.0 + 10 * i
            )
        time.sleep(0.1)
    hang_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
