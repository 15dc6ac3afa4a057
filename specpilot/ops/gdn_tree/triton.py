"""Triton kernels for the tree-masked gated delta rule (the one-shot WY form of chunk.py), one launch per layer,
and for the commit of kept paths (the fold and the conv windows of every layer and request, one launch each).

One program per (value-tile, request * value head). The tree's T nodes (padded to BT, a power of two >= 16)
fit one tile: the program builds the path-summed decay G = P g, the masked decay D, A = beta D (K K^T) below the
diagonal, solves the unit lower-triangular (I + A) u = rhs by the Neumann iteration u <- rhs - A u (A is nilpotent:
exact after as many steps as the longest path has nodes, minus one), and writes the outputs and the fold stash
(normalised k, u, G). Value columns are independent in the solve, so the [K, V] committed state is read in [K, BV]
tiles. The K-sliced norms and products, the decay matrix and the solve are the chunked prefill kernel's too
(ops/gated_delta_rule/blocks.py).

The fold runs one program per (layer * request * value head, value tile): it walks the request's path (up to the
longest, masked) accumulating exp(G_leaf - G_j) k_j u_j^T into a [K, BV] tile, then rewrites that tile of the
state in place. The conv commit runs one program per (layer * request, channel tile).
A key head dim that is not a multiple of the K slice is masked in its last slice; supports says what the tree
kernel takes (the commit kernels take any shape).
"""

import torch
import triton
import triton.language as tl

from specpilot.ops.dispatch import fits_tile, tile_width
from specpilot.ops.gated_delta_rule.blocks import (decay_matrix, l2_norm_factors, neumann_solve, program_heads,
                                                  qk_state_products)
from specpilot.ops.gated_delta_rule.reference import L2NORM_EPS
from specpilot.ops.path_index import NODES, PathIndex


# (num_warps, dot precision) by node tile (BT): the fastest at the 27B heads on the H200 among the settings as accurate
# as fp32 (docs/decisions/2026-12-01-gdn-chunk-kernels.md). tf32x3 is three tf32 tensor-core products
# (hi*hi + hi*lo + lo*hi), fp32-accurate; ieee is fp32 FMAs.
TREE_GDN_CONFIG = {16: (4, "tf32x3"), 32: (4, "ieee"), 64: (4, "tf32x3")}


