"""Gated DeltaNet over a draft tree (tree-masked WY form, tree conv) and the commit of a kept path.

The torch forms in chunk.py are the fast path for now (a Triton kernel is the next step); reference.py holds
the per-path truth they are tested against.
"""

from specpilot.ops.gdn_tree.chunk import ancestor_mask, commit_conv, fold_path, tree_causal_conv1d, tree_gated_delta_rule
from specpilot.ops.gdn_tree.reference import commit_path_ref, tree_causal_conv1d_ref, tree_gated_delta_rule_ref

__all__ = ["ancestor_mask", "commit_conv", "fold_path", "tree_causal_conv1d", "tree_gated_delta_rule",
           "commit_path_ref", "tree_causal_conv1d_ref", "tree_gated_delta_rule_ref"]
