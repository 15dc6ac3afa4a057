"""Gated DeltaNet over a draft tree (tree-masked WY form, tree conv) and the commit of a kept path.

`tree_gated_delta_rule` runs the Triton kernel (triton.py) on CUDA and the torch form (chunk.py) elsewhere;
reference.py holds the per-path truth both are tested against. The conv and the fold are torch for now.
"""

from specpilot.ops.dispatch import use_triton
from specpilot.ops.gdn_tree import chunk
from specpilot.ops.gdn_tree.chunk import ancestor_mask, commit_conv, fold_path, tree_causal_conv1d
from specpilot.ops.gdn_tree.reference import commit_path_ref, tree_causal_conv1d_ref, tree_gated_delta_rule_ref

__all__ = ["ancestor_mask", "commit_conv", "fold_path", "tree_causal_conv1d", "tree_gated_delta_rule",
           "commit_path_ref", "tree_causal_conv1d_ref", "tree_gated_delta_rule_ref"]


def tree_gated_delta_rule(q, k, v, g, beta, mask, initial_state, scale=None):
    """q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV]; mask [B,T,T] inclusive ancestor mask; initial_state
    [B,HV,K,V] fp32 -> (o [B,T,HV,V], fold stash (k [B,T,H,K] per key head, u [B,T,HV,V], G [B,T,HV]))."""
    if use_triton(v):
        from specpilot.ops.gdn_tree.triton import tree_gated_delta_rule as kernel

        return kernel(q, k, v, g, beta, mask, initial_state, scale)
    return chunk.tree_gated_delta_rule(q, k, v, g, beta, mask, initial_state, scale)
