"""W12N: the lossless ~12-bit storage format for bf16 weight matrices (encode, decode, FP8 view, policy, I/O).

This file owns the format itself: the planes one bf16 matrix W [N, K] becomes, the plain-torch encoder and
decoder (the truth that GPU decode kernels are checked against), the FP8 view nested inside the A plane,
size accounting, the compress-or-keep policy, and the safetensors key layout. Byte-level description:
`README.md` beside this file.

Per weight w = (s, e, m7) (sign, 8-bit exponent, 7-bit mantissa of the bf16 bit pattern):
  A byte   = s<<7 | c<<3 | m7>>4      c = e - base if 1 <= e - base <= 14, else 0 (escape)
  B nibble = m7 & 0xF                 two per byte, even element in the low nibble
Escaped weights take their exponent from the segment's XE byte; a segment whose escapes need more than one
exponent (or exponent 255: inf/NaN) is marked XE = 255 and stored verbatim in a bf16 pool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specpilot.checkpoint.file import PLANE_GROUP_MARK

FORMAT_VERSION = 2  # the planes of version 1, and a CRC-32 per tensor in the file's metadata (checkpoint/checksum.py)
READABLE_VERSIONS = (1, 2)  # same planes: a version 1 file is still decoded (to rewrite it), never loaded
VERBATIM = 255  # XE value marking a segment stored verbatim; also the inf/NaN exponent, which never escapes inline
MAX_CODE = 14  # code 15 is never stored, so no A byte is an E4M3fn NaN (0x7F / 0xFF)
MAX_BASE = 254 - MAX_CODE  # keeps base + code <= 254: the window never covers inf/NaN
FP8_BIAS = 7  # E4M3 exponent bias: A as FP8 equals w * 2^(120 - base) with the mantissa truncated to 3 bits
SEGMENTS = (128, 256, 512)  # searched per tensor: 128 wins at K = 384 (padding) and on trained weights (conflicts)
KEEP_BF16_BITS = 15.5  # at or above this many bits/weight W12N does not pay for its decode
_META_LEN = 5  # (N, K, base, segment, version)
_PLANES = ("a", "b", "xe", "rvb", "verbatim", "meta")  # in the order a tensor's checksum covers them


@dataclass(frozen=True, eq=False)
class W12NTensor:
    """The encoded planes of one bf16 matrix W [n, k]; kp = k padded up to a multiple of `segment`, S = kp // segment.

    a        uint8 [n, kp]        sign | 4-bit exponent code | top 3 mantissa bits (the FP8 view)
    b        uint8 [n, kp // 2]   low 4 mantissa bits; element 2j in the low nibble of byte j, 2j+1 in the high
    xe       uint8 [n, S]         exponent of the segment's escaped weights (0 if none); 255 = verbatim segment
    rvb      int32 [n]            pool index of row r's first verbatim segment (exclusive cumsum over rows)
    verbatim bf16  [V, segment]   verbatim segments, row-major in (row, segment) order, padding zeroed
    base     per-tensor exponent: code c in 1..14 means exponent base + c
    """

    a: torch.Tensor
    b: torch.Tensor
    xe: torch.Tensor
    rvb: torch.Tensor
    verbatim: torch.Tensor
    base: int
    n: int
    k: int
    segment: int

    def __post_init__(self) -> None:
        _check_segment(self.segment)
        if not 0 <= self.base <= MAX_BASE:
            raise ValueError(f"W12N base must be in [0, {MAX_BASE}], got {self.base}")
        if self.n < 1 or self.k < 1:
            raise ValueError(f"W12N shape must be at least 1x1, got {self.n}x{self.k}")
        kp, segs = self.padded_k, self.padded_k // self.segment
        n_verbatim = int((self.xe == VERBATIM).sum()) if self.xe.shape == (self.n, segs) else -1
        expected = {
            "a": (torch.uint8, (self.n, kp)),
            "b": (torch.uint8, (self.n, kp // 2)),
            "xe": (torch.uint8, (self.n, segs)),
            "rvb": (torch.int32, (self.n,)),
            "verbatim": (torch.bfloat16, (n_verbatim, self.segment)),
        }
        for field, (dtype, shape) in expected.items():
            got = getattr(self, field)
            if got.dtype != dtype or tuple(got.shape) != shape:
                raise ValueError(
                    f"W12N plane {field!r} must be {dtype} {list(shape)} for a {self.n}x{self.k} matrix "
                    f"with segment {self.segment}, got {got.dtype} {list(got.shape)}"
                )

    def to(self, device) -> W12NTensor:
        """The same planes on `device` (the kernels read them where the activations are)."""
        planes = {f: getattr(self, f).to(device) for f in ("a", "b", "xe", "rvb", "verbatim")}
        return replace(self, **planes)

    @property
    def padded_k(self) -> int:
        return -(-self.k // self.segment) * self.segment

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)


def _check_segment(segment: int) -> None:
    if not isinstance(segment, int) or segment < 2 or segment % 2:
        raise ValueError(f"W12N segment must be a positive even int (two B nibbles per byte), got {segment!r}")


def _split_bits(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bf16 [..] -> (sign, exponent, mantissa) int32 [..] of its bit pattern."""
    bits = w.view(torch.int16).to(torch.int32) & 0xFFFF
    return bits >> 15, (bits >> 7) & 0xFF, bits & 0x7F


def _join_bits(sign: torch.Tensor, exp: torch.Tensor, man: torch.Tensor) -> torch.Tensor:
    """(sign, exponent, mantissa) int32 [..] -> bf16 [..] with exactly that bit pattern."""
    bits = (sign << 15) | (exp << 7) | man
    # why: int32 -> int16 casts of values >= 2^15 are not guaranteed to wrap, so wrap explicitly
    bits = torch.where(bits >= 0x8000, bits - 0x10000, bits)
    return bits.to(torch.int16).view(torch.bfloat16)


def _exponent_histogram(w: torch.Tensor) -> torch.Tensor:
    """bf16 w -> int64 [256] counts of finite nonzero exponents (0 and 255 can never be inside the window)."""
    _, exp, _ = _split_bits(w)
    hist = torch.bincount(exp.flatten(), minlength=256).cpu()  # 256 counts: the base search runs on the host
    hist[0] = hist[VERBATIM] = 0
    return hist


def anchored_base(w: torch.Tensor) -> int:
    """Base for bf16 w so the 14-code window ends at the largest finite nonzero exponent.

    Escapes then all lie below the window, so the FP8 view of every finite weight is off by less than the
    window's smallest binade (2^(base-126)); outliers keep their FP8 value, which the verifier's scan needs.
    """
    present = torch.nonzero(_exponent_histogram(w)).flatten()
    if present.numel() == 0:
        return 0
    return min(max(int(present.max()) - MAX_CODE, 0), MAX_BASE)


def coverage_base(w: torch.Tensor) -> int:
    """Base for bf16 w whose 14-code window covers the most weights (ties: the highest such base).

    Fewer escapes than `anchored_base` when a few outliers sit far above the bulk (trained FFN output
    projections), but those outliers then escape and read as ~0 in the FP8 view.
    """
    cum = torch.cumsum(torch.cat((torch.zeros(1, dtype=torch.int64), _exponent_histogram(w))), 0)
    bases = torch.arange(MAX_BASE + 1)
    covered = cum[bases + MAX_CODE + 1] - cum[bases + 1]  # exponents base+1 .. base+14
    return MAX_BASE - int(torch.argmax(covered.flip(0)))  # why flip: argmax returns the first maximum


def _resolve_base(w: torch.Tensor, base: int | str) -> int:
    if base == "max":
        return anchored_base(w)
    if base == "coverage":
        return coverage_base(w)
    if isinstance(base, int) and not isinstance(base, bool) and 0 <= base <= MAX_BASE:
        return base
    raise ValueError(f"W12N base must be 'max', 'coverage' or an int in [0, {MAX_BASE}], got {base!r}")


def _check_matrix(w: torch.Tensor) -> None:
    if not isinstance(w, torch.Tensor) or w.dtype != torch.bfloat16 or w.dim() != 2:
        got = f"{w.dtype} {list(w.shape)}" if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"W12N encodes a 2-D bf16 tensor, got {got}")
    if w.shape[0] < 1 or w.shape[1] < 1:
        raise ValueError(f"W12N needs N, K >= 1, got a {w.shape[0]}x{w.shape[1]} tensor")


