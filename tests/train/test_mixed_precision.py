"""On a GPU the drafter trainers run the drafter's forward under bf16 autocast (the target's features and labels
stay fp32). The same forwards under CPU autocast, on the zoo's trained models: logits within bf16 error of the
fp32 forward, and gradients reach every trainable parameter."""

from pathlib import Path

import pytest
import torch

from specpilot.models.loader import load_model
from specpilot.spec_decode.drafters.dflash import load_dflash
from specpilot.models.eagle3 import load_eagle3_head
from specpilot.spec_decode.drafters.eagle3 import Eagle3Drafter
from specpilot.train.dflash import _features, dflash_forward
from specpilot.train.eagle3 import eagle3_forward

ZOO = Path(__file__).resolve().parents[2] / "zoo"


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_drafter_training_forwards_run_under_bf16_autocast(kind):
    target = load_model(str(ZOO / "dense"), "cpu", "float32").requires_grad_(False)
    tokens = torch.randint(5, 4000, (2, 48), generator=torch.Generator().manual_seed(0))
    if kind == "dflash":
        drafter = load_dflash(ZOO / "dense-dflash", target)
        model = drafter.model.float().requires_grad_(True)
        features, _ = _features(target, tokens, drafter.target_layers)
        anchors = torch.tensor([[3, 20, 33], [1, 17, 40]])
        mask = drafter.mask_token_id
        forward = lambda: dflash_forward(model, target, features, tokens, anchors, 8, mask)  # noqa: E731
    else:
        head, layers = load_eagle3_head(ZOO / "dense-eagle3", target, torch.float32)
        model = head
        for p in head.parameters():
            p.requires_grad_(p.is_floating_point())
        drafter = Eagle3Drafter(head, target, layers)
        features, _ = _features(target, tokens, layers)
        forward = lambda: eagle3_forward(drafter, features, tokens)  # noqa: E731
    params = [p for p in model.parameters() if p.is_floating_point()]
    want = forward().float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = forward()
    err = (got.float() - want).abs().max() / want.abs().max()
    assert err < 3e-2, f"{kind}: bf16 autocast logits off by {err:.3g} of the largest logit"
    got.float().logsumexp(-1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params if p.requires_grad)


def test_dflash_context_window_equals_the_forward_on_the_window_alone():
    """A windowed block at anchor a sees context [a - W, a): the same logits as the plain forward on the sequence
    cut to start at a - W (RoPE is relative, so only rounding differs); a window past the anchor changes nothing."""
    target = load_model(str(ZOO / "dense"), "cpu", "float32").requires_grad_(False)
    drafter = load_dflash(ZOO / "dense-dflash", target)
    model, mask = drafter.model.float(), drafter.mask_token_id
    tokens = torch.randint(5, 4000, (2, 61), generator=torch.Generator().manual_seed(1))
    features, _ = _features(target, tokens, drafter.target_layers)
    anchors, W = torch.tensor([[29, 40], [13, 50]]), 11
    with torch.no_grad():
        got = dflash_forward(model, target, features, tokens, anchors, 8, mask, context_window=W)
        torch.testing.assert_close(dflash_forward(model, target, features, tokens, anchors, 8, mask, context_window=64),
                                   dflash_forward(model, target, features, tokens, anchors, 8, mask),
                                   atol=1e-5, rtol=1e-5)
        for b in range(2):
            for j in range(2):
                s = int(anchors[b, j]) - W
                want = dflash_forward(model, target, features[b:b + 1, s:], tokens[b:b + 1, s:],
                                      torch.tensor([[W]]), 8, mask)
                torch.testing.assert_close(got[2 * b + j], want[0], atol=2e-4, rtol=1e-4)
