"""Coupled drafting: at temperature > 0 a drafter proposes the tokens its own distribution draws with the
request's race noise, the noise rows the target's draws at the same output positions use (runtime/sampling.py
NoiseStream). Where the draft distribution q is close to the target's p, the two races pick the same token,
and the raced rule (spec_decode/rejection.py) accepts it.

Why this is exact: the raced rule emits, at every output position, the target's race with that position's
noise row, whatever was proposed; proposals only decide how many of those tokens a step emits. So proposals may
read the noise.

A node's children and their scores: the draft's race in order (its winner, the coupled draw, first; then the
race's next draws without replacement, i.e. the top of log q + g, g = -log E the race's Gumbel noise), scored
log softmax((log q + g) / s). That score is the chance that the token wins the target's race if the target's
log-probs are the draft's plus an independent Gumbel error of scale s (the Gumbel-max identity: argmax(log q + g +
s g') for a fresh Gumbel row g' picks c with probability softmax((log q + g) / s)[c]). s is 1 by default; a
drafter that knows its logits' error scale e (in logits, before the temperature) passes it as logit_error, and
then s = e / temperature: the same logit error weighs more against the race the lower the temperature. So the
dynamic tree grows deep where the coupled race is clear and spends siblings where it is close; the scores are
log-probabilities (<= 0, summing to one), as the tree's growth and pruning assume. The scale changes the scores
only, never the order: the proposals of a fixed shape are the race's draws whatever it is.

Per request the noise is None (greedy: the drafter's log-probs, as before) or (SamplingParams, rows [depth,
vocab]): row d - 1 is the noise of the token at depth d.
"""

from __future__ import annotations

import torch

from specpilot.runtime.sampling import SamplingParams, race_scores

Noise = tuple[SamplingParams, torch.Tensor] | None


def coupled_row_scores(logits: torch.Tensor, params: SamplingParams, noise: torch.Tensor,
                       logit_error: float | None = None) -> torch.Tensor:
    """logits [..., vocab], noise [..., vocab] -> fp32 log-probabilities log softmax((log q + g) / s) of the filtered
    draft distribution q's race with this noise (g = -log noise; s = logit_error / temperature, or 1 when
    logit_error is None): their argmax is the race's draw, their top-k its first k draws without replacement (-inf
    where q is 0)."""
    race = race_scores(logits, params, noise)
    if logit_error is not None:
        race = race * (params.temperature / logit_error)
    return torch.log_softmax(race, dim=-1)


def coupled_scores(logits: torch.Tensor, noise: list[Noise], vocab_ids: torch.Tensor | None = None,
                   logit_error: float | None = None) -> torch.Tensor:
    """logits [n, depth, draft vocab] -> fp32 scores of the same shape whose argmax / top-k are the proposals: per
    request, coupled_row_scores of its filtered draft distribution with its noise rows (depth of them), or the
    log-softmax for a greedy request. vocab_ids [draft vocab]: the target token of each draft token, when the
    drafter's vocabulary is a subset of the target's (its noise is the target's rows at those tokens).
    logit_error: the drafter's logit error scale (coupled_row_scores)."""
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
        out.append(coupled_row_scores(rows, params, rows_noise, logit_error))
    return torch.stack(out)


# Coupled proposals replayed from CUDA graphs read the race noise from static rows [n, depth, vocab] that the
# drafter refills before each replay; a graph is captured per tuple of its rows' filter_key.
# The static noise rows all coupled graphs of one drafter may hold (fp32; a graph's own fp32 temporaries scale with
# them): past it a coupled proposal of a new shape or setting runs eagerly.
MAX_GRAPH_NOISE_BYTES = 1 << 30


def filter_key(e: Noise):
    """What a row's coupled draws depend on besides its noise: its filter settings (None: a greedy row)."""
    return None if e is None else (e[0].temperature, e[0].top_k, e[0].top_p)


def graph_noise_fits(graphs: dict, noise: list[Noise], depth: int, vocab: int) -> bool:
    """Whether one more graph's static rows [len(noise), depth, vocab] keep the rows all of `graphs` hold (their
    `.noise`, None for a greedy graph) within MAX_GRAPH_NOISE_BYTES."""
    held = sum(g.noise.numel() for g in graphs.values() if g.noise is not None)
    return 4 * (held + len(noise) * depth * vocab) <= MAX_GRAPH_NOISE_BYTES


def static_noise(noise: list[Noise], depth: int, vocab: int, device) -> torch.Tensor:
    """A new graph's static rows [n, depth, vocab] (ones: a greedy row's stay finite) holding this step's noise."""
    rows = torch.ones(len(noise), depth, vocab, device=device)
    fill_noise(rows, noise)
    return rows


def fill_noise(rows: torch.Tensor, noise: list[Noise]) -> None:
    """Each sampling row's first `depth` race noise rows into the static rows [n, depth, vocab] (a greedy row's stay
    as they are)."""
    depth = rows.shape[1]
    for b, e in enumerate(noise):
        if e is not None:
            rows[b].copy_(e[1][:depth])
