"""A stand-in for SGLang's server (`python -m tests.sglang_standin [--port P] [--hang-in PHASE | --fail-in PHASE]`;
`tests/fake_sglang` puts it under `python -m sglang.launch_server` too).

It replays SGLang 0.5.23's startup output (scheduler lines with a timestamp
prefix, progress bars ended by carriage returns, target then draft), starts a
scheduler subprocess as SGLang does, and serves /health on 127.0.0.1 only once
the CUDA graphs are "captured": 503 during warmup, 200 when ready (connection
refused before). `--hang-in` stops in that phase with both processes asleep, as
a hung launch does; `--fail-in cuda-graph` prints SGLang's capture failure and
exits 1.

Each line says where it comes from. REAL: printed by the real 0.5.23 on CPU
(tests/sglang_output/serve_cpu_0.5.23.log, serve_eagle3_cpu_0.5.23.log), figures
(memory, times, shard counts) aside. RECONSTRUCTED: GPU-only output that cannot
run here (CUDA graph capture, `accept len` in decode lines), written from
SGLang's source and sglang.md.
"""

from __future__ import annotations

import argparse
import http.server
import multiprocessing
import sys
import threading
import time

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


def scheduler() -> None:
    """SGLang's scheduler subprocess: here it only waits, as the server does between requests."""
    hang_forever()


class Health(http.server.BaseHTTPRequestHandler):
    ready = False

    def do_GET(self) -> None:
        code = 200 if self.path == "/health" and Health.ready else 503 if self.path == "/health" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


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
    """RECONSTRUCTED, all of it: CUDA graphs are captured on GPUs only."""
    say("Capture target verify CUDA graph begin. This can take up to several minutes. avail mem=20.05 GB")
    if fail:
        say(
            "Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
            "Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
            "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
            "3. disable torch compile by not using --enable-torch-compile\n"
            "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)"
        )
        say("Scheduler hit an exception: Traceback (most recent call last):\nRuntimeError: capture failed")
        sys.exit(1)
    for done in range(1, 5):
        bar("Capturing batches (bs=8 avail_mem=19.80 GB)", done, 4)
        if hang and done == 2:
            hang_forever()
    sys.stdout.write("\n")
    say("Capture target verify CUDA graph end. Time elapsed: 0.21 s. mem usage=0.25 GB. avail mem=19.80 GB.")
    say("Capture draft decode CUDA graph begin. This can take up to several minutes. avail mem=19.80 GB")
    say("Capture draft decode CUDA graph end. Time elapsed: 0.10 s. mem usage=0.05 GB. avail mem=19.75 GB.")
    say("Capture draft extend CUDA graph begin. This can take up to several minutes. avail mem=19.75 GB")
    say("Capture draft extend CUDA graph end. Time elapsed: 0.10 s. mem usage=0.05 GB. avail mem=19.70 GB.")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--hang-in", choices=PHASES)
    parser.add_argument("--fail-in", choices=("cuda-graph",))
    parser.add_argument("--decode-lines", type=int, default=0, help="decode log lines to print once ready")
    args, _sglang_flags = parser.parse_known_args()  # a real server command line carries many more flags
    hang = args.hang_in
    worker = multiprocessing.get_context("spawn").Process(target=scheduler, daemon=True)
    worker.start()
    say("Failed to import from vllm._C: ModuleNotFoundError(\"No module named 'vllm._C'\")")  # REAL, harmless
    say("Init parallel begin.")  # REAL
    if hang == "init":
        hang_forever()
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
    for i in range(args.decode_lines):
        say(  # RECONSTRUCTED: 0.5.23's metrics_reporter with speculative decoding (the rest of the line is REAL)
            f"Decode batch, #running-req: {i + 1}, #token: {900 + i}, token usage: 0.01, "
            f"accept len: {2.5 + i / 10:.2f}, accept rate: 0.50, cuda graph: True, "
            f"gen throughput (token/s): {400.0 + 10 * i:.2f}, #queue-req: 0"
        )
        time.sleep(0.1)
    hang_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
