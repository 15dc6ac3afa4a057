"""The Triton K/V compaction of kept paths equals the gather-then-scatter reference (TRITON_INTERPRET=1 on CPU)."""

import pytest
import torch

from specpilot.ops.keep_kv import keep_kv_ref
from specpilot.ops.path_index import PathIndex


def _paths(gen, n, width):
    """Kept root-first paths through trees of `width` nodes: increasing node ids, some in place, some empty."""
    paths = []
    for i in range(n):
        if i % 4 == 3:
            paths.append([])
            continue
        nodes = sorted(torch.randperm(width - 1, generator=gen)[:torch.randint(0, width - 1, (1,), generator=gen)]
                       .add(1).tolist())
        paths.append([0, *nodes] if i % 4 != 2 else list(range(min(3, width))))  # every 4th: already in place
    return paths


@pytest.mark.parametrize("L,N,KVH,S,D,B,width", [(1, 2, 1, 16, 8, 1, 5), (2, 5, 3, 40, 24, 4, 9),
                                                 (3, 4, 2, 64, 64, 7, 17)],
                         ids=["one-request", "odd-head-dim", "many-requests"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_keep_kv_matches_reference(L, N, KVH, S, D, B, width, dtype):
    pytest.importorskip("triton")
    from specpilot.ops.keep_kv.triton import keep_kv

    gen = torch.Generator().manual_seed(L * 100 + D)
    k, v = (torch.randn(L, N, KVH, S, D, generator=gen).to(dtype) for _ in range(2))
    slots = torch.randperm(N, generator=gen).tolist()[:B] if B <= N else [i % N for i in range(B)]
    slots = list(dict.fromkeys(slots))  # one request per slot
    paths = _paths(gen, len(slots), width)
    bases = [int(torch.randint(0, S - width, (1,), generator=gen)) for _ in slots]
    index = PathIndex.build(list(range(len(slots))), slots, paths, "cpu", bases=bases)
    k_ref, v_ref = k.clone(), v.clone()
    keep_kv_ref(k_ref, v_ref, index)
    assert not torch.equal(k_ref, k)  # something moved
    keep_kv(k, v, index)
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)


def test_reference_moves_overlapping_ranges():
    """A path whose moves overlap (node 2 -> 1 while node 3 -> 2) reads every source before it is overwritten."""
    k = torch.arange(10.0).view(1, 1, 1, 10, 1).clone()
    v = -k
    keep_kv_ref(k, v, PathIndex.build([0], [0], [[0, 2, 3, 5]], "cpu", bases=[4]))
    assert k.flatten().tolist() == [0, 1, 2, 3, 4, 6, 7, 9, 8, 9]
    assert torch.equal(v, -k)
