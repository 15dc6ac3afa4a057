"""The decode projection shapes of Qwen3-8B and Qwen3.5-27B (N output rows, K inputs), and how a GEMV over one is
timed: weights rotated so that no call finds its matrix in the L2, CUDA-graph replays of back-to-back launches."""

from __future__ import annotations

from bench.common import graph_ms

SHAPES = {  # name -> (N, K)
    "8B.qkv": (6144, 4096), "8B.o_proj": (4096, 4096), "8B.gate_up": (24576, 4096), "8B.down": (4096, 12288),
    "8B.lm_head": (151936, 4096),
    "27B.attn_qkv": (14336, 5120), "27B.o_proj": (5120, 6144), "27B.gdn_in_proj": (16480, 5120),
    "27B.gdn_out_proj": (5120, 6144), "27B.gate_up": (34816, 5120), "27B.down": (5120, 17408),
    "27B.lm_head": (248320, 5120),
}


def time_fn(fn, weights, x, calls: int = 24, reps: int = 10) -> float:
    """Median seconds per call of fn(x, w), weights rotated (no call finds its matrix in L2), measured as CUDA
    graph replays of `calls` back-to-back launches so that host launch overhead is not counted."""
    return graph_ms(lambda i: fn(x, weights[i % len(weights)]), calls, reps) / 1e3
