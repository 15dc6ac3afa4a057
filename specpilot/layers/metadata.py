"""BatchMetadata: the per-step inputs every layer reads, passed explicitly from runner to model to op.

A step writes a block of T new tokens per request into that request's cache slot. `positions` are RoPE
positions (for a tree: committed length + depth), `cache_loc` is where each token's K/V is stored in the
slot, `prefix_len` is how many committed tokens precede the block, and `block_mask` says which block tokens
each block token sees (None: causal within the block, the AR case). `paths` says which kernels the layers take
in this step (layers/paths.py; the runner sets them per step kind, PLAIN otherwise).

A verify block's index fields can all be views into one int64 buffer (`packed`, layout in packed_spans), so
that the host fills it once (HostMetadata) and copies it to the device once: into a fresh buffer that
BatchMetadata.unpack views, or straight into the static buffer of a captured graph whose inputs already view it.

MixedMetadata: several such blocks in one forward (a verify block and prefill chunks of other requests): the
token-wise layers (norms, projections, MLP) run once over all their tokens, so one weight load serves every
block; the token-mixing cores (attention, the delta rule) run per block (`segments`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from specpilot.layers.paths import PLAIN, KernelPaths


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
    packed: torch.Tensor | None = None  # [words] int64 that every index field above views (see packed_spans)
    paths: KernelPaths = PLAIN  # the kernels the layers take in this step
    equal_prefix: bool = False  # the host knows every request's prefix is max_prefix_len (prefill_many's chunks)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    @property
    def is_decode(self) -> bool:
        """One causal token per request: the attention decode kernel applies."""
        return self.input_ids.shape[1] == 1 and self.block_mask is None

    @staticmethod
    def contiguous(input_ids: torch.Tensor, prefix_len: torch.Tensor, slots: torch.Tensor, max_prefix_len: int,
                   paths: KernelPaths = PLAIN, equal_prefix: bool = False):
        """A causal block written right after each request's committed prefix (prefill, AR decode, chains);
        equal_prefix: the caller knows every prefix is max_prefix_len."""
        t = torch.arange(input_ids.shape[1], device=input_ids.device)
        pos = prefix_len[:, None] + t[None, :]
        return BatchMetadata(input_ids, pos, pos, slots, prefix_len, max_prefix_len, paths=paths,
                             equal_prefix=equal_prefix)

    def pack(self) -> torch.Tensor:
        """The index fields in one new int64 buffer, laid out as packed_spans says (the mask as bytes)."""
        parts = [self.input_ids, self.positions, self.cache_loc, self.slots, self.prefix_len]
        if self.block_mask is not None:
            mask = self.block_mask.reshape(-1).view(torch.uint8)
            parts += [self.parents, F.pad(mask, (0, -mask.numel() % 8)).view(torch.int64)]
        return torch.cat([p.reshape(-1) for p in parts])

    @staticmethod
    def unpack(packed: torch.Tensor, batch: int, width: int, tree: bool, max_prefix_len: int,
               paths: KernelPaths = PLAIN) -> BatchMetadata:
        """Metadata whose index fields are views into `packed` (written by pack() or filled per packed_spans)."""
        B, T, base = batch, width, packed.storage_offset()
        spans = packed_spans(B, T, tree)

        def field(name, shape, stride):  # one as_strided per field: the cheapest view torch makes
            return packed.as_strided(shape, stride, base + spans[name][0])

        ids, pos, loc = (field(n, (B, T), (T, 1)) for n in ("input_ids", "positions", "cache_loc"))
        mask = parents = None
        if tree:
            parents = field("parents", (B, T), (T, 1))
            mask = packed.view(torch.bool).as_strided((B, T, T), (T * T, T, 1), 8 * (base + spans["block_mask"][0]))
        return BatchMetadata(ids, pos, loc, field("slots", (B,), (1,)), field("prefix_len", (B,), (1,)),
                             max_prefix_len, mask, parents=parents, packed=packed, paths=paths)


@dataclass(frozen=True, slots=True)
class MixedMetadata:
    """Blocks of different shapes in one forward. Hidden states are [1, N, ...] with part i's B_i * T_i tokens
    (row-major) after those of the parts before it; `paths` are the token-wise layers' kernels, each part's own
    paths its core's."""

    parts: tuple[BatchMetadata, ...]
    paths: KernelPaths
    input_ids: torch.Tensor  # [1, N]
    positions: torch.Tensor  # [1, N]

    @staticmethod
    def of(parts: list[BatchMetadata], paths: KernelPaths) -> MixedMetadata:
        ids = torch.cat([p.input_ids.reshape(-1) for p in parts])[None]
        pos = torch.cat([p.positions.reshape(-1) for p in parts])[None]
        return MixedMetadata(tuple(parts), paths, ids, pos)

    @property
    def sizes(self) -> list[int]:
        return [p.input_ids.numel() for p in self.parts]

    def split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x [1, N, ...] -> per part [B_i, T_i, ...] (views)."""
        out, at = [], 0
        for p in self.parts:
            B, T = p.input_ids.shape
            out.append(x[0, at:at + B * T].unflatten(0, (B, T)))
            at += B * T
        return out


def segments(meta: BatchMetadata | MixedMetadata, *tensors: torch.Tensor):
    """Per block of the step: (its metadata, each of `tensors` as that block's [B, T, ...])."""
    if not isinstance(meta, MixedMetadata):
        yield (meta, *tensors)
        return
    for part, *views in zip(meta.parts, *(meta.split(t) for t in tensors)):
        yield (part, *views)


def join(blocks: list[torch.Tensor]) -> torch.Tensor:
    """The inverse of segments' split: per-block [B_i, T_i, ...] -> [1, N, ...] (the block itself when alone)."""
    if len(blocks) == 1:
        return blocks[0]
    return torch.cat([b.flatten(0, 1) for b in blocks])[None]


@dataclass(frozen=True, slots=True)
class HostMetadata:
    """A verify block's packed index fields, filled on the host (pinned memory for a GPU), and what unpacking
    them needs. Each copy of `packed` to a device is non-blocking: a fresh pinned buffer is kept by the caching
    host allocator until the copies recorded on it are done; a buffer kept across steps (the engine's, see
    runner.HostStaging) is refilled only after a sync that follows its copy."""

    packed: torch.Tensor  # [words] int64, laid out as packed_spans(batch, width, tree) says
    batch: int
    width: int
    tree: bool  # block_mask and parents are packed too (else: causal)
    max_prefix_len: int

    def to(self, device, paths: KernelPaths = PLAIN) -> BatchMetadata:
        """One copy to `device`, unpacked into views, for a step that takes `paths`."""
        # a copy on the CPU too: `packed` may be a staging buffer that the next step refills while the metadata
        # returned here is still held
        packed = self.packed.to(device, non_blocking=True, copy=True)
        return BatchMetadata.unpack(packed, self.batch, self.width, self.tree, self.max_prefix_len, paths)


@lru_cache(maxsize=256)
def packed_spans(batch: int, width: int, tree: bool) -> dict[str, tuple[int, int]]:
    """Word ranges of each field in a packed buffer: input_ids, positions, cache_loc [B, T]; slots, prefix_len
    [B]; for a tree block also parents [B, T] and block_mask [B, T, T] as bytes (padded to whole words)."""
    sizes = [("input_ids", batch * width), ("positions", batch * width), ("cache_loc", batch * width),
             ("slots", batch), ("prefix_len", batch)]
    if tree:
        sizes += [("parents", batch * width), ("block_mask", -(-batch * width * width // 8))]
    spans, start = {}, 0
    for name, n in sizes:
        spans[name] = (start, start + n)
        start += n
    return spans
