"""The cost model's arithmetic against hand-computed cases on the tiny shapes."""

from __future__ import annotations

import math

import pytest
import torch

from specpilot.bench.shapes import hf_config, random_model
from specpilot.bench.variation import VariationModel
from specpilot.engine.cost_curve import VerifyCostCurve
from specpilot.pilot.ceilings import Ceilings
from specpilot.pilot.cost_model import (AcceptanceStats, Configuration, CostModel, DrafterShape, Measured, ModelShape,
                                        Step, verify_width)
from specpilot.spec_decode.tree import DraftTree

# round numbers: a byte or a FLOP costs 1 ns, a kernel 1 us
ROOF = Ceilings(bandwidth=1e9, peak_flops=1e9, kernel_s=1e-6, launch_s=2e-6, sync_s=5e-5)


@pytest.fixture(scope="module")
def dense():
    return ModelShape.from_model(random_model(hf_config("tiny-dense"), "cpu", torch.float32))


def test_tiny_dense_shape_by_hand(dense):
    # per layer: qkv 128x64, o 64x64, q/k norms 16 each, gate_up 256x64, down 64x128, two norms 64: 37,024; two
    # layers and the final norm (64): 74,112 parameters of 4 bytes; head 512 x 64;
    # K/V: 2 x 2 heads x 16 x 4 B x 2 layers
    assert dense.layer_params == 74112 and dense.layer_bytes == 74112 * 4
    assert dense.head_params == 512 * 64 and dense.head_bytes == 512 * 64 * 4
    assert dense.embed_row_bytes == 64 * 4 and dense.kv_bytes_per_token == 512
    assert dense.state_bytes == 0 and not dense.hybrid
    assert dense.w12n_layer_bytes == dense.layer_bytes  # fp32 weights: nothing W12N would encode


def test_verify_parts_by_hand(dense):
    """Batch 2 (bucket 2) x width 4 = 8 tokens after 10 committed tokens each."""
    parts = CostModel(dense, ROOF).verify_parts(Step(batch=2, width=4, context=10))
    # weights: 296,448 B + 8 embedding rows of 256 B, 2 x 74,112 x 8 FLOPs: compute-bound at 1 ns each
    assert parts["weights"].bytes == 296448 + 8 * 256 and parts["weights"].flops == 2 * 74112 * 8
    assert parts["weights"].seconds == pytest.approx(1185792e-9)
    assert parts["lm_head"].seconds == pytest.approx(max(131072, 2 * 32768 * 8) * 1e-9)
    # attention: 2 requests x 10 committed tokens read + 8 written, 512 B each; 4 x 2 layers x 4 heads x 16 x 8 x 14
    assert parts["attention"].bytes == 512 * 28 and parts["attention"].flops == 4 * 2 * 4 * 16 * 8 * 14
    assert parts["attention"].seconds == pytest.approx(57344e-9)
    assert parts["recurrent"].seconds == 0.0
    assert parts["launch"].seconds == pytest.approx((10 * 2 + 4) * 1e-6)
    total = CostModel(dense, ROOF).parts(Step(2, 4, 10))["verify"].seconds
    assert total == pytest.approx(sum(p.seconds for p in parts.values()))


def test_the_batch_is_padded_to_its_verify_bucket(dense):
    model = CostModel(dense, ROOF)
    assert Step(3, 4, 0).bucket == 4 and Step(3, 4, 0).tokens == 16
    assert model.verify_parts(Step(3, 4, 0))["weights"].flops == model.verify_parts(Step(4, 4, 0))["weights"].flops