@triton.jit
def _tree_gdn_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, mask_ptr, s0_ptr, slot_ptr, o_ptr, kn_ptr, u_ptr, G_ptr,
                     T, HV, V, scale,
                     sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
                     GROUP: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                     EPS: tl.constexpr, HAS_SLOTS: tl.constexpr, PREC: tl.constexpr, BK: tl.constexpr,
                     EVEN_K: tl.constexpr):
    i_v, b, hv, h = program_heads(HV, GROUP)
    rows = tl.arange(0, BT)
    row_ok = rows < T
    offs_c = tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    v_ok = offs_v < V
    q_rows = q_ptr + b * sq_b + rows[:, None] * sq_t + h * sq_h
    k_rows = k_ptr + b * sk_b + rows[:, None] * sk_t + h * sk_h
    if HAS_SLOTS:  # the committed state read in place from the cache's pool
        sb = tl.load(slot_ptr + b).to(tl.int64)
    else:
        sb = b
    s0_rows = s0_ptr + (sb * HV + hv) * K * V + offs_v[None, :]
    write_k = (i_v == 0) & (hv % GROUP == 0)  # k is per key head: one of its value heads writes it
    key_rows = (b * T + rows) * (HV // GROUP) + h

    # q and k go through K in BK-wide slices (blocks.py): one pass for the L2 norms, one for the products with k
    # (and with the committed state)
    q_scale, k_scale = l2_norm_factors(q_rows, k_rows, 1, 1, row_ok, offs_c, scale, EPS, K, BK, EVEN_K)
    kk, qk, ks, qs = qk_state_products(q_rows, k_rows, 1, 1, q_scale, k_scale, s0_rows, V, row_ok, v_ok, offs_c,
                                       kn_ptr, key_rows, write_k, K, BK, BV, EVEN_K, PREC)

    vals = tl.load(v_ptr + b * sv_b + rows[:, None] * sv_t + hv * sv_h + offs_v[None, :],
                   mask=row_ok[:, None] & v_ok[None, :], other=0.0).to(tl.float32)
    gb = (b * T + rows) * HV + hv
    g = tl.load(g_ptr + gb, mask=row_ok, other=0.0)
    beta = tl.load(beta_ptr + gb, mask=row_ok, other=0.0)
    m = tl.load(mask_ptr + (b * T + rows[:, None]) * T + rows[None, :], mask=row_ok[:, None] & row_ok[None, :],
                other=0) != 0

    G = tl.sum(tl.where(m, g[None, :], 0.0), axis=1)  # [BT] log-decay summed along the path to the root
    D = decay_matrix(G, m)
    A = tl.where(rows[:, None] != rows[None, :], beta[:, None] * D * kk, 0.0)
    qkd = qk * D  # formed now, so that kk, qk and D are dead before the solve
    path_len = tl.max(tl.sum(m.to(tl.int32), axis=1), axis=0)  # the longest path: the solve's step count
    rhs = beta[:, None] * (vals - tl.exp(G)[:, None] * ks)
    o, u = neumann_solve(A, rhs, qkd, qs, G, path_len, PREC)

    out_rows = (b * T + rows) * HV + hv
    ov_mask = row_ok[:, None] & v_ok[None, :]
    tl.store(o_ptr + out_rows[:, None] * V + offs_v[None, :], o.to(o_ptr.dtype.element_ty), mask=ov_mask)
    tl.store(u_ptr + out_rows[:, None] * V + offs_v[None, :], u, mask=ov_mask)
    if i_v == 0:
        tl.store(G_ptr + out_rows, G, mask=row_ok)


def supports(q: torch.Tensor) -> bool:
    """The tree kernel takes up to 256 nodes (one tile) and a key head dim of up to MAX_TILE (K slices of at least
    16, the last one masked); any value head dim (tiled)."""
    return q.shape[1] <= 256 and fits_tile(q.shape[-1])


def tree_gated_delta_rule(q, k, v, g, beta, mask, initial_state, scale=None, out=None, state_slots=None, *,
                          block_v: int = 32, block_k: int = 32, num_warps: int | None = None,
                          precision: str | None = None):
    """Same contract as chunk.tree_gated_delta_rule: q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV]; mask [B,T,T]
    bool; initial_state [B,HV,K,V] fp32 -> (o [B,T,HV,V] in v.dtype, (k [B,T,H,K], u [B,T,HV,V], G [B,T,HV])),
    the stash written into `out` (contiguous fp32) if given. num_warps, precision (tl.dot input precision of the fp32
    products: "ieee", "tf32" or "tf32x3"): by default TREE_GDN_CONFIG's for the node tile."""
    B, T, H, K = q.shape
    HV, V = v.shape[-2:]
    assert k.shape == q.shape and v.shape[:2] == (B, T) and HV % H == 0
    assert supports(q), f"{T} nodes, K={K}: the kernel does not take them (see supports)"
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1, "head dims must be dense"
    BT = max(16, triton.next_power_of_2(T))
    default_warps, default_precision = TREE_GDN_CONFIG.get(BT, (4, "tf32x3"))
    num_warps = num_warps or default_warps
    precision = precision or default_precision
    g, beta = g.float().contiguous(), beta.float().contiguous()
    mask = mask.contiguous().view(torch.uint8)
    if state_slots is None:
        s0, slots = initial_state.float().contiguous(), mask  # slots: any pointer, never read
    else:
        assert initial_state.dtype == torch.float32 and initial_state.is_contiguous(), "the state pool is dense fp32"
        s0, slots = initial_state, state_slots.contiguous()  # the kernel reads slot b at offset b
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=v.device)
    if out is None:
        out = (torch.empty(B, T, H, K, dtype=torch.float32, device=v.device),
               torch.empty(B, T, HV, V, dtype=torch.float32, device=v.device),
               torch.empty(B, T, HV, dtype=torch.float32, device=v.device))
    kn, u, G = out
    assert kn.shape == (B, T, H, K) and u.shape == (B, T, HV, V) and G.shape == (B, T, HV)
    assert all(t.is_contiguous() and t.dtype == torch.float32 for t in out), "the stash is written densely in fp32"
    block_v = min(block_v, tile_width(V))
    block_k = min(block_k, tile_width(K))  # K slices of at least 16 (tl.dot), masked where K is not a multiple
    grid = (triton.cdiv(V, block_v), B * HV)
    _tree_gdn_kernel[grid](q, k, v, g, beta, mask, s0, slots, o, kn, u, G, T, HV, V,
                           K**-0.5 if scale is None else scale,
                           q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                           v.stride(0), v.stride(1), v.stride(2),
                           GROUP=HV // H, K=K, BT=BT, BV=block_v, EPS=L2NORM_EPS,
                           HAS_SLOTS=state_slots is not None, PREC=precision, BK=block_k,
                           EVEN_K=K % block_k == 0, num_warps=num_warps)
    return o, (kn, u, G)


