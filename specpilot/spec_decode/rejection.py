"""Speculative sampling at temperature > 0: the acceptance rules that keep a draft tree's output distributed
exactly as plain sampling from the target.

The target distribution after node n, p_n [vocab], is filtered_probs of the target's logits there (temperature,
top-k, top-p exactly as plain sampling applies them). Two rules:

- accept_recursive: recursive rejection sampling over siblings (SpecInfer's multi-step speculative sampling; a
  chain is the one-child case, i.e. standard speculative sampling). At node n, with running target p = p_n, for
  each child c in order: accept its token x with probability min(1, p(x) / q_c(x)) and move to c; on rejection
  p becomes the residual norm(max(0, p - q_c)). When every child is rejected the bonus token is drawn from p;
  after the last accepted node (a leaf) the bonus is drawn from its p_n. q_c is the distribution child c's token
  was drawn from given everything drawn before it (its parent's context and its earlier siblings): a drafter that
  draws siblings without replacement records q with the earlier siblings' tokens removed and renormalised. A
  child with no q is a deterministic proposal (q a point mass at x: accept with probability p(x); the residual
  is p with x zeroed, renormalised).
- accept_raced (the engine's): at node n the token y_n = argmax(p_n / E_d) is drawn by an exponential race with
  the noise row E_d of its output position, and the walk moves to the child carrying y_n. For proposals drawn
  independently of the noise (top tokens, n-gram lookups) this is, per node, the point-mass rule above in one
  draw (it moves to child c with probability p_n(x_c); on no match y_n is a draw from p_n with the children's
  tokens removed). And since E_d belongs to the output position, not to the tree, the emitted tokens are the
  tokens plain sampling draws with the same noise rows, whatever was proposed (proposals that read the noise
  too: spec_decode/coupling.py): the output does not depend on the tree, the drafter or the batch, only on the
  seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specpilot.runtime.sampling import SamplingParams, filtered_probs, race
from specpilot.spec_decode.tree import DraftTree
from specpilot.spec_decode.verify import Acceptance, accept_greedy


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what is left of target p after rejecting a draw from q. Where nothing is left (p <= q
    everywhere, so p == q and a rejection had probability 0) it is p itself."""
    r = (p - q).clamp_min(0)
    total = r.sum()
    return r / total if total > 0 else p


def point_mass(x: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[x] = 1.0
    return q


def acceptance_probability(p: torch.Tensor, x: int, q: torch.Tensor | None) -> float:
    """min(1, p(x) / q(x)): the chance that a draw x from q is kept under target p (q None: a point mass at x)."""
    px = float(p[x])
    if q is None:
        return min(1.0, px)
    qx = float(q[x])
    return min(1.0, px / qx) if qx > 0 else 0.0


Residual = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def accept_recursive(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator | None,
                     q: Sequence[torch.Tensor | None] | None = None, rule: Residual = residual) -> Acceptance:
    """probs [N, vocab]: the target's filtered distribution after each node (rows of nodes never reached are not
    read); q[i]: the distribution node i's token was drawn from (q[0] unused; None, or q None: deterministic).
    Draws one uniform per child tried and one race for the bonus token from `generator`. `rule` is the residual
    (a test injects a biased one)."""
    children, tokens = tree.layout.children, tree.tokens
    node, path, p = 0, [0], probs[0]
    while True:
        for child in children[node]:
            x, qc = tokens[child], q[child] if q is not None else None
            u = float(torch.rand((), generator=generator, device=probs.device))
            if u < acceptance_probability(p, x, qc):
                break
            p = rule(p, qc if qc is not None else point_mass(x, p))
        else:
            bonus = int(race(p, generator))
            return Acceptance(tuple(path), tuple([tokens[i] for i in path[1:]] + [bonus]))
        node = child
        path.append(node)
        p = probs[node]


def race_tokens(tree: DraftTree, probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """probs [N, vocab], noise [depth + 1, vocab] (row d: the Exp(1) row of the output position after depth d)
    -> [N] the token raced at every node, on the device (for accept_raced, after one host copy)."""
    depths = torch.tensor(tree.depths, device=probs.device)
    return race(probs[:tree.num_nodes], None, noise[depths])


def accept_raced(trees: list[DraftTree], raced: list[list[int]]) -> list[Acceptance]:
    """The walk of the raced rule: raced[b][i] is the token drawn at node i of tree b (race_tokens); move to the
    child carrying it, as greedy acceptance moves to the child carrying the argmax."""
    return accept_greedy(trees, raced)


def step_tokens(trees: list[DraftTree], rows: list[torch.Tensor], params: list[SamplingParams],
                noise: list[torch.Tensor | None]) -> list[torch.Tensor]:
    """A verify step's token per node, per request, on the device: rows[b] [>= N_b, vocab] the target's logits
    after each node of tree b; the argmax for a greedy request, else the raced token (noise[b]: its NoiseStream
    rows from the output position after the root, depth + 1 of them). The host reads them all in one copy and walks
    them with accept_raced."""
    out = []
    for tree, logits, p, e in zip(trees, rows, params, noise):
        logits = logits[:tree.num_nodes]
        out.append(logits.argmax(-1) if p.greedy else race_tokens(tree, filtered_probs(logits, p), e))
    return out
