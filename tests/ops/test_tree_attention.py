"""Tree attention: Triton (interpreted) vs the torch reference, and the reference vs per-query torch SDPA."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere, so kernels run on CPU

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from specpilot.ops.testing import assert_close  # noqa: E402
from specpilot.ops.tree_attention import tree_attention, tree_attention_ref  # noqa: E402
from specpilot.ops.tree_attention import triton as tat  # noqa: E402


def chain(n):
    return [-1] + list(range(n - 1))


def star(n):
    return [-1] + [0] * (n - 1)


def random_tree(n, gen):
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def ancestor_mask(parents, T):
    """[T, T] bool, ancestor-or-self for the len(parents) real nodes; padding rows past them see only themselves."""
    mask = torch.eye(T, dtype=torch.bool)
    for i in range(1, len(parents)):
        mask[i] |= mask[parents[i]]
    return mask


# (B, H, KVH, D, S, prefix_len per request, tree kind per request, T per request); requests shorter than
# max(T) are padded. GQA ratios 1, 4 and 7; prefixes of 0 and 1; prefixes and blocks that end mid-tile.
SHAPES = {
    "b1-g1-chain5-p7": (1, 2, 2, 16, 16, [7], ["chain"], [5]),
    "b1-g1-star6-p1": (1, 2, 2, 32, 12, [1], ["star"], [6]),
    "b1-g4-tree9-p0": (1, 8, 2, 16, 12, [0], ["random"], [9]),
    "b1-g4-tree20-p37": (1, 4, 1, 16, 64, [37], ["random"], [20]),
    "b3-g4-mixed-padded": (3, 8, 2, 16, 48, [0, 1, 23], ["random", "chain", "star"], [9, 4, 1]),
    "b3-g7-mixed-padded": (3, 7, 1, 32, 40, [19, 0, 1], ["star", "random", "chain"], [3, 7, 5]),
    # padding rows past the first K/V tile that see nothing before their own tile (prefix 0, or an empty chunk)
    "b2-g1-tree20-padded": (2, 2, 2, 16, 48, [0, 5], ["random", "star"], [20, 3]),
}
# (num_splits, block_m, block_n): one program per row block, and a prefix split three ways (some chunks empty).
SPLITS = {"one-split": (1, 16, 16), "3-splits": (3, 16, 16)}


def make_problem(B, H, KVH, D, S, prefix_lens, kinds, lens, dtype=torch.float32, causal=False, k_dead=float("nan"),
                 index_dtype=torch.int64):  # fmt: skip
    """Random problem in N = B + 2 slots, block tokens scattered past each prefix; every cache position a request
    must not read (past its prefix and not in its cache_loc, and all of the unused slots) holds poison."""
    gen = torch.Generator().manual_seed(42)
    T, N = max(lens), B + 2
    q = torch.randn(B, T, H, D, generator=gen)
    k_cache = torch.randn(N, KVH, S, D, generator=gen)
    v_cache = torch.randn(N, KVH, S, D, generator=gen)
    slots = torch.randperm(N, generator=gen)[:B]
    prefix_len = torch.tensor(prefix_lens)
    cache_loc = torch.stack([p + torch.randperm(S - p, generator=gen)[:T] for p in prefix_lens])
    parents, masks = [], []
    for kind, n in zip(kinds, lens):
        parents.append({"chain": chain, "star": star}[kind](n) if kind != "random" else random_tree(n, gen))
        masks.append(ancestor_mask(parents[-1], T))
    block_mask = torch.stack(masks)
    if causal:  # padding rows at the end of a causal block see the whole block: still finite, never read
        assert all(kind == "chain" for kind in kinds)
        block_mask = None
    live = torch.zeros(N, S, dtype=torch.bool)
    for b in range(B):
        live[slots[b], : prefix_lens[b]] = True
        live[slots[b], cache_loc[b]] = True  # padded tokens' K/V are written by the store too
    for cache, dead in ((k_cache, k_dead), (v_cache, float("nan"))):
        cache.masked_fill_(~live[:, None, :, None], dead)
    q, k_cache, v_cache = (t.to(dtype) for t in (q, k_cache, v_cache))
    idx = (slots.to(index_dtype), prefix_len.to(index_dtype), cache_loc.to(index_dtype))
    return (q, k_cache, v_cache, *idx, block_mask, D**-0.5), parents


@pytest.mark.parametrize("splits", SPLITS.values(), ids=SPLITS.keys())
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_triton_matches_reference_fp32(shape, splits):
    num_splits, block_m, block_n = splits
    args, _ = make_problem(*shape)
    ref = tree_attention_ref(*args)
    out = tat.tree_attention(*args, num_splits=num_splits, block_m=block_m, block_n=block_n)
    assert out.dtype == torch.float32
    assert_close("tree_attention fp32", ref, out, ratio=1e-5)


CAUSAL = {
    "b1-g1-chain5-p7": (1, 2, 2, 16, 16, [7], ["chain"], [5]),
    "b3-g4-chains-padded": (3, 8, 2, 16, 40, [1, 0, 17], ["chain"] * 3, [6, 2, 3]),
    "b2-g7-chains-padded": (2, 7, 1, 16, 24, [0, 3], ["chain"] * 2, [5, 2]),  # 16 rows hold 2 tokens of 7 heads
}


@pytest.mark.parametrize("splits", SPLITS.values(), ids=SPLITS.keys())
@pytest.mark.parametrize("shape", CAUSAL.values(), ids=CAUSAL.keys())
def test_triton_matches_reference_causal(shape, splits):
    num_splits, block_m, block_n = splits
    args, _ = make_problem(*shape, causal=True)
    assert args[6] is None
    ref = tree_attention_ref(*args)
    out = tat.tree_attention(*args, num_splits=num_splits, block_m=block_m, block_n=block_n)
    assert_close("tree_attention causal", ref, out, ratio=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape_id", ["b3-g4-mixed-padded", "b3-g7-mixed-padded"])
def test_triton_matches_reference_half(shape_id, dtype):
    # K poison is the dtype's max: if a dead position ever leaked into a score it would own the softmax.
    args, _ = make_problem(*SHAPES[shape_id], dtype=dtype, k_dead=torch.finfo(dtype).max)
    ref = tree_attention_ref(*args)
    out = tat.tree_attention(*args, num_splits=3, block_m=16, block_n=16)
    assert out.dtype == dtype
    assert_close(f"tree_attention {dtype}", ref, out, ratio=1e-2)


def test_triton_default_config_int32_indices():
    """Default block sizes and shape-derived num_splits, int32 index tensors."""
    args, _ = make_problem(*SHAPES["b3-g7-mixed-padded"], index_dtype=torch.int32)
    assert_close("tree_attention defaults", tree_attention_ref(*args), tat.tree_attention(*args), ratio=1e-5)


def test_triton_strided_q_view():
    """q sliced out of a fused qkv projection: a strided view with a dense last dim, read in place."""
    args, _ = make_problem(*SHAPES["b3-g4-mixed-padded"])
    q = args[0]
    B, T, H, D = q.shape
    KVH = args[1].shape[1]
    qkv = torch.randn(B, T, (H + 2 * KVH) * D)
    qkv[..., : H * D] = q.reshape(B, T, H * D)
    q_view = qkv[..., : H * D].view(B, T, H, D)
    assert not q_view.is_contiguous()
    out = tat.tree_attention(q_view, *args[1:], num_splits=1, block_m=16, block_n=16)
    assert out.is_contiguous()
    assert_close("tree_attention strided q", tree_attention_ref(*args), out, ratio=1e-5)


def _sdpa(q, k, v, scale):
    """q [H, D] over k, v [KVH, n, D] -> [H, D]."""
    return F.scaled_dot_product_attention(q[:, None], k, v, scale=scale, enable_gqa=True)[:, 0]


def _gather(cache, slot, positions):
    return cache[slot][:, positions]  # [KVH, len(positions), D]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "chain-mask"])
def test_reference_chain_matches_contiguous_sdpa(causal):
    """A chain: query i is ordinary attention over the contiguous sequence prefix + chain[0..i]."""
    args, _ = make_problem(*CAUSAL["b3-g4-chains-padded"], causal=causal)
    q, k, v, slots, prefix_len, cache_loc, _, scale = args
    ref = tree_attention_ref(*args)
    for b, n in enumerate(CAUSAL["b3-g4-chains-padded"][-1]):
        p, s = int(prefix_len[b]), int(slots[b])
        seq = list(range(p)) + cache_loc[b, :n].tolist()
        for i in range(n):
            dense = _sdpa(q[b, i], _gather(k, s, seq[: p + i + 1]), _gather(v, s, seq[: p + i + 1]), scale)
            assert_close(f"chain request {b} query {i}", dense, ref[b, i], ratio=1e-5)


@pytest.mark.parametrize("shape_id", ["b3-g4-mixed-padded", "b3-g7-mixed-padded", "b1-g4-tree20-p37"])
def test_reference_tree_matches_path_sdpa(shape_id):
    """A tree: query i is ordinary attention over the prefix plus its root-to-i path, nothing else."""
    args, parents = make_problem(*SHAPES[shape_id])
    q, k, v, slots, prefix_len, cache_loc, _, scale = args
    ref = tree_attention_ref(*args)
    for b, par in enumerate(parents):
        p, s = int(prefix_len[b]), int(slots[b])
        for i in range(len(par)):
            path = [i]
            while par[path[-1]] >= 0:
                path.append(par[path[-1]])
            seq = list(range(p)) + cache_loc[b, path[::-1]].tolist()
            dense = _sdpa(q[b, i], _gather(k, s, seq), _gather(v, s, seq), scale)
            assert_close(f"tree request {b} query {i}", dense, ref[b, i], ratio=1e-5)


def test_dispatch_uses_reference_on_cpu():
    args, _ = make_problem(*SHAPES["b3-g4-mixed-padded"])
    torch.testing.assert_close(tree_attention(*args), tree_attention_ref(*args))


def test_default_num_splits_fills_the_gpu_from_shapes_only():
    sms = 132
    # Batch 1, one row block per kv head, long cache: at least two waves of programs.
    assert 8 * tat.default_num_splits(8, 32768, 64, sms) >= 2 * sms
    # Never more splits than BLOCK_N tiles in the cache, never fewer than one.
    assert tat.default_num_splits(8, 100, 64, sms) == 2
    assert tat.default_num_splits(64 * 8 * 4, 32768, 64, sms) == 1


def test_triton_strided_index_views():
    """slots and prefix_len as columns of one packed int64 tensor (strided views, as a drafter's graph inputs
    carry them): the kernel reads the right request's values, not the neighbouring columns'."""
    args, _ = make_problem(*SHAPES["b3-g4-mixed-padded"])
    slots, prefix_len = args[3], args[4]
    packed = torch.stack([slots, torch.full_like(slots, 1 << 40), prefix_len], dim=1)  # [B, 3]: poison between
    views = (packed[:, 0], packed[:, 2])
    assert not views[0].is_contiguous()
    out = tat.tree_attention(*args[:3], *views, *args[5:], num_splits=1, block_m=16, block_n=16)
    assert_close("tree_attention strided indices", tree_attention_ref(*args), out, ratio=1e-5)
