"""The zoo_acceptance benchmark: per-depth counts add up over requests whose lists have different lengths, a
chain row becomes a synthetic profile of conditional acceptance, drafters trained elsewhere are measured into
`candidates` with their training report, --merge keeps the file's other rows, and an MTP directory is measured on
its own target only when that target is the zoo's."""

import json
import shutil

import pytest
import torch

import bench.zoo_acceptance as za


def test_a_drafter_equal_to_the_target_is_always_accepted(checkpoint_factory, tmp_path):
    path, _ = checkpoint_factory("qwen3")
    shutil.copytree(path, tmp_path / "t")
    shutil.copytree(path, tmp_path / "d")
    prompts = [[5, 9, 2], [7, 1, 3, 3, 8], [4] * 9]
    row = za.measure(tmp_path, "t", "d", "chain:3", prompts, new_tokens=13, batch=2, device="cpu")
    assert row["tokens"] == 39 and row["forcing"]["passed"]
    assert row["acceptance_per_depth"][:3] == [1.0, 1.0, 1.0]
    assert row["drafted_per_depth"][:3] == [row["steps"]] * 3


def test_every_chain_depth_counts_as_drafted_even_where_nothing_was_accepted(checkpoint_factory, tmp_path):
    target, _ = checkpoint_factory("qwen3")
    other, _ = checkpoint_factory("qwen3", num_hidden_layers=1)  # a different model: acceptance stops early
    shutil.copytree(target, tmp_path / "t")
    shutil.copytree(other, tmp_path / "d")
    row = za.measure(tmp_path, "t", "d", "chain:4", [[5, 9, 2], [7, 1, 3, 3, 8]], new_tokens=12, batch=2,
                     device="cpu")
    assert row["drafted_per_depth"][:4] == [row["steps"]] * 4
    assert row["tau"] == pytest.approx(row["tokens"] / row["steps"], abs=1e-4) and row["forcing"]["passed"]


def test_chain_profile_is_conditional_acceptance():
    row = {"target": "dense", "drafter": "dense-dflash", "tree": "chain:3", "prompts": 2, "tokens": 40, "tau": 2.0,
           "steps": 100, "drafted_per_depth": [100, 100, 100, 0], "accepted_per_depth": [50, 20, 0, 0]}
    prof = za.chain_profile(row)
    assert prof["name"] == "zoo-dense-dflash"
    assert prof["per_depth"] == pytest.approx([0.5, 0.4, 0.0])


def test_merge_replaces_the_same_triple_and_keeps_the_rest():
    doc = {"rows": [{"target": "t", "drafter": "a", "tree": "chain:7", "tau": 2.0},
                    {"target": "t", "drafter": "b", "tree": "chain:7", "tau": 3.0}]}
    za.merge_rows(doc, "rows", [{"target": "t", "drafter": "b", "tree": "chain:7", "tau": 3.5}])
    za.merge_rows(doc, "candidates", [{"target": "t", "drafter": "c", "tree": "chain:3", "tau": 1.5}])
    assert [(r["drafter"], r["tau"]) for r in doc["rows"]] == [("a", 2.0), ("b", 3.5)]
    assert doc["candidates"] == [{"target": "t", "drafter": "c", "tree": "chain:3", "tau": 1.5}]


