"""The optimisation loop every trainer shares: learning-rate schedule, backward, clipping, AdamW step, and a
progress bar with loss and tokens/s. A trainer supplies the loss of step s (a pure function of the step, so
runs repeat) and, if it checkpoints, a hook called after each step."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def optimize(params, opt: torch.optim.Optimizer, step_loss: Callable[[int], torch.Tensor], cfg, console,
             label: str = "train", start: int = 0, after_step: Callable[[int], None] | None = None) -> float:
    """Runs steps start .. cfg.steps-1 and returns the last loss; cfg has steps, lr, warmup, batch_size, seq_len."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    params = [p for p in params if p.requires_grad]
    cols = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.3f}"),
            TextColumn("{task.fields[tps]:,.0f} tok/s"), TimeRemainingColumn())
    loss_value, t0 = float("nan"), time.perf_counter()
    with Progress(*cols, console=console, transient=False, disable=console is None) as bar:
        task = bar.add_task(label, total=cfg.steps, completed=start, loss=float("nan"), tps=0.0)
        for step in range(start, cfg.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
            loss = step_loss(step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            loss_value = float(loss.detach())
            rate = (step + 1 - start) * cfg.batch_size * cfg.seq_len / (time.perf_counter() - t0)
            bar.update(task, advance=1, loss=loss_value, tps=rate)
            if after_step is not None:
                after_step(step + 1)
    return loss_value
