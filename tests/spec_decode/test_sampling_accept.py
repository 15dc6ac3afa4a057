"""SpecEngine.accept from verify logits (no model run: the logits are made up): a sampling request's nodes are
raced with its own noise rows from its output position, a greedy request's take the argmax, a prefill chunk's
first token is drawn the same way, and the noise a request reads does not depend on its neighbours."""

import torch

from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import GenerationResult
from specpilot.engine.request import Request
from specpilot.engine.scheduler import Chunk
from specpilot.engine.stats import SpecStats
from specpilot.runtime.sampling import NoiseStream, SamplingParams, filtered_probs
from specpilot.spec_decode.tree import DraftTree
from specpilot.spec_decode.verify import accept_greedy

V = 7
SAMPLED = SamplingParams(temperature=0.9, top_k=5, seed=11)
GREEDY = SamplingParams()


class _Staging:
    def read_tokens(self, tokens):
        return tokens.tolist()


class _Runner:
    staging = _Staging()


def _engine():
    engine = SpecEngine.__new__(SpecEngine)  # accept reads only the runner's staging and the verify width
    engine.runner, engine._width = _Runner(), 4
    return engine


def _request(params, emitted=(), prompt=(1, 2, 3)):
    r = Request("r", list(prompt), params, 0.0, GenerationResult(prompt_len=len(prompt)), SpecStats())
    r.result.token_ids.extend(emitted)
    return r


def _walk(tree, logits, params, emitted):
    """The raced rule by hand: node i's token is argmax(p_i / E) with E the row of output position emitted + depth."""
    rows = NoiseStream(params, V, "cpu").take(emitted, max(tree.depths) + 1)
    picked = [int((filtered_probs(logits[i], params) / rows[tree.depths[i]]).argmax()) for i in range(tree.num_nodes)]
    return accept_greedy([tree], [picked])[0]


def test_accept_races_sampling_requests_and_argmaxes_greedy_ones():
    gen = torch.Generator().manual_seed(0)
    trees = [DraftTree((4, 1, 2, 3), (-1, 0, 0, 1)), DraftTree((5, 6, 6), (-1, 0, 1))]
    logits = torch.randn(2, 4, V, generator=gen)
    for i, tree in enumerate(trees):  # drafts the target likes, so that walks go deep
        for node in range(1, tree.num_nodes):
            logits[i, tree.parents[node], tree.tokens[node]] += 2.0
    active = [_request(SAMPLED, emitted=(9, 4)), _request(GREEDY, emitted=(5,))]
    accepted, firsts = _engine().accept(trees, logits, (), active)
    assert firsts == []
    assert accepted[0] == _walk(trees[0], logits[0], SAMPLED, 2)
    assert accepted[1] == accept_greedy([trees[1]], [logits[1, :3].argmax(-1).tolist()])[0]
    # the same request beside another neighbour (or none) reads the same rows and emits the same tokens
    alone, _ = _engine().accept(trees[:1], logits[:1], (), [_request(SAMPLED, emitted=(9, 4))])
    assert alone[0] == accepted[0]


def test_accept_draws_a_last_chunks_first_token_from_its_noise():
    gen = torch.Generator().manual_seed(1)
    tree = DraftTree((4, 1), (-1, 0))
    logits = torch.randn(4 + 2, V, generator=gen)  # flat: the verify block's 4 rows, then one per chunk
    prefilling, midway = _request(SAMPLED, prompt=(1, 2, 3)), _request(SAMPLED, prompt=(1, 2, 3, 4, 5))
    chunks = [Chunk(prefilling, 0, (1, 2, 3)), Chunk(midway, 0, (1, 2))]
    accepted, firsts = _engine().accept([tree], logits, chunks, [_request(GREEDY, emitted=(4,))])
    assert accepted[0] == accept_greedy([tree], [logits[:2].argmax(-1).tolist()])[0]
    first = NoiseStream(SAMPLED, V, "cpu").take(0, 1)[0]
    assert firsts[0] == int((filtered_probs(logits[4], SAMPLED) / first).argmax())
    assert firsts[1] == int(logits[5].argmax())  # not the request's last chunk: its token is never emitted
    assert midway.noise is None
