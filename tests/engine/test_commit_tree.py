"""ModelCache.commit_tree: the batched commit of all linear layers and requests from the stacked stash equals the
per-layer per-request loop it replaced, through the cache's own stash views, loose stashes and a grown buffer."""

import pytest
import torch

from specpilot.bench.shapes import hf_config
from specpilot.config import ModelConfig
from specpilot.runtime.cache import ModelCache
from specpilot.ops.gdn_tree import commit_paths_ref
from specpilot.ops.path_index import PathIndex
from specpilot.ops.testing import assert_close

ROWS, NODES = 4, 9
PATHS = [[0, 2, 5, 6, 8], [], [0, 1]]  # ragged: one empty, one shorter than the conv window
ROWS_OF, SLOTS_OF = [3, 0, 2], [4, 1, 2]


def _cache(n_lin: int) -> ModelCache:
    cfg = ModelConfig.from_dict(hf_config("tiny-hybrid", num_hidden_layers=2 * n_lin).to_dict())
    cache = ModelCache(cfg, 5, 16, "cpu", torch.float32)
    cache.ssm.normal_()
    cache.conv.normal_()
    return cache


def _fill(cache: ModelCache, rows: int, nodes: int, loose: bool = False) -> None:
    """Random fold terms for every linear layer, written as a tree verify pass writes them."""
    for index in range(cache.ssm.shape[0]):
        views = cache.tree_stash_out(index, rows, nodes)
        terms = tuple(torch.empty_like(t) for t in views) if loose else views
        terms[0].normal_()
        terms[1].normal_(std=0.3)
        terms[2].normal_()
        terms[3].copy_(-torch.rand(terms[3].shape).cumsum(1))
        cache.tree_stash[index] = terms


def _expected(cache: ModelCache):
    ssm, conv = cache.ssm.clone(), cache.conv.clone()
    stacked = [torch.stack(t) for t in zip(*(cache.tree_stash[i] for i in sorted(cache.tree_stash)))]
    commit_paths_ref(ssm, conv, *stacked, ROWS_OF, SLOTS_OF, PATHS)
    return ssm, conv


def _check(cache: ModelCache) -> None:
    ssm, conv = _expected(cache)
    cache.commit_tree(PathIndex.build(ROWS_OF, SLOTS_OF, PATHS, "cpu"))
    assert not cache.tree_stash
    assert_close("state", ssm, cache.ssm, 1e-6)
    assert torch.equal(conv, cache.conv)


@pytest.mark.parametrize("n_lin", [1, 2, 5])
def test_batched_commit_equals_per_layer_loop(n_lin):
    cache = _cache(n_lin)
    _fill(cache, ROWS, NODES)
    assert cache._stacked_stash() is not None  # the one batched op, no stacking copy
    _check(cache)


def test_stash_survives_a_graph_style_restore():
    # VerifyGraph keeps dict(tree_stash) after capture and puts it back after each replay
    cache = _cache(2)
    _fill(cache, ROWS, NODES)
    kept = dict(cache.tree_stash)
    cache.tree_stash.clear()
    cache.tree_stash.update(kept)
    assert cache._stacked_stash() is not None
    _check(cache)


@pytest.mark.parametrize("n_lin", [1, 3])
def test_loose_or_outgrown_stash_commits_the_same(n_lin):
    cache = _cache(n_lin)
    _fill(cache, ROWS, NODES, loose=True)
    assert cache._stacked_stash() is None
    _check(cache)
    _fill(cache, ROWS, NODES)
    held = dict(cache.tree_stash)
    cache.tree_stash_out(0, ROWS, 4 * NODES)  # a bigger tree grows the buffers; held views keep the old ones
    cache.tree_stash.update(held)
    assert cache._stacked_stash() is None
    _check(cache)


def test_stash_views_are_reused_and_sized():
    cache = _cache(2)
    views = cache.tree_stash_out(1, 2, 3)
    assert views is cache.tree_stash_out(1, 2, 3)
    assert [tuple(t.shape) for t in views] == [(2, 3, 128), (2, 3, 2, 16), (2, 3, 4, 16), (2, 3, 4)]
    assert all(t.is_contiguous() for t in views)
    cache.tree_stash_out(0, 3, 2)  # same number of node rows: no growth, the earlier views stay current
    assert views is cache.tree_stash_out(1, 2, 3)


def test_keep_moves_every_request_at_once_with_overlap():
    """ModelCache.keep: each request's kept path lands at base, base + 1, ... of its slot (moves whose ranges
    overlap included, a path already in place and an empty one untouched), and nothing else changes."""
    cfg = type("Cfg", (), dict(num_attention_layers=2, num_linear_layers=0, num_key_value_heads=2, head_dim=4,
                               linear_num_key_heads=0, linear_key_head_dim=0, linear_num_value_heads=0,
                               linear_value_head_dim=0, linear_conv_kernel_dim=0))()
    cache = ModelCache(cfg, 4, 20, "cpu", torch.float32)
    cache.k.copy_(torch.randn_like(cache.k))
    cache.v.copy_(torch.randn_like(cache.v))
    k0, v0 = cache.k.clone(), cache.v.clone()
    slots, bases, paths = [1, 2, 3, 0], [12, 4, 7, 3], [[0, 2, 3, 5], [0, 1, 5], [0, 1], []]
    cache.keep(PathIndex.build([0, 1, 2, 3], slots, paths, "cpu", bases=bases))
    want_k, want_v = k0.clone(), v0.clone()
    for slot, base, path in zip(slots, bases, paths):
        for j, node in enumerate(path):
            want_k[:, slot, :, base + j], want_v[:, slot, :, base + j] = k0[:, slot, :, base + node], v0[:, slot, :, base + node]
    torch.testing.assert_close(cache.k, want_k, rtol=0, atol=0)
    torch.testing.assert_close(cache.v, want_v, rtol=0, atol=0)
    assert not torch.equal(want_k, k0)  # the case moves something
