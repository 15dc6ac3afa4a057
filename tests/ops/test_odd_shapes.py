"""Every kernel takes the shapes a loaded model may have (head dims 48 / 80 / 96, odd head counts, value/key head
ratios 1 / 2 / 3), or its dispatcher falls back to the reference: the Triton functions under the interpreter
against the references, each `supports` predicate, and the dispatch decision (CUDA simulated by patching
use_triton, so the interpreted kernel or the reference runs)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere, so kernels run on CPU

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

import specpilot.ops.causal_conv1d as conv_op  # noqa: E402
import specpilot.ops.decode_attention as decode_op  # noqa: E402
import specpilot.ops.gated_delta_rule as gdn_op  # noqa: E402
import specpilot.ops.gdn_tree as tree_gdn_op  # noqa: E402
import specpilot.ops.qk_norm_rope_store as rope_op  # noqa: E402
import specpilot.ops.tree_attention as tree_op  # noqa: E402
import specpilot.ops.w12n_gemv as w12n_op  # noqa: E402
from specpilot.ops import dispatch  # noqa: E402
from specpilot.ops.causal_conv1d import causal_conv1d_update_ref  # noqa: E402
from specpilot.ops.causal_conv1d import triton as conv_triton  # noqa: E402
from specpilot.ops.decode_attention import decode_attention_ref  # noqa: E402
from specpilot.ops.decode_attention import triton as decode_triton  # noqa: E402
from specpilot.ops.gated_delta_rule import chunk as gdn_chunk  # noqa: E402
from specpilot.ops.gated_delta_rule import fused_recurrent_gated_delta_rule_ref, gdn_gating  # noqa: E402
from specpilot.ops.gated_delta_rule import triton as gdn_triton  # noqa: E402
from specpilot.ops.gdn_tree import ancestor_mask  # noqa: E402
from specpilot.ops.gdn_tree import chunk as tree_gdn_chunk  # noqa: E402
from specpilot.ops.gdn_tree import triton as tree_gdn_triton  # noqa: E402
from specpilot.ops.qk_norm_rope_store import qk_norm_rope_store_ref  # noqa: E402
from specpilot.ops.qk_norm_rope_store import triton as rope_triton  # noqa: E402
from specpilot.ops.store_kv import store_kv_ref  # noqa: E402
from specpilot.ops.store_kv import triton as store_triton  # noqa: E402
from specpilot.ops.testing import assert_close  # noqa: E402
from specpilot.ops.tree_attention import tree_attention_ref  # noqa: E402
from specpilot.ops.tree_attention import triton as tree_triton  # noqa: E402
from specpilot.ops.w12n_gemv import triton as w12n_triton  # noqa: E402
from specpilot.ops.w12n_gemv import w12n_gemv_ref  # noqa: E402
from specpilot.weights import w12n  # noqa: E402


@pytest.fixture(autouse=True)
def _no_recorded_fallbacks():
    dispatch.clear_fallbacks()
    yield
    dispatch.clear_fallbacks()


def _cache(N, KVH, S, D, live: dict[int, int]):
    """Random K/V caches [N, KVH, S, D] whose positions past each slot's live length hold NaN."""
    k, v = torch.randn(N, KVH, S, D), torch.randn(N, KVH, S, D)
    dead = torch.ones(N, S, dtype=torch.bool)
    for slot, n in live.items():
        dead[slot, :n] = False
    return k.masked_fill(dead[:, None, :, None], float("nan")), v.masked_fill(dead[:, None, :, None], float("nan"))


# --- attention ---------------------------------------------------------------------------------------------------

# (D, H, KVH): head dims 48 / 80 / 96 with GQA groups of 3, 1 and 5 query heads (odd counts)
ATTN = {"d48-h6kv2": (48, 6, 2), "d80-h3kv3": (80, 3, 3), "d96-h5kv1": (96, 5, 1)}


