"""Chooses between an op's Triton kernel and its torch reference.

Triton runs only on CUDA tensors; CPU runs (and SPECPILOT_FORCE_REFERENCE_OPS=1, a debug switch listed in
docs/env.md) use the reference, and so does anything autograd records (training drafters): the kernels have no
backward, and a kernel would silently cut the gradient. Tests call the Triton functions directly under TRITON_INTERPRET=1.
"""

import os

import torch


def use_triton(x: torch.Tensor) -> bool:
    return (x.is_cuda and not (x.requires_grad and torch.is_grad_enabled())
            and os.environ.get("SPECPILOT_FORCE_REFERENCE_OPS", "0") != "1")
