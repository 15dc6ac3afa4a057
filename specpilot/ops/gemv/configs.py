"""Launch configs of the decode GEMV per weight shape (N, K): (block_n, block_k, num_warps, pre_tiles) for M = 1
(pre_tiles: weight tiles loaded before the PDL wait), and
(block_n, block_k, num_warps, num_stages) for the skinny kernel (M = 2..32; tuned at 4..16, 32-row tiles take
fewer stages where shared memory runs out).

The fastest configs of H200 sweeps; the figures behind each entry are in
docs/decisions/2026-11-30-gemv-launch-configs.md. Shapes not listed use DEFAULT. The tuner will own this table per
GPU later.
"""

DEFAULT = (8, 512, 4, 1)
SKINNY_DEFAULT = (64, 256, 4, 4)

# (N, K): (M = 1 config, skinny config, skinny also at 17..32 rows). The M = 1 configs of the 8B's qkv, o_proj
# and gate_up are the fastest inside the batch-1 decode step, not alone; a skinny config is the fastest at
# M = 4, 8 and 16 (the same at all three for every shape); at 17..32 rows (tree verify blocks) the skinny kernel
# runs only where it beat cuBLAS at both 24 and 32 rows, and cuBLAS takes the others.
H200 = {
    (6144, 4096): ((4, 1024, 8, 2), (64, 256, 4, 4), False),  # Qwen3-8B qkv
    (4096, 4096): ((8, 1024, 8, 1), (32, 512, 4, 4), False),  # Qwen3-8B o_proj
    (24576, 4096): ((4, 1024, 4, 2), (64, 128, 4, 3), False),  # Qwen3-8B gate_up
    (4096, 12288): ((16, 1024, 8, 1), (32, 512, 4, 4), False),  # Qwen3-8B down
    (151936, 4096): ((16, 512, 4, 1), (64, 128, 4, 3), False),  # Qwen3-8B lm_head
    (14336, 5120): ((8, 512, 4, 1), (64, 128, 4, 4), True),  # Qwen3.5-27B attention qkv
    (5120, 6144): ((4, 512, 4, 1), (64, 256, 4, 4), False),  # Qwen3.5-27B o_proj and GDN out_proj
    (16480, 5120): ((16, 512, 4, 1), (64, 128, 4, 4), True),  # Qwen3.5-27B GDN in_proj
    (34816, 5120): ((8, 512, 4, 1), (64, 128, 4, 3), False),  # Qwen3.5-27B gate_up
    (5120, 17408): ((8, 512, 8, 1), (64, 256, 4, 4), False),  # Qwen3.5-27B down
    (248320, 5120): ((16, 1024, 8, 1), (64, 128, 4, 3), True),  # Qwen3.5-27B lm_head
}


def gemv_config(n: int, k: int) -> tuple[int, int, int, int]:
    return H200[(n, k)][0] if (n, k) in H200 else DEFAULT


def skinny_config(n: int, k: int, m: int = 16) -> tuple[int, int, int, int] | None:
    """The skinny launch config for m rows, or None where cuBLAS is the faster choice (m > 16 off the table)."""
    _, config, wide = H200.get((n, k), (None, SKINNY_DEFAULT, False))
    return None if m > 16 and not wide else config
