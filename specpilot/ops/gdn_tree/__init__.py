"""Gated DeltaNet over a draft tree (tree-masked WY form, tree conv) and the commit of the kept paths.

`tree_causal_conv1d`, `tree_gated_delta_rule` and `commit_paths` run the Triton kernels (triton.py) on CUDA and
the torch forms (chunk.py) elsewhere; reference.py holds the per-path truth both are tested against.
"""

from specpilot.ops.dispatch import takes, use_triton
from specpilot.ops.gdn_tree import chunk
from specpilot.ops.gdn_tree.chunk import ancestor_mask
from specpilot.ops.path_index import PathIndex
from specpilot.ops.gdn_tree.reference import (commit_conv, commit_path_ref, commit_paths_ref, fold_path,
                                              tree_causal_conv1d_ref, tree_gated_delta_rule_ref)

__all__ = ["PathIndex", "ancestor_mask", "commit_paths", "tree_causal_conv1d", "tree_gated_delta_rule",
           "commit_conv", "commit_path_ref", "commit_paths_ref", "fold_path", "tree_causal_conv1d_ref",
           "tree_gated_delta_rule_ref"]


# the Triton kernel holds the whole tree in one register tile; larger trees take the torch form
# (docs/decisions/2026-11-30-gdn-tree-kernel-node-limit.md)
TRITON_MAX_NODES = 64


def tree_causal_conv1d(x, parents, conv_state, weight, x_out=None):
    """x [B,T,C] pre-conv inputs; parents [B,T]; conv_state [B,C,W-1] (oldest first); weight [C,W] -> y [B,T,C]:
    each node's causal conv along its path to the root, continued into the committed window, then silu. x is
    also copied into x_out if given (the commit's stash)."""
    if use_triton(x):
        from specpilot.ops.gdn_tree.triton import tree_causal_conv1d as kernel

        return kernel(x, parents, conv_state, weight, x_out)
    if x_out is not None:
        x_out.copy_(x)
    return chunk.tree_causal_conv1d(x, parents, conv_state, weight)


def tree_gated_delta_rule(q, k, v, g, beta, mask, initial_state, scale=None, out=None, state_slots=None):
    """q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV]; mask [B,T,T] inclusive ancestor mask; initial_state
    [B,HV,K,V] fp32 (or, with state_slots [B], the cache's pool [N,HV,K,V], read in place at those slots) ->
    (o [B,T,HV,V], fold stash (k [B,T,H,K] per key head, u [B,T,HV,V], G [B,T,HV])), the stash written into
    `out` (three contiguous fp32 tensors of those shapes) if given."""
    if use_triton(v) and q.shape[1] <= TRITON_MAX_NODES:
        from specpilot.ops.gdn_tree.triton import supports
        from specpilot.ops.gdn_tree.triton import tree_gated_delta_rule as kernel

        if takes("tree_gated_delta_rule", supports(q)):
            return kernel(q, k, v, g, beta, mask, initial_state, scale, out, state_slots)
    return chunk.tree_gated_delta_rule(q, k, v, g, beta, mask, initial_state, scale, out, state_slots)


def commit_paths(ssm, conv, stash, index: PathIndex) -> None:
    """Fold each request's kept path (root first) into its state and take the path's last inputs as its conv
    window, for every layer at once, in place: ssm [L,N,HV,K,V] fp32, conv [L,N,C,W-1]; stash = (x [L,R,T,C],
    k [L,R,T,H,K], u [L,R,T,HV,V], G [L,R,T,HV]) from a tree verify of R rows; request i reads stash row
    index.rows[i] and owns state slot index.slots[i]. A fixed number of launches."""
    if use_triton(ssm):
        from specpilot.ops.gdn_tree.triton import commit_paths as kernel

        return kernel(ssm, conv, *stash, index)
    return chunk.commit_paths(ssm, conv, *stash, index)
