"""Triton decode prologue: one program per (request * token, head) over the H query heads then the KVH key heads.

A query program normalises and rotates its q row into the output; a key program does the same to its k row
and writes it, with the v row, straight into the cache slot. Every rounding of the eager torch path is
repeated (casts to the activation dtype between the steps), so the fused kernel matches it in bf16 too.
"""

import torch
import triton
import triton.language as tl

from specpilot.ops.pdl import launch_kwargs, usable
from specpilot.ops.pdl_wait import wait_for_inputs


@triton.jit
def _round(x, dtype: tl.constexpr):
    """fp32 x rounded to the activation dtype (to nearest even, as eager torch rounds every intermediate) and
    back to fp32; a no-op in fp32."""
    if dtype == tl.bfloat16:
        # by hand: the interpreter truncates fp32 -> bf16 casts, and on a GPU this costs about what the cast does
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        y = bits.to(tl.float32, bitcast=True)
    else:
        y = x.to(dtype).to(tl.float32)
    return y


@triton.jit
def _scale(x, w_ptrs, rstd, mask, dtype: tl.constexpr, ZERO_CENTERED: tl.constexpr):
    w = tl.load(w_ptrs, mask=mask, other=0.0).to(tl.float32)
    n = x * rstd
    if ZERO_CENTERED:
        y = _round(n * (1.0 + w), dtype)  # (1 + w) applied in fp32, then cast
    else:
        y = _round(w * _round(n, dtype), dtype)  # cast, then scaled in the activation dtype
    return y


@triton.jit
def _norm_rope(x_ptr, w_ptr, cos_ptr, sin_ptr, eps, D: tl.constexpr, R: tl.constexpr, BLOCK_D: tl.constexpr,
               HAS_NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr):
    """One head row -> its normalised, rotated values [BLOCK_D] fp32, each exactly representable in x's dtype."""
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    half = R // 2
    # rotate-half partner of each rotary dim: the row is read twice (L1 hits) instead of permuting registers
    partner = tl.where(offs < half, offs + half, tl.where(offs < R, offs - half, offs))
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    dtype = x.dtype
    x = x.to(tl.float32)
    xp = tl.load(x_ptr + partner, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = tl.rsqrt(tl.sum(x * x, 0) / D + eps)
        x = _scale(x, w_ptr + offs, rstd, mask, dtype, ZERO_CENTERED)
        xp = _scale(xp, w_ptr + partner, rstd, mask, dtype, ZERO_CENTERED)
    rotary = offs < R
    cos = _round(tl.load(cos_ptr + offs, mask=rotary, other=0.0), dtype)
    sin = _round(tl.load(sin_ptr + offs, mask=rotary, other=0.0), dtype)
    xp = tl.where(offs < half, -xp, xp)
    rot = _round(_round(x * cos, dtype) + _round(xp * sin, dtype), dtype)
    return tl.where(rotary, rot, x)


@triton.jit
def _qk_norm_rope_store_kernel(q_ptr, k_ptr, v_ptr, out_ptr, kc_ptr, vc_ptr, slot_ptr, loc_ptr, cos_ptr, sin_ptr,
                               qw_ptr, kw_ptr, eps, T, H, KVH, S, sq_b, sq_t, sq_h, sk_b, sk_t, sk_h,
                               sv_b, sv_t, sv_h, D: tl.constexpr, R: tl.constexpr, BLOCK_D: tl.constexpr,
                               HAS_NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr, PDL: tl.constexpr = False):
    wait_for_inputs(PDL)
    i_bt = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    b = i_bt // T
    t = i_bt % T
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    cos_row, sin_row = cos_ptr + i_bt * R, sin_ptr + i_bt * R
    if head < H:
        q_row = q_ptr + b * sq_b + t * sq_t + head * sq_h
        q = _norm_rope(q_row, qw_ptr, cos_row, sin_row, eps, D, R, BLOCK_D, HAS_NORM, ZERO_CENTERED)
        tl.store(out_ptr + (i_bt * H + head) * D + offs, q.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        h = head - H
        k_row = k_ptr + b * sk_b + t * sk_t + h * sk_h
        k = _norm_rope(k_row, kw_ptr, cos_row, sin_row, eps, D, R, BLOCK_D, HAS_NORM, ZERO_CENTERED)
        v = tl.load(v_ptr + b * sv_b + t * sv_t + h * sv_h + offs, mask=mask)
        slot = tl.load(slot_ptr + b).to(tl.int64)
        pos = tl.load(loc_ptr + i_bt).to(tl.int64)
        dst = ((slot * KVH + h) * S + pos) * D + offs
        tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def supports(q, k, q_weight, k_weight, cos) -> bool:
    """Any head dim (padded to a power of two, masked); rotary dims an even number of at most the head dim (the
    rotate-half partner of each dim is R / 2 away); norm weights of the activations' dtype, as the kernel rounds
    in that dtype."""
    D, R = q.shape[-1], cos.shape[-1]
    norms_ok = q_weight is None or (q_weight.dtype == k_weight.dtype == q.dtype == k.dtype
                                    and q_weight.shape == k_weight.shape == (D,))
    return R % 2 == 0 and R <= D and norms_ok


def qk_norm_rope_store(q, k, v, q_weight, k_weight, cos, sin, eps: float, zero_centered: bool,
                       k_cache, v_cache, slots, loc, pdl: bool = False) -> torch.Tensor:
    """Same contract as qk_norm_rope_store_ref; pdl: launch with programmatic dependent launch (ops/pdl.py)."""
    B, T, H, D = q.shape
    KVH, R = k.shape[2], cos.shape[-1]
    N, _, S, _ = k_cache.shape
    assert k.shape == v.shape == (B, T, KVH, D) and k_cache.shape == v_cache.shape == (N, KVH, S, D)
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous [N, KVH, S, D]"
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1, "head dim must be dense"
    assert cos.shape == sin.shape == (B, T, R) and slots.shape == (B,) and loc.shape == (B, T)
    assert supports(q, k, q_weight, k_weight, cos), f"R={R}, D={D}: the kernel does not take them (see supports)"
    has_norm = q_weight is not None
    cos, sin, loc, slots = cos.contiguous(), sin.contiguous(), loc.contiguous(), slots.contiguous()
    out = torch.empty(B, T, H, D, dtype=q.dtype, device=q.device)
    block_d = triton.next_power_of_2(D)
    on = usable(q, pdl)
    # one row of D values per program: a single warp holds it, and the row sum needs no shared memory
    _qk_norm_rope_store_kernel[(B * T, H + KVH)](
        q, k, v, out, k_cache, v_cache, slots, loc, cos, sin,
        q_weight if has_norm else q, k_weight if has_norm else k, eps, T, H, KVH, S,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        D=D, R=R, BLOCK_D=block_d, HAS_NORM=has_norm, ZERO_CENTERED=zero_centered, num_warps=max(1, block_d // 256),
        PDL=on, **launch_kwargs(on))
    return out
