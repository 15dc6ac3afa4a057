"""`specpilot train drafter --kind dspark` on a tiny corpus (CPU): the loss falls, the result is a Qwen3DSparkModel
directory (DeepSpec's config fields, the target's embedding and head not saved) that build_drafter loads with the
trained weights, and speculative output with it equals AR output."""

import json

from tests.train.test_dflash2 import check_run_recorded, check_trained, train


def test_train_dspark(drafter_corpus, mask_target, tmp_path):
    first = train("dspark", mask_target, drafter_corpus, tmp_path / "d0", 1, "--markov-rank", "8")
    report = train("dspark", mask_target, drafter_corpus, tmp_path / "d", 15, "--markov-rank", "8")
    assert report["held_out_loss"] < first["held_out_loss"] and report["markov_rank"] == 8
    check_run_recorded(report, 15)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["block_size"] == 4 and cfg["enable_confidence_head"]
    check_trained(tmp_path / "d", mask_target, "dspark")
