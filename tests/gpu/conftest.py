"""GPU tests (marker `gpu`): the compiled Triton kernels and the engine in bf16 on a CUDA device, skipped without
one. Run on their own (tests/conftest.py sets TRITON_INTERPRET=1 for the CPU suite, and a kernel module decorated
then stays interpreted):

    PYTHONPATH=. python3 -m pytest -m gpu tests/gpu -q --junitxml=$OUT/gpu_tests.xml

SPECPILOT_GPU_DRY_RUN=1 runs the gate tests on the CPU on the tiny shapes (tests/gpu/gate_setup.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
HERE = Path(__file__).parent
# only tests/gpu collected: no kernel module is decorated yet, so the compiled kernels can still be had
_DECORATED = any(m.startswith("specpilot.ops.") for m in sys.modules)
if CUDA and not _DECORATED:
    os.environ["TRITON_INTERPRET"] = "0"


DRY = os.environ.get("SPECPILOT_GPU_DRY_RUN") == "1"  # the gate tests on the CPU, tiny shapes (gate_setup.py)


def _skip_reason(item) -> str | None:
    if DRY and item.path.name != "test_kernels.py":
        return None
    if not CUDA:
        return "no CUDA device"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return ("collected with the CPU suite (TRITON_INTERPRET=1 kernels): run python3 -m pytest -m gpu tests/gpu "
                "on its own")
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = _skip_reason(item) if HERE in Path(item.path).parents else None
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
