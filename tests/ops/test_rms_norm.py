"""RMSNorm (+ residual) Triton kernel vs its reference (TRITON_INTERPRET=1), and the reference vs the eager
pointwise helpers whose rounding it must reproduce."""

import pytest
import torch

from specpilot.layers import pointwise as pw
from specpilot.ops.rms_norm.reference import add_rms_norm_ref

pytest.importorskip("triton")


@pytest.mark.parametrize("zero_centered", [False, True], ids=["plain", "zero-centred"])
@pytest.mark.parametrize("residual", [False, True], ids=["norm", "add-norm"])
@pytest.mark.parametrize("rows,H,dtype", [(1, 4096, torch.bfloat16), (3, 100, torch.float32), (5, 37, torch.bfloat16)],
                         ids=["decode-bf16", "ragged-fp32", "odd-bf16"])
def test_kernel_matches_reference(rows, H, dtype, residual, zero_centered):
    from specpilot.ops.rms_norm.triton import add_rms_norm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 1, H, generator=g).to(dtype)
    r = torch.randn(rows, 1, H, generator=g).to(dtype) if residual else None
    w = (torch.randn(H, generator=g) * 0.1 + (0 if zero_centered else 1)).to(dtype)
    want, want_s = add_rms_norm_ref(x, r, w, 1e-6, zero_centered)
    got, got_s = add_rms_norm(x, r, w, 1e-6, zero_centered)
    # bf16: the interpreter rounds fp32 -> bf16 by truncation (a GPU to nearest), up to an ulp per rounding;
    # fp32: the mean is summed in another order
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=2 ** -6, atol=2 ** -6)
    torch.testing.assert_close(got_s.float(), want_s.float(), **tol)
    torch.testing.assert_close(got.float(), want.float(), **tol)


@pytest.mark.parametrize("zero_centered", [False, True])
def test_reference_rounds_like_the_pointwise_helpers(zero_centered):
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(2, 3, 64, generator=g).bfloat16() for _ in range(2))
    w = (torch.randn(64, generator=g) * 0.1 + (0 if zero_centered else 1)).bfloat16()
    add = pw.add_rms_norm_zero_centered if zero_centered else pw.add_rms_norm
    plain = pw.rms_norm_zero_centered if zero_centered else pw.rms_norm
    out, s = add(x, r, w, 1e-6)
    torch.testing.assert_close(add_rms_norm_ref(x, r, w, 1e-6, zero_centered), (out, s), rtol=0, atol=0)
    torch.testing.assert_close(add_rms_norm_ref(x, None, w, 1e-6, zero_centered)[0], plain(x, w, 1e-6), rtol=0, atol=0)
