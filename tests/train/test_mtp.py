"""`specpilot train drafter --kind mtp` on a tiny corpus (CPU): the loss falls, the output directory is the target
with an `mtp.*` shard that `--drafter mtp` loads with the trained weights, speculative output with it equals AR
output, and a dense target is refused in one line. training.json keeps the target's record (the MTP's under
"mtp"), and a target that already carries an MTP layer (the zoo's hybrid, W12N) is copied without it."""

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
        reports.append(json.loads((tmp_path / name / "training.json").read_text())["mtp"])
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


def test_retraining_keeps_the_targets_record_and_drops_its_old_mtp_layer(drafter_corpus, checkpoint_factory,
                                                                          tmp_path):
    """The zoo's case: a W12N target whose model.safetensors already holds `mtp.*` planes and whose training.json
    is the target's own record. The new directory holds one MTP layer (the new one), the target's stored tensors
    unchanged, and training.json = the target's record with the new MTP training under "mtp"."""
    import shutil

    from safetensors import safe_open

    from specpilot.weights.compress import compress

    path, _ = checkpoint_factory("qwen3_5")
    target = tmp_path / "target"
    shutil.copytree(path, target)
    (target / "training.json").write_text(json.dumps({"preset": "hybrid", "steps": 7}))
    run = ["train", "drafter", "--kind", "mtp", "--corpus", str(drafter_corpus), "--steps", "1", *TRAIN]
    assert main([*run, "--target", str(target), "--out", str(tmp_path / "m0")]) == 0
    compress(str(tmp_path / "m0"), tmp_path / "zoo_hybrid")  # one W12N model.safetensors: target + mtp.* planes
    zoo_hybrid = tmp_path / "zoo_hybrid"
    assert json.loads((zoo_hybrid / "training.json").read_text())["preset"] == "hybrid"
    assert main([*run, "--target", str(zoo_hybrid), "--out", str(tmp_path / "m1"), "--seed", "1"]) == 0
    out = tmp_path / "m1"
    record = json.loads((out / "training.json").read_text())
    assert record["preset"] == "hybrid" and record["steps"] == 7 and record["mtp"]["config"]["seed"] == 1
    assert not (out / "w12n.json").exists()  # the target's manifest does not list the new shard
    with safe_open(str(zoo_hybrid / "model.safetensors"), "pt") as before, \
            safe_open(str(out / "model.safetensors"), "pt") as after:
        kept = [k for k in before.keys() if not k.startswith("mtp.")]
        assert sorted(after.keys()) == sorted(kept)
        assert all(torch.equal(before.get_tensor(k), after.get_tensor(k)) for k in kept)
    with safe_open(str(out / "model-mtp.safetensors"), "pt") as f:
        new = {k: f.get_tensor(k) for k in f.keys()}
    drafter = build_drafter("mtp", load_model(str(out), "cpu", "float32"))  # loads: each mtp.* key exactly once
    for key, value in unpacked_state_dict(drafter.model).items():
        assert torch.equal(new[key].float(), value), key
