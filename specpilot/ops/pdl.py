"""Programmatic dependent launch (PDL, Hopper and later): the one switch for the decode kernels that use it.

A decode step is a chain of short kernels; between two of them the GPU drains one grid, then launches the next.
With PDL a kernel launched with the attribute may be scheduled while its predecessor is still running: it
signals its own dependents at once (gdc_launch_dependents) and waits (gdc_wait) before its first load, so its
launch overlaps the predecessor's tail while every read still sees the predecessor's writes. Kernels take a
`PDL` constexpr and call pdl_wait.wait_for_inputs first; wrappers pass `launch_kwargs()` when `active()`. Off on
the CPU (the interpreter cannot run the griddepcontrol instructions). The runner opens `enabled()` for decode
steps (EngineConfig.decode_pdl). This module imports no triton: CPU-only installs (no triton) import it too.
"""

from __future__ import annotations

import contextlib

import torch

_enabled = False


@contextlib.contextmanager
def enabled(on: bool = True):
    global _enabled
    previous, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = previous


def active(x: torch.Tensor) -> bool:
    if not (_enabled and x.is_cuda):
        return False
    import triton  # only for a CUDA tensor, whose ops run Triton kernels

    return not triton.knobs.runtime.interpret


def launch_kwargs(on: bool) -> dict:
    return {"launch_pdl": True} if on else {}

