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
