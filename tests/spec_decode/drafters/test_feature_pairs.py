"""The feature-pair bookkeeping EAGLE-3 and MTP share (spec_decode/drafters/feature_pairs.py): start and commit
take features of the drafter's width for each new pair, and refuse others (or none) in one line naming the shape."""

import pytest
import torch

from specpilot.models.loader import load_model


@pytest.fixture(params=["eagle3", "mtp"])
def drafter(request, checkpoint_factory):
    if request.param == "mtp":
        from specpilot.models.mtp import MTPModel, head_config
        from specpilot.spec_decode.drafters.mtp import MTPDrafter

        path, _ = checkpoint_factory("qwen3_5")
        target = load_model(str(path), "cpu", "float32")
        return MTPDrafter(MTPModel(head_config(target.config)), target)
    from specpilot.models.eagle3 import Eagle3Head, head_config
    from specpilot.spec_decode.drafters.eagle3 import Eagle3Drafter
    from specpilot.train.eagle3 import head_raw_config, tap_inputs

    path, _ = checkpoint_factory("qwen3")
    target = load_model(str(path), "cpu", "float32")
    raw = head_raw_config(target.config, 100, tap_inputs(target.config.num_hidden_layers))
    head = Eagle3Head(head_config(raw, "test"), target.config.hidden_size, 100, False, False)
    return Eagle3Drafter(head, target, (0, 1, 2))


def test_start_and_commit_queue_the_pairs(drafter):
    width = drafter.feature_width
    prompt = torch.randn(5, width)
    drafter.start(3, [7, 8, 9, 10, 11], prompt)
    assert drafter.seen[3] == 0 and drafter.pending_tokens[3] == [8, 9, 10, 11] and drafter.pending_feats[3] is prompt
    drafter.seen[3] = 5
    step = torch.randn(3, width)
    drafter.commit(3, [4, 6], step)
    assert drafter.seen[3] == 5 and drafter.pending_tokens[3] == [4, 6] and drafter.pending_feats[3] is step


def test_features_of_the_wrong_shape_are_refused(drafter):
    width = drafter.feature_width
    if drafter.name == "mtp":
        need = f"MTP needs the target's last-layer outputs [{{n}}, {width}], got {{got}}"
    else:
        need = f"EAGLE-3 needs target features [{{n}}, {width}] of layers (0, 1, 2), got {{got}}"
    with pytest.raises(ValueError) as e:
        drafter.start(0, [1, 2, 3], torch.randn(2, width))
    assert str(e.value) == need.format(n=3, got=(2, width))
    with pytest.raises(ValueError) as e:
        drafter.commit(0, [5], None)
    assert str(e.value) == need.format(n=2, got=None)
    with pytest.raises(ValueError) as e:
        drafter.commit(0, [], torch.randn(1, width + 1))
    assert str(e.value) == need.format(n=1, got=(1, width + 1))
