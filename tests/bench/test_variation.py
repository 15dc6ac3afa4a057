"""The acceptance variation model: its tables keep the profile's pooled per-depth acceptance, it is deterministic
under a seed, and the fit recovers the parameters that generated the traces."""

import math
import random

import pytest

from specpilot.bench.variation import (MOMENTS, VariationModel, _beta_cdf, fit, moment_errors, pooled_per_depth,
                                       simulate, simulate_arrays, state_tables, trace_stats)
from specpilot.bench.variation import _stats

GSM8K = (0.887074,) * 7
ZOO = (0.7744, 0.7309, 0.6179, 0.4877, 0.5589, 0.6971, 0.8768)  # zoo dense + dense-dflash, measured


@pytest.mark.parametrize("per_depth", [GSM8K, ZOO])
@pytest.mark.parametrize("model", [VariationModel(3.0, 1.0, 0.1, 3.0), VariationModel(0.6, 0.9, 0.3, 5.0)])
def test_a_run_keeps_the_profiles_pooled_per_depth_acceptance_and_tau(per_depth, model):
    """Requests of equal token budgets, long beside the switching, simulated: the run's pooled per-depth
    acceptance and its tau are the profile's, although requests differ (per-request tau spread) and steps are
    correlated within a request."""
    traces = simulate(model, per_depth, 7, 1000, 2047, random.Random(0))
    pooled = pooled_per_depth(traces, 7)
    # the tolerance is the sampling noise of 1,000 requests whose mixes differ (tau's spread / sqrt(1000) ~ 1%)
    assert pooled == pytest.approx(per_depth, abs=0.015)
    tau = 1 + sum(math.prod(per_depth[:d]) for d in range(1, 8))
    stats = trace_stats(traces, 7)
    assert stats["tau"] == pytest.approx(tau, rel=0.02)
    iid = trace_stats(simulate(None, per_depth, 7, 300, 2047, random.Random(0)), 7)
    assert stats["request_tau_std"] > 3 * iid["request_tau_std"]
    assert stats["lag1_within"] > 0.1 and abs(iid["lag1_within"]) < 0.03


def test_state_tables_straddle_the_profile_and_keep_their_contrast():
    easy, hard = state_tables(ZOO, 2.0, 1.0, 2.5)
    for e, h, q in zip(easy, hard, ZOO):
        assert h < q < e
        assert math.log(e / (1 - e)) - math.log(h / (1 - h)) == pytest.approx(2.5)
    for table in state_tables(ZOO, 2.0, 1.0, 0.0):
        assert table == pytest.approx(ZOO)
    assert state_tables((1.0, 0.0), 2.0, 1.0, 3.0) == ((1.0, 0.0), (1.0, 0.0))


def test_seeded_requests_repeat_exactly():
    model = VariationModel(2.0, 1.0, 0.2, 3.0)

    def path(seed):
        rng = random.Random(seed)
        state = model.request(GSM8K, rng)
        out = []
        for _ in range(200):
            out.append(state.per_depth())
            state.advance(rng)
        return state.mix, out

    assert path(5) == path(5)
    assert path(5) != path(6)
    assert simulate(model, GSM8K, 7, 20, 200, random.Random(1)) == simulate(model, GSM8K, 7, 20, 200, random.Random(1))


def test_a_request_switches_state_at_the_redraw_rate():
    """The state changes with probability redraw * 2 * mix * (1 - mix) per step, on average over mixes."""
    model = VariationModel(1.0, 1.0, 0.3, 2.0)
    rng, changes, expected, steps = random.Random(0), 0, 0.0, 0
    for _ in range(400):
        state = model.request(GSM8K, rng)
        for _ in range(100):
            before = state.easy
            state.advance(rng)
            changes += state.easy != before
            expected += 0.3 * 2 * state.mix * (1 - state.mix)
            steps += 1
    assert changes / steps == pytest.approx(expected / steps, rel=0.05)


def test_the_batch_simulation_matches_the_per_request_reference():
    """The fit's numpy simulation and the plain per-request one (RequestAcceptance, as the drafter draws) give
    the same statistics."""
    model = VariationModel(2.0, 1.0, 0.15, 3.0)
    plain = trace_stats(simulate(model, ZOO, 7, 3000, 255, random.Random(0)), 7)
    batch = _stats(*simulate_arrays(model, ZOO, 7, 3000, 255, 0), 7)
    for key in ("tau", "request_tau_std", "lag1_within", "lag4_within", "lag1_pooled", "zero_share", "full_share"):
        assert batch[key] == pytest.approx(plain[key], abs=0.03), key
    iid = _stats(*simulate_arrays(None, ZOO, 7, 3000, 255, 0), 7)
    assert pooled_per_depth([[1]], 7)[0] == 1.0 and iid["lag1_within"] == pytest.approx(-0.01, abs=0.02)


@pytest.mark.parametrize("true", [VariationModel(6.0, 4.0, 0.2, 2.5), VariationModel(30.0, 20.0, 0.08, 3.0)])
def test_the_fit_recovers_what_generated_the_traces(true):
    """Traces from a known model (the per-request reference): the fit finds its switching rate, and its moments
    are the traces' within their errors. (Contrast and mix mean trade against each other in these moments: the
    share of a step's variance that the state explains is what they fix.)"""
    traces = simulate(true, (0.75,) * 7, 7, 400, 255, random.Random(1))
    model, loss = fit([(traces, pooled_per_depth(traces, 7))], 255, requests=500)
    assert model.redraw == pytest.approx(true.redraw, rel=0.35)
    measured, error = trace_stats(traces, 7), moment_errors(traces, 7)
    fitted = _stats(*simulate_arrays(model, pooled_per_depth(traces, 7), 7, 500, 255, 0), 7)
    assert all(abs(fitted[m] - measured[m]) < 3 * error[m] for m in MOMENTS)
    assert loss < 4 * len(MOMENTS)


def test_beta_cdf_matches_closed_forms():
    for x in (1e-4, 0.1, 0.5, 0.9, 0.9999):
        assert _beta_cdf(x, 1, 1) == pytest.approx(x, abs=1e-12)
        assert _beta_cdf(x, 0.5, 1) == pytest.approx(math.sqrt(x), abs=1e-12)
        assert _beta_cdf(x, 1, 3) == pytest.approx(1 - (1 - x) ** 3, abs=1e-12)
        assert _beta_cdf(x, 0.3, 0.3) == pytest.approx(1 - _beta_cdf(1 - x, 0.3, 0.3), abs=1e-12)
        assert _beta_cdf(x, 2, 2) == pytest.approx(3 * x**2 - 2 * x**3, abs=1e-12)


def test_model_round_trips_and_rejects_bad_fields():
    model = VariationModel(2.0, 1.0, 0.15, 3.0)
    assert VariationModel.from_dict(model.to_dict()) == model
    with pytest.raises(ValueError, match="needs exactly the keys mix_a, mix_b, redraw, contrast"):
        VariationModel.from_dict({"mix_a": 1.0})
    with pytest.raises(ValueError, match="0 <= redraw <= 1"):
        VariationModel(1.0, 1.0, 1.5, 2.0)
