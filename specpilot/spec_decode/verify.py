"""Greedy acceptance over a batch of draft trees, and the verify pass's batch layout.

The verify pass runs every request's tree as one block (padded to the largest tree). Acceptance walks each
tree from the root: while a child carries the target's argmax at the current node, move to it. The emitted
tokens are the accepted draft tokens plus the bonus token (the target's argmax at the last accepted node).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from specpilot.layers.metadata import BatchMetadata, HostMetadata, packed_spans
from specpilot.spec_decode.tree import DraftTree, TreeLayout


@dataclass(frozen=True, slots=True)
class Acceptance:
    path: tuple[int, ...]  # accepted node indices, root first
    tokens: tuple[int, ...]  # emitted this step: accepted draft tokens, then the bonus token

    @property
    def num_accepted(self) -> int:
        return len(self.path) - 1


def tree_metadata(trees: list[DraftTree], prefix_len: list[int], slots: list[int], device,
                  width: int | None = None, chains_as_trees: bool = False) -> BatchMetadata:
    """The verify block of a batch on `device`: host_tree_metadata copied over in one non-blocking copy."""
    return host_tree_metadata(trees, prefix_len, slots, device, width, chains_as_trees).to(device)


def host_tree_metadata(trees: list[DraftTree], prefix_len: list[int], slots: list[int], device,
                       width: int | None = None, chains_as_trees: bool = False,
                       alloc: Callable[[int], torch.Tensor] | None = None) -> HostMetadata:
    """The verify block of a batch, packed on the host for `device`: nodes stored right after each request's
    committed prefix, RoPE positions by depth, the ancestor mask; smaller trees are padded (to `width` if given:
    a captured graph's fixed size) with nodes that see only themselves. A copy of the batch's shapes' cached
    template, then the step's tokens, slots and prefix lengths; in a fresh host buffer (host_int64), or in
    alloc(words) (the engine's: HostStaging.take, a buffer kept across steps)."""
    layouts = tuple(t.layout for t in trees)
    B, T = len(trees), max(width or 0, *[len(lay.parents) for lay in layouts])
    # chains need no mask: causal order is their ancestor order, and padding after a chain is seen by no real
    # node (this is also what lets recurrent layers, which take no mask, verify chains)
    tree = chains_as_trees or not all(lay.is_chain for lay in layouts)
    template = _template(layouts, T, tree)
    host = alloc(template.size) if alloc is not None else host_int64(template.size, device)
    buf = host.numpy()
    buf[:] = template
    spans = packed_spans(B, T, tree)
    (s0, s1), (p0, p1), pos, loc = spans["slots"], spans["prefix_len"], spans["positions"][0], spans["cache_loc"][1]
    for b, t in enumerate(trees):  # input_ids [B, T] come first
        buf[b * T:b * T + len(t.tokens)] = t.tokens
    buf[s0:s1] = slots
    buf[p0:p1] = prefix_len
    # positions (depth) and storage (node index) are adjacent [B, T] blocks, both past the request's prefix
    shifted = buf[pos:loc].reshape(2, B, T)
    shifted += buf[p0:p1, None]
    return HostMetadata(host, B, T, tree, max(prefix_len))


@lru_cache(maxsize=256)
def _template(layouts: tuple[TreeLayout, ...], T: int, tree: bool) -> np.ndarray:
    """The packed verify block of these tree shapes with every token, slot and prefix length 0 (read-only).
    Keyed by the layouts themselves, which the cache keeps alive: a key's identity is never reused while cached."""
    B = len(layouts)
    spans = packed_spans(B, T, tree)
    buf = np.zeros(spans["block_mask" if tree else "prefix_len"][1], dtype=np.int64)
    loc, pos = spans["cache_loc"], spans["positions"][0]
    buf[loc[0]:loc[1]].reshape(B, T)[:] = np.arange(T)
    if tree:
        par, mask = spans["parents"][0], buf[spans["block_mask"][0]:].view(np.bool_)
    for b, lay in enumerate(layouts):
        row = b * T
        depths, parents, anc = lay.padded(T)
        buf[pos + row:pos + row + T] = depths
        if tree:
            buf[par + row:par + row + T] = parents
            mask[row * T:(row + T) * T] = anc.reshape(-1)
    buf.flags.writeable = False
    return buf


def host_int64(n: int, device) -> torch.Tensor:
    """An uninitialised int64 host buffer to fill and send to `device`: pinned for a GPU, so the copy is truly
    non-blocking (the caching host allocator keeps it until that copy is done)."""
    return torch.empty(n, dtype=torch.long, pin_memory=str(device).startswith("cuda"))


def accept_greedy(trees: list[DraftTree], argmax: list[list[int]]) -> list[Acceptance]:
    """argmax[b][i]: the target's greedy token after node i of request b (host lists: the step's one sync)."""
    out = []
    for tree, best in zip(trees, argmax):
        children, tokens = tree.layout.children, tree.tokens
        node, path = 0, [0]
        while True:  # the first child (lowest index) carrying the target's token wins
            want = best[node]
            for child in children[node]:
                if tokens[child] == want:
                    break
            else:
                break
            node = child
            path.append(node)
        out.append(Acceptance(tuple(path), tuple([tokens[i] for i in path[1:]] + [best[node]])))
    return out
