"""Coupled scores with a drafter's logit error scale (spec_decode/coupling.py): the scale changes the scores a
dynamic tree keeps its nodes by, never the race's order, and the scores are the win chances of the target's race
when the target's logits are the draft's plus a Gumbel error of that scale."""

import pytest
import torch

from specpilot.runtime.sampling import SamplingParams, race_scores
from specpilot.spec_decode.coupling import coupled_row_scores, coupled_scores


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=4)])
def test_logit_error_scales_the_scores_not_the_order(params):
    gen = torch.Generator().manual_seed(3)
    logits, noise = 2 * torch.randn(6, 9, generator=gen), torch.empty(6, 9).exponential_(generator=gen)
    kept = noise.clone()
    race = race_scores(logits, params, noise)
    unit = coupled_row_scores(logits, params, noise)
    scaled = coupled_row_scores(logits, params, noise, logit_error=1.2)
    assert noise.equal(kept)  # the noise is the target's too: the scores read it, never write it
    assert unit.equal(torch.log_softmax(race, dim=-1))  # no scale given: the race's own
    assert torch.allclose(scaled, torch.log_softmax(race * params.temperature / 1.2, dim=-1))
    order = race.sort(dim=-1, descending=True).indices
    assert scaled.sort(dim=-1, descending=True).indices.equal(order)
    assert torch.allclose(scaled.exp().sum(-1), torch.ones(6)) and (scaled <= 0).all()
    assert torch.isinf(scaled).equal(torch.isinf(race))  # filtered tokens stay impossible
    both = coupled_scores(logits[None], [(params, noise)], logit_error=1.2)
    assert both[0].equal(scaled)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_scaled_scores_are_the_win_chances_under_that_logit_error(temperature):
    """Target logits = draft logits + e * Gumbel: the target's race with the same noise picks each token as often
    as exp(score) says, at any temperature (the unscaled scores assume an error of scale temperature instead)."""
    params, e = SamplingParams(temperature=temperature), 1.2
    logits = torch.tensor([2.0, 1.5, 0.0, -1.0, -3.0])
    noise = torch.tensor([2.0, 3.0, 0.05, 0.08, 5.0])
    scores = coupled_row_scores(logits, params, noise, logit_error=e)
    gen = torch.Generator().manual_seed(0)
    target = logits + e * -torch.empty(200_000, 5).exponential_(generator=gen).log()
    wins = torch.bincount(race_scores(target, params, noise.expand(200_000, 5)).argmax(-1), minlength=5)
    assert (wins.float() / 200_000 - scores.exp()).abs().max() < 0.005
    unit = coupled_row_scores(logits, params, noise)  # assumes an error of scale `temperature`: off here
    assert (wins.float() / 200_000 - unit.exp()).abs().max() > 0.05
