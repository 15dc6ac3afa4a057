"""Each Triton kernel family against its torch reference on the device, at the real head sizes of Qwen3-8B and
Qwen3.5-27B (the checks and their status rule: tests/gpu/kernel_checks.py)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import kernel_checks

pytestmark = pytest.mark.gpu

CHECKS = kernel_checks.checks("cuda")


@pytest.mark.parametrize(("name", "fn", "kwargs"), [(n, fn, kw) for n, _, fn, kw in CHECKS],
                         ids=[n for n, *_ in CHECKS])
def test_kernel_matches_its_reference(name, fn, kwargs):
    res = fn("cuda", **kwargs)
    torch.cuda.synchronize()
    assert kernel_checks.status(res) == "ok", {k: v for k, v in res.items() if k != "traceback"}
