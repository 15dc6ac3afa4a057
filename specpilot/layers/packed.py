"""PackedLinear: several checkpoint projections stored as row blocks of one weight, so decode runs one GEMV.

The shard names are the checkpoint's module names (q_proj, k_proj, ...); the loader fills each block from
its own tensor and proves every block was filled once.
"""

from __future__ import annotations

from specpilot.layers.linear import Linear


class PackedLinear(Linear):
    def __init__(self, in_features: int, shards: dict[str, int], bias: bool = False):
        super().__init__(in_features, sum(shards.values()), bias=bias)
        self.shards = dict(shards)

    def shard_rows(self, name: str) -> tuple[int, int]:
        """(first row, row count) of shard `name` in the packed weight."""
        start = 0
        for key, rows in self.shards.items():
            if key == name:
                return start, rows
            start += rows
        raise KeyError(name)
