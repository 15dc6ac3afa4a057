"""Decode attention: Triton (interpreted) vs the torch reference, and the reference vs torch SDPA."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere, so kernels run on CPU

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from specpilot.ops.decode_attention import decode_attention, decode_attention_ref  # noqa: E402
from specpilot.ops.decode_attention import triton as dat  # noqa: E402
from specpilot.ops.testing import assert_close  # noqa: E402

# (B, H, KVH, D, S, kv_len per request); kv_len covers 1, == S, and values that end mid-tile.
SHAPES = {
    "b1-h4kv4-d64-s1": (1, 4, 4, 64, 1, [1]),
    "b3-h4kv4-d128-s5": (3, 4, 4, 128, 5, [5, 1, 3]),
    "b3-h8kv2-d128-s67": (3, 8, 2, 128, 67, [1, 67, 30]),
    "b1-h8kv2-d64-s67": (1, 8, 2, 64, 67, [40]),
    "b3-h7kv1-d64-s300": (3, 7, 1, 64, 300, [300, 1, 129]),
    "b1-h7kv1-d128-s300": (1, 7, 1, 128, 300, [300]),
}
# (num_splits, block_n): the shape-derived default, one split, and many small splits (several of them empty).
SPLITS = {"default": (None, None), "one-split": (1, 64), "8-splits-n16": (8, 16)}


def make_problem(B, H, KVH, D, S, kv_lens, dtype=torch.float32, index_dtype=torch.int64, k_dead=float("nan")):
    """Random problem in N = B + 2 slots; every cache position a request must not read holds poison."""
    gen = torch.Generator().manual_seed(42)
    N = B + 2
    q = torch.randn(B, H, D, generator=gen)
    k_cache = torch.randn(N, KVH, S, D, generator=gen)
    v_cache = torch.randn(N, KVH, S, D, generator=gen)
    slot = torch.randperm(N, generator=gen)[:B]
    kv_len = torch.tensor(kv_lens)
    for name, cache, dead in (("k", k_cache, k_dead), ("v", v_cache, float("nan"))):
        live = torch.zeros(N, S, dtype=torch.bool)
        for b in range(B):
            live[slot[b], : kv_lens[b]] = True
        cache.masked_fill_(~live[:, None, :, None], dead)
    q, k_cache, v_cache = (t.to(dtype) for t in (q, k_cache, v_cache))
    return q, k_cache, v_cache, slot.to(index_dtype), kv_len.to(index_dtype), D**-0.5


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("splits", SPLITS.values(), ids=SPLITS.keys())
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_triton_matches_reference_fp32(shape, splits, index_dtype):
    num_splits, block_n = splits
    q, k, v, slot, kv_len, scale = make_problem(*shape, index_dtype=index_dtype)
    ref = decode_attention_ref(q, k, v, slot, kv_len, scale)
    out = dat.decode_attention(q, k, v, slot, kv_len, scale, num_splits=num_splits, block_n=block_n)
    assert out.dtype == q.dtype
    assert_close("decode_attention fp32", ref, out, ratio=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape_id", ["b3-h8kv2-d128-s67", "b3-h7kv1-d64-s300"])
def test_triton_matches_reference_half(shape_id, dtype):
    # K poison is the dtype's max: if a dead position ever leaked into a score it would own the softmax.
    big = torch.finfo(dtype).max
    q, k, v, slot, kv_len, scale = make_problem(*SHAPES[shape_id], dtype=dtype, k_dead=big)
    ref = decode_attention_ref(q, k, v, slot, kv_len, scale)
    out = dat.decode_attention(q, k, v, slot, kv_len, scale, num_splits=8, block_n=16)
    assert out.dtype == dtype
    assert_close(f"decode_attention {dtype}", ref, out, ratio=1e-2)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_reference_matches_sdpa(shape):
    q, k, v, slot, kv_len, scale = make_problem(*shape)
    ref = decode_attention_ref(q, k, v, slot, kv_len, scale)
    for b in range(q.shape[0]):
        n, s = int(kv_len[b]), int(slot[b])
        dense = F.scaled_dot_product_attention(
            q[b, :, None], k[s, :, :n], v[s, :, :n], scale=scale, enable_gqa=True
        )  # [H, 1, D]
        assert_close(f"reference vs sdpa, request {b}", dense[:, 0], ref[b], ratio=1e-5)


def test_dispatch_uses_reference_on_cpu():
    q, k, v, slot, kv_len, scale = make_problem(*SHAPES["b3-h8kv2-d128-s67"])
    torch.testing.assert_close(
        decode_attention(q, k, v, slot, kv_len, scale), decode_attention_ref(q, k, v, slot, kv_len, scale)
    )


def test_default_num_splits_fills_the_gpu_from_shapes_only():
    sms = 132
    # Batch-1 long context: at least two waves of programs.
    assert 1 * 8 * dat.default_num_splits(1, 8, 32768, 64, sms) >= 2 * sms
    # Never more splits than BLOCK_N tiles in the cache, never fewer than one.
    assert dat.default_num_splits(1, 8, 100, 64, sms) == 2
    assert dat.default_num_splits(512, 8, 32768, 64, sms) == 1
