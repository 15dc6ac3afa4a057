"""VerifyCostCurve: interpolation and extrapolation of measured points, the roofline default, JSON round trip and
atomic save, the cache path and model fingerprint, and measure() through a real runner on the CPU."""

import dataclasses
import json
import os
import random

import numpy as np
import pytest
import torch

from specpilot.bench.shapes import hf_config, random_model
from specpilot.engine.cost_curve import DEVICE_ROOFS, VerifyCostCurve, cache_path, measure, model_fingerprint
from specpilot.runtime.runner import ModelRunner
from tests.runtimes import cpu_runtime


def _curve(dip: bool = False) -> VerifyCostCurve:
    """Batches 1 and 4; contexts 100 and 300; t = 1 + 0.1 * tokens (+ 0.5 at context 300, + 1 at batch 4)."""
    toks = ((1, 2, 4, 8), (4, 8, 16, 32))
    grid = []
    for b, ts in zip((1, 4), toks):
        rows = []
        for c in (100, 300):
            row = [1 + 0.1 * t + (0.5 if c == 300 else 0) + (1.0 if b == 4 else 0) for t in ts]
            if dip and b == 1:
                row[2] = row[1] - 0.05  # 4 tokens measured faster than 2
            rows.append(tuple(row))
        grid.append(tuple(rows))
    return VerifyCostCurve((1, 4), (100, 300), toks, tuple(grid))


def test_grid_points_and_piecewise_linear_tokens():
    c = _curve()
    assert c.seconds(2, 1, 100) == pytest.approx(1.2)
    assert c.seconds(3, 1, 100) == pytest.approx(1.3)  # halfway between 2 and 4 tokens
    assert c.seconds(6, 1, 100) == pytest.approx(1.6)


def test_past_the_grid_linear_below_it_flat():
    c = _curve()
    assert c.seconds(20, 1, 100) == pytest.approx(1 + 0.1 * 20)  # the last segment's slope
    assert c.seconds(0, 1, 100) == pytest.approx(c.seconds(1, 1, 100))
    assert c.seconds(2, 4, 100) == pytest.approx(c.seconds(4, 4, 100))


def test_a_faster_point_is_lifted_to_the_one_before():
    c = _curve(dip=True)
    assert c.seconds(4, 1, 100) == pytest.approx(c.seconds(2, 1, 100))
    ts = np.arange(1, 40)
    assert np.all(np.diff(c.seconds(ts, 1, 100)) >= 0)


def test_context_linear_extrapolated_above_flat_below():
    c = _curve()
    assert c.seconds(2, 1, 200) == pytest.approx(1.2 + 0.25)
    assert c.seconds(2, 1, 500) == pytest.approx(1.2 + 1.0)
    assert c.seconds(2, 1, 0) == pytest.approx(1.2)


def test_context_slope_never_negative():
    toks = ((1, 8),)
    c = VerifyCostCurve((1,), (100, 300), toks, (((2.0, 3.0), (1.5, 2.5)),))
    assert c.seconds(1, 1, 1000) == pytest.approx(2.0)


def test_batch_between_buckets_linear_outside_nearest():
    c = _curve()
    mid = c.seconds(8, 2, 100)  # a third of the way from batch 1 to batch 4
    assert mid == pytest.approx(2 / 3 * c.seconds(8, 1, 100) + 1 / 3 * c.seconds(8, 4, 100))
    assert c.seconds(64, 16, 100) == pytest.approx(c.seconds(64, 4, 100))


def test_array_tokens_match_scalar_calls():
    c = _curve()
    ts = np.arange(0, 50)
    for b, ctx in [(1, 100), (2, 250), (3, 400), (8, 50)]:
        got = c.seconds(ts, b, ctx)
        assert isinstance(got, np.ndarray)
        assert got == pytest.approx([c.seconds(int(t), b, ctx) for t in ts])
    assert isinstance(c.seconds(3, 1, 100), float)


