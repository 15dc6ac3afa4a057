"""Fused q/k norm + RoPE + K/V store: Triton (interpreted) vs the reference, and the reference vs today's path."""

import pytest
import torch

from specpilot.config import RopeConfig
from specpilot.layers import pointwise as pw
from specpilot.layers.rotary import RotaryEmbedding
from specpilot.ops.qk_norm_rope_store import qk_norm_rope_store, qk_norm_rope_store_ref
from specpilot.ops.store_kv.reference import store_kv_ref
from specpilot.ops.testing import assert_close

triton = pytest.importorskip("triton")

# (B, T, H, KVH, D, R): GQA down to one KV head, partial rotary (Qwen3.5: D/4; 24 of 128: a half of 12, not a
# power of two), a head dim that is not a power of two (24), and a small block of T > 1.
SHAPES = {
    "b1-h8kv1-d128": (1, 1, 8, 1, 128, 128),
    "b3-h6kv2-d64": (3, 1, 6, 2, 64, 64),
    "b5-h4kv2-d64-r16": (5, 1, 4, 2, 64, 16),
    "b5-h3kv1-d128-r24": (5, 1, 3, 1, 128, 24),
    "b3-h4kv4-d24": (3, 1, 4, 4, 24, 24),
    "b2-t3-h4kv2-d64-r32": (2, 3, 4, 2, 64, 32),
}
NORMS = ["plain", "zero-centred", "none"]


def make_problem(B, T, H, KVH, D, R, norm, dtype=torch.float32, gate=False):
    """q/k/v as strided views of one packed projection (q interleaved with a gate when `gate`), ragged slots and
    cache positions, NaN-poisoned caches."""
    q_cols = H * D * (2 if gate else 1)
    packed = torch.randn(B, T, q_cols + 2 * KVH * D)
    q, k, v = packed.to(dtype).split([q_cols, KVH * D, KVH * D], dim=-1)
    q = q.view(B, T, H, 2 * D)[..., :D] if gate else q.view(B, T, H, D)
    k, v = k.view(B, T, KVH, D), v.view(B, T, KVH, D)
    positions = torch.randint(0, 900, (B, T))
    rotary = RotaryEmbedding(RopeConfig(theta=1e6, partial_rotary_factor=R / D), D)
    cos, sin = rotary(positions)
    assert cos.shape[-1] == R
    weights = {"plain": (1 + 0.3 * torch.randn(2, D)), "zero-centred": 0.3 * torch.randn(2, D), "none": None}[norm]
    qw, kw = (None, None) if weights is None else weights.to(dtype).unbind(0)
    N, S = B + 2, 40
    slots = torch.randperm(N)[:B]
    loc = torch.stack([torch.randperm(S)[:T] for _ in range(B)])
    caches = [torch.full((N, KVH, S, D), float("nan"), dtype=dtype) for _ in range(2)]
    return q, k, v, qw, kw, cos, sin, 1e-6, norm == "zero-centred", caches[0], caches[1], slots, loc


def run(fn, problem):
    """fn on fresh copies of the caches -> (q, k_cache, v_cache)."""
    *head, k_cache, v_cache, slots, loc = problem
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    return fn(*head, k_cache, v_cache, slots, loc), k_cache, v_cache


def todays_path(q, k, v, qw, kw, cos, sin, eps, zero_centered, k_cache, v_cache, slots, loc):
    q, k = pw.qk_norm_rope(q, k, qw, kw, cos, sin, eps, zero_centered)
    store_kv_ref(k, v, k_cache, v_cache, slots, loc)
    return q


def _triton(*args):
    from specpilot.ops.qk_norm_rope_store.triton import qk_norm_rope_store as fused

    return fused(*args)


def assert_caches_equal(ref, out):
    for name, a, b in (("k cache", ref[1], out[1]), ("v cache", ref[2], out[2])):
        assert torch.equal(torch.isnan(a), torch.isnan(b)), f"{name}: written positions differ"


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_triton_matches_reference_fp32(shape, norm):
    # q dense here, a strided half of a gated projection in the bf16 test (k and v are strided views in both)
    problem = make_problem(*shape, norm)
    ref, out = run(qk_norm_rope_store_ref, problem), run(_triton, problem)
    assert out[0].is_contiguous() and out[0].dtype == ref[0].dtype
    assert_caches_equal(ref, out)
    for name, a, b in zip(("q", "k cache", "v cache"), ref, out):
        assert_close(f"{name} fp32", a.nan_to_num(3.0), b.nan_to_num(3.0), ratio=1e-6)
    assert torch.equal(ref[2].nan_to_num(3.0), out[2].nan_to_num(3.0)), "v is copied, never changed"


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("shape_id", ["b3-h6kv2-d64", "b5-h3kv1-d128-r24", "b2-t3-h4kv2-d64-r32"])
def test_triton_matches_reference_bf16(shape_id, norm):
    """The kernel repeats eager torch's bf16 roundings: bit-equal under the interpreter; on a GPU the approximate
    rsqrt may move a rare element one bf16 step, which is all this allows."""
    problem = make_problem(*SHAPES[shape_id], norm, dtype=torch.bfloat16, gate=True)
    ref, out = run(qk_norm_rope_store_ref, problem), run(_triton, problem)
    assert out[0].dtype == torch.bfloat16
    assert_caches_equal(ref, out)
    for name, a, b in zip(("q", "k cache"), ref, out):
        a, b = a.nan_to_num(3.0).float(), b.nan_to_num(3.0).float()
        assert_close(f"{name} bf16", a, b, ratio=1e-3)
        assert (a == b).float().mean() > 0.99, f"{name}: more than 1% of elements not bit-equal"
    assert torch.equal(ref[2].nan_to_num(3.0), out[2].nan_to_num(3.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("shape_id", ["b5-h4kv2-d64-r16", "b2-t3-h4kv2-d64-r32"])
def test_reference_equals_todays_path(shape_id, norm, dtype):
    """The reference is bit for bit the unfused path: pointwise.qk_norm_rope (eager) then store_kv."""
    problem = make_problem(*SHAPES[shape_id], norm, dtype=dtype, gate=True)
    ref, today = run(qk_norm_rope_store_ref, problem), run(todays_path, problem)
    for a, b in zip(ref, today):
        assert torch.equal(a.nan_to_num(3.0), b.nan_to_num(3.0))


def test_dispatch_uses_reference_on_cpu():
    problem = make_problem(*SHAPES["b3-h6kv2-d64"], "plain")
    ref, out = run(qk_norm_rope_store_ref, problem), run(qk_norm_rope_store, problem)
    for a, b in zip(ref, out):
        assert torch.equal(a.nan_to_num(3.0), b.nan_to_num(3.0))


def test_triton_strided_slot_view():
    """slots as a column of one packed int64 tensor (a strided view, as a drafter's graph inputs carry it): the
    K/V land in each request's own slot."""
    problem = make_problem(*SHAPES["b5-h4kv2-d64-r16"], "plain")
    slots = problem[-2]
    packed = torch.stack([torch.full_like(slots, 1 << 40), slots], dim=1)  # [B, 2]: poison beside each slot
    view = packed[:, 1]
    assert not view.is_contiguous()
    ref, out = run(qk_norm_rope_store_ref, problem), run(_triton, (*problem[:-2], view, problem[-1]))
    assert_caches_equal(ref, out)
    for name, a, b in zip(("q", "k cache", "v cache"), ref, out):
        assert_close(f"{name} strided slots", a.nan_to_num(3.0), b.nan_to_num(3.0), ratio=1e-6)
