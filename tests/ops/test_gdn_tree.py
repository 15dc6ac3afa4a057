"""Gated DeltaNet over trees: the one-shot tree form and the fold commit against the per-path truth, and the
batched commit of all layers and requests (torch form and Triton kernels) against the per-layer per-request loop."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.ops.causal_conv1d import causal_conv1d_prefill
from specpilot.ops.gated_delta_rule import chunk_gated_delta_rule, gdn_gating
from specpilot.ops.gdn_tree import (PathIndex, ancestor_mask, commit_conv, commit_path_ref, commit_paths,
                                    commit_paths_ref, fold_path, tree_causal_conv1d, tree_causal_conv1d_ref,
                                    tree_gated_delta_rule, tree_gated_delta_rule_ref)
from specpilot.ops.testing import assert_close


def _inputs(B, T, H, HV, K, V, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g, beta = gdn_gating(torch.randn(B, T, HV, generator=gen), torch.randn(B, T, HV, generator=gen),
                         torch.rand(HV, generator=gen).log(), torch.randn(HV, generator=gen))
    S0 = torch.randn(B, HV, K, V, generator=gen) * 0.3
    return q, k, v, g, beta, S0


def _random_parents(B, T, seed):
    gen = torch.Generator().manual_seed(seed)
    par = torch.full((B, T), -1, dtype=torch.long)
    for b in range(B):
        for i in range(1, T):
            if torch.rand(1, generator=gen) < 0.9:  # some extra roots stand for padding nodes
                par[b, i] = torch.randint(0, i, (1,), generator=gen)
    return par


@given(st.integers(1, 3), st.integers(1, 19), st.sampled_from([(1, 1), (2, 4), (1, 3)]), st.integers(0, 999))
@settings(max_examples=25, deadline=None)
def test_tree_form_equals_per_path_recurrence(B, T, heads, seed):
    H, HV = heads
    q, k, v, g, beta, S0 = _inputs(B, T, H, HV, 8, 6, seed)
    parents = _random_parents(B, T, seed)
    out, _ = tree_gated_delta_rule(q, k, v, g, beta, ancestor_mask(parents), S0)
    assert_close("tree", tree_gated_delta_rule_ref(q, k, v, g, beta, parents, S0), out, 1e-5)


def test_chain_tree_equals_chunked_prefill():
    q, k, v, g, beta, S0 = _inputs(2, 23, 2, 4, 16, 8)
    chain = torch.arange(-1, 22).expand(2, 23)
    out, _ = tree_gated_delta_rule(q, k, v, g, beta, ancestor_mask(chain), S0)
    ref, _ = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=S0, chunk_size=8)
    assert_close("chain", ref, out, 1e-5)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fold_commit_equals_replayed_path(seed):
    B, T, C, W = 1, 12, 5, 4
    q, k, v, g, beta, S0 = _inputs(B, T, 2, 4, 8, 6, seed)
    parents = _random_parents(B, T, seed)
    par = parents[0].tolist()
    _, (kn, u, G) = tree_gated_delta_rule(q, k, v, g, beta, ancestor_mask(parents), S0)
    x, conv = torch.randn(T, C), torch.randn(C, W - 1)
    for leaf in range(T):
        path = [leaf]
        while par[path[-1]] >= 0:
            path.append(par[path[-1]])
        path = path[::-1]
        S_ref, conv_ref = commit_path_ref(S0[0], conv, q[0], k[0], v[0], g[0], beta[0], x, path)
        assert_close("fold", S_ref, fold_path(S0[0], kn[0], u[0], G[0], path), 1e-5)
        assert torch.equal(commit_conv(conv, x, path), conv_ref)


@given(st.integers(1, 3), st.integers(1, 15), st.integers(2, 5), st.integers(0, 999))
@settings(max_examples=25, deadline=None)
def test_tree_conv_equals_path_walk(B, T, W, seed):
    gen = torch.Generator().manual_seed(seed)
    x, state = torch.randn(B, T, 7, generator=gen), torch.randn(B, 7, W - 1, generator=gen)
    weight = torch.randn(7, W, generator=gen)
    parents = _random_parents(B, T, seed)
    assert_close("tree conv", tree_causal_conv1d_ref(x, parents, state, weight),
                 tree_causal_conv1d(x, parents, state, weight), 1e-6)


def test_tree_conv_on_a_chain_equals_prefill_conv():
    x, state, weight = torch.randn(2, 9, 6), torch.randn(2, 6, 3), torch.randn(6, 4)
    chain = torch.arange(-1, 8).expand(2, 9)
    ref, _ = causal_conv1d_prefill(x, weight, state)
    assert_close("chain conv", ref, tree_causal_conv1d(x, chain, state, weight), 1e-6)


@pytest.mark.parametrize("B,T,H,HV,K,V", [(1, 1, 1, 1, 16, 8), (2, 5, 2, 4, 16, 24), (1, 16, 1, 3, 32, 8),
                                          (2, 23, 2, 2, 16, 40), (2, 9, 2, 6, 128, 16)],
                         ids=["one-node", "gva2", "gva3-full-tile", "two-tiles", "k-slices"])
def test_triton_tree_kernel_matches_reference(B, T, H, HV, K, V):
    pytest.importorskip("triton")
    from specpilot.ops.gdn_tree.chunk import tree_gated_delta_rule as torch_form
    from specpilot.ops.gdn_tree.triton import tree_gated_delta_rule as kernel

    q, k, v, g, beta, S0 = _inputs(B, T, H, HV, K, V, seed=T)
    parents = _random_parents(B, T, seed=T)
    mask = ancestor_mask(parents)
    qkv = torch.cat([q, k], dim=2)  # strided views, as the layer passes them
    out, (kn, u, G) = kernel(qkv[:, :, :H], qkv[:, :, H:], v, g, beta, mask, S0, block_v=16)
    ref, (kn_r, u_r, G_r) = torch_form(q, k, v, g, beta, mask, S0)
    assert_close("o", tree_gated_delta_rule_ref(q, k, v, g, beta, parents, S0), out, 1e-5)
    assert_close("u", u_r, u, 1e-5)
    assert_close("k", kn_r, kn, 1e-6)
    assert_close("G", G_r, G, 1e-6)
    # into preallocated stash views (a slice of bigger buffers), as the layer writes them
    bufs = [torch.full((B * T + 3, *t.shape[2:]), float("nan")) for t in (kn, u, G)]
    out = tuple(b[:B * T].unflatten(0, (B, T)) for b in bufs)
    _, stash = kernel(qkv[:, :, :H], qkv[:, :, H:], v, g, beta, mask, S0, out=out, block_v=16)
    assert all(s is o for s, o in zip(stash, out))
    assert torch.equal(out[0], kn) and torch.equal(out[1], u) and torch.equal(out[2], G)


def test_triton_tree_kernel_long_paths():
    """A 37-node chain beside a bushy tree in one 64-node tile: the Neumann solve runs as many steps as the
    longest path of the batch needs, and a request with short paths is not hurt by the extra steps."""
    pytest.importorskip("triton")
    from specpilot.ops.gdn_tree.triton import tree_gated_delta_rule as kernel

    B, T, H, HV, K, V = 2, 37, 1, 2, 16, 8
    q, k, v, g, beta, S0 = _inputs(B, T, H, HV, K, V, seed=5)
    parents = torch.stack([torch.arange(-1, T - 1), _random_parents(1, T, seed=5)[0]])
    mask = ancestor_mask(parents)
    out, _ = kernel(q, k, v, g, beta, mask, S0, block_v=8)
    assert_close("o", tree_gated_delta_rule_ref(q, k, v, g, beta, parents, S0), out, 1e-5)


def random_commit(L, N, R, T, H, HV, K, V, C, width, seed):
    """State pools, a stacked stash of R rows x T nodes and L layers, and ragged root-first paths (one empty, one
    shorter than the conv window) of 3 requests on shuffled rows and slots."""
    gen = torch.Generator().manual_seed(seed)
    ssm, conv = torch.randn(L, N, HV, K, V, generator=gen), torch.randn(L, N, C, width, generator=gen)
    stash = (torch.randn(L, R, T, C, generator=gen), torch.randn(L, R, T, H, K, generator=gen) * 0.3,
             torch.randn(L, R, T, HV, V, generator=gen), -torch.rand(L, R, T, HV, generator=gen).cumsum(2))
    parents = _random_parents(R, T, seed)
    paths = []
    for length in (T, 0, 2):
        node, path = T - 1 - len(paths), []
        while node >= 0:
            path.append(node)
            node = parents[len(paths) % R, node].item()
        paths.append(path[::-1][:length])
    rows = torch.randperm(R, generator=gen)[:3].tolist()
    slots = torch.randperm(N, generator=gen)[:3].tolist()
    return ssm, conv, stash, rows, slots, paths


@pytest.mark.parametrize("L", [1, 2, 5])
@pytest.mark.parametrize("width", [3, 1, 0])
def test_batched_commit_equals_per_layer_loop(L, width):
    ssm, conv, stash, rows, slots, paths = random_commit(L, 5, 4, 9, 2, 4, 8, 6, 11, width, seed=L + width)
    ssm_ref, conv_ref = ssm.clone(), conv.clone()
    commit_paths_ref(ssm_ref, conv_ref, *stash, rows, slots, paths)
    commit_paths(ssm, conv, stash, PathIndex.build(rows, slots, paths, "cpu"))
    assert_close("state", ssm_ref, ssm, 1e-6)
    assert torch.equal(conv_ref, conv)


@pytest.mark.parametrize("L,H,HV,K,V,C,width",
                         [(2, 1, 3, 12, 20, 37, 3), (3, 2, 2, 16, 8, 5, 1), (1, 1, 1, 8, 33, 9, 0)],
                         ids=["gva3-odd-dims", "gva1", "no-conv"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32-conv", "bf16-conv"])
def test_triton_commit_matches_reference(L, H, HV, K, V, C, width, dtype):
    pytest.importorskip("triton")
    from specpilot.ops.gdn_tree.triton import commit_paths as kernel

    ssm, conv, stash, rows, slots, paths = random_commit(L, 6, 3, 7, H, HV, K, V, C, width, seed=C)
    conv, stash = conv.to(dtype), (stash[0].to(dtype), *stash[1:])  # x and the conv window in the model dtype
    ssm_ref, conv_ref = ssm.clone(), conv.clone()
    commit_paths_ref(ssm_ref, conv_ref, *stash, rows, slots, paths)
    x, k, u, G = stash
    # the stash as the cache hands it out: a [:R*T] slice of bigger stacked buffers
    views = [torch.cat([t.flatten(1, 2), torch.randn_like(t.flatten(1, 2))], 1)[:, :3 * 7].unflatten(1, (3, 7))
             for t in (x, k, u, G)]
    kernel(ssm, conv, *views, PathIndex.build(rows, slots, paths, "cpu"), block_v=16, block_c=32, num_warps=1)
    assert_close("state", ssm_ref, ssm, 1e-5)
    assert torch.equal(conv_ref, conv)


@pytest.mark.parametrize("B,T,C,W,dtype", [(1, 1, 5, 4, torch.float32), (3, 7, 70, 4, torch.float32),
                                           (2, 33, 300, 2, torch.float32), (2, 9, 40, 1, torch.float32),
                                           (2, 12, 64, 4, torch.bfloat16)],
                         ids=["one-node", "ragged-c", "two-tiles-w2", "w1", "bf16"])
def test_triton_tree_conv_matches_reference(B, T, C, W, dtype):
    pytest.importorskip("triton")
    from specpilot.ops.gdn_tree.triton import tree_causal_conv1d as kernel

    gen = torch.Generator().manual_seed(T + C)
    x = torch.randn(B, T, C + 3, generator=gen)[..., :C].to(dtype)  # strided rows, dense channels
    state = torch.randn(B, C, W - 1, generator=gen).to(dtype)
    weight = torch.randn(C, W, generator=gen).to(dtype)
    parents = _random_parents(B, T, seed=C)
    ref = tree_causal_conv1d_ref(x, parents, state, weight)
    x_out = torch.full((B, T, C), float("nan")).to(dtype)
    out = kernel(x, parents, state, weight, x_out, block_c=64)
    assert out.is_contiguous() and out.dtype == dtype
    assert torch.equal(x_out, x), "the stash copy of the pre-conv inputs"
    assert_close("triton tree conv", ref.float(), out.float(), 1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("form", ["torch", "triton"])
def test_state_read_in_place_at_slots_equals_gathered(form):
    """With state_slots the tree pass reads each request's committed state from the pool in place: the same
    output and fold terms as passing the gathered states."""
    from specpilot.ops.gdn_tree import chunk

    if form == "triton":
        pytest.importorskip("triton")
        from specpilot.ops.gdn_tree.triton import tree_gated_delta_rule as fn
    else:
        fn = chunk.tree_gated_delta_rule
    B, T, H, HV, K, V = 2, 6, 1, 2, 16, 8
    q, k, v, g, beta, _ = _inputs(B, T, H, HV, K, V, seed=3)
    pool = torch.randn(5, HV, K, V) * 0.3
    slots = torch.tensor([3, 1])
    mask = ancestor_mask(_random_parents(B, T, seed=3))
    o, stash = fn(q, k, v, g, beta, mask, pool, state_slots=slots)
    o_ref, stash_ref = fn(q, k, v, g, beta, mask, pool[slots])
    torch.testing.assert_close(o, o_ref, rtol=0, atol=0)
    for a, b in zip(stash, stash_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
