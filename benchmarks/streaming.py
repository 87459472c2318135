"""Streaming throughput and lag: a run writing 50,000 log lines/s and 2,000 metric rows/s.

    .venv/bin/python -m benchmarks.streaming [--seconds 10]

The run stamps each line and row with its write time; a subscribed client
checks that every line and row arrives exactly once, in order, and measures
lag = arrival time - write time. Target: no loss, p99 lag <= 250 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import cpu_seconds, percentile, print_table
from console.link.client import AgentClient
from console.link.local import LocalTransport

WRITER = """
import json, os, sys, time
lines_per_s, rows_per_s, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
tick = 0.01
out = sys.stdout.buffer
metrics = open(os.environ["EAGLE3_METRICS_FILE"], "a")
start = time.time()
n = r = 0
while True:
    now = time.time()
    if now - start >= seconds:
        break
    due_lines = int((now - start) * lines_per_s)
    due_rows = int((now - start) * rows_per_s)
    chunk = b"".join(b"%d %.6f padding-to-look-like-a-real-log-line\\n" % (i, now) for i in range(n, due_lines))
    out.write(chunk); out.flush()
    metrics.write("".join(json.dumps({"step": j, "t": now, "loss": 1.0}) + "\\n" for j in range(r, due_rows)))
    metrics.flush()
    n, r = due_lines, due_rows
    time.sleep(tick)
"""


async def measure(seconds: float, lines_per_s: int, rows_per_s: int, workdir: Path) -> dict[str, float]:
    client = AgentClient(LocalTransport(workdir))
    hello = await client.start()
    launched = await client.request(
        "launch", kind="train", argv=[sys.executable, "-c", WRITER, str(lines_per_s), str(rows_per_s), str(seconds)]
    )
    sub = await client.subscribe(run=launched["run"])
    proc = json.loads((workdir / "runs" / launched["run"] / "proc.json").read_text())
    supervisor = proc["supervisor"]["pid"]
    cpu0, sup0, t0 = cpu_seconds(hello["pid"]), cpu_seconds(supervisor), time.monotonic()
    sup_last = (sup0, t0)
    lags: list[float] = []
    expected_line = expected_row = 0
    order_errors = 0
    partial = b""
    async for msg in sub:
        arrived = time.time()
        with contextlib.suppress(OSError):  # the supervisor leaves when the run ends
            sup_last = (cpu_seconds(supervisor), time.monotonic())
        if msg["stream"] == "log":
            data = partial + base64.b64decode(msg["data_b64"])
            *complete, partial = data.split(b"\n")
            for line in complete:
                index, stamp, *_ = line.split(b" ")
                order_errors += int(index) != expected_line
                expected_line = int(index) + 1
                lags.append(arrived - float(stamp))
        elif msg["stream"] == "metrics":
            for row in msg["rows"]:
                order_errors += row["step"] != expected_row
                expected_row = row["step"] + 1
                lags.append(arrived - row["t"])
    cpu = (cpu_seconds(hello["pid"]) - cpu0) / (time.monotonic() - t0) * 100
    await client.close()
    return {
        "lines": expected_line,
        "rows": expected_row,
        "order_errors": order_errors,
        "p50_ms": percentile(lags, 50) * 1000,
        "p99_ms": percentile(lags, 99) * 1000,
        "cpu": cpu,
        "supervisor_cpu": (sup_last[0] - sup0) / max(sup_last[1] - t0, 1e-9) * 100,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--lines-per-s", type=int, default=50_000)
    parser.add_argument("--rows-per-s", type=int, default=2_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = asyncio.run(measure(args.seconds, args.lines_per_s, args.rows_per_s, Path(tmp)))
    want_lines, want_rows = int(args.seconds * args.lines_per_s), int(args.seconds * args.rows_per_s)
    print(
        f"streaming {args.lines_per_s} lines/s + {args.rows_per_s} rows/s "
        f"for {args.seconds:.0f} s on {os.cpu_count()} cores"
    )
    print_table(
        [
            ("log lines delivered", f"{r['lines']:.0f}", f"~{want_lines}", f"{r['lines'] / want_lines:.3f}"),
            ("metric rows delivered", f"{r['rows']:.0f}", f"~{want_rows}", f"{r['rows'] / want_rows:.3f}"),
            ("lost or out of order", f"{r['order_errors']:.0f}", "0", "-"),
            ("lag p50, ms", f"{r['p50_ms']:.1f}", "-", "-"),
            ("lag p99, ms", f"{r['p99_ms']:.1f}", "250", f"{r['p99_ms'] / 250:.2f}"),
            ("agent CPU, % of one core", f"{r['cpu']:.1f}", "-", "-"),
            ("the run's supervisor CPU (its watch reads every line), %", f"{r['supervisor_cpu']:.1f}", "-", "-"),
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