def test_w12n_bytes_only_where_the_w12n_gemv_runs():
    model = random_model(hf_config("tiny-dense"), "cpu", torch.bfloat16)
    shape = ModelShape.from_model(model)
    linears = 2 * (128 * 64 + 64 * 64 + 256 * 64 + 64 * 128)  # the layers' bf16 Linear weights, no bias
    assert shape.w12n_layer_bytes == pytest.approx(shape.layer_bytes - linears * (16 - 12.05) / 8)
    assert shape.w12n_head_bytes == pytest.approx(shape.head_bytes - 512 * 64 * (16 - 12.05) / 8)
    cost = CostModel(shape, ROOF)
    small = cost.verify_parts(Step(1, 16, 0, weight_format="w12n"))  # 16 rows: W12N planes
    large = cost.verify_parts(Step(2, 16, 0, weight_format="w12n"))  # 32 rows: bf16
    assert small["weights"].bytes == shape.w12n_layer_bytes + 16 * shape.embed_row_bytes
    assert large["weights"].bytes == shape.layer_bytes + 32 * shape.embed_row_bytes
    only = cost.verify_parts(Step(2, 16, 0, weight_format="w12n_only"))
    assert only["lm_head"].bytes == shape.w12n_head_bytes


def test_hybrid_state_and_commit_fold_by_hand():
    shape = ModelShape.from_model(random_model(hf_config("tiny-hybrid"), "cpu", torch.float32))
    # two linear-attention layers: state 4 heads x 16 x 16 fp32 = 4,096 B; conv window (2 x 2 x 16 + 4 x 16) x 3 x 4 B
    assert shape.linear_layers == 2 and shape.state_bytes == 2 * (4096 + 128 * 3 * 4)
    parts = CostModel(shape, ROOF).parts(Step(batch=3, width=8, context=5, accepted=2.0))
    kv = shape.kv_bytes_per_token
    assert parts["commit"].bytes == 2 * 3 * shape.state_bytes + 2 * 3 * 2.0 * kv
    assert parts["commit"].seconds == pytest.approx(parts["commit"].bytes * 1e-9 + 3e-6)
    flat = CostModel(shape, ROOF).parts(Step(3, 8, 5, 2.0, tree_commit=False))
    assert flat["commit"].bytes == 2 * 3 * 2.0 * kv


def test_chain_tokens_per_step_by_hand():
    acc = AcceptanceStats((0.5, 0.5, 0.5))
    mean, std = acc.tokens_per_step(DraftTree.chain([0] * 4))
    # P(depth >= d) = 0.5, 0.25, 0.125; E[L^2] = 1 + 3 x 0.5 + 5 x 0.25 + 7 x 0.125
    assert mean == pytest.approx(1.875)
    assert std == pytest.approx(math.sqrt(4.625 - 1.875 ** 2))


def test_tree_siblings_decay_by_hand():
    tree = DraftTree((0, 1, 2), (-1, 0, 0))  # a root with two children
    mean, _ = AcceptanceStats((0.5,), sibling_decay=0.5).tokens_per_step(tree)
    assert mean == pytest.approx(1 + 0.5 + (1 - 0.5) * 0.25)


def test_variation_keeps_a_chains_pooled_tokens_and_changes_a_trees():
    """The two-state tables hold the pooled per-depth acceptance, so a chain's expected tokens stay the i.i.d. ones;
    a tree's do not (its gain is not linear in p)."""
    p = (0.8,) * 4
    var = VariationModel(20.0, 30.0, 0.05, 4.0)
    chain = DraftTree.chain([0] * 5)
    assert AcceptanceStats(p, variation=var).tokens_per_step(chain)[0] == pytest.approx(
        AcceptanceStats(p).tokens_per_step(chain)[0], rel=1e-6)
    tree = Configuration(1, "static:2,2", 0, AcceptanceStats(p)).tree()
    assert AcceptanceStats(p, variation=var).tokens_per_step(tree)[0] != pytest.approx(
        AcceptanceStats(p).tokens_per_step(tree)[0], rel=1e-4)
    assert AcceptanceStats(p, variation=var).tokens_per_step(chain)[1] > AcceptanceStats(p).tokens_per_step(chain)[1]


def test_acceptance_from_counts():
    chain = AcceptanceStats.from_counts([10, 10, 10], [8, 4, 2], rows=10)
    assert chain.per_depth == pytest.approx((0.8, 0.5, 0.5))
    # two children per parent at depth 1 (20 drafted over 10 rows), one of them accepted in 7 rows:
    # 1 - (1 - p)(1 - p / 2) = 0.7
    tree = AcceptanceStats.from_counts([20], [7], rows=10, sibling_decay=0.5, children=(2,))
    p = tree.per_depth[0]
    assert 1 - (1 - p) * (1 - p / 2) == pytest.approx(0.7)
    assert AcceptanceStats.from_counts([5, 0], [0, 0], rows=5).per_depth == (0.0,)