# the request count and path length change from step to step: unspecialised, so that a value of 1 (or a stride
# that happens to divide by 16) does not compile a new variant in the middle of a run
@triton.jit(do_not_specialize=["B", "P", "idx_b"])
def _fold_kernel(ssm_ptr, k_ptr, u_ptr, G_ptr, idx_ptr, B, HV, K, V, P,
                 s_l, s_n, k_l, k_r, k_t, u_l, u_r, u_t, G_l, G_r, G_t, idx_b,
                 GROUP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, FIRST: tl.constexpr):
    pid = tl.program_id(0)  # layer * request * value head can pass the 65535 limit of grid axis 1
    i_v = tl.program_id(1)
    layer = (pid // (B * HV)).to(tl.int64)
    b = (pid // HV) % B
    hv = pid % HV
    h = hv // GROUP
    entry = idx_ptr + b * idx_b  # row, slot, base, path length, nodes (padded to P): ops/path_index.py
    row = tl.load(entry).to(tl.int64)
    slot = tl.load(entry + 1).to(tl.int64)
    n = tl.load(entry + 3)
    offs_k = tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    k_ok = offs_k < K
    v_ok = offs_v < V
    k_base = k_ptr + layer * k_l + row * k_r + h * K
    u_base = u_ptr + layer * u_l + row * u_r + hv * V
    G_base = G_ptr + layer * G_l + row * G_r + hv
    # the state tile's load is issued first, so that it overlaps the walk along the path
    s_ptrs = ssm_ptr + layer * s_l + slot * s_n + (hv * K + offs_k[:, None]) * V + offs_v[None, :]
    s_mask = k_ok[:, None] & v_ok[None, :]
    state = tl.load(s_ptrs, mask=s_mask, other=0.0)
    leaf = tl.load(entry + FIRST + tl.maximum(n - 1, 0))
    G_leaf = tl.where(n > 0, tl.load(G_base + leaf * G_t), 0.0)
    acc = tl.zeros([BK, BV], dtype=tl.float32)
    for p in range(0, P):
        t = tl.load(entry + FIRST + p)
        w = tl.where(p < n, tl.exp(G_leaf - tl.load(G_base + t * G_t)), 0.0)
        kt = tl.load(k_base + t * k_t + offs_k, mask=k_ok, other=0.0)
        ut = tl.load(u_base + t * u_t + offs_v, mask=v_ok, other=0.0)
        acc += (w * kt)[:, None] * ut[None, :]
    tl.store(s_ptrs, tl.exp(G_leaf) * state + acc, mask=s_mask)


@triton.jit(do_not_specialize=["B", "idx_b"])
def _conv_commit_kernel(conv_ptr, x_ptr, idx_ptr, B, C, c_l, c_n, x_l, x_r, x_t, idx_b,
                        WIDTH: tl.constexpr, BC: tl.constexpr, FIRST: tl.constexpr):
    pid = tl.program_id(0)
    i_c = tl.program_id(1)
    layer = (pid // B).to(tl.int64)
    b = pid % B
    entry = idx_ptr + b * idx_b
    row = tl.load(entry).to(tl.int64)
    slot = tl.load(entry + 1).to(tl.int64)
    n = tl.load(entry + 3)
    ch = i_c * BC + tl.arange(0, BC)
    ch_ok = ch < C
    window = conv_ptr + layer * c_l + slot * c_n + ch * WIDTH
    x_base = x_ptr + layer * x_l + row * x_r + ch
    # in place: column c takes old column n + c (a left shift, read before it is overwritten, by the same thread:
    # BC >= threads, so no element is held twice) or path input n + c - WIDTH
    for c in tl.static_range(WIDTH):
        pos = n + c
        from_x = pos >= WIDTH
        node = tl.load(entry + FIRST + tl.maximum(pos - WIDTH, 0))
        # where, not &: the interpreter rejects a block mask combined with a scalar one
        new = tl.load(x_base + node * x_t, mask=tl.where(from_x, ch_ok, False), other=0.0)
        old = tl.load(window + tl.minimum(pos, WIDTH - 1), mask=tl.where(from_x, False, ch_ok), other=0.0)
        new = new.to(conv_ptr.dtype.element_ty)
        tl.store(window + c, tl.where(from_x, new, old), mask=ch_ok)


def commit_paths(ssm, conv, x, k, u, G, index: PathIndex, *, block_v: int = 32, block_c: int = 256,
                 num_warps: int = 4) -> None:
    """Same contract as chunk.commit_paths (state pools updated in place), in two launches."""
    L, _, HV, K, V = ssm.shape
    H, C, width = k.shape[-2], conv.shape[2], conv.shape[-1]
    packed = index.packed.contiguous()
    B, P = packed.shape[0], packed.shape[1] - NODES
    assert k.shape[0] == u.shape[0] == G.shape[0] == x.shape[0] == L and HV % H == 0
    assert ssm.stride()[2:] == (K * V, V, 1) and (width == 0 or conv.stride()[2:] == (width, 1)), "dense slots"
    assert k.stride()[3:] == (K, 1) and u.stride()[3:] == (V, 1) and G.stride(3) == 1 and x.stride(3) == 1
    if B == 0:
        return
    block_v = min(block_v, max(16, triton.next_power_of_2(V)))
    _fold_kernel[(L * B * HV, triton.cdiv(V, block_v))](
        ssm, k, u, G, packed, B, HV, K, V, P, ssm.stride(0), ssm.stride(1), k.stride(0), k.stride(1), k.stride(2),
        u.stride(0), u.stride(1), u.stride(2), G.stride(0), G.stride(1), G.stride(2), packed.stride(0),
        GROUP=HV // H, BK=triton.next_power_of_2(K), BV=block_v, FIRST=NODES, num_warps=num_warps)
    if width == 0:
        return
    block_c = max(block_c, 32 * num_warps)  # no replicated elements: the in-place shift relies on it
    _conv_commit_kernel[(L * B, triton.cdiv(C, block_c))](
        conv, x, packed, B, C, conv.stride(0), conv.stride(1), x.stride(0), x.stride(1), x.stride(2),
        packed.stride(0), WIDTH=width, BC=block_c, FIRST=NODES, num_warps=num_warps)


@triton.jit
def _tree_conv_kernel(x_ptr, parents_ptr, state_ptr, w_ptr, y_ptr, xo_ptr, T, C, sx_b, sx_t, sp_b, ss_b, ss_c, sy_b,
                      sy_t, W: tl.constexpr, BLOCK_C: tl.constexpr, STORE_X: tl.constexpr):
    """One program per (channel tile, request * node): walk W - 1 parent pointers up from the node (into the
    committed conv window above the root), then y = silu(sum_w weight[:, w] * window[w]) in fp32."""
    i_c, i_bt = tl.program_id(0), tl.program_id(1)
    b, i = i_bt // T, i_bt % T
    cols = i_c * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = cols < C
    x_b = x_ptr + b.to(tl.int64) * sx_b
    s_b = state_ptr + b.to(tl.int64) * ss_b + cols * ss_c
    # window position of the newest input: node i; positions < 0 count back through the state's W - 1 columns
    node = i
    x_i = tl.load(x_b + node * sx_t + cols, mask=ok, other=0.0)
    if STORE_X:  # the node's pre-conv input, which the commit needs: a dense copy (same layout as y)
        tl.store(xo_ptr + b.to(tl.int64) * sy_b + i * sy_t + cols, x_i, mask=ok)
    acc = tl.load(w_ptr + cols * W + (W - 1), mask=ok, other=0.0).to(tl.float32) * x_i.to(tl.float32)
    for j in tl.static_range(W - 1):
        w = W - 2 - j
        # a node steps to its parent; the root's parent is state column W - 2; inside the state, one column left
        par = tl.load(parents_ptr + b * sp_b + tl.maximum(node, 0))
        node = tl.where(node >= 0, tl.where(par >= 0, par, -1), node - 1)
        in_x = (cols * 0 + node) >= 0  # the scalar test as a channel vector (masks must be vectors)
        val = tl.load(x_b + tl.maximum(node, 0) * sx_t + cols, mask=ok & in_x, other=0.0).to(tl.float32)
        sv = tl.load(s_b + (W - 1 + tl.minimum(node, -1)), mask=ok & ~in_x, other=0.0).to(tl.float32)
        acc += tl.load(w_ptr + cols * W + w, mask=ok, other=0.0).to(tl.float32) * tl.where(in_x, val, sv)
    y = acc * tl.sigmoid(acc)
    tl.store(y_ptr + b.to(tl.int64) * sy_b + i * sy_t + cols, y.to(y_ptr.dtype.element_ty), mask=ok)


def tree_causal_conv1d(x, parents, conv_state, weight, x_out=None, *, block_c: int = 256, num_warps: int = 4):
    """Same contract as chunk.tree_causal_conv1d: x [B,T,C] (dense channels); parents [B,T]; conv_state [B,C,W-1]
    (oldest first); weight [C,W] -> y [B,T,C] in x.dtype, dense; x is also copied into x_out (dense, like y) if
    given."""
    B, T, C = x.shape
    W = weight.shape[1]
    assert x.stride(-1) == 1 and weight.is_contiguous() and parents.shape == (B, T)
    assert W == 1 or conv_state.stride(-1) == 1, "the conv window's columns must be dense"
    assert conv_state.shape == (B, C, W - 1), f"conv_state {tuple(conv_state.shape)} != {(B, C, W - 1)}"
    parents = parents.contiguous()
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    state = conv_state if W > 1 else x.new_zeros(B, C, 1)  # never read when W == 1
    if x_out is not None:
        assert x_out.shape == (B, T, C) and x_out.is_contiguous(), "x_out must be a dense [B, T, C]"
    _tree_conv_kernel[(triton.cdiv(C, block_c), B * T)](
        x, parents, state, weight, y, y if x_out is None else x_out, T, C, x.stride(0), x.stride(1),
        parents.stride(0), state.stride(0), state.stride(1), y.stride(0), y.stride(1), W=W, BLOCK_C=block_c,
        STORE_X=x_out is not None, num_warps=num_warps)
    return y
