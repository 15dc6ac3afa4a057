"""Fused recurrent gated delta rule for decode and short verify runs: one Triton kernel does the gating,
q/k L2 norm, the per-token state update and the output, reading and writing the state in place in a slot pool."""

import torch
import triton
import triton.language as tl

from .reference import L2NORM_EPS

_EPS = tl.constexpr(L2NORM_EPS)


@triton.jit
def _fused_recurrent_gdn_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, pool_ptr, idx_ptr, o_ptr,
    T, HV, V, scale,
    sq_b, sq_t, sq_h,
    sk_b, sk_t, sk_h,
    sv_b, sv_t, sv_h,
    sa_b, sa_t,
    sb_b, sb_t,
    GROUP: tl.constexpr,
    K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Program (i_v, b * HV + hv) owns the state tile [K, BLOCK_V] of value head hv of request b."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = (i_bh // HV).to(tl.int64)
    i_hv = i_bh % HV
    i_h = i_hv // GROUP
    offs_k = tl.arange(0, K)
    offs_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_v = offs_v < V

    slot = tl.load(idx_ptr + i_b).to(tl.int64)
    state_off = ((slot * HV + i_hv) * K + offs_k[:, None]) * V + offs_v[None, :]
    state_mask = (offs_k[:, None] < K) & mask_v[None, :]
    S = tl.load(pool_ptr + state_off, mask=state_mask, other=0.0).to(tl.float32)

    neg_A = -tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + i_hv).to(tl.float32)

    q_base = q_ptr + i_b * sq_b + i_h * sq_h
    k_base = k_ptr + i_b * sk_b + i_h * sk_h
    v_base = v_ptr + i_b * sv_b + i_hv * sv_h
    o_base = o_ptr + ((i_b * T) * HV + i_hv) * V
    for t in range(T):
        q = tl.load(q_base + t * sq_t + offs_k).to(tl.float32)
        k = tl.load(k_base + t * sk_t + offs_k).to(tl.float32)
        v = tl.load(v_base + t * sv_t + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + i_b * sa_b + t * sa_t + i_hv).to(tl.float32)
        b = tl.load(b_ptr + i_b * sb_b + t * sb_t + i_hv).to(tl.float32)

        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + _EPS) * scale
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + _EPS)
        x = a + dt_bias
        # Same cut-over as torch softplus: above 20, log(1 + e^x) == x in fp32 and e^x would overflow.
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
        g = neg_A * softplus
        beta = 1.0 / (1.0 + tl.exp(-b))

        S = S * tl.exp(g)
        u = beta * (v - tl.sum(S * k[:, None], axis=0))
        S = S + k[:, None] * u[None, :]
        o = tl.sum(S * q[:, None], axis=0)
        tl.store(o_base + t * HV * V + offs_v, o.to(o_ptr.dtype.element_ty), mask=mask_v)

    tl.store(pool_ptr + state_off, S.to(pool_ptr.dtype.element_ty), mask=state_mask)


def _unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    """Kernel addresses the last dim densely and the others by stride; copy only if the last dim is strided."""
    return x if x.stride(-1) == 1 else x.contiguous()


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_pool: torch.Tensor,
    state_idx: torch.Tensor,
    scale: float | None = None,
    *,
    block_v: int = 32,
    num_warps: int = 4,
) -> torch.Tensor:
    """Same contract as reference.fused_recurrent_gated_delta_rule_ref.

    q, k [B,T,H,K]; v [B,T,HV,V]; a, b [B,T,HV]; A_log, dt_bias [HV]; state_pool [N,HV,K,V] fp32 contiguous,
    updated in place; state_idx [B] int (distinct slots). Returns o [B,T,HV,V] in v.dtype.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[-2:]
    assert k.shape == q.shape and v.shape[:2] == (B, T), "q, k, v shapes disagree"
    assert a.shape == b.shape == (B, T, HV), f"a, b must be [B,T,HV]={B, T, HV}"
    assert HV % H == 0, f"value heads {HV} not a multiple of key heads {H}"
    assert K & (K - 1) == 0 and K <= 256, f"K={K} must be a power of two <= 256"
    assert state_pool.is_contiguous() and state_pool.shape[1:] == (HV, K, V), "state_pool must be [N,HV,K,V]"
    assert state_pool.dtype == torch.float32, "state_pool must be fp32"
    assert state_idx.shape == (B,), "state_idx must be [B]"
    assert A_log.is_contiguous() and dt_bias.is_contiguous() and state_idx.is_contiguous()
    q, k, v, a, b = (_unit_last_stride(x) for x in (q, k, v, a, b))
    scale = K**-0.5 if scale is None else scale
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=v.device)
    block_v = min(block_v, triton.next_power_of_2(V))
    grid = (triton.cdiv(V, block_v), B * HV)
    _fused_recurrent_gdn_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, state_pool, state_idx, o,
        T, HV, V, scale,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1),
        GROUP=HV // H, K=K, BLOCK_V=block_v,
        num_warps=num_warps,
    )
    return o