@pytest.mark.parametrize("D,H,KVH", ATTN.values(), ids=ATTN.keys())
def test_store_kv_takes_odd_head_dims(D, H, KVH):
    B, T, N, S = 2, 3, 3, 8
    k, v = torch.randn(B, T, KVH, D), torch.randn(B, T, KVH, D)
    slots, loc = torch.tensor([2, 0]), torch.tensor([[0, 3, 5], [1, 2, 7]])
    kc, vc = (torch.full((N, KVH, S, D), float("nan")) for _ in range(2))
    kr, vr = kc.clone(), vc.clone()
    store_kv_ref(k, v, kr, vr, slots, loc)
    store_triton.store_kv(k, v, kc, vc, slots, loc)
    # written rows equal, every other row still NaN (a padded column written past D would land in the next row)
    torch.testing.assert_close(kc, kr, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(vc, vr, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("num_splits", [1, 4], ids=["direct", "4-splits"])
@pytest.mark.parametrize("D,H,KVH", ATTN.values(), ids=ATTN.keys())
def test_decode_attention_takes_odd_head_dims(D, H, KVH, num_splits):
    B, N, S = 2, 3, 40
    slot, kv_len = torch.tensor([2, 0]), torch.tensor([37, 5])
    q = torch.randn(B, H, D)
    kc, vc = _cache(N, KVH, S, D, {2: 37, 0: 5})
    out = decode_triton.decode_attention(q, kc, vc, slot, kv_len, D**-0.5, num_splits=num_splits, block_n=16)
    assert_close(f"decode_attention D={D}", decode_attention_ref(q, kc, vc, slot, kv_len, D**-0.5), out)


@pytest.mark.parametrize("num_splits", [1, 3], ids=["one-split", "3-splits"])
@pytest.mark.parametrize("tree", [False, True], ids=["causal", "tree"])
@pytest.mark.parametrize("D,H,KVH", ATTN.values(), ids=ATTN.keys())
def test_tree_attention_takes_odd_head_dims(D, H, KVH, tree, num_splits):
    B, T, N, S = 2, 5, 3, 48
    slots, prefix = torch.tensor([2, 0]), torch.tensor([30, 9])
    loc = prefix[:, None] + torch.arange(T)
    q = torch.randn(B, T, H, D)
    kc, vc = _cache(N, KVH, S, D, {2: 35, 0: 14})
    mask = ancestor_mask(torch.tensor([[-1, 0, 0, 1, 2], [-1, 0, 1, 1, 3]])) if tree else None
    out = tree_triton.tree_attention(q, kc, vc, slots, prefix, loc, mask, D**-0.5, num_splits=num_splits)
    assert_close(f"tree_attention D={D}", tree_attention_ref(q, kc, vc, slots, prefix, loc, mask, D**-0.5), out)


# (D, rotary dims, per-head norm): Qwen3.5's partial RoPE (a quarter of the head) and full RoPE
ROPE = {"d80-r20-norm": (80, 20, True), "d48-r48": (48, 48, False), "d96-r24-norm": (96, 24, True)}


@pytest.mark.parametrize("D,R,norm", ROPE.values(), ids=ROPE.keys())
def test_qk_norm_rope_store_takes_odd_head_dims(D, R, norm):
    B, T, H, KVH, N, S = 2, 2, 3, 1, 3, 6
    q, k, v = torch.randn(B, T, H, D), torch.randn(B, T, KVH, D), torch.randn(B, T, KVH, D)
    qw, kw = (torch.randn(D) * 0.2, torch.randn(D) * 0.2) if norm else (None, None)
    angles = torch.rand(B, T, R // 2) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    slots, loc = torch.tensor([1, 2]), torch.tensor([[0, 1], [4, 5]])
    kc, vc = (torch.full((N, KVH, S, D), float("nan")) for _ in range(2))
    kr, vr = kc.clone(), vc.clone()
    ref = qk_norm_rope_store_ref(q, k, v, qw, kw, cos, sin, 1e-6, True, kr, vr, slots, loc)
    out = rope_triton.qk_norm_rope_store(q, k, v, qw, kw, cos, sin, 1e-6, True, kc, vc, slots, loc)
    assert_close("qk_norm_rope_store q", ref, out)
    torch.testing.assert_close(kc, kr, rtol=1e-5, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(vc, vr, rtol=0, atol=0, equal_nan=True)


# --- Gated DeltaNet ------------------------------------------------------------------------------------------------

# (K, V, key heads, value/key head ratio)
GDN = {"k48-v96-r3": (48, 96, 2, 3), "k96-v48-r2": (96, 48, 1, 2), "k80-v48-r1": (80, 48, 3, 1)}


def _gdn_inputs(B, T, H, HV, K, V):
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, HV, V)
    a, b = torch.randn(B, T, HV), torch.randn(B, T, HV)
    A_log, dt_bias = torch.empty(HV).uniform_(0.01, 4.0).log(), torch.randn(HV)
    return q, k, v, a, b, A_log, dt_bias


@pytest.mark.parametrize("K,V,H,ratio", GDN.values(), ids=GDN.keys())
def test_fused_recurrent_gdn_takes_odd_head_dims(K, V, H, ratio):
    B, T, HV = 2, 3, H * ratio
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(B, T, H, HV, K, V)
    pool = torch.randn(4, HV, K, V) * 0.3
    idx = torch.tensor([3, 1])
    ref_pool, out_pool = pool.clone(), pool.clone()
    ref = fused_recurrent_gated_delta_rule_ref(q, k, v, a, b, A_log, dt_bias, ref_pool, idx)
    out = gdn_triton.fused_recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, out_pool, idx)
    assert_close(f"fused recurrent K={K}", ref, out)
    assert_close(f"fused recurrent state K={K}", ref_pool, out_pool)


@pytest.mark.parametrize("K,V,H,ratio", GDN.values(), ids=GDN.keys())
def test_chunk_gdn_kernel_takes_odd_head_dims(K, V, H, ratio):
    B, T, HV = 1, 37, H * ratio  # three chunks of 16, the last one partial
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(B, T, H, HV, K, V)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    s0 = torch.randn(B, HV, K, V) * 0.3
    ref_o, ref_s = gdn_chunk.chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=16)
    o, s = gdn_triton.chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=16, precision="ieee")
    assert_close(f"chunk kernel K={K}", ref_o, o, 1e-5)
    assert_close(f"chunk kernel state K={K}", ref_s, s, 1e-5)


