"""Calibration: measured once per GPU and fingerprint, cached atomically, read back equal, measured again when the
fingerprint (target shape, weight format, dtype, drafter) or the file's format differs; the CPU ceilings."""

from __future__ import annotations

import json

import pytest
import torch

from specpilot.bench.shapes import RANDOM_DRAFTERS, hf_config, random_model
from specpilot.pilot import calibration
from specpilot.pilot.calibration import Calibration, CalibrationPlan
from specpilot.pilot.ceilings import Ceilings, measure
from specpilot.runtime.runner import ModelRunner

PLAN = CalibrationPlan(batches=(1,), curve_tokens=(1, 8), contexts=(8,), prompt=8, warmup=0, steps=2, reps=1)


@pytest.fixture(scope="module")
def pair():
    model = random_model(hf_config("tiny-dense"), "cpu", torch.float32)
    runner = ModelRunner(model)
    return runner, RANDOM_DRAFTERS["random-dflash"](model, "tiny-dense", runner.runtime)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path))
    return tmp_path


def test_cpu_ceilings_are_measured_and_positive():
    c = measure("cpu")
    assert all(v > 0 for v in c.to_dict().values())
    assert Ceilings.from_dict(c.to_dict()) == c
    assert c.roofline(c.bandwidth, 0) == pytest.approx(1.0) and c.roofline(0, c.peak_flops) == pytest.approx(1.0)


def test_calibration_round_trips_and_is_cached(pair, cache, monkeypatch):
    runner, drafter = pair
    calls = []
    real = calibration.calibrate
    monkeypatch.setattr(calibration, "calibrate", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = calibration.cached(runner, drafter, PLAN)
    assert len(calls) == 1
    files = list((cache / "pilot").glob("*.json"))
    assert [f.name for f in files] == [f"cpu-{first.fingerprint}.json"]
    assert not list((cache / "pilot").glob("*.tmp"))  # the atomic write left nothing behind
    again = calibration.cached(runner, drafter, PLAN)
    assert len(calls) == 1 and again == first  # read back, equal field by field (curve and points included)
    assert {p.step.batch for p in first.points} == {1}
    assert set(dict(first.points[0].seconds)) == {"draft", "verify", "accept", "commit", "other", "host_gap"}
    assert first.verify_curve.batches == (1,) and first.verify_curve.tokens == ((1, 8),)
    # a batch size the cache lacks is measured
    calibration.cached(runner, drafter, CalibrationPlan(**{**PLAN.__dict__, "batches": (2,)}))
    assert len(calls) == 2


def test_another_fingerprint_is_measured_again(pair, cache, monkeypatch):
    runner, drafter = pair
    calls = []
    real = calibration.calibrate
    monkeypatch.setattr(calibration, "calibrate", lambda *a, **k: calls.append(1) or real(*a, **k))
    a = calibration.cached(runner, drafter, PLAN)
    other = RANDOM_DRAFTERS["random-dflash2"](runner.model, "tiny-dense", runner.runtime)
    b = calibration.cached(runner, other, PLAN)
    assert len(calls) == 2 and a.fingerprint != b.fingerprint
    deeper = random_model(hf_config("tiny-dense", num_hidden_layers=3), "cpu", torch.float32)
    assert calibration.fingerprint(deeper, "bf16", "x") != calibration.fingerprint(runner.model, "bf16", "x")
    assert calibration.fingerprint(runner.model, "w12n", "x") != calibration.fingerprint(runner.model, "bf16", "x")


def test_a_stale_or_damaged_cache_file_is_measured_again(pair, cache, monkeypatch):
    runner, drafter = pair
    first = calibration.cached(runner, drafter, PLAN)
    path = calibration.cache_path(first.gpu, first.fingerprint)
    calls = []
    real = calibration.calibrate
    monkeypatch.setattr(calibration, "calibrate", lambda *a, **k: calls.append(1) or real(*a, **k))
    path.write_text("{ not json")
    calibration.cached(runner, drafter, PLAN)
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "fingerprint": "000000000000"}))  # a file under the wrong name
    calibration.cached(runner, drafter, PLAN)
    path.write_text(json.dumps({**raw, "version": 0}))
    with pytest.raises(ValueError, match="version"):
        Calibration.load(path)
    calibration.cached(runner, drafter, PLAN)
    assert len(calls) == 3


def test_plan_refuses_bad_counts():
    with pytest.raises(ValueError, match="batch 0"):
        CalibrationPlan(batches=(0,))
    with pytest.raises(ValueError, match="steps 0"):
        CalibrationPlan(steps=0)


def test_a_cache_that_cannot_be_written_keeps_the_measurement(pair, cache, monkeypatch):
    runner, drafter = pair

    def refuse(self, path):
        raise PermissionError(f"{path}: permission denied")

    monkeypatch.setattr(Calibration, "save", refuse)
    said = []
    cal = calibration.cached(runner, drafter, PLAN, log=said.append)
    assert cal.points and "not cached" in said[-1] and "permission denied" in said[-1]
