"""runtime/sampling.py: the filtered distribution on any leading shape, the race, and a request's noise stream
(rows by output position, the draws plain sampling of a lone request makes)."""

import pytest
import torch

from specpilot.runtime.sampling import (NoiseStream, SamplingParams, filtered_probs, make_generator, race,
                                        race_scores, sample)

PARAMS = SamplingParams(temperature=0.8, top_k=6, top_p=0.9, seed=4)


def test_filtered_probs_on_a_tree_of_rows_equals_each_row():
    logits = torch.randn(3, 5, 17, generator=torch.Generator().manual_seed(0))
    whole = filtered_probs(logits, PARAMS)
    rows = torch.stack([filtered_probs(logits[i], PARAMS) for i in range(3)])
    assert torch.equal(whole, rows)
    assert torch.allclose(whole.sum(-1), torch.ones(3, 5)) and ((whole > 0).sum(-1) <= 6).all()


def test_noise_rows_are_plain_samplings_draws_by_position():
    logits = torch.randn(4, 17, generator=torch.Generator().manual_seed(1))
    gen = make_generator(PARAMS, torch.device("cpu"))
    # a lone request, step by step: one Exp(1) row per output position from the generator its seed makes
    plain = [int(race(filtered_probs(logits[i], PARAMS), gen)) for i in range(4)]
    assert [int(sample(logits[i:i + 1], PARAMS, [lone], i)) for lone in [NoiseStream(PARAMS, 17, "cpu")]
            for i in range(4)] == plain
    stream = NoiseStream(PARAMS, 17, "cpu")
    first = stream.take(0, 3)  # a step that looks 3 positions ahead, then emits 1
    later = stream.take(1, 3)  # the next step starts at position 1: rows 1 and 2 again, then row 3
    assert torch.equal(first[1:], later[:2])
    raced = [int(race(filtered_probs(logits[0], PARAMS), None, first[0]))]
    raced += [int(race(filtered_probs(logits[i], PARAMS), None, later[i - 1])) for i in (1, 2, 3)]
    assert raced == plain
    assert int(race_scores(logits[1], PARAMS, later[0]).argmax()) == plain[1]


def test_noise_rows_only_move_forward_and_keep_their_vocabulary():
    stream = NoiseStream(PARAMS, 17, "cpu")
    stream.take(2, 2)  # positions 0 and 1 drawn and dropped on the way
    assert torch.equal(stream.take(3, 1), NoiseStream(PARAMS, 17, "cpu").take(0, 4)[3:])
    with pytest.raises(ValueError, match="already used"):
        stream.take(1, 1)
    with pytest.raises(ValueError, match="of 16 tokens asked from a stream of 17"):
        stream.take(3, 1, vocab=16)
