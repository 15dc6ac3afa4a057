"""Triton decode GEMV against the fp32 reference on odd shapes (TRITON_INTERPRET=1, set by conftest)."""

import pytest
import torch

from specpilot.ops.gemv.reference import gemv_ref
from specpilot.ops.testing import assert_close

pytest.importorskip("triton")


@pytest.mark.parametrize("M,N,K,block_n,block_k", [(1, 1, 7, 8, 16), (1, 37, 96, 8, 32), (3, 50, 100, 16, 64),
                                                   (4, 9, 64, 4, 64), (2, 130, 1000, 8, 256)],
                         ids=["tiny", "even-k", "ragged-k", "m4", "wide"])
def test_gemv_matches_reference(M, N, K, block_n, block_k):
    from specpilot.ops.gemv.triton import gemv

    x = torch.randn(M, 2 * K)[:, ::2]  # strided rows are allowed only with a dense last dim
    x = x.contiguous()
    w = torch.randn(N + 3, K)[:N]
    assert_close("gemv", gemv_ref(x, w), gemv(x, w, block_n=block_n, block_k=block_k), 1e-5)


@pytest.mark.parametrize("M,N,K,block_n,block_k,dtype", [
    (2, 17, 40, 16, 16, torch.float32), (5, 70, 96, 32, 32, torch.float32), (16, 33, 130, 16, 64, torch.float32),
    (8, 48, 256, 32, 64, torch.bfloat16), (13, 20, 100, 16, 32, torch.bfloat16)],
    ids=["m2-ragged", "m5-even", "m16-ragged", "m8-bf16", "m13-bf16-ragged"])
def test_skinny_matches_reference(M, N, K, block_n, block_k, dtype):
    from specpilot.ops.gemv.triton import skinny

    x = torch.randn(M, K + 5)[:, :K].to(dtype)  # strided rows, dense last dim
    w = (torch.randn(N + 3, K)[:N] * 0.1).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert_close("skinny", gemv_ref(x, w), skinny(x, w, block_n=block_n, block_k=block_k), tol)


def test_dispatch_takes_reference_on_cpu_and_checks_rows():
    from specpilot.ops.gemv import gemv

    x, w = torch.randn(3, 8), torch.randn(5, 8)
    torch.testing.assert_close(gemv(x, w), gemv_ref(x, w))