def test_prediction_without_calibration_is_the_ceilings(dense):
    cost = CostModel(dense, ROOF, DrafterShape(1000.0, 100.0, 4, 1))
    config = Configuration(2, "chain:3", 10, AcceptanceStats((0.5,)))
    pred = cost.predict(config)
    step = Step(2, 4, 10, 0.875)
    parts = cost.parts(step)
    assert pred.step == step
    assert pred.components["verify"] == pytest.approx(parts["verify"].seconds)
    assert pred.components["draft"] == pytest.approx(max(1000, 2 * 100 * 2 * 4) * 1e-9 + 10e-6)
    assert pred.components["accept"] == pytest.approx(5e-5)
    assert pred.components["other"] == 0.0 and pred.components["host_gap"] == 0.0
    assert pred.tau == pytest.approx(1.875)
    assert pred.tok_s == pytest.approx(2 * 1.875 / sum(pred.components.values()))


def test_calibration_points_scale_the_ceilings_and_interpolate_in_batch(dense):
    base = CostModel(dense, ROOF, DrafterShape(1000.0, 100.0, 4, 1))
    a, b = Step(1, 4, 10), Step(4, 4, 10)
    # draft measured at 2x its ceiling at batch 1 and 4x at batch 4; host gap 1 ms and 3 ms
    pts = (Measured(a, (("draft", 2 * base.parts(a)["draft"].seconds), ("host_gap", 1e-3))),
           Measured(b, (("draft", 4 * base.parts(b)["draft"].seconds), ("host_gap", 3e-3))))
    cost = CostModel(dense, ROOF, base.drafter, pts)
    at = Step(2, 8, 10)
    got = cost.component_seconds(at)
    assert got["draft"] == pytest.approx(base.parts(at)["draft"].seconds * (2 + (4 - 2) / 3))
    assert got["host_gap"] == pytest.approx(1e-3 + 2e-3 / 3)
    assert cost.component_seconds(Step(64, 4, 10))["host_gap"] == pytest.approx(3e-3)  # flat past the last point
    assert got["commit"] == pytest.approx(base.parts(at)["commit"].seconds)  # no point measured it: its ceiling


def test_verify_from_the_curve_and_carried_to_w12n_by_the_ceilings():
    shape = ModelShape.from_model(random_model(hf_config("tiny-dense"), "cpu", torch.bfloat16))
    curve = VerifyCostCurve((1,), (0, 100), ((1, 8, 16),), (((1e-3, 2e-3, 3e-3), (1e-3, 2e-3, 3e-3)),))
    fast = Ceilings(bandwidth=1e9, peak_flops=1e15, kernel_s=1e-6, launch_s=2e-6, sync_s=5e-5)  # bandwidth-bound
    cost = CostModel(shape, fast, None, (), curve, "bf16")
    bf16, w12n = Step(1, 8, 50), Step(1, 8, 50, weight_format="w12n")
    assert cost.component_seconds(bf16)["verify"] == pytest.approx(2e-3)
    ratio = cost.parts(w12n)["verify"].seconds / cost.parts(bf16)["verify"].seconds
    assert ratio < 1
    assert cost.component_seconds(w12n)["verify"] == pytest.approx(2e-3 * ratio)


def test_verify_width_pads_to_a_power_of_two_within_the_full_tree():
    assert verify_width(5, 8) == 8 and verify_width(5, 6) == 6 and verify_width(5, 8, graphs=False) == 5
    assert verify_width(8, 8) == 8 and verify_width(1, 8) == 1


