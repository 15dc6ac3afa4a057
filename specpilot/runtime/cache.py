"""ModelCache: the preallocated KV cache and recurrent-state slots of every request in a batch.

Attention layers keep K/V per slot as [N, KVH, S, D]; Gated DeltaNet layers keep the conv window
[N, C, W-1] (model dtype) and the delta-rule state [N, HV, K, V] (fp32). Layers write through the views
this object hands out; after a step, `commit` (`keep`: compact accepted tree nodes; `commit_tree`: fold the
kept paths) and `restore` (roll recurrent state back to a snapshot) are the only other writers.

A tree verify pass stashes per linear layer and node what the fold needs (pre-conv x, k, u, G) into stacked
buffers [L_lin, rows * nodes, ...] owned here (grown on demand, written in place, so a CUDA graph replay
refreshes them), and records each layer's views in `tree_stash`; commit_tree folds all layers and requests at
once from the stacked buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.config import ModelConfig
from specpilot.ops.gdn_tree import commit_paths
from specpilot.ops.keep_kv import keep_kv
from specpilot.ops.path_index import PathIndex


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
        # per node row: x [C] (model dtype), k [H, K], u [HV, V], G [HV] (fp32); allocated on the first tree
        self._stash_rows = ((conv_dim,), (cfg.linear_num_key_heads, cfg.linear_key_head_dim),
                            (cfg.linear_num_value_heads, cfg.linear_value_head_dim), (cfg.linear_num_value_heads,))
        self._stash_buffers: tuple[torch.Tensor, ...] | None = None
        self._stash_views: dict[tuple[int, int], tuple] = {}  # (rows, nodes) -> (stacked, per-layer views)
        self._device, self._dtype = device, dtype

    def kv(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[index], self.v[index]

    def linear_state(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv[index], self.ssm[index]

    def reset(self, slots: torch.Tensor) -> None:
        """Clear the recurrent state of slots about to hold new requests (KV needs no clearing: lengths rule)."""
        self.conv[:, slots] = 0
        self.ssm[:, slots] = 0

    def commit(self, slots: list[int], bases: list[int], paths: list[tuple[int, ...]], fold: bool) -> None:
        """After a verify pass of len(slots) rows whose tree nodes sat from bases[i] on: compact each row's kept
        root-first path into place (K/V) and, with fold, commit the recurrent state along it. One host-to-device
        copy; no launch where every path is already in place and nothing folds."""
        # a root-first path rises strictly (parents precede children) from node 0, so it is in place (node j at j)
        # exactly when it ends at node len - 1
        moves = any(path and path[-1] != len(path) - 1 for path in paths)
        if not (moves or fold):
            return
        index = PathIndex.build(list(range(len(slots))), slots, paths, self._device, bases=bases)
        if moves:
            self.keep(index)
        if fold:
            self.commit_tree(index)

    def keep(self, index: PathIndex) -> None:
        """Compact the K/V of each request's kept path (node j of it from base + nodes[j] to base + j of its slot),
        in every attention layer, for all requests at once: one kernel on a GPU."""
        keep_kv(self.k, self.v, index)

    def tree_stash_out(self, index: int, rows: int, nodes: int) -> tuple[torch.Tensor, ...]:
        """Where a tree verify pass of `rows` x `nodes` writes linear layer `index`'s fold terms: contiguous views
        (x [rows, nodes, C], k [.., H, K], u [.., HV, V], G [.., HV]) of the stacked stash buffers. The same
        tensors for the same shape until the buffers grow; record them in tree_stash[index] once written."""
        return self._stash_layout(rows, nodes)[1][index]

    def _stash_layout(self, rows: int, nodes: int):
        key = (rows, nodes)
        if key not in self._stash_views:
            if self._stash_buffers is None or self._stash_buffers[0].shape[1] < rows * nodes:
                self._grow_stash(rows * nodes)
            stacked = tuple(t[:, :rows * nodes].unflatten(1, (rows, nodes)) for t in self._stash_buffers)
            layers = [tuple(t[i] for t in stacked) for i in range(self.ssm.shape[0])]
            self._stash_views[key] = (stacked, layers)
        return self._stash_views[key]

    def _grow_stash(self, capacity: int) -> None:
        # views handed out before stay valid (they keep the old buffers alive) but no longer stack: see commit_tree
        n_lin = self.ssm.shape[0]
        dtypes = (self._dtype, torch.float32, torch.float32, torch.float32)
        self._stash_buffers = tuple(torch.empty((n_lin, capacity, *row), device=self._device, dtype=dt)
                                    for row, dt in zip(self._stash_rows, dtypes))
        self._stash_views.clear()

    def commit_tree(self, index: PathIndex) -> None:
        """Recurrent state after a tree verify: for each request (its row of the verify batch, its slot, its kept
        path) fold the path's stashed terms into its committed state and take the path's last inputs as its conv
        window, for every layer and request in one batched op. No state per node is ever materialised."""
        if self.tree_stash:
            stacked = self._stacked_stash()
            if stacked is not None:
                commit_paths(self.ssm, self.conv, stacked, index)
            else:
                # a stash not (all) in the current buffers, e.g. replayed by a graph captured before they grew
                for layer, terms in self.tree_stash.items():
                    commit_paths(self.ssm[layer:layer + 1], self.conv[layer:layer + 1], tuple(t[None] for t in terms),
                                 index)
        self.tree_stash.clear()

    def _stacked_stash(self) -> tuple[torch.Tensor, ...] | None:
        """The stash as stacked [L_lin, rows, nodes, ...] buffers, if every layer's entry is this cache's view."""
        rows, nodes = next(iter(self.tree_stash.values()))[0].shape[:2]
        layout = self._stash_views.get((rows, nodes))
        if layout is None or len(self.tree_stash) != len(layout[1]):
            return None
        if any(self.tree_stash.get(i) is not views for i, views in enumerate(layout[1])):
            return None
        return layout[0]

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
