"""Fused recurrent gated delta rule for decode and short verify runs: one Triton kernel does the gating,
q/k L2 norm, the per-token state update and the output, reading and writing the state in place in a slot pool.
Also the chunked prefill form in one launch. A key head dim that is not a power of two is padded to one (masked);
supports says what the kernels take."""

import torch
import triton
import triton.language as tl

from ..dispatch import fits_tile, tile_width
from .blocks import (decay_matrix, dot, l2_norm_factors, neumann_solve, program_heads, qk_state_products,
                     slice_mask)
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
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Program (i_v, b * HV + hv) owns the state tile [K, BLOCK_V] of value head hv of request b (K padded to
    BLOCK_K: the padding rows hold zeros and are never stored)."""
    i_v, i_b, i_hv, i_h = program_heads(HV, GROUP)
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    offs_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_v = offs_v < V

    slot = tl.load(idx_ptr + i_b).to(tl.int64)
    state_off = ((slot * HV + i_hv) * K + offs_k[:, None]) * V + offs_v[None, :]
    state_mask = mask_k[:, None] & mask_v[None, :]
    S = tl.load(pool_ptr + state_off, mask=state_mask, other=0.0).to(tl.float32)

    neg_A = -tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + i_hv).to(tl.float32)

    q_base = q_ptr + i_b * sq_b + i_h * sq_h
    k_base = k_ptr + i_b * sk_b + i_h * sk_h
    v_base = v_ptr + i_b * sv_b + i_hv * sv_h
    o_base = o_ptr + ((i_b * T) * HV + i_hv) * V
    for t in range(T):
        if BLOCK_K == K:  # no padding: the unmasked loads a power-of-two K always compiled to
            q = tl.load(q_base + t * sq_t + offs_k).to(tl.float32)
            k = tl.load(k_base + t * sk_t + offs_k).to(tl.float32)
        else:
            q = tl.load(q_base + t * sq_t + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            k = tl.load(k_base + t * sk_t + offs_k, mask=mask_k, other=0.0).to(tl.float32)
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


def supports(q: torch.Tensor) -> bool:
    """Both kernels take a key head dim of up to MAX_TILE (padded to a power of two) and any value head dim
    (tiled)."""
    return fits_tile(q.shape[-1])


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
    assert supports(q), f"K={K}: the kernel does not take it (see supports)"
    assert state_pool.is_contiguous() and state_pool.shape[1:] == (HV, K, V), "state_pool must be [N,HV,K,V]"
    assert state_pool.dtype == torch.float32, "state_pool must be fp32"
    assert state_idx.shape == (B,), "state_idx must be [B]"
    A_log, dt_bias, state_idx = A_log.contiguous(), dt_bias.contiguous(), state_idx.contiguous()
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
        GROUP=HV // H, K=K, BLOCK_K=tile_width(K, least=1), BLOCK_V=block_v,
        num_warps=num_warps,
    )
    return o


@triton.jit
def _chunk_gdn_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, ws_ptr, o_ptr,
                      T, HV, V, scale,
                      sq_b, sq_t, sq_h, sq_k, sk_b, sk_t, sk_h, sk_k, sv_b, sv_t, sv_h, sv_v, ws_n,
                      GROUP: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
                      PREC: tl.constexpr, EVEN_K: tl.constexpr):
    """Program (i_v, b * HV + hv) runs the chunks of request b, value head hv, value columns of tile i_v in order.

    The [K, BV] state lives in the two halves of the workspace ws: chunk c reads half (c + 1) % 2 (the initial
    state is in half 1) and writes half c % 2, so that no location is read and written in one chunk (a replicated
    element could otherwise be rewritten before another thread has read it); a barrier per chunk publishes the
    writes to the next chunk. K goes in BK-wide slices; without EVEN_K the last slice is masked (its padding
    columns load as zeros and are never stored)."""
    i_v, b, hv, h = program_heads(HV, GROUP)
    offs_c = tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    v_ok = offs_v < V
    tile = ws_ptr + (b * HV + hv) * K * V + (offs_c[:, None] * V + offs_v[None, :])
    q_base = q_ptr + b * sq_b + h * sq_h
    k_base = k_ptr + b * sk_b + h * sk_h
    v_base = v_ptr + b * sv_b + hv * sv_h
    for c in range(0, tl.cdiv(T, BT)):
        # the masks depend on the chunk so that they are not hoisted out of the loop (and held in registers)
        t = c * BT + tl.arange(0, BT)
        row_ok = t < T
        causal = t[:, None] >= t[None, :]
        src = tile + ((c + 1) % 2) * ws_n
        dst = tile + (c % 2) * ws_n
        q_rows = q_base + t[:, None] * sq_t + offs_c[None, :] * sq_k
        k_rows = k_base + t[:, None] * sk_t + offs_c[None, :] * sk_k
        # q and k go through K in BK-wide slices (blocks.py): one pass for the norms, one for the products with k
        # and the state, one for the state's update
        q_scale, k_scale = l2_norm_factors(q_rows, k_rows, sq_k, sk_k, row_ok, offs_c, scale, _EPS, K, BK, EVEN_K)
        kk, qk, ks, qs = qk_state_products(q_rows, k_rows, sq_k, sk_k, q_scale, k_scale, src, V, row_ok, v_ok, offs_c,
                                           None, None, False, K, BK, BV, EVEN_K, PREC)
        vals = tl.load(v_base + t[:, None] * sv_t + offs_v[None, :] * sv_v, mask=row_ok[:, None] & v_ok[None, :],
                       other=0.0).to(tl.float32)
        gb = (b * T + t) * HV + hv
        g = tl.load(g_ptr + gb, mask=row_ok, other=0.0)
        beta = tl.load(beta_ptr + gb, mask=row_ok, other=0.0)
        # padded rows have g = beta = 0 and k = 0: their u is 0 and they leave the state alone
        G = tl.sum(tl.where(causal, g[None, :], 0.0), axis=1)  # [BT] cumulative log-decay within the chunk
        G_last = tl.sum(g, axis=0)
        D = decay_matrix(G, causal)
        A = tl.where(t[:, None] > t[None, :], beta[:, None] * D * kk, 0.0)
        qkd = qk * D  # formed now, so that kk, qk and D are dead before the solve
        rhs = beta[:, None] * (vals - tl.exp(G)[:, None] * ks)
        # a chunk is a chain: its longest path is its token count
        o, u = neumann_solve(A, rhs, qkd, qs, G, tl.minimum(T - c * BT, BT), PREC)
        tl.store(o_ptr + ((b * T + t[:, None]) * HV + hv) * V + offs_v[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & v_ok[None, :])
        w = tl.exp(G_last - G) * k_scale  # [BT] each write's decay to the chunk's end, with k's norm
        for kc0 in tl.static_range(0, K, BK):
            kc = tl.load(k_rows + kc0 * sk_k, mask=slice_mask(row_ok, offs_c, kc0, K, EVEN_K), other=0.0)
            kc = kc.to(tl.float32) * w[:, None]
            s_ok = slice_mask(v_ok, offs_c, kc0, K, EVEN_K, rows=True)
            sc = tl.load(src + kc0 * V, mask=s_ok, other=0.0)
            tl.store(dst + kc0 * V, tl.exp(G_last) * sc + dot(tl.trans(kc), u, PREC), mask=s_ok)
        # the next chunk reads state columns that other threads of this program wrote
        tl.debug_barrier()


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           initial_state: torch.Tensor | None = None, scale: float | None = None,
                           chunk_size: int = 64, *, block_v: int = 32, block_k: int = 32, num_warps: int = 4,
                           precision: str = "tf32x3") -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as chunk.chunk_gated_delta_rule, in one launch (plus the copy of the initial state into the
    workspace): q, k [B,T,H,K]; v [B,T,HV,V] (any strides: views of the conv output, whose channels the torch
    prefill conv leaves strided); g, beta [B,T,HV] fp32; initial_state [B,HV,K,V] fp32 or None (zeros) ->
    (o [B,T,HV,V] in v.dtype, final state [B,HV,K,V] fp32). chunk_size (a power of two in [16, 64]) is the token
    tile; precision the tl.dot input precision of the fp32 products (tf32x3: three tf32 products, fp32-accurate,
    the tree kernel's at 64 nodes)."""
    B, T, H, K = q.shape
    HV, V = v.shape[-2:]
    assert k.shape == q.shape and v.shape[:2] == (B, T) and HV % H == 0, "q, k, v shapes disagree"
    assert g.shape == beta.shape == (B, T, HV), f"g, beta must be [B,T,HV]={B, T, HV}"
    assert supports(q), f"K={K}: the kernel does not take it (see supports)"
    assert chunk_size & (chunk_size - 1) == 0 and 16 <= chunk_size <= 64, f"chunk_size={chunk_size}"
    assert T > 0, "an empty block has no chunk"
    g, beta = g.float().contiguous(), beta.float().contiguous()
    ws = torch.empty(2, B, HV, K, V, dtype=torch.float32, device=v.device)
    if initial_state is None:
        ws[1].zero_()
    else:
        ws[1].copy_(initial_state)
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=v.device)
    BT = min(chunk_size, max(16, triton.next_power_of_2(T)))
    block_v = min(block_v, tile_width(V))
    block_k = min(block_k, tile_width(K))  # K slices of at least 16 (tl.dot), masked where K is not a multiple
    grid = (triton.cdiv(V, block_v), B * HV)
    _chunk_gdn_kernel[grid](q, k, v, g, beta, ws, o, T, HV, V, K**-0.5 if scale is None else scale,
                            *q.stride(), *k.stride(), *v.stride(), ws.stride(0),
                            GROUP=HV // H, K=K, BT=BT, BV=block_v, BK=block_k, PREC=precision,
                            EVEN_K=K % block_k == 0, num_warps=num_warps)
    return o, ws[(triton.cdiv(T, BT) - 1) % 2]