def encode(w: torch.Tensor, segment: int = 512, base: int | str = "max") -> W12NTensor:
    """Encode bf16 W [N, K] (any N, K >= 1) losslessly.

    base: 'max' (`anchored_base`, keeps the FP8 view faithful), 'coverage' (`coverage_base`, fewest
    escapes), or an explicit int in [0, 240].
    """
    _check_matrix(w)
    _check_segment(segment)
    base = _resolve_base(w, base)
    n, k = w.shape
    kp = -(-k // segment) * segment
    src = torch.zeros(n, kp, dtype=torch.bfloat16)  # why: zero padding keeps padded verbatim segments deterministic
    src[:, :k] = w.detach().cpu()
    sign, exp, man = _split_bits(src)
    code = exp - base
    in_window = (code >= 1) & (code <= MAX_CODE)
    code = torch.where(in_window, code, 0)
    a = ((sign << 7) | (code << 3) | (man >> 4)).to(torch.uint8)
    nib = man & 0xF
    b = (nib[:, 0::2] | (nib[:, 1::2] << 4)).to(torch.uint8)

    xe = _escape_exponents(~in_window, exp, k, segment)
    is_verbatim = xe == VERBATIM
    verbatim = src.view(n, kp // segment, segment)[is_verbatim].contiguous()
    counts = is_verbatim.sum(dim=1, dtype=torch.int32)
    rvb = (torch.cumsum(counts, 0, dtype=torch.int32) - counts).to(torch.int32)
    t = W12NTensor(a=a, b=b, xe=xe.to(torch.uint8), rvb=rvb, verbatim=verbatim, base=base, n=n, k=k, segment=segment)
    return t.to(w.device)  # built on the host (bit-exact everywhere), returned where w lives


def encode_best(
    w: torch.Tensor, segments: tuple[int, ...] = SEGMENTS, bases: tuple[int | str, ...] = ("max", "coverage")
) -> W12NTensor:
    """The smallest encoding of W [N, K] over the given segment sizes and base rules (first wins ties).

    Sizes are predicted from the escape pattern alone, so only the winner is fully encoded.
    """
    _check_matrix(w)
    if not segments or not bases:
        raise ValueError(f"encode_best needs at least one segment and one base, got {segments!r} and {bases!r}")
    n, k = w.shape
    _, exp, _ = _split_bits(w)
    best = None
    for rule in bases:
        base = _resolve_base(w, rule)
        code = exp - base
        escaped = (code < 1) | (code > MAX_CODE)
        for segment in segments:
            _check_segment(segment)
            pad = -k % segment
            xe = _escape_exponents(_pad_cols(escaped, pad), _pad_cols(exp, pad), k, segment)
            bits = _predicted_bits(n, k, segment, int((xe == VERBATIM).sum()))
            if best is None or bits < best[0]:
                best = (bits, segment, base)
    return encode(w, segment=best[1], base=best[2])


def _pad_cols(x: torch.Tensor, pad: int) -> torch.Tensor:
    """x [N, K] -> [N, K + pad], zero/False filled (F.pad does not take bool)."""
    return torch.cat((x, x.new_zeros(x.shape[0], pad)), dim=1)


def _predicted_bits(n: int, k: int, segment: int, n_verbatim: int) -> float:
    """bits_per_weight of an n x k encoding with n_verbatim verbatim segments, without building it."""
    kp = -(-k // segment) * segment
    nbytes = n * kp + n * kp // 2 + n * (kp // segment) + 4 * n + 2 * segment * n_verbatim + 8 * _META_LEN
    return 8.0 * nbytes / (n * k)


def _escape_exponents(escaped: torch.Tensor, exp: torch.Tensor, k: int, segment: int) -> torch.Tensor:
    """escaped bool [N, Kp], exp int32 [N, Kp] -> XE int32 [N, S]: the single escape exponent, 0, or 255.

    Padding (columns >= k) is ignored: it decodes to whatever XE says and kernels mask it off.
    """
    n, kp = exp.shape
    escaped = escaped.clone()
    escaped[:, k:] = False
    seg_shape = (n, kp // segment, segment)
    lo = torch.where(escaped, exp, 256).view(seg_shape).amin(dim=2)
    hi = torch.where(escaped, exp, -1).view(seg_shape).amax(dim=2)
    has_escape = hi >= 0
    # why: XE = 255 is the verbatim marker, so inf/NaN escapes cannot be stored inline even when they agree
    conflict = has_escape & ((lo != hi) | (hi == VERBATIM))
    xe = torch.where(has_escape, hi, 0)
    return torch.where(conflict, VERBATIM, xe)


def decode(t: W12NTensor) -> torch.Tensor:
    """W12NTensor -> bf16 W [N, K], bit-identical to the encoded source."""
    a = t.a.to(torch.int32)
    b = t.b.to(torch.int32)
    nib = torch.stack((b & 0xF, b >> 4), dim=2).view(t.n, t.padded_k)
    code = (a >> 3) & 0xF
    xe = t.xe.to(torch.int32).repeat_interleave(t.segment, dim=1)
    exp = torch.where(code != 0, code + t.base, xe)
    out = _join_bits(a >> 7, exp, ((a & 0x7) << 4) | nib)
    # why: boolean-mask assignment walks (row, segment) in row-major order, the pool's order
    out.view(t.n, -1, t.segment)[t.xe == VERBATIM] = t.verbatim
    return out[:, : t.k].contiguous()


def fp8_view(t: W12NTensor) -> tuple[torch.Tensor, float]:
    """A plane as float8_e4m3fn [N, K] (a view, no copy) and scale s with fp8.float() * s ~= W.

    Non-escaped weights: |view - w| < 2^-3 |w|, same sign, never larger (mantissa truncated to 3 bits).
    Escaped weights (`escape_mask`) read as the FP8 subnormal sign * (m7 >> 4) / 8 * 2^-6, so |view| < 2^(base-126),
    the window's smallest binade: within that of w for escapes below the window (every finite weight under the
    default 'max' base; zeros read as signed zeros), meaningless above it ('coverage' outliers) and for inf/NaN.
    """
    return t.a[:, : t.k].view(torch.float8_e4m3fn), 2.0 ** (t.base - 127 + FP8_BIAS)


def escape_mask(t: W12NTensor) -> torch.Tensor:
    """bool [N, K]: weights whose exponent is outside the window (code 0), verbatim segments included."""
    return (t.a[:, : t.k] & 0x78) == 0


def bits_per_weight(t: W12NTensor) -> float:
    """All stored bits (planes, XE, row index, verbatim pool, meta) over N*K source weights."""
    planes = (t.a, t.b, t.xe, t.rvb, t.verbatim)
    nbytes = sum(p.numel() * p.element_size() for p in planes) + len(_meta(t)) * 8
    return 8.0 * nbytes / (t.n * t.k)


def stats(t: W12NTensor) -> dict:
    """Summary for inspection and policy: shape, base, segment, escape rate, verbatim fraction, bits/weight."""
    segments = t.xe.numel()
    n_verbatim = int((t.xe == VERBATIM).sum())
    return {
        "n": t.n,
        "k": t.k,
        "base": t.base,
        "segment": t.segment,
        "escape_rate": float(escape_mask(t).sum()) / (t.n * t.k),
        "verbatim_segments": n_verbatim,
        "verbatim_fraction": n_verbatim / segments,
        "bits_per_weight": bits_per_weight(t),
    }


def maybe_encode(
    w: torch.Tensor,
    segment: int | None = None,
    max_bits: float = KEEP_BF16_BITS,
    bases: tuple[int | str, ...] = ("max", "coverage"),
) -> W12NTensor | None:
    """The compress-or-keep policy: the smallest W12N encoding of w, or None when w should stay bf16.

    segment None searches SEGMENTS per tensor (`encode_best`); an int fixes it. Stays bf16: anything not a
    2-D bf16 tensor (norms, biases, fp32 params), and matrices whose encoding costs max_bits or more per
    weight (too many verbatim segments, or padding on a tiny K). Pass bases=("max",) when the FP8 view
    must keep outliers (two-level verification).
    """
    if not isinstance(w, torch.Tensor) or w.dtype != torch.bfloat16 or w.dim() != 2 or w.numel() == 0:
        return None
    t = encode_best(w, segments=SEGMENTS if segment is None else (segment,), bases=bases)
    return t if bits_per_weight(t) < max_bits else None


def should_compress(w: torch.Tensor, **policy) -> bool:
    """True when `maybe_encode(w, **policy)` stores w as W12N (prefer maybe_encode: it encodes only once)."""
    return maybe_encode(w, **policy) is not None


def _meta(t: W12NTensor) -> torch.Tensor:
    """int64 [_META_LEN] = (N, K, base, segment, format version)."""
    return torch.tensor([t.n, t.k, t.base, t.segment, FORMAT_VERSION], dtype=torch.int64)


def plane_keys(name: str) -> list[str]:
    """The safetensors keys of one encoded matrix, in the order its checksum covers them."""
    return [f"{name}{PLANE_GROUP_MARK}{plane}" for plane in _PLANES]


def to_state_dict(name: str, t: W12NTensor) -> dict[str, torch.Tensor]:
    """The safetensors entries for one encoded matrix: {name}.w12n_{a,b,xe,rvb,verbatim,meta}."""
    planes = (t.a, t.b, t.xe, t.rvb, t.verbatim, _meta(t))
    return {key: p.contiguous() for key, p in zip(plane_keys(name), planes)}


def from_state_dict(name: str, tensors: dict[str, torch.Tensor]) -> W12NTensor:
    """Inverse of `to_state_dict`; raises ValueError naming the missing or malformed key."""
    key = dict(zip(_PLANES, plane_keys(name)))
    missing = [k for k in key.values() if k not in tensors]
    if missing:
        raise ValueError(f"W12N tensor {name!r} is missing keys: {', '.join(missing)}")
    a, b, xe, rvb, verbatim, meta = (tensors[k] for k in key.values())
    if meta.dtype != torch.int64 or meta.dim() != 1 or meta.numel() < _META_LEN:
        raise ValueError(
            f"{key['meta']} must be int64 [{_META_LEN}] (N, K, base, segment, version), "
            f"got {meta.dtype} {list(meta.shape)}"
        )
    n, k, base, segment, version = (int(v) for v in meta[:_META_LEN])
    if version not in READABLE_VERSIONS:
        raise ValueError(f"{key['meta']} says format version {version}; this reader knows "
                         f"{', '.join(map(str, READABLE_VERSIONS))}")
    try:
        t = W12NTensor(a=a, b=b, xe=xe, rvb=rvb, verbatim=verbatim, base=base, n=n, k=k, segment=segment)
    except ValueError as err:
        raise ValueError(f"W12N tensor {name!r}: {err}") from None
    counts = (xe == VERBATIM).sum(dim=1, dtype=torch.int32)
    if not torch.equal(rvb, (torch.cumsum(counts, 0, dtype=torch.int32) - counts).to(torch.int32)):
        raise ValueError(f"{key['rvb']} does not match the verbatim segments marked in {key['xe']}")
    return t
