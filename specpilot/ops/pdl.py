"""Programmatic dependent launch (PDL, Hopper and later): whether a kernel launch may use it, and how.

A decode step is a chain of short kernels; between two of them the GPU drains one grid, then launches the next.
With PDL a kernel launched with the attribute may be scheduled while its predecessor is still running: it
signals its own dependents at once (gdc_launch_dependents) and waits (gdc_wait) before its first load, so its
launch overlaps the predecessor's tail while every read still sees the predecessor's writes. Kernels take a
`PDL` constexpr and call pdl_wait.wait_for_inputs first; an op wrapper takes `pdl: bool` from its caller (the
layer passes its KernelPaths.pdl, layers/paths.py) and launches with `launch_kwargs(usable(x, pdl))`. Never on
the CPU (the interpreter cannot run the griddepcontrol instructions). This module imports no triton: CPU-only
installs (no triton) import it too.
"""

from __future__ import annotations

import torch


def usable(x: torch.Tensor, on: bool) -> bool:
    """Whether a kernel reading x launches with PDL: asked for (on), a CUDA tensor, and not the interpreter."""
    if not (on and x.is_cuda):
        return False
    import triton  # only for a CUDA tensor, whose ops run Triton kernels

    return not triton.knobs.runtime.interpret


def launch_kwargs(on: bool) -> dict:
    return {"launch_pdl": True} if on else {}