@pytest.mark.parametrize("K,V,H,ratio", GDN.values(), ids=GDN.keys())
def test_tree_gdn_kernel_takes_odd_head_dims(K, V, H, ratio):
    B, T, HV = 2, 6, H * ratio
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(B, T, H, HV, K, V)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    mask = ancestor_mask(torch.tensor([[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 3, 4]]))
    pool, slots = torch.randn(4, HV, K, V) * 0.3, torch.tensor([3, 0])
    ref_o, ref_stash = tree_gdn_chunk.tree_gated_delta_rule(q, k, v, g, beta, mask, pool, state_slots=slots)
    stash = tuple(torch.full(t.shape, float("nan")) for t in ref_stash)  # dense, as the cache holds it
    o, _ = tree_gdn_triton.tree_gated_delta_rule(q, k, v, g, beta, mask, pool, out=stash, state_slots=slots,
                                                 precision="ieee")
    assert_close(f"tree kernel K={K}", ref_o, o, 1e-5)
    for name, ref, got in zip(("k", "u", "G"), ref_stash, stash):
        assert_close(f"tree kernel stash {name} K={K}", ref, got, 1e-5)


# --- supports predicates and dispatch decisions --------------------------------------------------------------------

def test_shared_tile_helpers():
    assert [dispatch.tile_width(d) for d in (1, 8, 16, 48, 80, 96, 128, 130)] == [16, 16, 16, 64, 128, 128, 128, 256]
    assert dispatch.tile_width(3, least=1) == 4 and dispatch.tile_width(1, least=1) == 1
    assert dispatch.fits_tile(48, 96, 256) and not dispatch.fits_tile(48, 320) and not dispatch.fits_tile(0)


@pytest.mark.parametrize("D", [8, 48, 80, 96, 256])
def test_kernels_take_head_dims_up_to_a_tile(D):
    q = torch.randn(1, 2, 3, D)
    assert decode_triton.supports(q[:, 0]) and tree_triton.supports(q)
    assert gdn_triton.supports(q) and tree_gdn_triton.supports(q)


