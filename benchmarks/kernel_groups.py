"""One call's GPU kernels, from the torch profiler, summed by name and grouped as a training step's profile
reads: matrix products, attention forward and backward, SiLU, norms, the loss, the optimizer, gathers,
copies and casts, and the rest. The groups go by kernel name (cuBLAS's, torch's own, inductor's fused
kernels, which name the aten ops they fuse, and ours), first match wins; the full list by name is kept
too, so a file of it can be regrouped later without the GPU.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks._device_timing import synchronize

# First match wins: a fused inductor kernel named for silu and a cast is SiLU's; one for rsqrt a norm's.
# The teacher's products are among the matrix products.
GROUPS: tuple[tuple[str, str], ...] = (
    ("SiLU and multiply", r"silu|swiglu"),
    ("attention bwd", r"_key_grads_kernel|_query_grads_kernel|flex_attention_backward|flex_bwd"),
    ("attention fwd", r"ttt_attention|_forward_kernel|flex_attention|flex_fwd"),
    ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|splitk|triton_tem_fused_(add)?mm|triton_tem_fused_bmm"),
    ("loss", r"_soft_ce|log_softmax_(forward|backward)_kernel|cross_entropy|nll_loss"),
    ("teacher", r"_row_stats_kernel"),
    ("optimizer", r"Adam|adam|LpNorm|lpnorm|Foreach|foreach|multi_tensor|grad_norm|clip"),
    ("norms", r"rms|rsqrt|layer_norm|RowwiseMoments|GammaBeta|norm_kernel|ComputeInternalGradients"),
    ("gathers and scatters", r"index|gather|scatter|embedding|Embedding|nonzero"),
    ("copies and casts", r"copy|Copy|Memcpy|Memset|fill|CatArray|cat_|_to_copy|convert"),
)
OTHER = "other elementwise and reductions"


def group_of(name: str) -> str:
    for group, pattern in GROUPS:
        if re.search(pattern, name):
            return group
    return OTHER


@dataclass
class Kernels:
    """Per kernel name: (launches, device microseconds) over the profiled call; the device's idle gaps
    between its first kernel's start and its last one's end, as (ms, the kernel before, the one after)."""

    by_name: dict[str, tuple[int, float]]
    gaps: list[tuple[float, str, str]]

    def total_ms(self) -> float:
        return sum(us for _, us in self.by_name.values()) / 1e3

    def groups(self) -> dict[str, tuple[int, float]]:
        """Per group: (launches, milliseconds), largest first."""
        sums: dict[str, list[float]] = {}
        for name, (calls, us) in self.by_name.items():
            entry = sums.setdefault(group_of(name), [0, 0.0])
            entry[0] += calls
            entry[1] += us / 1e3
        return dict(sorted(((g, (int(c), ms)) for g, (c, ms) in sums.items()), key=lambda kv: -kv[1][1]))

    def top(self, count: int) -> list[tuple[str, int, float]]:
        """The `count` kernels of most device time: (name, launches, ms)."""
        ordered = sorted(self.by_name.items(), key=lambda kv: -kv[1][1])[:count]
        return [(name, calls, us / 1e3) for name, (calls, us) in ordered]

    def idle_ms(self) -> float:
        return sum(ms for ms, _, _ in self.gaps)

    def to_json(self) -> dict[str, Any]:
        return {
            "total_ms": self.total_ms(),
            "idle_ms": self.idle_ms(),
            "gaps": sorted(self.gaps, reverse=True)[:20],
            "groups": {g: {"launches": c, "ms": ms} for g, (c, ms) in self.groups().items()},
            "kernels": [[name, calls, us] for name, (calls, us) in self.by_name.items()],
        }

    def report(self, top: int = 15) -> str:
        total = self.total_ms()
        lines = [f"{'group':<34}{'launches':>9}{'ms':>10}{'share':>8}"]
        for group, (calls, ms) in self.groups().items():
            lines.append(f"{group:<34}{calls:>9}{ms:>10.2f}{ms / total:>8.1%}")
        lines.append(f"{'all kernels':<34}{sum(c for c, _ in self.by_name.values()):>9}{total:>10.2f}")
        lines.append(f"{'device idle between them':<34}{len(self.gaps):>9}{self.idle_ms():>10.2f}")
        for ms, before, after in sorted(self.gaps, reverse=True)[:5]:
            lines.append(f"  idle {ms:6.2f} ms after {before[:60]} before {after[:60]}")
        lines.append(f"top {top} kernels (ms, launches, group):")
        for name, calls, ms in self.top(top):
            lines.append(f"  {ms:8.2f} {calls:5d}  {group_of(name):<22} {name[:100]}")
        return "\n".join(lines)


def profile_kernels(call: Callable[[], Any], device: torch.device | str) -> Kernels:
    """The kernels `call` ran on the device, summed by name."""
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        synchronize(device)
    by_name: dict[str, tuple[int, float]] = {}
    spans = []
    for event in prof.events():
        if event.device_type == DeviceType.CPU:
            continue
        calls, us = by_name.get(event.name, (0, 0.0))
        by_name[event.name] = (calls + 1, us + event.device_time_total)
        spans.append((event.time_range.start, event.time_range.end, event.name))
    return Kernels(by_name, idle_gaps(spans))


def idle_gaps(spans: list[tuple[float, float, str]], least_us: float = 10.0) -> list[tuple[float, str, str]]:
    """The gaps of at least `least_us` when no kernel of `spans` (start us, end us, name) ran."""
    gaps = []
    busy_until, last = float("inf"), ""
    for start, end, name in sorted(spans):
        if start - busy_until >= least_us:
            gaps.append(((start - busy_until) / 1e3, last, name))
        if end >= busy_until or busy_until == float("inf"):
            busy_until, last = end, name
    return gaps