@pytest.mark.parametrize("bad", [
    dict(batches=(4, 1)),
    dict(contexts=()),
    dict(tokens=((1, 2, 4, 8),)),
    dict(seconds_grid=(((1.0,) * 4,) * 2, ((1.0,) * 3,) * 2)),
    dict(seconds_grid=(((1.0, 2.0, 0.0, 3.0), (1.0,) * 4), ((1.0,) * 4,) * 2)),
    dict(seconds_grid=(((1.0, 2.0, float("nan"), 3.0), (1.0,) * 4), ((1.0,) * 4,) * 2)),
])
def test_malformed_grids_are_refused(bad):
    with pytest.raises(ValueError, match="VerifyCostCurve"):
        dataclasses.replace(_curve(), **bad)


def _roofline_ref(tokens, batch, ctx, weight=1e9, flops=2e9, kv=1e5, bw=1e12, peak=1e14, floor=1e-4, state=5e6):
    return floor + max((weight + batch * (ctx * kv + state)) / bw, tokens * flops / peak)


def test_roofline_is_the_analytic_time_on_its_grid():
    c = VerifyCostCurve.roofline(int(1e9), 2e9, 1e5, 1e12, 1e14, 1e-4, state_bytes_per_request=5e6)
    assert c.source == "roofline"
    rng = random.Random(0)
    for _ in range(300):
        b = rng.choice(c.batches)
        ctx = rng.choice(c.contexts)
        t = rng.randrange(b, 64 * b + 1)
        assert c.seconds(t, b, ctx) == pytest.approx(_roofline_ref(t, b, ctx), rel=2e-3)
    # bandwidth-bound at one token, compute-bound at many
    assert c.seconds(1, 1, 0) == pytest.approx(1e-4 + (1e9 + 5e6) / 1e12)
    assert c.seconds(4096, 64, 0) == pytest.approx(1e-4 + 4096 * 2e9 / 1e14)


def _tiny(shape="tiny-dense"):
    return random_model(hf_config(shape, num_hidden_layers=2), device="cpu", dtype=torch.float32, seed=1)


def test_from_model_reads_the_model():
    model = _tiny()
    weights = model.weight_bytes_per_token()
    params = sum(p.numel() for p in model.parameters())
    emb = model.model.embed_tokens.weight
    params -= emb.numel() - emb.shape[1]  # untied: one row of the table is read
    cpu, roof = VerifyCostCurve.from_model(model, "cpu"), DEVICE_ROOFS["cpu"]
    for t in (1, 8, 64):  # memory and compute times added
        assert cpu.seconds(t, 1, 0) == pytest.approx(roof.floor_s + weights / roof.bandwidth
                                                     + t * 2 * params / roof.peak_flops)
    cfg = model.config
    kv = 2 * cfg.num_attention_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    assert cpu.seconds(1, 1, 4096) - cpu.seconds(1, 1, 0) == pytest.approx(4096 * kv / roof.bandwidth)
    gpu, h200 = VerifyCostCurve.from_model(model, "cuda", overlap=True), DEVICE_ROOFS["cuda"]
    assert h200.bandwidth == 4.8e12 and h200.peak_flops == 7e14
    assert gpu.seconds(1, 1, 0) == pytest.approx(h200.floor_s + weights / h200.bandwidth)
    assert gpu.seconds(64 * 256, 256, 0) == pytest.approx(h200.floor_s + 64 * 256 * 2 * params / h200.peak_flops)


def test_from_model_counts_the_recurrent_state_of_a_hybrid():
    model = _tiny("tiny-hybrid")
    roof = DEVICE_ROOFS["cpu"]
    assert VerifyCostCurve.from_model(model, "cpu").seconds(1, 1, 0) > (
        roof.floor_s + model.weight_bytes_per_token() / roof.bandwidth)


def test_dict_round_trip_and_save_load(tmp_path):
    c = _curve()
    assert VerifyCostCurve.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    path = tmp_path / "sub" / "curve.json"
    c.save(path)
    assert VerifyCostCurve.load(path) == c
    c.save(path, gpu="NVIDIA H200", commit="abc")  # a document: the record beside the curve
    doc = json.loads(path.read_text())
    assert doc["gpu"] == "NVIDIA H200" and "curve" in doc
    assert VerifyCostCurve.load(path) == c
    assert sorted(os.listdir(path.parent)) == ["curve.json"]