def test_kernels_refuse_what_they_cannot_take():
    wide = torch.randn(1, 2, 3, 320)
    assert not decode_triton.supports(wide[:, 0]) and not tree_triton.supports(wide)
    assert not gdn_triton.supports(wide) and not tree_gdn_triton.supports(wide)
    assert not tree_gdn_triton.supports(torch.randn(1, 257, 1, 16))  # more nodes than one tile
    assert not decode_triton.supports(torch.randn(1, 2, 64, dtype=torch.float64))
    assert [conv_triton.supports(torch.randn(4, w)) for w in (1, 2, 4, 8, 9)] == [False, True, True, True, False]
    q, k = torch.randn(1, 1, 2, 48), torch.randn(1, 1, 1, 48)
    assert rope_triton.supports(q, k, None, None, torch.randn(1, 1, 12))
    assert not rope_triton.supports(q, k, None, None, torch.randn(1, 1, 13))  # odd rotary dims
    assert not rope_triton.supports(q, k, torch.randn(48, dtype=torch.float64), torch.randn(48), torch.randn(1, 1, 12))
    x = torch.randn(1, 64)
    assert w12n_triton.supports(x, w12n.encode(torch.randn(8, 64).bfloat16(), segment=4))
    odd = w12n.encode(torch.randn(8, 64).bfloat16(), segment=6)  # tiles of whole 4-weight words do not fit
    assert not w12n_triton.supports(x, odd) and not w12n_triton.decode_supports(odd)


def _on_cuda(monkeypatch, *ops):
    """CPU tensors dispatched as if on CUDA: the interpreted kernel, or the reference where it cannot take them."""
    for op in ops:
        monkeypatch.setattr(op, "use_triton", lambda x: True)


def test_decode_attention_dispatch(monkeypatch):
    _on_cuda(monkeypatch, decode_op)
    slot, kv_len = torch.tensor([1]), torch.tensor([6])
    for D, kernel in ((80, True), (320, False)):
        q = torch.randn(1, 3, D)
        kc, vc = _cache(2, 1, 8, D, {1: 6})
        out = decode_op.decode_attention(q, kc, vc, slot, kv_len, D**-0.5)
        assert_close(f"dispatched decode_attention D={D}", decode_attention_ref(q, kc, vc, slot, kv_len, D**-0.5), out)
        assert dispatch.fallbacks() == ({} if kernel else {"decode_attention": 1})


def test_tree_attention_dispatch(monkeypatch):
    _on_cuda(monkeypatch, tree_op)
    slots, prefix, loc = torch.tensor([0]), torch.tensor([3]), torch.tensor([[3, 4]])
    for D, kernel in ((96, True), (320, False)):
        q = torch.randn(1, 2, 2, D)
        kc, vc = _cache(1, 2, 8, D, {0: 5})
        out = tree_op.tree_attention(q, kc, vc, slots, prefix, loc, None, D**-0.5)
        assert_close(f"dispatched tree_attention D={D}",
                     tree_attention_ref(q, kc, vc, slots, prefix, loc, None, D**-0.5), out)
        assert dispatch.fallbacks() == ({} if kernel else {"tree_attention": 1})


def test_gated_delta_rule_dispatch(monkeypatch):
    _on_cuda(monkeypatch, gdn_op)
    for K, kernel in ((48, True), (320, False)):
        q, k, v, a, b, A_log, dt_bias = _gdn_inputs(1, 2, 1, 3, K, 16)
        pool = torch.randn(2, 3, K, 16) * 0.3
        ref_pool, out_pool, idx = pool.clone(), pool.clone(), torch.tensor([1])
        ref = fused_recurrent_gated_delta_rule_ref(q, k, v, a, b, A_log, dt_bias, ref_pool, idx)
        out = gdn_op.fused_recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, out_pool, idx)
        assert_close(f"dispatched fused recurrent K={K}", ref, out)
        assert_close(f"dispatched fused recurrent state K={K}", ref_pool, out_pool)
        g, beta = gdn_gating(a, b, A_log, dt_bias)
        ref_o, _ = gdn_chunk.chunk_gated_delta_rule(q, k, v, g, beta, pool[:1])
        o, _ = gdn_op.chunk_gated_delta_rule(q, k, v, g, beta, pool[:1], kernel=True)
        assert_close(f"dispatched chunk K={K}", ref_o, o, 1e-5)
        assert dispatch.fallbacks() == ({} if kernel else {"fused_recurrent_gated_delta_rule": 1,
                                                           "chunk_gated_delta_rule": 1})
        dispatch.clear_fallbacks()


