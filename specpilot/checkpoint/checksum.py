"""Per-tensor checksums of checkpoint files: a CRC-32 of each source tensor's stored bytes, kept in the safetensors
metadata.

`specpilot compress` writes one per source tensor (a W12N matrix: over its planes in `w12n.plane_keys` order;
a tensor kept as it was: over its bytes); `CheckpointFile` (file.py) checks every tensor it reads, for the loader
and `specpilot inspect`. CRC-32 because it is the fastest standard check at hand (0.29 s per GiB on one core;
specpilot/weights/README.md).
"""

from __future__ import annotations

import json
import zlib

import torch

METADATA_KEY = "specpilot.crc32"  # JSON object: tensor name -> CRC-32 as 8 hex digits


def crc32(tensors: list[torch.Tensor]) -> str:
    """CRC-32 (8 hex digits) of the tensors' bytes, in order, as safetensors stores them (row-major)."""
    value = 0
    for t in tensors:
        value = zlib.crc32(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy(), value)
    return f"{value:08x}"


def to_metadata(sums: dict[str, str]) -> dict[str, str]:
    """The safetensors metadata entry holding `sums` (tensor name -> crc32)."""
    return {METADATA_KEY: json.dumps(sums, separators=(",", ":"), sort_keys=True)}


def from_metadata(metadata: dict[str, str] | None) -> dict[str, str] | None:
    """tensor name -> crc32 from a file's safetensors metadata; None when it has no checksums.
    Raises ValueError when the entry is not a JSON object of strings."""
    raw = (metadata or {}).get(METADATA_KEY)
    if raw is None:
        return None
    try:
        sums = json.loads(raw)
    except json.JSONDecodeError:
        sums = None
    if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
        raise ValueError(f"metadata entry {METADATA_KEY!r} is not a JSON object of checksums")
    return sums
