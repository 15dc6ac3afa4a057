"""PDL's device side: `wait_for_inputs`, the @triton.jit building block a PDL kernel calls before its first load.

Only kernel modules import it (it imports triton); the host side (whether and how a launch uses PDL), which
CPU-only installs import, is pdl.py.
"""

import triton
import triton.language as tl


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Let the next kernel launch, then wait until the previous one's writes are visible (no-op without PDL)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
