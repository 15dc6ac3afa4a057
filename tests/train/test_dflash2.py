"""`specpilot train drafter --kind dflash2` on a tiny corpus (CPU): the loss falls, the result is a DFlash2DraftModel
directory in the public layout that build_drafter loads with the trained weights, and speculative output with it
equals AR output."""

import json

import torch

from specpilot.cli import main
from specpilot.models.loader import load_model, unpacked_state_dict
from specpilot.spec_decode.drafters.registry import build_drafter

TRAIN = ["--steps", "{steps}", "--batch-size", "2", "--seq-len", "32", "--lr", "3e-3", "--warmup", "2",
         "--eval-batches", "1", "--device", "cpu", "--block-size", "4", "--draft-layers", "1", "--anchors", "4"]


def train(kind: str, target, corpus_dir, out, steps: int, *extra: str) -> dict:
    args = ["train", "drafter", "--kind", kind, "--target", str(target), "--out", str(out), "--corpus",
            str(corpus_dir), *[a.format(steps=steps) for a in TRAIN], *extra]
    assert main(args) == 0
    return json.loads((out / "training.json").read_text())


def check_run_recorded(report: dict, steps: int) -> None:
    """training.json says how the drafter was trained: the run's config with the device it ran on, and for how long."""
    assert report["config"]["device"] == "cpu" and report["config"]["steps"] == steps == report["steps"]
    assert report["config"]["batch_size"] == 2 and report["train_seconds"] > 0


def check_trained(out, target_dir, name: str) -> None:
    """build_drafter reads back the saved weights; speculative greedy output equals AR output."""
    from safetensors.torch import load_file

    from tests.spec_decode.drafters.test_mtp import check_greedy

    target = load_model(str(target_dir), "cpu", "float32")
    drafter = build_drafter(str(out), target)
    assert drafter.name == name
    saved = load_file(str(out / "model.safetensors"))
    for key, value in unpacked_state_dict(drafter.model).items():
        assert torch.equal(saved[key].float(), value), key
    check_greedy(target, drafter, "chain:3")


def test_train_dflash2(drafter_corpus, mask_target, tmp_path):
    first = train("dflash2", mask_target, drafter_corpus, tmp_path / "d0", 1, "--selector-top-k", "4")
    report = train("dflash2", mask_target, drafter_corpus, tmp_path / "d", 15, "--selector-top-k", "4")
    assert report["held_out_loss"] < first["held_out_loss"] and report["selector_top_k"] == 4
    check_run_recorded(report, 15)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["dflash_config"]["block_size"] == 4
    check_trained(tmp_path / "d", mask_target, "dflash2")
