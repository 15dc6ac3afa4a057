"""Weight storage formats: W12N (lossless ~12-bit bf16 with a nested FP8 view); see README.md here."""

from specpilot.weights.w12n import (
    FORMAT_VERSION,
    W12NTensor,
    anchored_base,
    bits_per_weight,
    coverage_base,
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

__all__ = [
    "FORMAT_VERSION",
    "W12NTensor",
    "anchored_base",
    "bits_per_weight",
    "coverage_base",
    "decode",
    "encode",
    "encode_best",
    "escape_mask",
    "fp8_view",
    "from_state_dict",
    "maybe_encode",
    "should_compress",
    "stats",
    "to_state_dict",
]
