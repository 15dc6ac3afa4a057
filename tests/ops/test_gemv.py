"""Triton decode GEMVs against their fp32 references on odd shapes (TRITON_INTERPRET=1, set by conftest)."""

import pytest
import torch
import torch.nn.functional as F

from specpilot.ops.gemv.reference import add_rmsnorm_gemv_ref, gemv_ref, silu_mul_gemv_ref
from specpilot.ops.testing import assert_close, nan_like

pytest.importorskip("triton")

SHAPES = [(1, 1, 7, 8, 16), (1, 37, 96, 8, 32), (3, 50, 100, 16, 64), (4, 9, 64, 4, 64), (2, 130, 1000, 8, 256)]
IDS = ["tiny", "even-k", "ragged-k", "m4", "wide"]


@pytest.mark.parametrize("M,N,K,block_n,block_k", SHAPES, ids=IDS)
def test_gemv_matches_reference(M, N, K, block_n, block_k):
    from specpilot.ops.gemv.triton import gemv

    x = torch.randn(M, K)
    w = torch.randn(N + 3, K)[:N]
    assert_close("gemv", gemv_ref(x, w), gemv(x, w, block_n=block_n, block_k=block_k), 1e-5)


@pytest.mark.parametrize("M,N,K,block_n,block_k", SHAPES, ids=IDS)
@pytest.mark.parametrize("zero_centered", [False, True], ids=["plain", "zero-centred"])
def test_add_rmsnorm_gemv_matches_reference(M, N, K, block_n, block_k, zero_centered):
    from specpilot.ops.gemv.triton import add_rmsnorm_gemv

    x, res, g = torch.randn(1, K), torch.randn(1, K), torch.randn(K)
    w = torch.randn(N, K)
    y_ref, s_ref = add_rmsnorm_gemv_ref(x, res, g, 1e-6, zero_centered, w)
    y, s = add_rmsnorm_gemv(x, res, g, 1e-6, zero_centered, w, block_n=block_n, block_k=block_k)
    assert_close("y", y_ref, y, 1e-5)
    assert torch.equal(s, s_ref)


def test_add_rmsnorm_gemv_is_norm_then_linear():
    """The fused form is RMSNorm followed by the projection (exact math, fp32)."""
    from specpilot.layers.pointwise import add_rms_norm_zero_centered

    x, res, g, w = torch.randn(1, 48), torch.randn(1, 48), torch.randn(48), torch.randn(20, 48)
    h, s = add_rms_norm_zero_centered(x, res, g, 1e-6)
    y, s2 = add_rmsnorm_gemv_ref(x, res, g, 1e-6, True, w)
    assert_close("norm-then-linear", F.linear(h, w), y, 1e-6)
    assert torch.equal(s, s2)


@pytest.mark.parametrize("M,N,K,block_n,block_k", SHAPES, ids=IDS)
def test_silu_mul_gemv_matches_reference(M, N, K, block_n, block_k):
    from specpilot.ops.gemv.triton import silu_mul_gemv

    gate_up = torch.randn(1, 2 * K)
    w = torch.randn(N, K)
    ref = silu_mul_gemv_ref(gate_up, w)
    assert_close("silu_mul_gemv", ref, silu_mul_gemv(gate_up, w, block_n=block_n, block_k=block_k), 1e-5)
    gate, up = gate_up.chunk(2, -1)
    assert_close("silu-mul-then-linear", F.linear(F.silu(gate) * up, w), ref, 1e-6)


def test_bf16_inputs_round_the_residual_like_the_unfused_add():
    from specpilot.ops.gemv.triton import add_rmsnorm_gemv

    x, res = torch.randn(1, 64).bfloat16(), torch.randn(1, 64).bfloat16()
    w, g = (torch.randn(16, 64) * 0.1).bfloat16(), torch.randn(64).bfloat16()
    out = nan_like(torch.empty(1, 16))
    y, s = add_rmsnorm_gemv(x, res, g, 1e-6, False, w, block_n=4, block_k=32)
    out.copy_(y)
    # the interpreter rounds fp32 -> bf16 toward zero (compiled Triton rounds to nearest even): allow one ulp
    torch.testing.assert_close(s.float(), (x + res).float(), rtol=2**-7, atol=0)
    assert_close("bf16", add_rmsnorm_gemv_ref(x, res, g, 1e-6, False, w)[0].float(), out, 1e-2)
