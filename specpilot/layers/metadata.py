"""BatchMetadata: the per-step inputs every layer reads, passed explicitly from runner to model to op.

A step writes a block of T new tokens per request into that request's cache slot. `positions` are RoPE
positions (for a tree: committed length + depth), `cache_loc` is where each token's K/V is stored in the
slot, `prefix_len` is how many committed tokens precede the block, and `block_mask` says which block tokens
each block token sees (None: causal within the block, the AR case).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    input_ids: torch.Tensor  # [B, T] int64
    positions: torch.Tensor  # [B, T] int64, RoPE positions
    cache_loc: torch.Tensor  # [B, T] int64, storage index of each token in its slot
    slots: torch.Tensor  # [B] int64, cache slot of each request
    prefix_len: torch.Tensor  # [B] int64, committed tokens before this block
    max_prefix_len: int  # host copy of prefix_len.max(), bounds the attention gather without a sync
    block_mask: torch.Tensor | None = None  # [B, T, T] bool, None = causal
    kv_len: torch.Tensor | None = None  # [B] valid cache length after a decode write (computed once per step)
    parents: torch.Tensor | None = None  # [B, T] tree parent indices (-1: none), given with block_mask

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    @property
    def is_decode(self) -> bool:
        """One causal token per request: the attention decode kernel applies."""
        return self.input_ids.shape[1] == 1 and self.block_mask is None

    @staticmethod
    def contiguous(input_ids: torch.Tensor, prefix_len: torch.Tensor, slots: torch.Tensor, max_prefix_len: int):
        """A causal block written right after each request's committed prefix (prefill, AR decode, chains)."""
        t = torch.arange(input_ids.shape[1], device=input_ids.device)
        pos = prefix_len[:, None] + t[None, :]
        return BatchMetadata(input_ids, pos, pos, slots, prefix_len, max_prefix_len)
