"""PathIndex: the kept root-first path of each request of a commit, packed for the device in one copy.

The commit after a verify pass reads it three times (the K/V compaction, the recurrent fold, the conv windows), so
it is built once per step and each of those ops takes it as is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NODES = 4  # column of the first path node in a packed row: row, slot, base, length, nodes...


@dataclass(frozen=True, slots=True)
class PathIndex:
    """Per request: stash row (its row in the verify batch), state/cache slot, base (its committed length: node i
    of its tree sat at base + i, kept node j goes to base + j) and path length, then the root-first path nodes,
    in one [B, NODES + P] int64 tensor. Paths are padded to the longest (P >= 1) by repeating their last node (node
    0 for an empty path), so padded reads stay inside the tree."""

    packed: torch.Tensor

    @classmethod
    def build(cls, rows: list[int], slots: list[int], paths: list[list[int]], device,
              bases: list[int] | None = None) -> PathIndex:
        width = max(1, max((len(p) for p in paths), default=0))
        bases = bases if bases is not None else [0] * len(rows)
        table = [[r, s, base, len(p), *p, *[p[-1] if p else 0] * (width - len(p))]
                 for r, s, base, p in zip(rows, slots, bases, paths)]
        cuda = torch.device(device).type == "cuda"
        # filled in place in a pinned buffer (from the caching host allocator), so the copy does not wait for the
        # queued GPU work; the buffer is kept until that copy is done
        host = torch.empty((len(table), NODES + width), dtype=torch.long, pin_memory=cuda)
        if table:
            host.numpy()[:] = table
        return cls(host.to(device, non_blocking=True) if cuda else host)

    @property
    def rows(self) -> torch.Tensor:
        return self.packed[:, 0]

    @property
    def slots(self) -> torch.Tensor:
        return self.packed[:, 1]

    @property
    def bases(self) -> torch.Tensor:
        return self.packed[:, 2]

    @property
    def lens(self) -> torch.Tensor:
        return self.packed[:, 3]

    @property
    def nodes(self) -> torch.Tensor:
        return self.packed[:, NODES:]