def test_a_drafter_dir_is_merged_into_candidates_with_its_training(checkpoint_factory, tmp_path, capsys):
    path, _ = checkpoint_factory("qwen3")
    zoo = tmp_path / "zoo"
    shutil.copytree(path, zoo / "dense")
    (zoo / "zoo.json").write_text(json.dumps({"built_at_commit": "abc"}))
    shutil.copytree(path, tmp_path / "d")
    (tmp_path / "d" / "training.json").write_text(json.dumps({"kind": "x", "config": {"device": "cpu"}}))
    (tmp_path / "p.txt").write_text("def add(a, b):\n")
    out = tmp_path / "acc.json"
    old = {"command": "old", "rows": [{"target": "dense", "drafter": "z", "tree": "chain:3", "tau": 9.0}]}
    out.write_text(json.dumps(old))
    args = ["--out", str(out), "--zoo", str(zoo), "--prompts", str(tmp_path / "p.txt"), "--max-new-tokens", "6",
            "--trees", "chain:3", "--pairs", "dense:new", "--drafter-dir", f"new={tmp_path / 'd'}"]
    za.main(args + ["--merge"])
    assert torch.is_grad_enabled()  # the caller's grad mode is left as it was (trainers in the same process)
    doc = json.loads(out.read_text())

    assert doc["command"] == "old" and doc["rows"] == old["rows"]
    (row,) = doc["candidates"]
    assert row["drafter"] == "new" and row["training"] == {"kind": "x", "config": {"device": "cpu"}}
    assert row["forcing"]["passed"] and "--drafter-dir new=" in row["command"] and row["command"].endswith("--merge")
    with pytest.raises(SystemExit) as e:
        za.main(args[:-2] + ["--drafter-dir", "new"])
    assert e.value.code == 2 and "give NAME=PATH" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        za.main(["--out", str(tmp_path / "none.json"), "--zoo", str(zoo), "--merge", "--pairs", "dense:dense"])
    assert "--merge: " in capsys.readouterr().err


def test_an_mtp_dir_is_measured_on_its_own_target_only_if_that_is_the_zoos(tmp_path):
    """Its target tensors are compared, not its files: the zoo's hybrid carries its own MTP layer in
    model.safetensors, a trained MTP directory the target's tensors there and its layer in model-mtp.safetensors."""
    from safetensors.torch import save_file

    target = {"model.w": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "lm_head.weight": torch.ones(3)}
    zoo = tmp_path / "zoo"
    (zoo / "hybrid").mkdir(parents=True)
    save_file(target | {"mtp.fc.weight": torch.zeros(2)}, str(zoo / "hybrid" / "model.safetensors"))
    mtp = tmp_path / "mtp"
    mtp.mkdir()
    (mtp / "config.json").write_text(json.dumps({"mtp_num_hidden_layers": 1}))
    save_file(target, str(mtp / "model.safetensors"))
    save_file({"mtp.fc.weight": torch.ones(2)}, str(mtp / "model-mtp.safetensors"))
    assert za.drafter_source(zoo, "hybrid", "hybrid-mtp", mtp) == (mtp, "mtp")
    assert za.drafter_source(zoo, "hybrid", "mtp", None) == (zoo / "hybrid", "mtp")
    save_file(target | {"model.w": target["model.w"] + 1}, str(mtp / "model.safetensors"))
    with pytest.raises(ValueError, match=r"\(1 tensors differ, e.g. model.w\) are not those of"):
        za.drafter_source(zoo, "hybrid", "hybrid-mtp", mtp)


def test_merge_keeps_rows_another_run_merged_meanwhile(checkpoint_factory, tmp_path, monkeypatch):
    path, _ = checkpoint_factory("qwen3")
    shutil.copytree(path, tmp_path / "zoo" / "dense")
    (tmp_path / "p.txt").write_text("def add(a, b):\n")
    out = tmp_path / "acc.json"
    out.write_text(json.dumps({"rows": []}))

    def measure(zoo, target, drafter, tree, *args):  # another run merges its row while this one measures
        doc = json.loads(out.read_text())
        za.merge_rows(doc, "rows", [{"target": target, "drafter": "other", "tree": tree}])
        out.write_text(json.dumps(doc))
        return {"target": target, "drafter": drafter, "tree": tree, "tau": 2.0, "acceptance_per_depth": [],
                "forcing": {"passed": True}, "seconds": 0.0}

    monkeypatch.setattr(za, "measure", measure)
    za.main(["--out", str(out), "--zoo", str(tmp_path / "zoo"), "--prompts", str(tmp_path / "p.txt"), "--trees",
             "chain:3", "chain:5", "--pairs", "dense:dense", "--merge"])
    rows = json.loads(out.read_text())["rows"]
    assert sorted((r["drafter"], r["tree"]) for r in rows) == [("dense", "chain:3"), ("dense", "chain:5"),
                                                               ("other", "chain:3"), ("other", "chain:5")]
