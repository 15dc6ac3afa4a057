"""Triton device functions of one Gated DeltaNet chunk, shared by the chunked prefill kernel (triton.py,
`_chunk_gdn_kernel`) and the tree kernel (ops/gdn_tree/triton.py, `_tree_gdn_kernel`), as flash-linear-attention
shares `fla/ops/common/`.

A chunk is BT rows (tokens of a chunk, or nodes of a tree) of one value head: q and k [BT, K] go through K in
BK-wide slices (no [BT, K] fp32 tile stays live), the last slice masked where K is not a multiple of BK (EVEN_K
False). Here: the program's heads, the K-slice addressing and masks, the L2-norm factors of q and k, the products
of normalised q and k with k and with the [K, BV] start state, the decay matrix of the chunk's paths (causal for a
chain, ancestors for a tree) and the Neumann solve for its outputs. What they compute is checked through the two
kernels against the torch forms (chunk.py, ops/gdn_tree/chunk.py), and alone in
tests/ops/test_gated_delta_rule_blocks.py.
"""

import triton
import triton.language as tl


@triton.jit
def program_heads(HV, GROUP: tl.constexpr):
    """-> (value tile, request, value head, key head) of program (i_v, request * HV + value head)."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    b = (i_bh // HV).to(tl.int64)
    hv = i_bh % HV
    return i_v, b, hv, hv // GROUP


@triton.jit
def dot(a, b, PREC: tl.constexpr):
    """a @ b in fp32 at tl.dot's input precision PREC ("ieee", "tf32" or "tf32x3")."""
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def slice_mask(ok, offs_c, c0, K: tl.constexpr, EVEN_K: tl.constexpr, rows: tl.constexpr = False):
    """The mask of a K slice [c0, c0 + BK): `ok` (per row of a [BT, BK] q/k slice, or with rows=True per value
    column of a [BK, BV] state slice) and, without EVEN_K, the slice's columns (rows) inside K."""
    if rows:
        m = ok[None, :]
        if not EVEN_K:
            m = m & (c0 + offs_c < K)[:, None]
    else:
        m = ok[:, None]
        if not EVEN_K:
            m = m & (c0 + offs_c < K)[None, :]
    return m


@triton.jit
def qk_slice(rows, c, s_k, offs_c):
    """Addresses of K slice [c, c + BK) of a q or k tile: rows [BT, BK] address slice 0 (s_k the stride along K), or
    rows [BT, 1] address the rows of a layout dense along K (the slice's columns offs_c are added here)."""
    if rows.shape[1] == 1:
        ptrs = rows + c + offs_c[None, :]
    else:
        ptrs = rows + c * s_k
    return ptrs


@triton.jit
def state_slice(s, c, V, offs_c):
    """Addresses of K slice [c, c + BK) of a [K, BV] state tile with row stride V: s [BK, BV] addresses slice 0, or
    s [1, BV] addresses the value columns of row 0 (the slice's rows offs_c are added here)."""
    if s.shape[0] == 1:
        ptrs = s + (c + offs_c[:, None]) * V
    else:
        ptrs = s + c * V
    return ptrs


@triton.jit
def l2_norm_factors(q_rows, k_rows, sq_k, sk_k, row_ok, offs_c, scale, EPS: tl.constexpr, K: tl.constexpr,
                    BK: tl.constexpr, EVEN_K: tl.constexpr):
    """-> (rsqrt(sum q^2 + EPS) * scale, rsqrt(sum k^2 + EPS)) per row of q and k (addressed as qk_slice takes
    them), over K in BK slices. Rows not row_ok, and columns past K, read zeros."""
    q_ss = tl.zeros(row_ok.shape, dtype=tl.float32)
    k_ss = tl.zeros(row_ok.shape, dtype=tl.float32)
    for c in tl.static_range(0, K, BK):
        qk_ok = slice_mask(row_ok, offs_c, c, K, EVEN_K)
        qc = tl.load(qk_slice(q_rows, c, sq_k, offs_c), mask=qk_ok, other=0.0).to(tl.float32)
        kc = tl.load(qk_slice(k_rows, c, sk_k, offs_c), mask=qk_ok, other=0.0).to(tl.float32)
        q_ss += tl.sum(qc * qc, axis=1)
        k_ss += tl.sum(kc * kc, axis=1)
    return tl.rsqrt(q_ss + EPS) * scale, tl.rsqrt(k_ss + EPS)


@triton.jit
def qk_state_products(q_rows, k_rows, sq_k, sk_k, q_scale, k_scale, s, V, row_ok, v_ok, offs_c, kn_ptr, kn_rows,
                      write_k, K: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, EVEN_K: tl.constexpr,
                      PREC: tl.constexpr):
    """-> (k k^T, q k^T [BT, BT], k S, q S [BT, BV]) of q and k scaled by their L2-norm factors (addressed as
    qk_slice takes them) and the start state S [K, BV] (addressed as state_slice takes it), over K in BK slices.
    Where write_k, each slice of scaled k is also stored, dense along K, at row kn_rows of kn_ptr (None: never)."""
    BT: tl.constexpr = row_ok.shape[0]
    kk = tl.zeros([BT, BT], dtype=tl.float32)
    qk = tl.zeros([BT, BT], dtype=tl.float32)
    ks = tl.zeros([BT, BV], dtype=tl.float32)
    qs = tl.zeros([BT, BV], dtype=tl.float32)
    for c in tl.static_range(0, K, BK):
        qk_ok = slice_mask(row_ok, offs_c, c, K, EVEN_K)
        qc = tl.load(qk_slice(q_rows, c, sq_k, offs_c), mask=qk_ok, other=0.0).to(tl.float32) * q_scale[:, None]
        kc = tl.load(qk_slice(k_rows, c, sk_k, offs_c), mask=qk_ok, other=0.0).to(tl.float32) * k_scale[:, None]
        sc = tl.load(state_slice(s, c, V, offs_c), mask=slice_mask(v_ok, offs_c, c, K, EVEN_K, rows=True), other=0.0)
        kk += dot(kc, tl.trans(kc), PREC)
        qk += dot(qc, tl.trans(kc), PREC)
        ks += dot(kc, sc, PREC)
        qs += dot(qc, sc, PREC)
        if kn_ptr is not None:
            if write_k:
                tl.store(kn_ptr + kn_rows[:, None] * K + c + offs_c[None, :], kc, mask=qk_ok)
    return kk, qk, ks, qs


@triton.jit
def decay_matrix(G, m):
    """D [BT, BT] = exp(G_i - G_j) where m (row j on row i's path: its causal prefix or its ancestors, itself
    included), else 0; G [BT] the log-decay summed along each row's path. The exp's argument is masked too, so
    that it stays <= 0 (off the path G_i - G_j can be large)."""
    return tl.where(m, tl.exp(tl.where(m, G[:, None] - G[None, :], 0.0)), 0.0)


@triton.jit
def neumann_solve(A, rhs, qkd, qs, G, steps, PREC: tl.constexpr):
    """-> (o, u) of a chunk: u solves (I + A) u = rhs [BT, BV], with A = beta D (k k^T) off the diagonal on each
    row's path, and o = exp(G) (q S) + ((q k^T) D) u (qkd = (q k^T) D). A links a row only to rows before it on its
    path, so A^n = 0 once n reaches the longest path (`steps` rows): the iteration u <- rhs - A u is exact after
    steps - 1 iterations (none for one row) and keeps only A and u live."""
    u = rhs
    for _ in range(1, steps):
        u = rhs - dot(A, u, PREC)
    return tl.exp(G)[:, None] * qs + dot(qkd, u, PREC), u
