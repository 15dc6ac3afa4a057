"""The shared Gated DeltaNet chunk blocks (ops/gated_delta_rule/blocks.py) alone, through small wrapper kernels
under the Triton interpreter, against torch: the L2-norm factors and the products with k and the start state in
both addressings the kernels use (rows of a layout dense along K, and [BT, BK] slices with a K stride), on key
head dims that are not a multiple of the K slice; the decay matrix and the Neumann solve on a tree."""

import os
import sys

# Must precede the first triton import (see tests/ops/test_gated_delta_rule.py).
_TRITON_IMPORTED_COMPILED = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from specpilot.ops.gated_delta_rule.blocks import (decay_matrix, l2_norm_factors, neumann_solve,  # noqa: E402
                                                   qk_state_products)
from specpilot.ops.gated_delta_rule.reference import L2NORM_EPS, l2norm  # noqa: E402
from specpilot.ops.gdn_tree import ancestor_mask  # noqa: E402
from specpilot.ops.testing import assert_close, nan_like  # noqa: E402

_EPS = tl.constexpr(L2NORM_EPS)


@pytest.fixture(autouse=True)
def _interpreted():
    if _TRITON_IMPORTED_COMPILED:
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set; export TRITON_INTERPRET=1")


@triton.jit
def _norm_products_kernel(q_ptr, k_ptr, s_ptr, fac_ptr, kk_ptr, qk_ptr, ks_ptr, qs_ptr, kn_ptr, T, V, s_t, s_k,
                          scale, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                          EVEN_K: tl.constexpr, DENSE_K: tl.constexpr):
    rows = tl.arange(0, BT)
    row_ok = rows < T
    offs_c = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    v_ok = offs_v < V
    if DENSE_K:  # as the tree kernel passes them: row addresses, the blocks add the slice's columns (rows)
        q_rows = q_ptr + rows[:, None] * s_t
        k_rows = k_ptr + rows[:, None] * s_t
        s = s_ptr + offs_v[None, :]
    else:  # as the chunked prefill kernel passes them: addresses of slice 0, any K stride
        q_rows = q_ptr + rows[:, None] * s_t + offs_c[None, :] * s_k
        k_rows = k_ptr + rows[:, None] * s_t + offs_c[None, :] * s_k
        s = s_ptr + offs_c[:, None] * V + offs_v[None, :]
    q_scale, k_scale = l2_norm_factors(q_rows, k_rows, s_k, s_k, row_ok, offs_c, scale, _EPS, K, BK, EVEN_K)
    kk, qk, ks, qs = qk_state_products(q_rows, k_rows, s_k, s_k, q_scale, k_scale, s, V, row_ok, v_ok, offs_c,
                                       kn_ptr, rows, True, K, BK, BV, EVEN_K, "ieee")
    tl.store(fac_ptr + rows, q_scale)
    tl.store(fac_ptr + BT + rows, k_scale)
    square = rows[:, None] * BT + rows[None, :]
    tl.store(kk_ptr + square, kk)
    tl.store(qk_ptr + square, qk)
    wide = rows[:, None] * BV + offs_v[None, :]
    tl.store(ks_ptr + wide, ks)
    tl.store(qs_ptr + wide, qs)


def _run_norm_products(T, K, V, dense_k, BT=16, BK=32):
    gen = torch.Generator().manual_seed(K + T)
    if dense_k:
        q = torch.randn(T, K + 5, generator=gen)[:, :K]  # strided rows, dense along K
        k = torch.randn(T, K + 5, generator=gen)[:, :K]
        s_t, s_k = q.stride(0), 1
    else:
        q = torch.randn(K, T, generator=gen).T  # channels-major: stride T along K
        k = torch.randn(K, T, generator=gen).T
        s_t, s_k = q.stride()
    S = torch.randn(K, V, generator=gen)
    BV = triton.next_power_of_2(V)
    fac = nan_like(torch.empty(2, BT))
    kk, qk = nan_like(torch.empty(BT, BT)), nan_like(torch.empty(BT, BT))
    ks, qs = nan_like(torch.empty(BT, BV)), nan_like(torch.empty(BT, BV))
    kn = nan_like(torch.empty(T, K))
    _norm_products_kernel[(1,)](q, k, S, fac, kk, qk, ks, qs, kn, T, V, s_t, s_k, 0.3, K=K, BT=BT, BK=BK, BV=BV,
                                EVEN_K=K % BK == 0, DENSE_K=dense_k)
    return (q, k, S), (fac, kk, qk, ks, qs, kn)


@pytest.mark.parametrize("dense_k", [True, False], ids=["dense-k", "k-stride"])
@pytest.mark.parametrize("T,K,V", [(13, 48, 24), (16, 96, 40), (5, 64, 16), (1, 80, 7)],
                         ids=["K48", "K96-full-tile", "K64-even", "K80-one-row"])
