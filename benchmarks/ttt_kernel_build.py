"""The TTT attention kernels built for Hopper (sm_90) on a machine without a GPU: each kernel's registers,
stack (spilled registers) and shared memory, per head_dim's tiles and TTT step count, at no device time.

    python -m benchmarks.ttt_kernel_build [--steps 0,6] [--head-dims 128] [--tiles KERNEL,ROWS,KEYS,WARPS,STAGES]

Triton compiles for a target it is given, and its wheel carries ptxas and cuobjdump. Arguments are
specialised as the JIT specialises them on the GPU (pointers and strides divisible by 16, the trainer's case),
so the report matches a GPU build: ttt_kernel.py's dQ kernel read 640 B of stack at 6 steps here and in
the H200 build of the same code. Triton's interpreter, which the CPU tests run the kernels under, accepts
code its compiler refuses (a helper returning tiles of two shapes from the branches of a constexpr if, a loop
variable whose tile shape changes): tests/test_ttt_kernel.py builds them here too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import tempfile
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from backends.train import ttt_kernel
from backends.train.ttt_kernel import Blocks
from benchmarks._common import print_table

HOPPER = GPUTarget("cuda", 90, 32)
GROUPS = 4  # the Llama-3.1-8B draft's 32 heads over 8 kv heads
TUPLES = {"KD": "*bf16", "VD": "*bf16", "KWD": "*i32", "dKD": "*bf16", "dVD": "*bf16"}
CONSTANTS = {"HEAD_DIM", "G", "STEPS", "BLOCK_G", "BLOCK_T", "BLOCK_N", "BLOCK_D"}
INTS = {"T", "KV_HEADS"}
MAPS = {"QW", "KW0"}
FLOAT32 = {"Lse", "Delta"}


def _type(name: str, steps: int) -> str | tuple[str, ...]:
    if name in TUPLES:
        return (TUPLES[name],) * steps
    if name in MAPS:
        return "*i32"
    if name in FLOAT32:
        return "*fp32"
    if name.endswith("scale"):  # before the strides' "s": sm_scale is a float
        return "fp32"
    if name in INTS or name.startswith("s"):
        return "i32"
    return "*bf16"  # the tensors: Q, K0, V0, Out, dO, dQ, dK0, dV0


def build(kernel: Any, blocks: Blocks, head_dim: int, steps: int) -> dict[str, int]:
    """Compile one kernel for sm_90; its resource use as cuobjdump reports it (REG, STACK, SHARED)."""
    block_g, block_t = ttt_kernel._tile(blocks.rows, GROUPS)
    constants = {
        "HEAD_DIM": head_dim,
        "G": GROUPS,
        "STEPS": steps,
        "BLOCK_G": block_g,
        "BLOCK_T": block_t,
        "BLOCK_N": blocks.keys,
        "BLOCK_D": triton.next_power_of_2(head_dim),
    }
    signature: dict[str, Any] = {}
    values: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    for i, name in enumerate(kernel.arg_names):
        if name in CONSTANTS:
            signature[name] = "constexpr"
            values[(i,)] = constants[name]
            continue
        kind = _type(name, steps)
        signature[name] = kind
        # What the JIT specialises on the GPU: 16-byte aligned pointers, strides and lengths divisible by 16.
        if isinstance(kind, tuple):
            attrs.update({(i, j): [["tt.divisibility", 16]] for j in range(len(kind))})
        elif kind.startswith("*") or (kind == "i32" and name != "KV_HEADS"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(
        ASTSource(kernel, signature, values, attrs),
        target=HOPPER,
        options={"num_warps": blocks.warps, "num_stages": blocks.stages},
    )
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        with open(cubin, "wb") as fh:
            fh.write(compiled.asm["cubin"])
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        report = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    line = next(row for row in report.splitlines() if "REG:" in row)
    fields = dict(field.split(":") for field in line.split() if ":" in field)
    return {"registers": int(fields["REG"]), "stack": int(fields["STACK"]), "shared": int(compiled.metadata.shared)}


KERNELS = {
    "forward": ttt_kernel._forward_kernel,
    "key_grads": ttt_kernel._key_grads_kernel,
    "query_grads": ttt_kernel._query_grads_kernel,
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ttt_kernel_build", description=__doc__)
    parser.add_argument("--steps", default="0,6", help="comma list of earlier TTT steps (the kernel's STEPS)")
    parser.add_argument("--head-dims", default="128", help=f"comma list of {', '.join(map(str, ttt_kernel.CONFIGS))}")
    parser.add_argument("--tiles", action="append", default=[], help="KERNEL,ROWS,KEYS,WARPS,STAGES to build too")
    args = parser.parse_args()
    rows = []
    for head_dim in (int(d) for d in args.head_dims.split(",")):
        config = ttt_kernel.CONFIGS[head_dim]
        choices = [(part, getattr(config, part)) for part in KERNELS]
        for tile in args.tiles:
            part, *numbers = tile.split(",")
            choices.append((part, Blocks(*map(int, numbers))))
        for steps in (int(s) for s in args.steps.split(",")):
            for part, blocks in choices:
                used = build(KERNELS[part], blocks, head_dim, steps)
                rows.append(
                    [part, str(head_dim), str(steps), str(dataclasses.astuple(blocks)), *map(str, used.values())]
                )
    print_table(
        rows, ("kernel", "head_dim", "steps", "tiles (rows, keys, warps, stages)", "registers", "stack B", "shared B")
    )


if __name__ == "__main__":
    main()
