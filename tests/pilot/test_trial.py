"""A trial at temperature > 0 (pilot/trial.py): its outputs equal plain sampling with each prompt's seed, so its
exactness check passes on the engine as it is and fails when the engine's acceptance is biased (a rule that takes the
drafter's first token whatever the target's race drew)."""

from __future__ import annotations

import pytest

from specpilot.pilot.recipe import Choice
from specpilot.pilot.sampling import Sampling


@pytest.fixture(scope="module")
def dense(zoo):
    from specpilot.models.loader import load_model, load_tokenizer
    from specpilot.spec_decode.drafters.registry import build_drafter

    model, tok = load_model(str(zoo / "dense"), "cpu", "auto"), load_tokenizer(str(zoo / "dense"))
    make = lambda rt: build_drafter(str(zoo / "draft-lm"), model, tok, runtime=rt)  # noqa: E731 (coupled drafter)
    return model, make, [tok.encode("def add(a, b):\n"), tok.encode("class Stack:\n")]


def _lenient(real):
    """A biased acceptance: the target's draw at the root is replaced by the drafter's first token, so that token is
    always accepted (the output then follows the drafter where the race drew something else)."""
    def accept(trees, raced):
        raced = [list(r) for r in raced]
        for tree, r in zip(trees, raced):
            first = next((i for i, p in enumerate(tree.parents) if p == 0), None)
            if first is not None:
                r[0] = tree.tokens[first]
        return real(trees, raced)
    return accept


def test_a_sampled_trial_equals_plain_sampling_and_its_check_catches_a_biased_rule(dense, monkeypatch):
    from specpilot.engine import engine as engine_module
    from specpilot.pilot.trial import Trial

    model, make, prompts = dense
    sampling = Sampling(0.8, seed=3)
    trial = Trial(model, make, 2, 12, 8, ["chain:3"], sampling=sampling)
    run = trial.measure(Choice("chain:3"), prompts)
    assert [len(o) for o in run.outputs] == [12, 12] and run.extra["rows"] > 0
    verdict = trial.force(prompts, run.outputs)
    assert verdict["passed"] and verdict["check"] == "equal to AR sampling with the same seed"
    greedy = Trial(model, make, 2, 12, 8, ["chain:3"]).measure(Choice("chain:3"), prompts)
    assert run.outputs != greedy.outputs  # it sampled
    assert trial.plain(prompts[1:]) == [run.outputs[1]]  # each prompt's own seed: the same output alone as in a batch
    assert trial.measure(Choice("chain:3"), prompts[::-1]).outputs == run.outputs[::-1]  # runs repeat, in any order
    monkeypatch.setattr(engine_module, "accept_raced", _lenient(engine_module.accept_raced))
    biased = trial.measure(Choice("chain:3"), prompts)
    verdict = trial.force(prompts, biased.outputs)
    assert not verdict["passed"] and verdict["failure"].endswith("differ from plain sampling with the same seed")
    trial.close()


def test_a_sampled_synthetic_trial_on_a_random_target_is_exact():
    import torch

    from specpilot.bench.shapes import RANDOM_DRAFTERS, RandomTarget
    from specpilot.bench.synthetic import AcceptanceProfile
    from specpilot.pilot.trial import Trial

    target = RandomTarget.parse("random:tiny-dense", "margin")
    model = target.build("cpu", torch.float32)
    make = lambda rt: RANDOM_DRAFTERS["random-dflash"](model, target.shape, rt)  # noqa: E731
    trial = Trial(model, make, 2, 10, 6, ["chain:3"], profile=AcceptanceProfile.load("dflash2-gsm8k"),
                  sampling=Sampling(0.7, top_k=20, seed=1))
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
    run = trial.measure(Choice("chain:3"), prompts)
    assert [len(o) for o in run.outputs] == [10, 10] and sum(run.extra["accepted"]) > 0
    assert trial.force(prompts, run.outputs)["passed"]
    trial.close()