def test_norm_and_products_match_torch(T, K, V, dense_k):
    (q, k, S), (fac, kk, qk, ks, qs, kn) = _run_norm_products(T, K, V, dense_k)
    q64, k64 = q.double(), k.double()
    q_fac = torch.rsqrt(q64.pow(2).sum(-1) + L2NORM_EPS) * 0.3
    k_fac = torch.rsqrt(k64.pow(2).sum(-1) + L2NORM_EPS)
    assert_close("q factor", q_fac, fac[0, :T], 1e-6)
    assert_close("k factor", k_fac, fac[1, :T], 1e-6)
    # rows past T read zeros: their factors are finite and their products zero
    torch.testing.assert_close(fac[:, T:], torch.tensor([0.3, 1.0])[:, None].expand(2, 16 - T) / L2NORM_EPS**0.5)
    qn, kn_ref = q64 * q_fac[:, None], l2norm(k).double()
    assert_close("k k^T", kn_ref @ kn_ref.T, kk[:T, :T])
    assert_close("q k^T", qn @ kn_ref.T, qk[:T, :T])
    assert_close("k S", kn_ref @ S.double(), ks[:T, :V])
    assert_close("q S", qn @ S.double(), qs[:T, :V])
    for name, x in (("k k^T", kk), ("q k^T", qk), ("k S", ks), ("q S", qs)):
        assert not x[T:].any(), f"{name}: padding rows must be zero"
    assert_close("stored k", kn_ref, kn, 1e-6)  # every element written: no NaN left


@triton.jit
def _solve_kernel(kk_ptr, qk_ptr, ks_ptr, qs_ptr, v_ptr, g_ptr, beta_ptr, m_ptr, o_ptr, u_ptr, D_ptr, T,
                  BT: tl.constexpr, BV: tl.constexpr):
    rows = tl.arange(0, BT)
    row_ok = rows < T
    cols = tl.arange(0, BV)
    square = rows[:, None] * BT + rows[None, :]
    wide = rows[:, None] * BV + cols[None, :]
    m = tl.load(m_ptr + square, mask=row_ok[:, None] & row_ok[None, :], other=0) != 0
    g = tl.load(g_ptr + rows, mask=row_ok, other=0.0)
    beta = tl.load(beta_ptr + rows, mask=row_ok, other=0.0)
    G = tl.sum(tl.where(m, g[None, :], 0.0), axis=1)
    D = decay_matrix(G, m)
    A = tl.where(rows[:, None] != rows[None, :], beta[:, None] * D * tl.load(kk_ptr + square), 0.0)
    rhs = beta[:, None] * (tl.load(v_ptr + wide) - tl.exp(G)[:, None] * tl.load(ks_ptr + wide))
    steps = tl.max(tl.sum(m.to(tl.int32), axis=1), axis=0)
    o, u = neumann_solve(A, rhs, tl.load(qk_ptr + square) * D, tl.load(qs_ptr + wide), G, steps, "ieee")
    tl.store(o_ptr + wide, o)
    tl.store(u_ptr + wide, u)
    tl.store(D_ptr + square, D)


@pytest.mark.parametrize("T", [1, 11, 16], ids=["one-node", "T11-padded", "full-tile"])
def test_decay_and_solve_match_torch(T):
    """A tree that starts with a chain of 6 nodes: the decay matrix is zero off the paths, and the solve is the
    triangular solve of (I + A) u = rhs (every Neumann step counts: the decays are mild, A is not small)."""
    BT, BV = 16, 16
    gen = torch.Generator().manual_seed(T)
    parents = torch.full((T,), -1)
    for i in range(1, T):
        parents[i] = i - 1 if i < 6 else int(torch.randint(0, i, (1,), generator=gen))
    m = torch.zeros(BT, BT, dtype=torch.bool)
    m[:T, :T] = ancestor_mask(parents[None])[0]
    g, beta = torch.zeros(BT), torch.zeros(BT)
    g[:T] = -torch.rand(T, generator=gen) * 0.5
    beta[:T] = torch.rand(T, generator=gen)
    kk, qk = torch.randn(BT, BT, generator=gen), torch.randn(BT, BT, generator=gen)
    ks, qs, vals = (torch.randn(BT, BV, generator=gen) for _ in range(3))
    o, u, D = nan_like(torch.empty(BT, BV)), nan_like(torch.empty(BT, BV)), nan_like(torch.empty(BT, BT))
    _solve_kernel[(1,)](kk, qk, ks, qs, vals, g, beta, m.to(torch.uint8), o, u, D, T, BT=BT, BV=BV)

    G = (m.double() @ g.double())
    D_ref = torch.exp((G[:, None] - G[None, :]).masked_fill(~m, float("-inf")))
    A = (beta.double()[:, None] * D_ref * kk.double()).masked_fill(torch.eye(BT, dtype=torch.bool), 0.0)
    rhs = beta.double()[:, None] * (vals.double() - G.exp()[:, None] * ks.double())
    u_ref = torch.linalg.solve_triangular(torch.eye(BT, dtype=torch.float64) + A, rhs, upper=False)
    o_ref = G.exp()[:, None] * qs.double() + (qk.double() * D_ref) @ u_ref
    assert not D[~m].any(), "D is zero off the paths"
    assert_close("D", D_ref, D, 1e-6)
    assert_close("u", u_ref, u)
    assert_close("o", o_ref, o)
