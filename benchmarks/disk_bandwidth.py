"""Sequential write bandwidth of a folder's disk: the physical limit of an extraction that writes its shards there.

    PYTHONPATH=. python -m benchmarks.disk_bandwidth [--dir DIR] [--size-gib 4] [--threads 1,4,8]

For each thread count, writes --size-gib GiB in all, split evenly over that many files (one per thread), in
--block-mib MiB writes of incompressible bytes, then fsyncs every file; the bandwidth is the bytes written over
the time from the first write to the last fsync, so the page cache cannot flatter it. A run stops writing at
--max-seconds and counts what it wrote by then. The files are deleted afterwards; a size that would leave the
disk less than 10% free is refused.

Standalone (no torch, no GPU) so that it measures the output disk of any host before an extraction is
launched there; `benchmarks.extract_throughput` imports `write_bandwidth` to put the same figure beside its
own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from benchmarks._common import print_table

GIB = 1 << 30
MIB = 1 << 20


def write_bandwidth(folder: Path, total_bytes: int, threads: int, block_bytes: int, max_seconds: float) -> float:
    """Bytes per second written sequentially to `folder` by `threads` threads, fsync included."""
    usage = shutil.disk_usage(folder)
    if total_bytes > usage.free - usage.total // 10:
        raise SystemExit(f"{folder}: writing {total_bytes / GIB:.1f} GiB would leave less than 10% free; lower it")
    block = memoryview(os.urandom(block_bytes))
    share = total_bytes // threads
    written = [0] * threads
    errors: list[BaseException] = []
    work = Path(tempfile.mkdtemp(prefix="disk-bandwidth-", dir=folder))
    start = threading.Barrier(threads + 1)

    def writer(slot: int) -> None:
        try:
            with open(work / f"{slot}.bin", "wb", buffering=0) as fh:
                start.wait()
                deadline = time.perf_counter() + max_seconds
                while written[slot] < share and time.perf_counter() < deadline:
                    data = block[: share - written[slot]]
                    while data:
                        done = fh.write(data) or 0
                        data = data[done:]
                        written[slot] += done
                os.fsync(fh.fileno())
        except BaseException as exc:
            errors.append(exc)
            start.abort()  # nobody waits for a writer that is gone

    pool = [threading.Thread(target=writer, args=(slot,)) for slot in range(threads)]
    try:
        for thread in pool:
            thread.start()
        with contextlib.suppress(threading.BrokenBarrierError):  # a writer failed: its error is raised below
            start.wait()
        began = time.perf_counter()
        for thread in pool:
            thread.join()
        elapsed = time.perf_counter() - began
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if errors:
        raise errors[0]
    return sum(written) / elapsed


def thread_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",")]
    if any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: thread counts must be at least 1")
    return counts


def add_arguments(parser: argparse.ArgumentParser, size_gib: float = 4.0) -> None:
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="folder on the disk to test")
    parser.add_argument("--size-gib", type=float, default=size_gib, help="GiB written per thread count, in all")
    parser.add_argument("--threads", type=thread_counts, default=[1, 4, 8], help="thread counts, comma-separated")
    parser.add_argument("--block-mib", type=int, default=64, help="MiB per write(2)")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="stop writing after this long per count")


def measure(args: argparse.Namespace) -> dict[int, float]:
    """Bytes per second by thread count, as the arguments of `add_arguments` ask."""
    total = int(args.size_gib * GIB)
    return {n: write_bandwidth(args.dir, total, n, args.block_mib * MIB, args.max_seconds) for n in args.threads}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.disk_bandwidth", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    print(f"{args.dir}: {args.size_gib:g} GiB per thread count, {args.block_mib} MiB writes, fsync at the end")
    rates = measure(args)
    print_table(
        [[str(n), f"{rate / 1e9:.2f}"] for n, rate in rates.items()],
        headers=("threads", "write GB/s"),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
