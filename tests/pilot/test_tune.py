"""`specpilot tune`: the candidate space and its ranking, a batch size's search with stand-in measurements, a trial's
forcing on the zoo (a corrupted output fails it), a tiny tune on the zoo end to end, and its bad-input errors."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from specpilot.cli import main
from specpilot.pilot.controller import Controller, ControllerConfig, Run
from specpilot.pilot.recipe import Choice, Recipe, target_fingerprint
from specpilot.pilot.tune import TunePlan, rank, space, stock, tune_batch


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("def add(a, b):\nclass Stack:\nimport os\nfor i in range(10):\ndef main():\nwhile True:\n")
    return path


def test_space_cuts_trees_to_the_drafters_depth_and_leaves_stock_out():
    plan = TunePlan(trees=("chain:3", "chain:5", "chain:7", "static:2,2,2"))
    assert stock(None) == Choice("chain:7") and stock(4) == Choice("chain:4")
    full = space(plan, None)
    assert Choice("chain:7") not in full and Choice("chain:7", adaptive=True) in full and len(full) == 7
    cut = space(plan, 3)  # chain:5 and chain:7 become chain:3 (one candidate); chain:3 is stock's own tree now
    assert [c.label for c in cut] == ["chain:3 adaptive", "static:2,2,2", "static:2,2,2 adaptive"]
    assert all(not c.adaptive for c in space(TunePlan(adaptive=(False,)), None))


def test_the_space_at_temperature_above_0_holds_the_best_first_tree():
    from specpilot.pilot.sampling import Sampling
    from specpilot.pilot.tune import default_trees

    assert "dynamic:24,7,24" not in default_trees(Sampling())
    sampled = space(TunePlan(trees=default_trees(Sampling(0.7))), None)
    assert Choice("dynamic:24,7,24") in sampled and Choice("dynamic:24,7,24", adaptive=True) in sampled


@dataclass
class Predicts:
    """A stand-in cost model: tok/s per tree."""

    rates: dict

    def predict(self, config):
        return type("P", (), {"tok_s": self.rates[config.tree_spec]})()


def test_rank_orders_by_predicted_tok_s_over_stock():
    cands = [Choice("chain:3"), Choice("static:2,2,2"), Choice("chain:5", adaptive=True)]
    model = Predicts({"chain:7": 100.0, "chain:3": 90.0, "static:2,2,2": 150.0, "chain:5": 120.0})
    got = rank(model, cands, stock(None), 1, 64.0, acceptance=object())
    assert [(c.tree, round(p, 2)) for c, p in got] == [("static:2,2,2", 1.5), ("chain:5", 1.2), ("chain:3", 0.9)]
    assert rank(None, cands, stock(None), 1, 64.0, None) == [(c, None) for c in cands]


def test_tune_batch_measures_the_best_few_and_logs_the_rest():
    calls = []

    def measure(choice, prompts):
        calls.append(choice.tree)
        return Run(140.0 if choice.tree == "static:2,2,2" else 100.0, [list(p) for p in prompts])

    controller = Controller(measure, lambda p, o: {"passed": True}, ControllerConfig(repeats=2))
    model = Predicts({"chain:7": 100.0, "chain:3": 90.0, "static:2,2,2": 150.0, "chain:5": 120.0})
    cands = [Choice("chain:3"), Choice("static:2,2,2"), Choice("chain:5")]
    plan = TunePlan(measure=2, repeats=2)
    prompts = [[i, i + 1] for i in range(6)]
    r = tune_batch(controller, plan, 1, prompts, cands, stock(None), lambda run: (model, object(), 10.0))
    assert r.choice == Choice("static:2,2,2") and [v.kept for v in r.verdicts] == [True, False]
    assert [s["candidate"] for s in r.skipped] == ["chain:3"] and "ranked 3 of 3" in r.skipped[0]["reason"]
    assert len(r.log()) == 3 and len(r.evidence()) == 1 and "chain:3" not in calls  # never measured
    with pytest.raises(ValueError, match=r"--batch-sizes 4: only 3 tuning prompts \(of 6\); raise --limit"):
        tune_batch(controller, plan, 4, prompts, cands, stock(None), lambda run: (model, object(), 10.0))


def test_trial_forcing_passes_on_real_output_and_fails_on_a_corrupted_one(zoo):
    from specpilot.models.loader import load_model, load_tokenizer
    from specpilot.pilot.trial import Trial
    from specpilot.spec_decode.drafters.registry import build_drafter

    model, tok = load_model(str(zoo / "dense"), "cpu", "auto"), load_tokenizer(str(zoo / "dense"))
    prompts = [tok.encode("def add(a, b):\n"), tok.encode("class Stack:\n")]
    trial = Trial(model, lambda rt: build_drafter("ngram", model, tok, runtime=rt), 2, 12, 8, ["chain:3"])
    run = trial.measure(Choice("chain:3"), prompts)
    assert run.tok_s > 0 and [len(o) for o in run.outputs] == [12, 12] and run.extra["rows"] > 0
    assert trial.force(prompts, run.outputs)["passed"]
    broken = [list(o) for o in run.outputs]
    broken[1][5] = (broken[1][5] + 1) % model.config.vocab_size
    verdict = trial.force(prompts, broken)
    assert not verdict["passed"] and verdict["failures"] >= 1


def test_a_tiny_tune_on_the_zoo_runs_end_to_end(zoo, tmp_path, prompts, monkeypatch, capsys):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "r.json"
    argv = ["tune", "--target", str(zoo / "dense"), "--drafter", "ngram", "--workloads", str(prompts),
            "--batch-sizes", "1", "--max-new-tokens", "8", "--trees", "chain:3", "static:2,2,2", "--measure", "2",
            "--repeats", "2", "--rank", "ceilings", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    recipe = Recipe.load(out)
    assert set(recipe.choices) == {1} and recipe.settings["prompts"] == 6 and recipe.device == "cpu"
    assert len(recipe.candidates) == 4  # chain:3, static:2,2,2 and chain:7, each with and without the budget
    assert sum(1 for c in recipe.candidates if not c["reason"].startswith("not measured")) == 2
    assert all(c["predicted_vs_stock"] is not None for c in recipe.candidates)
    assert recipe.evidence[1] == [c for c in recipe.candidates if c["kept"]]
    from specpilot.models.loader import load_model

    assert recipe.target.same_model(target_fingerprint(load_model(str(zoo / "dense"), "cpu", "auto"), "x"))
    captured = capsys.readouterr()
    assert "every candidate, in the order judged" in captured.out and "wrote" in captured.err
    assert json.loads(out.read_text())["version"] == 1


@pytest.mark.parametrize("biased", [False, True])
def test_a_tiny_sampled_tune_on_the_zoo_checks_plain_sampling_and_records_its_temperature(zoo, tmp_path, prompts,
                                                                                           capsys, monkeypatch, biased):
    """The candidate is made to look 2x faster (its measured tok/s doubled) so that the held-out pairs and the
    exactness check always run; biased: the engine's acceptance takes the drafter's first token whatever the target's
    race drew, and the check rejects the candidate."""
    from specpilot.engine import engine as engine_module
    from specpilot.pilot.trial import Trial

    from tests.pilot.test_trial import _lenient

    real = Trial.measure

    def faster(self, choice, prompts):
        run = real(self, choice, prompts)
        return Run(run.tok_s * (2.0 if choice.tree == "chain:3" else 1.0), run.outputs, run.extra)

    monkeypatch.setattr(Trial, "measure", faster)
    if biased:
        monkeypatch.setattr(engine_module, "accept_raced", _lenient(engine_module.accept_raced))
    out = tmp_path / "r.json"
    argv = ["tune", "--target", str(zoo / "dense"), "--drafter", str(zoo / "draft-lm"), "--workloads", str(prompts),
            "--max-new-tokens", "8", "--temperature", "0.7", "--top-p", "0.9", "--seed", "2", "--trees", "chain:3",
            "--no-adaptive", "--measure", "1", "--repeats", "2", "--rank", "ceilings", "--device", "cpu",
            "--out", str(out)]
    assert main(argv) == 0
    recipe = Recipe.load(out)
    assert (recipe.sampling.temperature, recipe.sampling.top_p, recipe.sampling.seed) == (0.7, 0.9, 2)
    (verdict,) = recipe.candidates
    assert verdict["forcing"]["check"] == "equal to AR sampling with the same seed"
    if biased:
        assert not verdict["kept"] and not verdict["forcing"]["passed"]
        assert verdict["reason"].endswith("differ from plain sampling with the same seed on the held-out prompts")
        assert recipe.choices[1] == Choice("chain:7")
    else:
        assert verdict["forcing"]["passed"] and verdict["forcing"]["failures"] == 0
    assert "at temperature 0.7, top-p 0.9" in capsys.readouterr().err


def test_a_tiny_tune_of_a_random_target_under_synthetic_acceptance(tmp_path, prompts, capsys):
    out = tmp_path / "r.json"
    argv = ["tune", "--target", "random:tiny-dense", "--drafter", "random-dflash", "--workloads", str(prompts),
            "--max-new-tokens", "8", "--trees", "chain:3", "--no-adaptive", "--measure", "1", "--repeats", "2",
            "--rank", "ceilings", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    recipe = Recipe.load(out)
    assert recipe.settings["acceptance"] == "synthetic:dflash2-gsm8k" and recipe.settings["target_kind"] == "margin"
    (verdict,) = recipe.candidates
    assert verdict["candidate"] == "chain:3" and verdict["predicted_vs_stock"] is not None
    assert verdict["forcing"] is None or verdict["forcing"]["passed"]  # exact: the oracle only picks the drafts
    assert "SYNTHETIC acceptance" in capsys.readouterr().err


def test_a_synthetic_trial_follows_the_oracle_and_passes_forcing():
    import torch

    from specpilot.bench.shapes import RANDOM_DRAFTERS, RandomTarget
    from specpilot.bench.synthetic import AcceptanceProfile
    from specpilot.pilot.trial import Trial

    target = RandomTarget.parse("random:tiny-dense", "margin")
    model = target.build("cpu", torch.float32)
    make = lambda rt: RANDOM_DRAFTERS["random-dflash"](model, target.shape, rt)  # noqa: E731
    trial = Trial(model, make, 2, 10, 6, ["chain:3"], profile=AcceptanceProfile.load("dflash2-gsm8k"))
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
    run = trial.measure(Choice("chain:3"), prompts)
    assert [len(o) for o in run.outputs] == [10, 10] and sum(run.extra["accepted"]) > 0
    assert trial.force(prompts, run.outputs)["passed"]
    assert trial.clock.seconds > 0  # the oracle's time was taken out of the timing
    again = trial.measure(Choice("chain:3"), prompts)
    assert again.extra["accepted"] == run.extra["accepted"]  # group n draws seed n: runs see the same pattern
    trial.close()


def test_a_replay_judges_the_recipes_kept_changes_again_here(zoo, tmp_path, prompts, capsys):
    from specpilot.pilot.recipe import Fingerprint, versions

    kept = [{"config": Choice("chain:3").to_dict(), "kept": True}, {"config": Choice("static:2,2,2").to_dict(),
                                                                     "kept": True}]
    old = tmp_path / "old.json"
    Recipe(Fingerprint("elsewhere", "a" * 16, "b" * 16), Fingerprint("other", "c", "d"), "NVIDIA H200", versions(),
           {1: Choice("static:2,2,2")}, {1: kept}, kept).save(old)
    out = tmp_path / "new.json"
    argv = ["tune", "--target", str(zoo / "dense"), "--drafter", "ngram", "--workloads", str(prompts),
            "--max-new-tokens", "8", "--repeats", "2", "--device", "cpu", "--replay", str(old), "--out", str(out)]
    assert main(argv) == 0
    new = Recipe.load(out)
    assert set(new.choices) == {1}  # the replayed recipe's batch sizes
    assert [c["candidate"] for c in new.candidates] == ["chain:3", "static:2,2,2"]  # in the order kept, all measured
    assert new.choices[1] in (Choice("chain:7"), Choice("chain:3"), Choice("static:2,2,2"))
    assert new.settings["replay_of"]["target"]["name"] == "elsewhere" and new.target.name == str(zoo / "dense")
    assert "kept changes still win here" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--repeats", "1"], "error: --repeats 1: must be >= 2 (one pair gives no interval)"),
    (["--batch-sizes", "0"], "error: --batch-sizes 0: must be >= 1"),
    (["--held-out", "1.5"], "error: --held-out 1.5: the share of prompts held out, in (0, 1)"),
    (["--trees", "ring:3"], "ring:3"),
    (["--limit", "0"], "error: --limit 0: must be >= 1"),
    (["--drafter", "none"], "error: --drafter none: tune searches speculative configurations"),
    (["--target", "random:tiny-dense", "--acceptance", "real"], "acceptance on random weights means nothing"),
    (["--acceptance", "synthetic:nope"], "acceptance profile 'nope'"),
    (["--drafter", "random-dflash"], "error: --drafter random-dflash goes with a random:SHAPE target"),
    (["--weight-formats", "w12n"], "--weight-formats w12n needs --dtype bfloat16"),
    (["--out", "{tmp}"], "is a directory; give a file path in it"),
    (["--workloads", "{tmp}/missing.txt"], "no such prompt file"),
    (["--replay", "{tmp}/none.json"], "error: recipe {tmp}/none.json: no such file"),
    (["--temperature", "-0.5"], "error: --temperature -0.5: must be a finite number >= 0 (0: greedy)"),
    (["--temperature", "nan"], "error: --temperature nan: must be a finite number >= 0 (0: greedy)"),
    (["--temperature", "0.7", "--top-p", "0"], "error: --top-p 0: must be in (0, 1] (1: off)"),
    (["--temperature", "0.7", "--top-k", "-1"], "error: --top-k -1: must be an integer >= 0 (0: off)"),
    (["--top-k", "40"], "error: --top-k 40: filters sampling; it needs --temperature > 0 (0 is greedy)"),
])
def test_bad_input_is_one_line_and_status_2(zoo, tmp_path, prompts, capsys, args, message):
    base = {"--target": str(zoo / "dense"), "--drafter": "ngram", "--workloads": str(prompts),
            "--out": str(tmp_path / "r.json")}
    flags = dict(zip(args[::2], args[1::2]))
    argv = ["tune", "--device", "cpu"] + [x for k, v in {**base, **flags}.items() for x in (k, v)]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message.replace("{tmp}", str(tmp_path)) in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r.json").exists()