def test_bad_inputs():
    with pytest.raises(ValueError, match="batch"):
        Step(0, 4, 0)
    with pytest.raises(ValueError, match="batch 0"):
        Configuration(0, "chain:3", 0, AcceptanceStats((0.5,)))
    with pytest.raises(ValueError, match="per_depth"):
        AcceptanceStats((1.5,))
    with pytest.raises(ValueError, match="bandwidth"):
        Ceilings(0.0, 1.0, 1.0, 1.0, 1.0)


def test_the_engines_verify_over_the_curve_at_the_points_scales_the_curve():
    shape = ModelShape.from_model(random_model(hf_config("tiny-dense"), "cpu", torch.float32))
    curve = VerifyCostCurve((1, 4), (0,), ((1, 8), (4, 32)), (((1e-3, 2e-3),), ((2e-3, 4e-3),)))
    pts = (Measured(Step(1, 8, 0), (("verify", 2.2e-3),)), Measured(Step(4, 8, 0), (("verify", 4.0e-3),)))
    cost = CostModel(shape, ROOF, None, pts, curve, "bf16")
    assert cost.component_seconds(Step(1, 8, 0))["verify"] == pytest.approx(2.2e-3)
    assert cost.component_seconds(Step(1, 1, 0))["verify"] == pytest.approx(1.1e-3)  # the same 1.1 at batch 1
    assert cost.component_seconds(Step(2, 8, 0))["verify"] == pytest.approx(
        float(curve.seconds(16, 2, 0)) * (1.1 + (1.0 - 1.1) / 3))


@pytest.mark.parametrize("fmt", ["w12n", "w12n_only"])
def test_w12n_bytes_from_the_attached_planes(fmt):
    """With planes attached (a runner of that format), the W12N bytes are the planes' own; w12n_only drops the bf16
    weights, whose bytes the shape still counts as the bf16 the planes stand for."""
    from specpilot.config import EngineConfig
    from specpilot.layers.linear import Linear
    from specpilot.runtime.settings import Runtime
    from specpilot.weights.w12n import bits_per_weight

    bf16 = ModelShape.from_model(random_model(hf_config("tiny-dense"), "cpu", torch.bfloat16))
    model = random_model(hf_config("tiny-dense"), "cpu", torch.bfloat16)
    from specpilot.runtime.runner import ModelRunner

    ModelRunner(model, Runtime.build(EngineConfig(weight_format=fmt), torch.device("cpu")))
    planes = [m.w12n for name, m in model.named_modules() if isinstance(m, Linear) and m.w12n is not None
              and name != "lm_head"]
    assert planes
    shape = ModelShape.from_model(model)
    assert shape.layer_bytes == bf16.layer_bytes and shape.layer_params == bf16.layer_params
    saved = sum(t.n * t.k * (16 - bits_per_weight(t)) / 8 for t in planes)
    assert shape.w12n_layer_bytes == pytest.approx(bf16.layer_bytes - saved)


def test_drafter_shape_of_a_dflash_drafter_by_hand(dense):
    """The random tiny DFlash: its own parameters, the target's LM head it drafts through, its block, and its K/V
    per context token (1 layer x 2 x KV heads x head dim x 4 B); the draft ceiling reads that K/V per request."""
    from specpilot.bench.shapes import RANDOM_DRAFTERS

    model = random_model(hf_config("tiny-dense"), "cpu", torch.float32)
    drafter = RANDOM_DRAFTERS["random-dflash"](model, "tiny-dense", None)
    own = list(drafter.model.parameters())
    d = DrafterShape.from_drafter(drafter, dense, 7)
    assert d.weight_bytes == sum(p.numel() * 4 for p in own) + dense.head_bytes
    assert d.params == sum(p.numel() for p in own) + dense.head_params
    cfg = drafter.model.config
    assert (d.tokens, d.layers) == (8, 1)
    assert d.kv_bytes_per_token == 2 * cfg.num_key_value_heads * cfg.head_dim * 4 * cfg.num_attention_layers
    cost = CostModel(dense, ROOF, d)
    near, far = cost.parts(Step(2, 8, 0))["draft"], cost.parts(Step(2, 8, 100))["draft"]
    assert far.bytes - near.bytes == 2 * 100 * d.kv_bytes_per_token
