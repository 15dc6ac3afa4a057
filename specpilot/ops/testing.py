"""Helpers shared by kernel tests: NaN-poisoned outputs and a relative-error comparison."""

import torch


def nan_like(x: torch.Tensor) -> torch.Tensor:
    """An output buffer that shows any element a kernel forgot to write."""
    return torch.full_like(x, float("nan"))


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float = 1e-5) -> None:
    """Fails unless out has no NaN and its relative RMS error against ref is at most ratio."""
    assert ref.shape == out.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    ref64, out64 = ref.double(), out.double()
    assert not torch.isnan(out64).any(), f"{name}: output has NaN (unwritten or invalid elements)"
    diff = (ref64 - out64).abs()
    rel = diff.pow(2).mean().sqrt() / ref64.pow(2).mean().sqrt().clamp_min(1e-30)
    assert rel <= ratio, f"{name}: relative RMS error {rel:.3e} > {ratio:.1e} (max abs err {diff.max():.3e})"
