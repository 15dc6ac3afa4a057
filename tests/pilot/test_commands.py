"""`--recipe` on `specpilot generate` (pilot/commands.py: apply_recipe, check_recipe_models): the recipe's batch-1
entry replaces --tree and --weight-format and reaches the engine; a recipe of another target or drafter, a missing
file and --drafter none are one-line errors with status 2."""

from __future__ import annotations

import json

import pytest

from specpilot.cli import main
from specpilot.pilot.recipe import Choice, Fingerprint, Recipe, target_fingerprint, versions


@pytest.fixture(scope="module")
def dense_fp(zoo):
    from specpilot.models.loader import load_model

    return target_fingerprint(load_model(str(zoo / "dense"), "cpu", "auto"), str(zoo / "dense"))


def _write(tmp_path, target: Fingerprint, drafter: Fingerprint, choice: Choice) -> str:
    path = tmp_path / "recipe.json"
    Recipe(target, drafter, "cpu", versions(), {1: choice, 8: Choice("chain:7")}).save(path)
    return str(path)


@pytest.fixture(scope="module")
def ngram(zoo) -> Fingerprint:
    from specpilot.models.loader import load_model, load_tokenizer
    from specpilot.pilot.recipe import drafter_fingerprint
    from specpilot.spec_decode.drafters.registry import build_drafter

    model = load_model(str(zoo / "dense"), "cpu", "auto")
    return drafter_fingerprint(build_drafter("ngram", model, load_tokenizer(str(zoo / "dense"))), "ngram")


def _generate(zoo, recipe: str, drafter: str = "ngram") -> list[str]:
    return ["generate", "--target", str(zoo / "dense"), "--prompt", "def add(a, b):\n", "--drafter", drafter,
            "--max-new-tokens", "6", "--device", "cpu", "--json", "--recipe", recipe]


