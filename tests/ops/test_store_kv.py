"""Triton K/V store against the indexing reference (TRITON_INTERPRET=1, set by conftest)."""

import pytest
import torch

from specpilot.ops.store_kv.reference import store_kv_ref

triton = pytest.importorskip("triton")


@pytest.mark.parametrize("B,T,KVH,D,N,S", [(1, 1, 1, 16, 1, 5), (3, 7, 2, 32, 5, 40), (2, 1, 3, 64, 4, 9)],
                         ids=["decode-1", "block-7", "heads-3"])
def test_store_kv_matches_reference(B, T, KVH, D, N, S):
    from specpilot.ops.store_kv.triton import store_kv

    k = torch.randn(B, T, 2 * KVH, D)[:, :, ::2]  # strided heads
    v = torch.randn(B, T, KVH, D)
    slots = torch.randperm(N)[:B]
    loc = torch.stack([torch.randperm(S)[:T] for _ in range(B)])
    caches = [torch.full((N, KVH, S, D), float("nan")) for _ in range(4)]
    store_kv_ref(k, v, caches[0], caches[1], slots, loc)
    store_kv(k, v, caches[2], caches[3], slots, loc)
    assert torch.equal(caches[0].nan_to_num(7.0), caches[2].nan_to_num(7.0))
    assert torch.equal(caches[1].nan_to_num(7.0), caches[3].nan_to_num(7.0))
    assert not torch.isnan(caches[2][slots[0], :, loc[0, 0]]).any()
