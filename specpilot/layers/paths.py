"""KernelPaths: which kernel each layer takes in one kind of forward pass, carried on the step's BatchMetadata.

specpilot/runtime/settings.py::Runtime.build decides one KernelPaths per step kind (decode, verify, prefill, the
DFlash proposal) from the EngineConfig and the device; the runner puts it on the step's metadata and every layer
reads `meta.paths`. A forward nobody chose a path for (CPU tests, training, teacher forcing) gets PLAIN: plain
torch and cuBLAS. Every path here has its plain reference beside it, and an op that cannot take a shape falls
back to it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KernelPaths:
    gemv: bool = False  # projections of up to ops.gemv.MAX_M rows through ops/gemv instead of cuBLAS
    gated_down: bool = False  # a single-row down projection reads [gate | up] and forms silu(gate) * up (gated GEMV)
    w12n: bool = False  # layers with W12N planes multiply up to 16 rows through them (ops/w12n_gemv)
    w12n_swiglu: bool = False  # an MLP's W12N gate_up GEMV forms silu(gate) * up in its epilogue
    fused_qk_rope_store: bool = False  # q/k norm + RoPE + K/V store in one kernel (decode, tree-op blocks)
    block_kernel: bool = False  # multi-token blocks through ops/tree_attention instead of SDPA
    # a causal block (block_mask None) of one request, or of requests whose prefixes are known equal (equal_prefix),
    # through SDPA's FlashAttention / memory-efficient kernels, bottom-right causal over prefix + block, instead of
    # the tree-attention op or the masked SDPA
    causal_sdpa: bool = False
    decode_splits: int = 0  # decode attention chunks per sequence (0: chosen from the shapes)
    pdl: bool = False  # our kernels launch with programmatic dependent launch (ops/pdl.py), norms as ops/rms_norm
    compiled: bool = False  # the pointwise helpers (layers/pointwise.py) run torch.compiled on CUDA
    # norms and the SwiGLU activation of many-row blocks (prefill chunks: no graph fixes their shapes for the compiled
    # helpers) through the Triton row kernels ops/rms_norm and ops/silu_mul instead of eager fp32 torch
    row_kernels: bool = False
    # Gated DeltaNet blocks over 16 tokens: ops.gated_delta_rule.prefill_kernel's choice (True: fla-core's chunked
    # rule where installed and it takes the inputs, else ours as one Triton kernel; or "fla" / "triton" / "torch")
    gdn_prefill_kernel: bool | str = False


PLAIN = KernelPaths()