def test_generate_runs_the_recipes_configuration(zoo, dense_fp, ngram, tmp_path, capsys, monkeypatch):
    from specpilot import cli

    seen = []
    real = cli.spec_engine
    monkeypatch.setattr(cli, "spec_engine", lambda *a, **k: seen.append(a[3]) or real(*a, **k))
    path = _write(tmp_path, dense_fp, ngram, Choice("static:2,1", adaptive=False))
    assert main(_generate(zoo, path) + ["--tree", "chain:9"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["stats"]["tree"] == "static:2,1"  # the recipe's, not --tree's
    assert "the batch-1 entry, static:2,1" in out.err
    assert seen and seen[0].adaptive is False and seen[0].max_num_seqs == 1


def test_a_recipe_tuned_at_another_temperature_runs_with_a_warning(zoo, dense_fp, ngram, tmp_path, capsys):
    from specpilot.pilot.sampling import Sampling

    path = tmp_path / "recipe.json"
    Recipe(dense_fp, ngram, "cpu", versions(), {1: Choice("chain:3")}, sampling=Sampling(0.7, seed=1)).save(path)
    assert main(_generate(zoo, str(path))) == 0  # greedy here
    err = capsys.readouterr().err.strip().splitlines()
    assert "(tuned at temperature 0.7)" in err[0]
    assert err[1] == (f"warning: --recipe {path} was tuned at temperature 0.7; this run decodes at temperature 0 "
                      f"(greedy): the output stays exact, but the configuration was chosen for the other setting "
                      f"(specpilot tune --temperature 0 tunes one for this)")
    assert main(_generate(zoo, str(path)) + ["--temperature", "0.7", "--seed", "4"]) == 0
    assert "warning" not in capsys.readouterr().err  # the same distribution: no warning


def test_bench_warns_of_the_temperatures_a_recipe_was_not_tuned_at(tmp_path, capsys):
    from argparse import Namespace

    from specpilot.pilot.commands import _with_recipe
    from specpilot.pilot.sampling import Sampling

    path = tmp_path / "recipe.json"
    fp = Fingerprint("t", "c", "w")
    Recipe(fp, fp, "cpu", versions(), {1: Choice("chain:3")}, sampling=Sampling(0.7, top_k=40)).save(path)
    args = Namespace(recipe=str(path), batch_sizes=[1], configs=[], temperature=[0.0, 0.7, 1.0], top_k=40, top_p=1.0,
                     target="t", drafter="d")
    assert _with_recipe(args).configs == ["recipe-b1=tree:chain:3;weight_format:bf16;adaptive:false;batches:1"]
    warning = capsys.readouterr().err.strip().splitlines()[-1]
    assert warning.startswith(f"warning: --recipe {path} was tuned at temperature 0.7, top-k 40; this run decodes at "
                              f"temperature 0 (greedy); temperature 1, top-k 40: the output stays exact")


@pytest.mark.parametrize("case", ["target", "drafter"])
def test_a_recipe_of_another_model_is_refused(zoo, dense_fp, ngram, tmp_path, capsys, case):
    other = Fingerprint("zoo/hybrid", "0" * 16, "1" * 16)
    target, drafter = (other, ngram) if case == "target" else (dense_fp, other)
    assert main(_generate(zoo, _write(tmp_path, target, drafter, Choice("chain:3")))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("recipe ")  # the dim line naming the entry, then the error
    want = "error: recipe tuned on target zoo/hybrid" if case == "target" else "error: recipe tuned with drafter zoo/hy"
    assert err[1].startswith(want)


def test_bad_recipe_flags_fail_before_any_model_loads(zoo, tmp_path, capsys):
    missing = str(tmp_path / "nope.json")
    assert main(_generate(zoo, missing)) == 2
    assert capsys.readouterr().err.strip() == f"error: recipe {missing}: no such file"
    path = _write(tmp_path, Fingerprint("t", "c", "w"), Fingerprint("ngram", "d", "none"), Choice("chain:3"))
    assert main(_generate(zoo, path, drafter="none")) == 2
    assert capsys.readouterr().err.strip() == (f"error: --recipe {path}: tuned with the drafter ngram; pass --drafter "
                                               f"ngram")


def test_bench_runs_each_recipe_entry_at_its_batch_sizes(zoo, dense_fp, ngram, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\nclass Stack:\n")
    path = tmp_path / "recipe.json"
    Recipe(dense_fp, ngram, "cpu", versions(), {1: Choice("chain:3"), 2: Choice("static:2,1", adaptive=True)}).save(
        path)
    out = tmp_path / "b.json"
    argv = ["bench", "--target", str(zoo / "dense"), "--drafter", "ngram", "--workloads", str(prompts),
            "--batch-sizes", "1", "2", "--max-new-tokens", "6", "--device", "cpu", "--out", str(out), "--recipe",
            str(path)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["results"]
    got = {(r["batch"], r["config"]): r for r in rows}
    assert sorted(got) == [(1, "ar"), (1, "recipe-b1"), (1, "stock"), (2, "ar"), (2, "recipe-b2"), (2, "stock")]
    assert got[1, "recipe-b1"]["tree"] == "chain:3" and not got[1, "recipe-b1"]["adaptive"]
    assert got[2, "recipe-b2"]["tree"] == "static:2,1" and got[2, "recipe-b2"]["adaptive"]
    assert all(r["forcing"]["passed"] for r in rows if "forcing" in r)
    capsys.readouterr()
    other = tmp_path / "other.json"
    Recipe(Fingerprint("zoo/hybrid", "0" * 16, "1" * 16), ngram, "cpu", {}, {1: Choice("chain:3")}).save(other)
    out.unlink()
    assert main(argv[:-1] + [str(other)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: recipe tuned on target zoo/hybrid")
    assert not out.exists()


def test_serve_builds_the_recipes_entry_for_its_slots(zoo, dense_fp, ngram, tmp_path):
    import dataclasses

    from specpilot.cli import _parser, serve_app

    def app(recipe: Recipe):
        path = tmp_path / "recipe.json"
        recipe.save(path)
        args = _parser().parse_args(["serve", "--target", str(zoo / "dense"), "--drafter", "ngram", "--device", "cpu",
                                     "--max-num-seqs", "4", "--tree", "chain:9", "--recipe", str(path)])
        return serve_app(args)

    choices = {1: Choice("chain:3"), 4: Choice("static:2,1", adaptive=False)}
    engine = app(Recipe(dense_fp, ngram, "cpu", versions(), choices)).state.engine_loop.engine
    assert str(engine.tree) == "static:2,1" and engine.config.adaptive is False and engine.config.max_num_seqs == 4
    other = dataclasses.replace(dense_fp, weight_hash="0" * 16)
    with pytest.raises(ValueError, match="recipe tuned on target"):
        app(Recipe(other, ngram, "cpu", versions(), choices))
