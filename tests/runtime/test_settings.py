"""Runtime.build: which kernels each step kind takes for an EngineConfig on a device, decided once."""

import dataclasses

import pytest
import torch

from specpilot.config import Ablations, EngineConfig
from specpilot.layers.paths import PLAIN, KernelPaths
from specpilot.runtime.settings import Runtime

GPU = "cuda"  # building a Runtime needs no GPU: torch.device("cuda") is only a name


def test_defaults_on_a_gpu():
    rt = Runtime.build(EngineConfig(), GPU)
    assert rt.decode == KernelPaths(gemv=True, gated_down=True, w12n_swiglu=True, fused_qk_rope_store=True, pdl=True,
                                    compiled=True)
    assert rt.verify == KernelPaths(gemv=True, gated_down=True, w12n_swiglu=True, fused_qk_rope_store=True,
                                    block_kernel=True, compiled=True)
    assert rt.prefill == KernelPaths(w12n_swiglu=True, block_kernel=True, causal_sdpa=True, row_kernels=True,
                                     gdn_prefill_kernel=True)
    assert rt.draft == KernelPaths(gemv=True, block_kernel=True, compiled=True)
    assert (rt.device, rt.on_gpu, rt.cuda_graphs, rt.verify_graphs, rt.verify_layers_per_graph) == (GPU, True, True,
                                                                                                    True, 8)
    assert rt.fold_hybrid_chains and rt.weight_format == "bf16"
    assert not rt.verify.pdl, "verify blocks never launch with PDL"


def test_on_the_cpu_every_gpu_path_is_off():
    everything = EngineConfig(block_attention="sdpa", decode_attention_splits=3)
    rt = Runtime.build(everything, "cpu")
    assert rt.decode == KernelPaths(decode_splits=3) and rt.verify == rt.prefill == rt.draft == PLAIN
    assert not (rt.on_gpu or rt.cuda_graphs or rt.verify_graphs)
    # what is not a GPU path holds on the CPU too: the tree-attention op asked for, the W12N weights
    rt = Runtime.build(EngineConfig(block_attention="tree", weight_format="w12n"), torch.device("cpu"))
    assert rt.verify.block_kernel and rt.prefill.block_kernel and not rt.verify_graphs
    assert rt.decode.w12n and rt.verify.w12n and rt.prefill.w12n and not rt.draft.w12n


@pytest.mark.parametrize("field,step,path", [
    ("compile_pointwise", "decode", "compiled"), ("compile_pointwise", "verify", "compiled"),
    ("compile_pointwise", "draft", "compiled"), ("decode_gemv", "decode", "gemv"), ("decode_gemv", "verify", "gemv"),
    ("decode_gemv", "draft", "gemv"), ("decode_gemv", "decode", "gated_down"),
    ("fused_qk_rope_store", "decode", "fused_qk_rope_store"), ("fused_qk_rope_store", "verify", "fused_qk_rope_store"),
    ("decode_pdl", "decode", "pdl"), ("decode_gated_down", "decode", "gated_down"),
    ("decode_gated_down", "verify", "gated_down"), ("w12n_swiglu", "decode", "w12n_swiglu"),
    ("triton_gdn_prefill", "prefill", "gdn_prefill_kernel")])
def test_each_ablation_turns_its_path_off(field, step, path):
    on = getattr(Runtime.build(EngineConfig(), GPU), step)
    off = getattr(Runtime.build(EngineConfig(ablations=Ablations(**{field: False})), GPU), step)
    assert getattr(on, path) and not getattr(off, path)


def test_engine_fields_map_to_the_runtime():
    build = lambda **f: Runtime.build(EngineConfig(**f), GPU)  # noqa: E731
    sdpa = build(block_attention="sdpa")
    # SDPA blocks slice the prefix by a host-side length, which a captured graph cannot follow
    assert not sdpa.verify.block_kernel and not sdpa.prefill.block_kernel and not sdpa.verify_graphs
    assert not sdpa.verify.compiled, "eager verify blocks (any width) stay uncompiled"
    assert sdpa.draft.block_kernel, "the DFlash block always reads its context through the tree-attention op"
    no_graphs = build(verify_graphs=False)
    assert no_graphs.verify.block_kernel and not no_graphs.verify_graphs and not no_graphs.verify.compiled
    eager = build(cuda_graphs=False)
    assert not eager.cuda_graphs and not eager.draft.compiled and eager.decode.compiled and eager.verify_graphs
    assert build(decode_attention_splits=4).decode.decode_splits == 4
    only = build(weight_format="w12n_only")
    assert only.decode.w12n and only.weight_format == "w12n_only"
    assert not build(hybrid_chain_commit="replay").fold_hybrid_chains
    assert build(verify_layers_per_graph=0).verify_layers_per_graph == 0


def test_runtime_is_frozen():
    rt = Runtime.build(EngineConfig(), "cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rt.cuda_graphs = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        rt.decode.gemv = True


def test_engine_config_round_trips_through_json():
    import json

    cfg = EngineConfig(weight_format="w12n", verify_layers_per_graph=4, ablations=Ablations(decode_pdl=False))
    assert EngineConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert EngineConfig.from_dict({"decode_pdl": False, "weight_format": "w12n", "verify_layers_per_graph": 4}) == cfg
    with pytest.raises(ValueError, match="unknown key 'max_batch_size'"):
        EngineConfig.from_dict({"max_batch_size": 8})
    with pytest.raises(ValueError, match="ablations: unknown key 'cuda_graphs'"):
        EngineConfig.from_dict({"ablations": {"cuda_graphs": False}})
    with pytest.raises(ValueError, match="both at top level and under ablations"):
        EngineConfig.from_dict({"decode_pdl": False, "ablations": {"decode_pdl": True}})
    with pytest.raises(ValueError, match="weight_format"):
        EngineConfig.from_dict({"weight_format": "int4"})


def test_engine_config_replace_takes_ablation_switches_by_name():
    cfg = EngineConfig().replace(decode_gemv=False, weight_format="w12n")
    assert cfg == EngineConfig(weight_format="w12n", ablations=Ablations(decode_gemv=False))
    assert cfg.replace(decode_gemv=True) == EngineConfig(weight_format="w12n")
    with pytest.raises(TypeError):
        EngineConfig().replace(verify_pdl=True)


def test_unread_rejected_and_unmeasured_fields_are_gone():
    names = {f.name for f in dataclasses.fields(EngineConfig)} | {f.name for f in dataclasses.fields(Ablations)}
    assert not names & {"device", "dtype", "max_batch_size", "max_seq_len", "verify_pdl", "batched_prefill"}
    with pytest.raises(ValueError, match="unknown key 'batched_prefill'"):  # an old recipe that names it
        EngineConfig.from_dict({"batched_prefill": True})


def test_a_runner_takes_a_runtime_of_its_device():
    from specpilot.bench.shapes import hf_config, random_model
    from specpilot.runtime.runner import ModelRunner

    model = random_model(hf_config("tiny-dense", num_hidden_layers=1), device="cpu", dtype=torch.float32)
    assert ModelRunner(model).runtime == Runtime.build(EngineConfig(), "cpu")
    with pytest.raises(TypeError, match="takes a Runtime"):
        ModelRunner(model, EngineConfig())
    with pytest.raises(ValueError, match="built for cuda"):
        ModelRunner(model, Runtime.build(EngineConfig(), "cuda"))
