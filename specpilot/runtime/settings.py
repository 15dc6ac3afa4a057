"""Runtime: an EngineConfig resolved once for one device, then handed to the runner and to every drafter.

`Runtime.build(engine, device)` decides which kernels each kind of forward pass takes, one KernelPaths
(layers/paths.py) per step kind, and the runtime's other choices: CUDA graphs, verify graph cuts, how hybrid
chains commit, the weight format. The runner puts a step kind's paths on the step's BatchMetadata and the
layers read them there; nothing reads the EngineConfig after this. On the CPU every
GPU-only path is off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.config import EngineConfig
from specpilot.layers.paths import KernelPaths


@dataclass(frozen=True, slots=True)
class Runtime:
    device: str  # the device type it was built for ("cuda", "cpu", ...)
    decode: KernelPaths  # AR decode steps (ModelRunner.decode, eager or its CUDA graph)
    verify: KernelPaths  # verify blocks (ModelRunner.verify, eager or captured)
    prefill: KernelPaths  # prefill chunks, extend, prefill_many; ModelRunner.logits
    draft: KernelPaths  # the DFlash drafter's proposal forward (spec_decode/drafters/dflash.py)
    cuda_graphs: bool  # decode steps and DFlash proposals replayed from CUDA graphs
    verify_graphs: bool  # the verify forward replayed from a CUDA graph per (batch, width, chain or tree)
    verify_layers_per_graph: int  # a verify graph cut after layer 0 and every N layers (0: one graph)
    fold_hybrid_chains: bool  # hybrid targets verify a chain as a tree and fold its kept prefix
    weight_format: str  # "bf16", "w12n" or "w12n_only" (EngineConfig.weight_format)

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    @classmethod
    def build(cls, engine: EngineConfig, device: str | torch.device) -> Runtime:
        kind = torch.device(device).type
        on_gpu = kind == "cuda"
        ab = engine.ablations
        # "auto" is the tree-attention op on a GPU, SDPA on the CPU; only the op's path can be captured (SDPA
        # slices the prefix by a host-side length)
        block_kernel = engine.block_attention == "tree" or (engine.block_attention == "auto" and on_gpu)
        verify_graphs = engine.verify_graphs and on_gpu and block_kernel
        cuda_graphs = engine.cuda_graphs and on_gpu
        gemv = ab.decode_gemv and on_gpu
        compiled = ab.compile_pointwise and on_gpu
        fused = ab.fused_qk_rope_store and on_gpu
        weights = dict(w12n=engine.weight_format in ("w12n", "w12n_only"), w12n_swiglu=ab.w12n_swiglu and on_gpu)
        decode = KernelPaths(gemv=gemv, gated_down=gemv and ab.decode_gated_down, fused_qk_rope_store=fused,
                             decode_splits=engine.decode_attention_splits, pdl=ab.decode_pdl and on_gpu,
                             compiled=compiled, **weights)
        # a captured graph fixes the shapes, so the pointwise helpers compile once per graph; eager verify blocks
        # (any width) stay uncompiled. No PDL in verify blocks (docs/decisions/2026-12-01-engine-config-defaults.md)
        verify = KernelPaths(gemv=gemv, gated_down=gemv and ab.decode_gated_down, fused_qk_rope_store=fused,
                             block_kernel=block_kernel, compiled=compiled and verify_graphs, **weights)
        # prefill chunks are causal blocks right after the committed prefix: FlashAttention takes them whole
        prefill = KernelPaths(block_kernel=block_kernel, causal_sdpa=on_gpu, row_kernels=on_gpu,
                              gdn_prefill_kernel=ab.triton_gdn_prefill and on_gpu, **weights)
        # the DFlash block reads its context by a device length through the tree-attention op whatever
        # block_attention says; its pointwise helpers compile only where its proposal graphs fix the shapes
        draft = KernelPaths(gemv=gemv, block_kernel=on_gpu, compiled=compiled and cuda_graphs)
        return cls(device=kind, decode=decode, verify=verify, prefill=prefill, draft=draft,
                   cuda_graphs=cuda_graphs, verify_graphs=verify_graphs,
                   verify_layers_per_graph=engine.verify_layers_per_graph,
                   fold_hybrid_chains=engine.hybrid_chain_commit == "fold", weight_format=engine.weight_format)
