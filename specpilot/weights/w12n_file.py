"""W12N matrices of a checkpoint file: the plane groups a `CheckpointFile` reads back, checked, as W12NTensors and
as the bf16 tensors they encode; every other tensor as the file stores it. The loader (models/loader.py) and
`compress` / `inspect` (compress.py) read source tensors through here."""

from __future__ import annotations

import torch

from specpilot.checkpoint.file import CheckpointFile
from specpilot.weights import w12n


def source_shape(f: CheckpointFile, name: str) -> tuple[int, ...]:
    """The shape of source tensor `name`; of a W12N matrix from its meta plane (N, K, base, segment, version)."""
    if name in f.groups:
        meta = w12n.plane_keys(name)[-1]  # the meta plane: read unchecked, as the shape is all it gives here
        return tuple(f.handle.get_tensor(meta)[:2].tolist())
    return f.shape(name)


def read_source(f: CheckpointFile, name: str) -> torch.Tensor:
    """The values of source tensor `name`: a W12N matrix decoded (bit-exact bf16), any other as stored."""
    if name in f.groups:
        return w12n.decode(read_w12n(f, name))
    return f.read(name)


def read_w12n(f: CheckpointFile, name: str) -> w12n.W12NTensor:
    """The W12NTensor of the plane group `name`, checksum and structure checked."""
    planes = f.read_planes(name, w12n.plane_keys(name))
    try:
        return w12n.from_state_dict(name, planes)
    except ValueError as e:
        raise f.corrupt(str(e)) from None