def test_tree_gated_delta_rule_dispatch(monkeypatch):
    _on_cuda(monkeypatch, tree_gdn_op)
    mask = ancestor_mask(torch.tensor([[-1, 0, 0]]))
    for K, kernel in ((96, True), (320, False)):
        q, k, v, a, b, A_log, dt_bias = _gdn_inputs(1, 3, 1, 2, K, 16)
        g, beta = gdn_gating(a, b, A_log, dt_bias)
        s0 = torch.randn(1, 2, K, 16) * 0.3
        ref, _ = tree_gdn_chunk.tree_gated_delta_rule(q, k, v, g, beta, mask, s0)
        out, _ = tree_gdn_op.tree_gated_delta_rule(q, k, v, g, beta, mask, s0)
        assert_close(f"dispatched tree gdn K={K}", ref, out, 1e-5)
        assert dispatch.fallbacks() == ({} if kernel else {"tree_gated_delta_rule": 1})


@pytest.mark.parametrize("W,kernel", [(4, True), (9, False)])
def test_causal_conv1d_dispatch(monkeypatch, W, kernel):
    _on_cuda(monkeypatch, conv_op)
    x, weight, pool = torch.randn(1, 2, 24), torch.randn(24, W), torch.randn(2, 24, W - 1)
    ref_pool, out_pool, idx = pool.clone(), pool.clone(), torch.tensor([1])
    ref = causal_conv1d_update_ref(x, ref_pool, idx, weight)
    out = conv_op.causal_conv1d_update(x, out_pool, idx, weight)
    assert_close(f"dispatched conv W={W}", ref, out)
    assert_close(f"dispatched conv state W={W}", ref_pool, out_pool)
    assert dispatch.fallbacks() == ({} if kernel else {"causal_conv1d_update": 1})


def test_qk_norm_rope_store_dispatch_odd_rotary_dims(monkeypatch):
    _on_cuda(monkeypatch, rope_op)
    q, k, v = torch.randn(1, 1, 2, 48), torch.randn(1, 1, 1, 48), torch.randn(1, 1, 1, 48)
    angles = torch.rand(1, 1, 7)
    cos, sin = torch.cat([angles.cos()] * 2, -1)[..., :13], torch.cat([angles.sin()] * 2, -1)[..., :13]
    slots, loc = torch.tensor([0]), torch.tensor([[1]])
    kc, vc = torch.randn(1, 1, 4, 48), torch.randn(1, 1, 4, 48)
    kr, vr = kc.clone(), vc.clone()
    ref = qk_norm_rope_store_ref(q, k, v, None, None, cos, sin, 1e-6, False, kr, vr, slots, loc)
    out = rope_op.qk_norm_rope_store(q, k, v, None, None, cos, sin, 1e-6, False, kc, vc, slots, loc)
    assert torch.equal(out, ref) and torch.equal(kc, kr) and torch.equal(vc, vr)
    assert dispatch.fallbacks() == {"qk_norm_rope_store": 1}


def test_w12n_dispatch_odd_segment(monkeypatch):
    _on_cuda(monkeypatch, w12n_op)
    x = torch.randn(2, 36)
    t = w12n.encode(torch.randn(5, 36).bfloat16(), segment=6)
    assert_close("dispatched w12n segment 6", w12n_gemv_ref(x, t), w12n_op.w12n_gemv(x, t))
    x20 = torch.randn(20, 36).bfloat16()  # more rows than the fused GEMV takes: decode, then F.linear
    assert torch.equal(w12n_op.w12n_linear(x20, t), torch.nn.functional.linear(x20, w12n.decode(t)))
    assert dispatch.fallbacks() == {"w12n_gemv": 1, "w12n_decode": 1}
