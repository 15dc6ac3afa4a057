"""`specpilot train drafter --kind mtp` on a tiny corpus (CPU): the loss falls, the output directory is the target
with an `mtp.*` shard that `--drafter mtp` loads with the trained weights, speculative output with it equals AR
output, and a dense target is refused in one line."""

import json

import torch

from specpilot.cli import main
from specpilot.models.loader import load_model, unpacked_state_dict
from specpilot.spec_decode.drafters.registry import build_drafter
from tests.train.test_dflash2 import check_run_recorded

TRAIN = ["--batch-size", "2", "--seq-len", "32", "--lr", "3e-3", "--warmup", "2", "--eval-batches", "1",
         "--device", "cpu"]


def test_train_mtp(drafter_corpus, checkpoint_factory, tmp_path, capsys):
    from safetensors.torch import load_file

    from tests.spec_decode.drafters.test_mtp import check_greedy

    path, _ = checkpoint_factory("qwen3_5")
    reports = []
    for name, steps in (("m0", "1"), ("m", "15")):
        assert main(["train", "drafter", "--kind", "mtp", "--target", str(path), "--out", str(tmp_path / name),
                     "--corpus", str(drafter_corpus), "--steps", steps, *TRAIN]) == 0
        reports.append(json.loads((tmp_path / name / "training.json").read_text()))
    assert reports[1]["held_out_loss"] < reports[0]["held_out_loss"]
    check_run_recorded(reports[1], 15)
    target = load_model(str(tmp_path / "m"), "cpu", "float32")
    drafter = build_drafter("mtp", target)
    saved = load_file(str(tmp_path / "m" / "model-mtp.safetensors"))
    for key, value in unpacked_state_dict(drafter.model).items():
        assert torch.equal(saved[key].float(), value), key
    check_greedy(target, drafter, "chain:3")
    dense, _ = checkpoint_factory("qwen3")
    capsys.readouterr()
    assert main(["train", "drafter", "--kind", "mtp", "--target", str(dense), "--out", str(tmp_path / "x"),
                 "--corpus", str(drafter_corpus), "--steps", "1", *TRAIN]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "an MTP layer is a Qwen3.5 / Qwen3-Next layer" in err
