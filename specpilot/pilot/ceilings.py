"""Ceilings: what the present device can do at best, measured by microbenchmarks in a few seconds.

- bandwidth: bytes read + written per second by a large device-to-device copy (the rooflines' denominator);
- peak_flops: FLOP/s of a large square matmul in the model's dtype (bf16 tensor cores on a GPU);
- kernel_s: the GPU time of one tiny kernel inside a CUDA graph (the per-kernel floor of a captured forward);
- launch_s: the time of one tiny eager launch, back to back (the host's per-kernel floor);
- sync_s: one round trip, a tiny kernel and a device-to-host read of its result (an accept's floor).
On the CPU the same quantities are measured on CPU tensors (fp32 matmul; kernel_s is launch_s there).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, fields

import torch


@dataclass(frozen=True)
class Ceilings:
    bandwidth: float  # bytes / s
    peak_flops: float  # FLOP / s
    kernel_s: float  # s per kernel in a captured graph
    launch_s: float  # s per eager launch
    sync_s: float  # s per round trip

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"Ceilings.{f.name}={v!r}: must be a positive number")

    def roofline(self, nbytes: float, flops: float) -> float:
        """Seconds of work that moves `nbytes` and does `flops` at the better of the two ceilings' limits."""
        return max(nbytes / self.bandwidth, flops / self.peak_flops)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(raw: dict) -> Ceilings:
        names = [f.name for f in fields(Ceilings)]
        if not isinstance(raw, dict) or any(n not in raw for n in names):
            raise ValueError(f"ceilings: need the fields {', '.join(names)}")
        return Ceilings(**{n: float(raw[n]) for n in names})


def measure(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> Ceilings:
    """The five ceilings of `device` (about 5 s on a GPU, well under a second on the CPU)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    if not cuda:
        dtype = torch.float32
    launch = launch_seconds(device)
    return Ceilings(bandwidth=copy_bandwidth(device), peak_flops=matmul_flops(device, dtype),
                    kernel_s=graph_kernel_seconds(device) if cuda else launch, launch_s=launch,
                    sync_s=sync_seconds(device))


def _timed(fn, device: torch.device, reps: int, warmup: int = 3) -> float:
    """Median seconds of one call of fn() (CUDA events on a GPU, wall time on the CPU)."""
    cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(out)


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Bytes read + written per second by a device-to-device copy of nbytes (64 MiB on the CPU)."""
    if device.type != "cuda":
        nbytes = min(nbytes, 64 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _timed(lambda: dst.copy_(src), device, reps)
    return 2 * nbytes / seconds


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 8192, reps: int = 10) -> float:
    """FLOP/s of an n x n x n matmul (n = 512 on the CPU)."""
    if device.type != "cuda":
        n = 512
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = _timed(lambda: torch.mm(a, b, out=out), device, reps)
    return 2.0 * n ** 3 / seconds


def launch_seconds(device: torch.device, launches: int = 200, reps: int = 5) -> float:
    """Seconds per tiny eager launch, back to back (the host issues them as fast as it can)."""
    x = torch.zeros(16, device=device)

    def burst():
        for _ in range(launches):
            x.add_(1.0)

    return _timed(burst, device, reps) / launches


def graph_kernel_seconds(device: torch.device, kernels: int = 200, reps: int = 5) -> float:
    """GPU seconds per tiny kernel replayed inside a CUDA graph."""
    x = torch.zeros(16, device=device)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):  # warm-up off the default stream, as torch's capture needs
        x.add_(1.0)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            x.add_(1.0)
    seconds = _timed(graph.replay, device, reps)
    del graph
    return seconds / kernels


def sync_seconds(device: torch.device, reps: int = 50) -> float:
    """Seconds of a tiny kernel followed by a device-to-host read of its result."""
    x = torch.zeros(16, device=device)

    def trip():
        x.add_(1.0)
        x[0].item()

    for _ in range(3):
        trip()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        trip()
        out.append(time.perf_counter() - t0)
    return max(statistics.median(out), 1e-9)
