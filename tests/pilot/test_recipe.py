"""Recipes: round trip through the file, the entry a batch size takes, fingerprints that tell models apart, and
one-line errors for a missing file, bad JSON, another format version, a missing field or a bad value."""

from __future__ import annotations

import json

import pytest
import torch

from specpilot.bench.shapes import hf_config, random_model
from specpilot.pilot.recipe import Choice, Fingerprint, Recipe, target_fingerprint, versions, weight_hash


def _recipe() -> Recipe:
    verdict = {"batch": 1, "candidate": "chain:3", "kept": True, "reason": "faster on held-out prompts",
               "ratio": 1.3, "interval": [1.2, 1.4], "forcing": {"passed": True}}
    return Recipe(Fingerprint("zoo/dense", "c" * 16, "w" * 16), Fingerprint("ngram", "none", "none"), "cpu",
                  versions(), {1: Choice("chain:3"), 8: Choice("static:2,2,2", adaptive=True, engine={
                      "verify_graphs": False}, scheduler={"max_prefill_tokens": 256})},
                  {1: [verdict]}, [verdict, {**verdict, "candidate": "chain:5", "kept": False}], {"seed": 0})


def test_recipe_round_trips_through_its_file(tmp_path):
    r = _recipe()
    path = tmp_path / "sub" / "recipe.json"
    r.save(path)
    assert Recipe.load(path) == r
    assert [p.name for p in path.parent.iterdir()] == ["recipe.json"]  # no temp file left
    assert json.loads(path.read_text())["version"] == 1


def test_the_sampling_a_recipe_was_tuned_at_round_trips(tmp_path):
    from dataclasses import replace

    from specpilot.pilot.sampling import Sampling

    r = replace(_recipe(), sampling=Sampling(0.7, top_k=40, top_p=0.9, seed=3))
    path = tmp_path / "recipe.json"
    r.save(path)
    assert Recipe.load(path).sampling == Sampling(0.7, 40, 0.9, 3)
    raw = json.loads(path.read_text())
    assert raw["sampling"] == {"temperature": 0.7, "top_k": 40, "top_p": 0.9, "seed": 3}
    del raw["sampling"]  # a recipe written before sampling was recorded was tuned greedy
    path.write_text(json.dumps(raw))
    assert Recipe.load(path).sampling.greedy
    raw["sampling"] = {"temperature": -1}
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"^recipe .*: --temperature -1: must be a finite number >= 0"):
        Recipe.load(path)


def test_choice_for_takes_the_largest_tuned_batch_not_above():
    r = _recipe()
    assert r.choice_for(1) == (1, Choice("chain:3"))
    assert r.choice_for(4)[0] == 1 and r.choice_for(8)[0] == 8 and r.choice_for(64)[0] == 8
    assert r.choice_for(8)[1].scheduler_config(8).adaptive
    assert r.choice_for(8)[1].scheduler_config(8).max_prefill_tokens == 256
    assert not r.choice_for(8)[1].engine_config().verify_graphs
    assert Recipe(r.target, r.drafter, "cpu", {}, {8: Choice("chain:7")}).choice_for(1)[0] == 8


def test_fingerprints_tell_weights_and_configs_apart():
    a = random_model(hf_config("tiny-dense"), "cpu", torch.float32)
    fa = target_fingerprint(a, "a")
    assert target_fingerprint(a, "again").same_model(fa)
    with torch.no_grad():
        next(a.parameters()).view(-1)[0] += 1.0
    assert target_fingerprint(a, "a").weight_hash != fa.weight_hash
    b = random_model(hf_config("tiny-hybrid"), "cpu", torch.float32)
    assert target_fingerprint(b, "b").config_hash != fa.config_hash
    assert weight_hash(None) == "none"
    r = Recipe(fa, Fingerprint("ngram", "none", "none"), "cpu", {}, {1: Choice("chain:3")})
    with pytest.raises(ValueError, match=r"^recipe tuned on target a .*: tune this target"):
        r.check_target(target_fingerprint(b, "b"))


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ("[1]", "not a recipe"),
    ('{"version": 99}', "recipe format version 99, this specpilot reads version 1: tune again"),
    ('{"version": 1, "choices": {"1": {"tree": "chain:3"}}}', "the recipe lacks the field 'target'"),
    ('{"version": 1, "choices": {}}', "the recipe has no batch sizes"),
    ('{"version": 1, "choices": {"1": {"tree": "ring:3"}}}', "ring:3"),
])
def test_bad_recipe_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError) as e:
        Recipe.load(path)
    assert message in str(e.value) and str(e.value).startswith(f"recipe {path}: ") and "\n" not in str(e.value)
