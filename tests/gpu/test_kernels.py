"""bench/kernel_check.py's checks as tests: each Triton kernel family against its torch reference on the device,
at the real head sizes of Qwen3-8B and Qwen3.5-27B, with the script's status rule (bench.kernel_check.status)."""

from __future__ import annotations

import pytest
import torch

from bench import kernel_check

pytestmark = pytest.mark.gpu

CHECKS = kernel_check.checks("cuda")


@pytest.mark.parametrize(("name", "fn", "kwargs"), [(n, fn, kw) for n, _, fn, kw in CHECKS],
                         ids=[n for n, *_ in CHECKS])
def test_kernel_matches_its_reference(name, fn, kwargs):
    res = fn("cuda", **kwargs)
    torch.cuda.synchronize()
    assert kernel_check.status(res) == "ok", {k: v for k, v in res.items() if k != "traceback"}
