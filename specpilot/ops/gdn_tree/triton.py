"""Triton kernel for the tree-masked gated delta rule (the one-shot WY form of chunk.py), one launch per layer.

One program per (value-tile, request * value head). The tree's T nodes (padded to BT, a power of two >= 16)
fit one tile: the program builds the path-summed decay G = P g, the masked decay D, A = beta D (K K^T) below the
diagonal, inverts the unit lower-triangular (I + A) by the nilpotent product (I - A)(I + A^2)(I + A^4)...
(log2 BT matrix products, no sequential solve), and writes the outputs and the fold stash (normalised k, u, G).
Value columns are independent in the solve, so the [K, V] committed state is read in [K, BV] tiles.
"""

import torch
import triton
import triton.language as tl

from specpilot.ops.gated_delta_rule.reference import L2NORM_EPS


@triton.jit
def _dot(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _tree_gdn_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, mask_ptr, s0_ptr, o_ptr, kn_ptr, u_ptr, G_ptr,
                     T, HV, V, scale,
                     sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
                     GROUP: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, LOG2_BT: tl.constexpr,
                     EPS: tl.constexpr):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    b = (i_bh // HV).to(tl.int64)
    hv = i_bh % HV
    h = hv // GROUP
    rows = tl.arange(0, BT)
    row_ok = rows < T
    offs_k = tl.arange(0, K)
    offs_v = i_v * BV + tl.arange(0, BV)
    v_ok = offs_v < V

    q = tl.load(q_ptr + b * sq_b + rows[:, None] * sq_t + h * sq_h + offs_k[None, :], mask=row_ok[:, None], other=0.0)
    k = tl.load(k_ptr + b * sk_b + rows[:, None] * sk_t + h * sk_h + offs_k[None, :], mask=row_ok[:, None], other=0.0)
    q = q.to(tl.float32)
    k = k.to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=1) + EPS)[:, None] * scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=1) + EPS)[:, None]
    vals = tl.load(v_ptr + b * sv_b + rows[:, None] * sv_t + hv * sv_h + offs_v[None, :],
                   mask=row_ok[:, None] & v_ok[None, :], other=0.0).to(tl.float32)
    gb = (b * T + rows) * HV + hv
    g = tl.load(g_ptr + gb, mask=row_ok, other=0.0)
    beta = tl.load(beta_ptr + gb, mask=row_ok, other=0.0)
    m = tl.load(mask_ptr + (b * T + rows[:, None]) * T + rows[None, :], mask=row_ok[:, None] & row_ok[None, :],
                other=0) != 0

    G = tl.sum(tl.where(m, g[None, :], 0.0), axis=1)  # [BT] log-decay summed along the path to the root
    D = tl.where(m, tl.exp(tl.where(m, G[:, None] - G[None, :], 0.0)), 0.0)
    strict = rows[:, None] != rows[None, :]
    A = tl.where(strict, beta[:, None] * D * _dot(k, tl.trans(k)), 0.0)

    s0 = tl.load(s0_ptr + ((b * HV + hv) * K + offs_k[:, None]) * V + offs_v[None, :], mask=v_ok[None, :], other=0.0)
    rhs = beta[:, None] * (vals - tl.exp(G)[:, None] * _dot(k, s0))
    # (I + A)^-1 = sum_n (-A)^n, and -A is nilpotent (strictly lower in topological order): the product of
    # (I + (-A)^(2^i)) for i < log2(BT) is exact
    eye = tl.where(strict, 0.0, 1.0)
    power = -A
    inv = eye + power
    for _ in tl.static_range(LOG2_BT - 1):
        power = _dot(power, power)
        inv = _dot(inv, eye + power)
    u = _dot(inv, rhs)
    o = tl.exp(G)[:, None] * _dot(q, s0) + _dot(_dot(q, tl.trans(k)) * D, u)

    out_rows = (b * T + rows) * HV + hv
    ov_mask = row_ok[:, None] & v_ok[None, :]
    tl.store(o_ptr + out_rows[:, None] * V + offs_v[None, :], o.to(o_ptr.dtype.element_ty), mask=ov_mask)
    tl.store(u_ptr + out_rows[:, None] * V + offs_v[None, :], u, mask=ov_mask)
    if i_v == 0:
        tl.store(G_ptr + out_rows, G, mask=row_ok)
        if hv % GROUP == 0:  # k is per key head: one of its value heads writes it
            key_rows = (b * T + rows) * (HV // GROUP) + h
            tl.store(kn_ptr + key_rows[:, None] * K + offs_k[None, :], k, mask=row_ok[:, None])


def tree_gated_delta_rule(q, k, v, g, beta, mask, initial_state, scale=None, *, block_v: int = 32, num_warps: int = 4):
    """Same contract as chunk.tree_gated_delta_rule: q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV]; mask [B,T,T]
    bool; initial_state [B,HV,K,V] fp32 -> (o [B,T,HV,V] in v.dtype, (k [B,T,H,K], u [B,T,HV,V], G [B,T,HV]))."""
    B, T, H, K = q.shape
    HV, V = v.shape[-2:]
    assert k.shape == q.shape and v.shape[:2] == (B, T) and HV % H == 0
    assert K & (K - 1) == 0 and 16 <= K <= 256, f"K={K} must be a power of two in [16, 256]"
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1, "head dims must be dense"
    assert T <= 256, f"trees of up to 256 nodes fit one tile; got {T}"
    BT = max(16, triton.next_power_of_2(T))
    g, beta = g.float().contiguous(), beta.float().contiguous()
    mask = mask.contiguous().view(torch.uint8)
    s0 = initial_state.float().contiguous()
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=v.device)
    kn = torch.empty(B, T, H, K, dtype=torch.float32, device=v.device)
    u = torch.empty(B, T, HV, V, dtype=torch.float32, device=v.device)
    G = torch.empty(B, T, HV, dtype=torch.float32, device=v.device)
    block_v = min(block_v, max(16, triton.next_power_of_2(V)))
    grid = (triton.cdiv(V, block_v), B * HV)
    _tree_gdn_kernel[grid](q, k, v, g, beta, mask, s0, o, kn, u, G, T, HV, V, K**-0.5 if scale is None else scale,
                           q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                           v.stride(0), v.stride(1), v.stride(2),
                           GROUP=HV // H, K=K, BT=BT, BV=block_v, LOG2_BT=BT.bit_length() - 1, EPS=L2NORM_EPS,
                           num_warps=num_warps)
    return o, (kn, u, G)
