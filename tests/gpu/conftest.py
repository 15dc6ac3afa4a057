"""GPU tests (marker `gpu`): the compiled Triton kernels and the engine in bf16 on a CUDA device, skipped without
one. Run on their own (tests/conftest.py sets TRITON_INTERPRET=1 for the CPU suite, and a kernel module decorated
then stays interpreted):

    PYTHONPATH=. python3 -m pytest -m gpu tests/gpu -q --junitxml=$OUT/gpu_tests.xml
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


def _skip_reason() -> str | None:
    if not CUDA:
        return "no CUDA device"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return ("collected with the CPU suite (TRITON_INTERPRET=1 kernels): run python3 -m pytest -m gpu tests/gpu "
                "on its own")
    return None


def pytest_collection_modifyitems(config, items):
    reason = _skip_reason()
    if reason is None:
        return
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.skip(reason=reason))
