"""Token forcing: check speculative output against one teacher-forced pass of the plain (stock) model.

The stock pass runs prompt + output through the target as a plain causal prefill and compares, at every
output position, the emitted token with the stock argmax. A mismatch is reported with its logit margin
(stock argmax logit - emitted token's logit); only mismatches above the tie tolerance fail the check (in
bf16 a near-tie may flip between two equally valid kernels).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specpilot.layers.metadata import BatchMetadata


@dataclass(frozen=True, slots=True)
class Mismatch:
    prompt: int
    position: int  # index in the output
    emitted: int
    expected: int
    margin: float


@dataclass(slots=True)
class ForcingReport:
    tokens: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)

    def failures(self, tolerance: float) -> list[Mismatch]:
        return [m for m in self.mismatches if m.margin > tolerance]

    @property
    def max_margin(self) -> float:
        return max((m.margin for m in self.mismatches), default=0.0)


@torch.inference_mode()
def force_check(runner, prompt_ids: list[int], output_ids: list[int], report: ForcingReport, prompt_index: int = 0,
                chunk: int = 1024) -> None:
    """Adds one request's positions to `report`. `runner` is the target's ModelRunner (slot 0 is used)."""
    if not output_ids:
        return
    seq = list(prompt_ids) + list(output_ids)
    runner.allocate(1, len(seq) + 1)
    cache, dev, model = runner.cache, runner.device, runner.model
    cache.reset(torch.tensor([0], device=dev))
    ids = torch.tensor(seq, device=dev)
    first = len(prompt_ids) - 1  # logits at this position predict output[0]
    for start in range(0, len(seq) - 1, chunk):
        block = ids[start:min(start + chunk, len(seq) - 1)][None]
        meta = BatchMetadata.contiguous(block, torch.tensor([start], device=dev), torch.tensor([0], device=dev), start)
        logits = model.logits(model(meta, cache))[0].float()
        lo = max(first, start)
        if lo >= start + block.shape[1]:
            continue
        rows = logits[lo - start:]
        emitted = ids[lo + 1:start + block.shape[1] + 1]
        best = rows.argmax(-1)
        margin = rows.gather(1, best[:, None])[:, 0] - rows.gather(1, emitted[:, None])[:, 0]
        for j in torch.nonzero(best != emitted).flatten().tolist():
            report.mismatches.append(Mismatch(prompt_index, lo + j - first, int(emitted[j]), int(best[j]),
                                              float(margin[j])))
    report.tokens += len(output_ids)
