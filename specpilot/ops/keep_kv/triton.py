"""Triton K/V compaction of kept tree paths: one launch moves K and V of every layer, head and request.

One program per (layer * kv head, request) walks the request's path in order. Kept node j of the path lands at
base + j from base + nodes[j] >= base + j, and a later move never writes where an earlier one has yet to read
(sources grow with j), so the in-order walk needs no staging copy. Every thread reloads only the elements it
stored itself, so no barrier is needed between steps either.
"""

import torch
import triton
import triton.language as tl

from specpilot.ops.path_index import NODES, PathIndex


# the path length (and so the index's row stride) changes from step to step: unspecialised, so that a new value
# does not compile a new variant in the middle of a run
@triton.jit(do_not_specialize=["P", "idx_b"])
def _keep_kv_kernel(k_ptr, v_ptr, idx_ptr, KVH, P, s_l, s_n, s_h, s_s, idx_b,
                    D: tl.constexpr, BD: tl.constexpr, FIRST: tl.constexpr):
    lh = tl.program_id(0)
    b = tl.program_id(1)
    layer = (lh // KVH).to(tl.int64)
    h = lh % KVH
    entry = idx_ptr + b * idx_b
    slot = tl.load(entry + 1).to(tl.int64)
    base = tl.load(entry + 2)
    n = tl.load(entry + 3)
    offs = tl.arange(0, BD)
    d_ok = offs < D
    head = layer * s_l + slot * s_n + h * s_h + offs
    for j in range(0, P):
        node = tl.load(entry + FIRST + j)
        # where, not &: the interpreter rejects a block mask combined with a scalar one
        ok = tl.where((j < n) & (node != j), d_ok, False)
        src = head + (base + node) * s_s
        dst = head + (base + j) * s_s
        kv = tl.load(k_ptr + src, mask=ok)
        vv = tl.load(v_ptr + src, mask=ok)
        tl.store(k_ptr + dst, kv, mask=ok)
        tl.store(v_ptr + dst, vv, mask=ok)


def keep_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, index: PathIndex, *, num_warps: int = 1) -> None:
    """Same contract as keep_kv_ref."""
    L, N, KVH, S, D = k_cache.shape
    assert v_cache.shape == k_cache.shape and v_cache.stride() == k_cache.stride(), "K and V caches alike"
    assert k_cache.stride(-1) == 1, "head dim must be dense"
    packed = index.packed.contiguous()
    B, P = packed.shape[0], packed.shape[1] - NODES
    if B == 0 or L == 0:
        return
    _keep_kv_kernel[(L * KVH, B)](k_cache, v_cache, packed, KVH, P, k_cache.stride(0), k_cache.stride(1),
                                  k_cache.stride(2), k_cache.stride(3), packed.stride(0), D=D,
                                  BD=triton.next_power_of_2(D), FIRST=NODES, num_warps=num_warps)
