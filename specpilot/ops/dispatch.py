"""Chooses between an op's Triton kernel and its torch reference.

Triton runs only on CUDA tensors; CPU runs (and SPECPILOT_FORCE_REFERENCE_OPS=1, a debug switch listed in
docs/env.md) use the reference, and so does anything autograd records (training drafters): the kernels have no
backward, and a kernel would silently cut the gradient. Tests call the Triton functions directly under TRITON_INTERPRET=1.

A kernel that cannot take a shape says so through its `supports(...)` predicate (next to the kernel); the op's
dispatcher then runs the reference and records the fallback (`fallbacks()`), so a model of any shape the loader
accepts runs on the GPU. Most kernels pad a head dimension to a power-of-two register tile with masks
(`tile_width`); `fits_tile` is the shared bound on how wide such a tile may be.
"""

import os
from collections import Counter

import torch

MAX_TILE = 256  # widest head dim a kernel holds as one register tile (the widest the kernels were measured at)

_fallbacks: Counter = Counter()  # op name -> calls that took the reference on CUDA (diagnostics only)


def use_triton(x: torch.Tensor) -> bool:
    return (x.is_cuda and not (x.requires_grad and torch.is_grad_enabled())
            and os.environ.get("SPECPILOT_FORCE_REFERENCE_OPS", "0") != "1")


def tile_width(d: int, least: int = 16) -> int:
    """The power-of-two tile a kernel pads a dimension of d elements to (at least `least`: tl.dot's minimum)."""
    return max(least, 1 << max(d - 1, 0).bit_length())


def fits_tile(*dims: int, most: int = MAX_TILE) -> bool:
    """Whether every dimension is between 1 and `most` elements, so its padded tile fits a kernel's registers."""
    return all(1 <= d <= most for d in dims)


def takes(op: str, supported: bool) -> bool:
    """The dispatch decision for a CUDA call: `supported` (the kernel's predicate); a call the kernel cannot take
    is counted under `op` for `fallbacks()`."""
    if not supported:
        _fallbacks[op] += 1
    return supported


def fallbacks() -> dict[str, int]:
    """Op name -> CUDA calls that ran the reference because the kernel could not take the shapes."""
    return dict(_fallbacks)


def clear_fallbacks() -> None:
    _fallbacks.clear()
