"""The zoo_acceptance benchmark: per-depth counts add up over requests whose lists have different lengths, and a
chain row becomes a synthetic profile of conditional acceptance."""

import shutil

import pytest

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
