"""Triton K/V store: one program per (request, token, kv head) copies that head's K and V rows (any head dim:
the row is padded to a power-of-two tile and masked)."""

import torch
import triton
import triton.language as tl

from specpilot.ops.dispatch import tile_width


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, loc_ptr, T, KVH, S,
                     sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, D: tl.constexpr, BLOCK_D: tl.constexpr):
    i_bt = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = (i_bt // T).to(tl.int64)
    t = i_bt % T
    slot = tl.load(slot_ptr + b).to(tl.int64)
    pos = tl.load(loc_ptr + i_bt).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    dst = ((slot * KVH + h) * S + pos) * D + offs
    k_src = k_ptr + b * sk_b + t * sk_t + h * sk_h + offs
    v_src = v_ptr + b * sv_b + t * sv_t + h * sv_h + offs
    if BLOCK_D == D:  # no padding: unmasked, as a power-of-two head dim always compiled
        tl.store(kc_ptr + dst, tl.load(k_src).to(kc_ptr.dtype.element_ty))
        tl.store(vc_ptr + dst, tl.load(v_src).to(vc_ptr.dtype.element_ty))
    else:
        ok = offs < D
        tl.store(kc_ptr + dst, tl.load(k_src, mask=ok).to(kc_ptr.dtype.element_ty), mask=ok)
        tl.store(vc_ptr + dst, tl.load(v_src, mask=ok).to(vc_ptr.dtype.element_ty), mask=ok)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor, loc: torch.Tensor) -> None:
    """Same contract as store_kv_ref."""
    B, T, KVH, D = k.shape
    N, _, S, _ = k_cache.shape
    assert v.shape == k.shape and k_cache.shape == v_cache.shape == (N, KVH, S, D)
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous [N, KVH, S, D]"
    assert k.stride(-1) == 1 and v.stride(-1) == 1, "head dim must be dense"
    loc, slots = loc.contiguous(), slots.contiguous()
    assert slots.shape == (B,) and loc.shape == (B, T)
    _store_kv_kernel[(B * T, KVH)](k, v, k_cache, v_cache, slots, loc, T, KVH, S,
                                  k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), D=D,
                                  BLOCK_D=tile_width(D, least=1))