def test_a_failed_save_keeps_the_old_file_and_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "curve.json"
    _curve().save(path)
    before = path.read_text()

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        dataclasses.replace(_curve(), source="roofline").save(path)
    assert path.read_text() == before
    assert os.listdir(tmp_path) == ["curve.json"]


def test_load_names_the_file_and_what_is_wrong(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON"):
        VerifyCostCurve.load(bad)
    bad.write_text(json.dumps({"batches": [1], "contexts": [0], "tokens": [[1]]}))
    with pytest.raises(ValueError, match=r"bad\.json: .*needs the field 'seconds'"):
        VerifyCostCurve.load(bad)
    bad.write_text(json.dumps({"batches": [1], "contexts": [0], "tokens": [[1]], "seconds": [[[-1.0]]]}))
    with pytest.raises(ValueError, match=r"bad\.json: .*positive"):
        VerifyCostCurve.load(bad)
    with pytest.raises(FileNotFoundError):
        VerifyCostCurve.load(tmp_path / "missing.json")


def test_cache_path_and_fingerprint(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path))
    cfg = _tiny().config
    fp = model_fingerprint(cfg)
    assert len(fp) == 12 and int(fp, 16) >= 0
    assert fp == model_fingerprint(dataclasses.replace(cfg, eos_token_ids=(7,), architecture="other"))
    assert fp != model_fingerprint(cfg, weight_format="w12n")
    assert fp != model_fingerprint(cfg, dtype="float32")
    assert fp != model_fingerprint(dataclasses.replace(cfg, hidden_size=cfg.hidden_size * 2))
    assert cache_path("NVIDIA H200", fp) == tmp_path / "cost_curves" / f"nvidia-h200-{fp}.json"
    monkeypatch.delenv("SPECPILOT_CACHE")
    assert str(cache_path("cpu", fp)).endswith(os.path.join(".cache", "specpilot", "cost_curves", f"cpu-{fp}.json"))


def test_measure_times_chain_verifies_through_the_runner():
    runner = ModelRunner(_tiny(), cpu_runtime())
    seen = []
    verify = runner.verify

    def spy(meta, layers=()):
        seen.append((tuple(meta.input_ids.shape), int(meta.prefix_len[0])))
        return verify(meta, layers)

    runner.verify = spy
    c = measure(runner, batches=[2, 1], tokens_grid=[3], contexts=[32, 8], reps=1, rounds=1)
    assert c.batches == (1, 2) and c.contexts == (8, 32)
    assert c.tokens == ((3,), (6,))
    assert all(s > 0 for rows in c.seconds_grid for r in rows for s in r)
    assert {shape for shape, _ in seen} == {(1, 3), (2, 3)} and {ctx for _, ctx in seen} == {8, 32}
    assert runner.cache.num_slots >= 2 and runner.cache.max_seq_len >= 32 + 3 + 1


def test_measure_verifies_a_hybrid_targets_chains():
    runner = ModelRunner(_tiny("tiny-hybrid"), cpu_runtime())
    c = measure(runner, batches=[2], tokens_grid=[3], contexts=[8], reps=1, rounds=1)
    assert c.tokens == ((6,),) and c.seconds_grid[0][0][0] > 0


def test_the_shipped_curve_is_the_benchmark_shapes_and_the_cpu_takes_the_roofline():
    """The package ships the H200 curve of the random:Qwen3.5-27B benchmark shape under the name the engine looks
    up (its GPU and model fingerprint); off a GPU the engine's curve is the model's roofline."""
    from specpilot.config import ModelConfig
    from specpilot.engine.cost_curve import BUNDLED, curve_for

    cfg = ModelConfig.from_dict(hf_config("Qwen3.5-27B").to_dict())
    name = cache_path("NVIDIA H200", model_fingerprint(cfg, "bf16", "bfloat16")).name
    shipped = VerifyCostCurve.load(BUNDLED / name)
    assert shipped.source == "measured" and 0.01 < shipped.seconds(64, 8, 2048) < 0.03
    assert curve_for(_tiny(), "bf16").source == "roofline"
