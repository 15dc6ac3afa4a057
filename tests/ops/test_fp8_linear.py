"""ops/fp8_linear: the quantization round trip, the reference product against the exact one within FP8's error
bound, and the dispatch (the reference wherever the FP8 GEMM cannot run: CPU, shapes it does not take)."""

import pytest
import torch

from specpilot.ops.fp8_linear import FP8, fp8_linear, fp8_linear_ref, quantize, quantize_weight, supports

E4M3_REL = 2.0 ** -4  # E4M3's relative rounding error (3 mantissa bits, round to nearest)
E4M3_SUB = 2.0 ** -9  # its subnormal spacing, in units of the scale


def test_quantize_round_trip_is_within_e4m3_rounding():
    t = torch.randn(37, 19, generator=torch.Generator().manual_seed(0)) * 3
    q, scale = quantize(t)
    assert q.dtype == FP8 and scale.dtype == torch.float32 and scale.dim() == 0
    assert float(q.float().abs().max()) == 448.0  # the amax maps to E4M3's largest value
    err = (q.float() * scale - t).abs()
    assert bool((err <= E4M3_REL * t.abs() + E4M3_SUB * scale).all())


def test_quantize_of_zeros_has_a_finite_scale():
    q, scale = quantize(torch.zeros(4, 8))
    assert float(scale) > 0 and bool((q.float() == 0).all())


@pytest.mark.parametrize(("m", "n", "k"), [(1, 7, 13), (3, 33, 64), (17, 16, 48)])
def test_reference_product_is_within_fp8_error_of_the_exact_one(m, n, k):
    gen = torch.Generator().manual_seed(m * 100 + n)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen) * 0.05
    wq, scale = quantize_weight(w)
    y = fp8_linear_ref(x, wq, scale)
    assert y.shape == (m, n) and y.dtype == x.dtype
    # each factor is within E4M3_REL (plus a subnormal step) of its exact value, so each term of the sum is within
    # about 2 E4M3_REL of x_i w_i
    bound = (2.2 * E4M3_REL) * (x.abs() @ w.abs().t()) + 1e-3
    assert bool(((y - x @ w.t()).abs() <= bound).all())
    assert not torch.equal(y, x @ w.t())  # the product is the quantized one, not the exact one


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_dispatch_is_the_reference(dtype):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 32, generator=gen).to(dtype)
    wq, scale = quantize_weight(torch.randn(48, 32, generator=gen))
    y = fp8_linear(x, wq, scale)
    assert y.dtype == dtype and torch.equal(y, fp8_linear_ref(x, wq, scale))


def test_shapes_the_gemm_does_not_take():
    x = torch.zeros(1, 32)
    assert not supports(x, torch.zeros(7, 32, dtype=FP8))  # N not a multiple of 16
    assert not supports(x, torch.zeros(16, 13, dtype=FP8))  # K not a multiple of 16
    assert not supports(x, torch.zeros(16, 32, dtype=FP8))  # a CPU tensor
