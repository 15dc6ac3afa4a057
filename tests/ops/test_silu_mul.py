"""SwiGLU activation: the Triton kernel vs its reference (TRITON_INTERPRET=1) on odd shapes and strided rows, the
reference vs the eager pointwise helper it replaces in prefill, and the dispatch."""

import pytest
import torch

from specpilot.layers import pointwise as pw
from specpilot.ops.silu_mul import silu_mul, silu_mul_ref

pytest.importorskip("triton")


@pytest.mark.parametrize("shape,dtype", [((1, 10), torch.float32), ((3, 74), torch.float32),
                                         ((17, 600), torch.bfloat16), ((2, 5, 38), torch.bfloat16)],
                         ids=["row-fp32", "odd-fp32", "many-rows-bf16", "3d-bf16"])
def test_kernel_matches_reference(shape, dtype):
    from specpilot.ops.silu_mul.triton import silu_mul as kernel

    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    want = silu_mul_ref(x)
    got = kernel(x, block_r=4, block_n=16)  # several row and column blocks, masked edges
    assert got.shape == want.shape and got.dtype == dtype
    # bf16: the interpreter rounds fp32 -> bf16 by truncation (a GPU to nearest): up to an ulp
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=2 ** -7)
    torch.testing.assert_close(got.float(), want.float(), **tol)


def test_kernel_reads_rows_of_a_wider_tensor():
    """Rows as a column slice of a wider tensor (a dense last dimension, strided rows)."""
    from specpilot.ops.silu_mul.triton import silu_mul as kernel

    wide = torch.randn(9, 50, generator=torch.Generator().manual_seed(1))
    x = wide[:, 3:43]
    torch.testing.assert_close(kernel(x, block_r=4, block_n=8), silu_mul_ref(x), rtol=1e-6, atol=1e-6)


def test_reference_is_the_eager_helper():
    x = torch.randn(4, 3, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert torch.equal(silu_mul_ref(x), pw.silu_mul(x))


def test_cpu_dispatch_is_the_reference_and_odd_widths_are_refused():
    from specpilot.ops.silu_mul.triton import supports

    x = torch.randn(3, 8)
    assert torch.equal(silu_mul(x), silu_mul_ref(x))
    assert supports(x) and not supports(torch.randn(3, 7)) and not supports(torch.randn(8, 3).t())
