"""ModelCache: the preallocated KV cache and recurrent-state slots of every request in a batch.

Attention layers keep K/V per slot as [N, KVH, S, D]; Gated DeltaNet layers keep the conv window
[N, C, W-1] (model dtype) and the delta-rule state [N, HV, K, V] (fp32). Layers write through the views
this object hands out; after a step, `keep` (compact accepted tree nodes) and `restore` (roll recurrent
state back to a snapshot) are the only other writers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.config import ModelConfig
from specpilot.ops.gdn_tree import commit_conv, fold_path


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    slots: torch.Tensor  # [B]
    conv: torch.Tensor  # [L_lin, B, C, W-1]
    ssm: torch.Tensor  # [L_lin, B, HV, K, V] fp32


class ModelCache:
    def __init__(self, cfg: ModelConfig, num_slots: int, max_seq_len: int, device, dtype: torch.dtype):
        self.num_slots, self.max_seq_len = num_slots, max_seq_len
        n_attn, n_lin = cfg.num_attention_layers, cfg.num_linear_layers
        kv_shape = (n_attn, num_slots, cfg.num_key_value_heads, max_seq_len, cfg.head_dim)
        self.k = torch.zeros(kv_shape, device=device, dtype=dtype)
        self.v = torch.zeros(kv_shape, device=device, dtype=dtype)
        conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
        conv_dim += cfg.linear_num_value_heads * cfg.linear_value_head_dim
        width = max(cfg.linear_conv_kernel_dim - 1, 0)
        self.conv = torch.zeros((n_lin, num_slots, conv_dim, width), device=device, dtype=dtype)
        ssm_shape = (n_lin, num_slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
        self.ssm = torch.zeros(ssm_shape, device=device, dtype=torch.float32)
        # per linear layer, from the last tree verify pass: (pre-conv x, k, u, G) per node, for commit_tree
        self.tree_stash: dict[int, tuple[torch.Tensor, ...]] = {}

    def kv(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[index], self.v[index]

    def linear_state(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv[index], self.ssm[index]

    def reset(self, slots: torch.Tensor) -> None:
        """Clear the recurrent state of slots about to hold new requests (KV needs no clearing: lengths rule)."""
        self.conv[:, slots] = 0
        self.ssm[:, slots] = 0

    def keep(self, slot: int, src_loc: torch.Tensor, dst_start: int) -> None:
        """Move the K/V of kept block tokens (src_loc [n], in order) to contiguous positions from dst_start."""
        n = src_loc.numel()
        dst = slice(dst_start, dst_start + n)
        self.k[:, slot, :, dst] = self.k[:, slot, :, src_loc].clone()
        self.v[:, slot, :, dst] = self.v[:, slot, :, src_loc].clone()

    def commit_tree(self, rows: list[int], slots: list[int], paths: list[list[int]]) -> None:
        """Recurrent state after a tree verify: for each request (row of the verify batch) fold the kept path's
        stashed terms into its committed state and take the path's last inputs as its conv window. No state
        per node is ever materialised."""
        for index, (x, k, u, G) in self.tree_stash.items():
            for row, slot, path in zip(rows, slots, paths):
                self.ssm[index, slot] = fold_path(self.ssm[index, slot], k[row], u[row], G[row], path)
                self.conv[index, slot] = commit_conv(self.conv[index, slot], x[row], path)
        self.tree_stash.clear()

    def tree_stash_bytes(self) -> int:
        """Bytes stashed by the last tree verify pass (all requests, all linear layers)."""
        return sum(t.numel() * t.element_size() for terms in self.tree_stash.values() for t in terms)

    def snapshot(self, slots: torch.Tensor) -> StateSnapshot:
        return StateSnapshot(slots.clone(), self.conv[:, slots].clone(), self.ssm[:, slots].clone())

    def restore(self, snap: StateSnapshot, rows: list[int] | None = None) -> None:
        """Puts the snapshot's recurrent state back (only its `rows`, the positions in snap.slots, if given)."""
        if rows is None:
            self.conv[:, snap.slots], self.ssm[:, snap.slots] = snap.conv, snap.ssm
            return
        idx = torch.tensor(rows, device=snap.slots.device)
        self.conv[:, snap.slots[idx]] = snap.conv[:, idx]
        self.ssm[:, snap.slots[idx]] = snap.ssm[:, idx]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.conv, self.ssm))
