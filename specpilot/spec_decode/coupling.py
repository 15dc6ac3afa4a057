"""Coupled drafting: at temperature > 0 a drafter proposes the tokens its own distribution draws with the
request's race noise, the noise rows the target's draws at the same output positions use (runtime/sampling.py
NoiseStream). Where the draft distribution q is close to the target's p, the two races pick the same token,
and the raced rule (spec_decode/rejection.py) accepts it.

Why this is exact: the raced rule emits, at every output position, the target's race with that position's
noise row, whatever was proposed; proposals only decide how many of those tokens a step emits. So proposals may
read the noise.

A node's children: first the draft's own race winner (the coupled draw), then the draft's most likely other
tokens (log q): the walk moves on when the target's draw is among them, so beyond the coupled draw a tree covers
the most draft probability it can (later draws of a race without replacement would cover less).

Per request the noise is None (greedy: the drafter's log-probs, as before) or (SamplingParams, rows [depth,
vocab]): row d - 1 is the noise of the token at depth d.
"""

from __future__ import annotations

import torch

from specpilot.runtime.sampling import SamplingParams, filtered_probs, race_scores

Noise = tuple[SamplingParams, torch.Tensor] | None


def coupled_row_scores(logits: torch.Tensor, params: SamplingParams, noise: torch.Tensor) -> torch.Tensor:
    """logits [..., vocab], noise [..., vocab] -> fp32 scores whose argmax is the race's draw from the filtered
    draft distribution q and whose next best are q's most likely other tokens: log q, with the draw lifted to
    just above the row's maximum."""
    logq = filtered_probs(logits, params).log()
    draw = race_scores(logits, params, noise).argmax(-1, keepdim=True)
    top = logq.amax(-1, keepdim=True)
    return logq.scatter(-1, draw, top + top.abs() * 1e-6 + 1e-6)


def coupled_scores(logits: torch.Tensor, noise: list[Noise], vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """logits [n, depth, draft vocab] -> fp32 scores of the same shape whose argmax / top-k are the proposals: per
    request, coupled_row_scores of its filtered draft distribution with its noise rows (depth of them), or the
    log-softmax for a greedy request. vocab_ids [draft vocab]: the target token of each draft token, when the
    drafter's vocabulary is a subset of the target's (its noise is the target's rows at those tokens)."""
    out = []
    for b, e in enumerate(noise):
        rows = logits[b]
        if e is None:
            out.append(torch.log_softmax(rows.float(), dim=-1))
            continue
        params, rows_noise = e
        rows_noise = rows_noise[:rows.shape[0]]
        if vocab_ids is not None:
            rows_noise = rows_noise[:, vocab_ids]
        out.append(coupled_row_scores(rows, params, rows_noise))
    return torch.stack(out)
