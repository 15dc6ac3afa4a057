"""Reference K/V compaction of kept tree paths: one gather and one scatter per cache (all requests at once)."""

import torch

from specpilot.ops.path_index import PathIndex


def keep_kv_ref(k_cache: torch.Tensor, v_cache: torch.Tensor, index: PathIndex) -> None:
    """k_cache, v_cache [L, N, KVH, S, D]: for each request, kept node nodes[j] of its path moves from position
    base + nodes[j] to base + j of its slot, in every layer (nodes already in place stay). The gather reads every
    source before the scatter writes, so overlapping moves are safe."""
    nodes, lens = index.nodes, index.lens
    step = torch.arange(nodes.shape[1], device=nodes.device)
    b, j = ((step < lens[:, None]) & (nodes != step)).nonzero(as_tuple=True)
    slots, src, dst = index.slots[b], index.bases[b] + nodes[b, j], index.bases[b] + j
    for t in (k_cache, v_cache):
        t[:, slots, :, dst] = t[:, slots, :, src]
