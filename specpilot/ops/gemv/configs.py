"""Launch configs of the decode GEMV per weight shape (N, K): (block_n, block_k, num_warps, pre_tiles) for M = 1
(pre_tiles: weight tiles loaded before the PDL wait), and
(block_n, block_k, num_warps, num_stages) for the skinny kernel (M = 2..32; tuned at 4..16, 32-row tiles take
fewer stages where shared memory runs out).

Measured on an H200 by `python3 -m bench gemv` (bench/results/gemv_h200.json: each best config with its speed-up over
cuBLAS at M = 1), or inside the decode step where marked. Shapes not listed use DEFAULT. The tuner will own
this table per GPU later.
"""

DEFAULT = (8, 512, 4, 1)

H200 = {
    # the 8B's qkv, o_proj and gate_up: the best of ar_decode.STEP_GRID inside the batch-1 step
    # (bench/results/gemv_step_sweep_h200.json: step ms against 4.334 with the lone-GEMV winners)
    (6144, 4096): (4, 1024, 8, 2),  # Qwen3-8B qkv: 4.291 ms
    (4096, 4096): (8, 1024, 8, 1),  # Qwen3-8B o_proj: 4.157 ms
    (24576, 4096): (4, 1024, 4, 2),  # Qwen3-8B gate_up: 4.227 ms
    (4096, 12288): (16, 1024, 8, 1),  # Qwen3-8B down: 1.19x
    (151936, 4096): (16, 512, 4, 1),  # Qwen3-8B lm_head: 1.04x
    (14336, 5120): (8, 512, 4, 1),  # Qwen3.5-27B attention qkv: 1.08x
    (5120, 6144): (4, 512, 4, 1),  # Qwen3.5-27B o_proj and GDN out_proj: 1.06x
    (16480, 5120): (16, 512, 4, 1),  # Qwen3.5-27B GDN in_proj: 1.04x
    (34816, 5120): (8, 512, 4, 1),  # Qwen3.5-27B gate_up: 1.06x
    (5120, 17408): (8, 512, 8, 1),  # Qwen3.5-27B down: 1.14x
    (248320, 5120): (16, 1024, 8, 1),  # Qwen3.5-27B lm_head: 1.08x
}


def gemv_config(n: int, k: int) -> tuple[int, int, int, int]:
    return H200.get((n, k), DEFAULT)


SKINNY_DEFAULT = (64, 256, 4, 4)

# measured by python3 -m bench gemv --skinny (bench/results/gemv_skinny_h200.json): the best config at M = 4, 8, 16
# was the same for every shape; time at M = 16 over our M = 1 GEMV in the comment
SKINNY_H200 = {
    (6144, 4096): (64, 256, 4, 4),  # Qwen3-8B qkv: 1.08x
    (4096, 4096): (32, 512, 4, 4),  # Qwen3-8B o_proj: 1.06x
    (24576, 4096): (64, 128, 4, 3),  # Qwen3-8B gate_up: 1.01x
    (4096, 12288): (32, 512, 4, 4),  # Qwen3-8B down: 1.07x
    (151936, 4096): (64, 128, 4, 3),  # Qwen3-8B lm_head: 1.02x
    (14336, 5120): (64, 128, 4, 4),  # Qwen3.5-27B attention qkv: 1.04x
    (5120, 6144): (64, 256, 4, 4),  # Qwen3.5-27B o_proj and GDN out_proj: 1.06x
    (16480, 5120): (64, 128, 4, 4),  # Qwen3.5-27B GDN in_proj: 1.01x
    (34816, 5120): (64, 128, 4, 3),  # Qwen3.5-27B gate_up: 1.06x
    (5120, 17408): (64, 256, 4, 4),  # Qwen3.5-27B down: 1.04x
    (248320, 5120): (64, 128, 4, 3),  # Qwen3.5-27B lm_head: 1.03x
}


# 17..32 rows (tree verify blocks): only the shapes where the skinny kernel beat cuBLAS at both 24 and 32 rows
# (bench/results/gemv_skinny32_h200.json, us at 32 rows); with fewer programs than SMs (N = 5120 over 64-row
# tiles) or the 32-row tile's fewer stages, cuBLAS won the rest: 27B o_proj 20.4 vs 18.2, down 50.2 vs 47.9,
# gate_up 87.9 vs 87.4; the 8B shapes are unmeasured there
SKINNY_WIDE_H200 = {
    (14336, 5120),  # Qwen3.5-27B attention qkv: 36.8 vs cuBLAS 37.8
    (16480, 5120),  # Qwen3.5-27B GDN in_proj: 41.1 vs 43.5
    (248320, 5120),  # Qwen3.5-27B lm_head: 579 vs 607
}


def skinny_config(n: int, k: int, m: int = 16) -> tuple[int, int, int, int] | None:
    """The skinny launch config for m rows, or None where cuBLAS is the faster choice (m > 16 off the table)."""
    if m > 16 and (n, k) not in SKINNY_WIDE_H200:
        return None
    return SKINNY_H200.get((n, k), SKINNY_DEFAULT)
