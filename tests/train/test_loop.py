"""The shared optimisation loop: warm-up then cosine schedule, a loss that falls, the hook after every step, and a
resumed run that starts at its step."""

from dataclasses import dataclass

import pytest
import torch

from specpilot.train.loop import lr_at, optimize


@dataclass(frozen=True)
class _Cfg:
    steps: int = 40
    lr: float = 0.1
    warmup: int = 4
    batch_size: int = 1
    seq_len: int = 1


def test_schedule_warms_up_then_decays_to_a_tenth():
    lrs = [lr_at(s, 100, 1.0, 10) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] == pytest.approx(0.1)


def test_optimize_lowers_the_loss_and_calls_the_hook():
    w = torch.nn.Parameter(torch.full((3,), 5.0))
    opt = torch.optim.AdamW([w], weight_decay=0.0)
    seen = []
    last = optimize([w], opt, lambda step: (w ** 2).sum(), _Cfg(), None, after_step=seen.append)
    assert last < 75.0 * 0.5 and seen == list(range(1, 41))
    seen.clear()
    optimize([w], opt, lambda step: (w ** 2).sum(), _Cfg(), None, start=30, after_step=seen.append)
    assert seen == list(range(31, 41))
