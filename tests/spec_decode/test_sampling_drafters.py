"""Coupled drafting (spec_decode/coupling.py): given a sampling request's race noise, a drafter proposes the tokens
its own filtered distribution draws with that noise; a greedy request's proposals do not change."""

import inspect
from types import SimpleNamespace

import pytest
import torch

from specpilot.engine.generator import Generator
from specpilot.models.loader import load_model
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import NoiseStream, SamplingParams, filtered_probs
from specpilot.spec_decode.coupling import coupled_scores
from specpilot.spec_decode.drafters.dflash import DFlashDrafter
from specpilot.spec_decode.drafters.draft_lm import DraftLMDrafter
from specpilot.spec_decode.tree import TreeSpec

PARAMS = SamplingParams(max_new_tokens=6, temperature=0.6, top_k=40, seed=9, ignore_eos=True)


def test_draft_lm_drafting_for_itself_proposes_what_plain_sampling_draws(checkpoint_factory):
    """The target as its own draft model, coupled: the chain (and a tree's first-child path) is the continuation
    plain sampling draws with the same seed."""
    path, _ = checkpoint_factory("qwen3")
    target = load_model(str(path), "cpu", "float32")
    prompt = [5, 9, 14, 3, 5, 9]
    plain = Generator(ModelRunner(target)).generate([prompt], PARAMS)[0].token_ids
    vocab = target.config.vocab_size
    for spec in (TreeSpec.parse("chain:4"), TreeSpec.parse("static:2,2,1,1")):
        drafter = DraftLMDrafter(target)
        drafter.allocate(1, 64)
        drafter.start(0, prompt)
        rows = NoiseStream(PARAMS, vocab, "cpu").take(1, spec.depth)  # the root is output 0; drafts fill 1..depth
        (tree,) = drafter.propose([0], [plain[0]], spec, noise=[(PARAMS, rows)])
        first_path, node = [], 0
        while tree.children(node):
            node = tree.children(node)[0]
            first_path.append(tree.tokens[node])
        assert first_path == plain[1:1 + spec.depth]
        greedy = DraftLMDrafter(target)
        greedy.allocate(1, 64)
        greedy.start(0, prompt)
        assert greedy.propose([0], [plain[0]], spec, noise=[None]) == DraftLMDrafter.propose(
            _started(target, prompt), [0], [plain[0]], spec)


def _started(target, prompt):
    d = DraftLMDrafter(target)
    d.allocate(1, 64)
    d.start(0, prompt)
    return d


def test_dflash_picks_race_draws_per_position():
    """A sampling request's block: the race's draws in order, scored at the drafter's logit error scale."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 11, generator=gen) * 2  # [requests, depth, vocab]
    rows = torch.empty(3, 11).exponential_(generator=gen)
    noise = [(PARAMS, rows), None]
    drafter = SimpleNamespace(logit_error=inspect.signature(DFlashDrafter).parameters["logit_error"].default)
    assert drafter.logit_error == 1.2
    chain = DFlashDrafter._pick(drafter, logits, 0, noise)
    assert chain[0].tolist() == [int((filtered_probs(logits[0, d], PARAMS) / rows[d]).argmax()) for d in range(3)]
    assert chain[1].tolist() == logits[1].argmax(-1).tolist()
    top = DFlashDrafter._pick(drafter, logits, 3, noise)
    scores = coupled_scores(logits, noise, logit_error=1.2)
    assert top[0].tolist() == scores.topk(3, dim=-1).indices.tolist()
    assert top[1].view(torch.float32).equal(scores.topk(3, dim=-1).values)  # the scaled scores, not the unit ones
    assert not top[1].view(torch.float32).equal(coupled_scores(logits, noise).topk(3, dim=-1).values)
    assert top[0][:, :, 0].tolist() == chain.tolist()  # each position's best race score is its chain draw
    assert (DFlashDrafter._pick(drafter, logits, 3, [None, None]) == DFlashDrafter._pick(drafter, logits, 3)).all()


def test_eagle3_draws_over_its_draft_vocabulary_with_the_target_tokens_noise(checkpoint_factory, tmp_path):
    """EAGLE-3's head drafts over a reduced vocabulary: its coupled draw races q with the noise of the target
    tokens the draft tokens stand for, and a tree's first child is that draw."""
    from tests.spec_decode.test_eagle3 import TARGET_LAYERS, write_eagle3
    from specpilot.spec_decode.drafters.eagle3 import Eagle3Drafter

    path, _ = checkpoint_factory("llama", num_hidden_layers=TARGET_LAYERS)
    target = load_model(str(path), "cpu", "float32")
    head_dir = write_eagle3(tmp_path / "e3")
    prompt, root = [7, 30, 2, 99, 41], 17
    runner = ModelRunner(target)
    runner.allocate(1, 32)

    def started():
        d = Eagle3Drafter.from_pretrained(head_dir, target)
        d.allocate(1, 64)
        with torch.inference_mode():
            d.start(0, prompt, runner.prefill_features(0, prompt, d.target_layers)[1])
        return d

    rows = torch.empty(3, target.config.vocab_size).exponential_(generator=torch.Generator().manual_seed(4))
    probe = started()
    with torch.inference_mode():
        q = filtered_probs(probe.draft_logits(probe.feed(0, root)[-1]), PARAMS)
    want = int(probe.draft_to_target[(q / rows[0, probe.draft_to_target]).argmax()])
    (chain,) = started().propose([0], [root], TreeSpec.parse("chain:3"), noise=[(PARAMS, rows)])
    (tree,) = started().propose([0], [root], TreeSpec.parse("static:3,1"), noise=[(PARAMS, rows)])
    assert chain.tokens[1] == want == tree.tokens[tree.children(0)[0]]
    assert len(set(tree.tokens[c] for c in tree.children(0))) == 3


def test_coupled_scores_are_the_race_in_order_with_its_soft_win_chances():
    """A node's children are the draft race's draws in order (its winner, then the top of log q + g), scored
    log softmax(log q + g): the chance that each token wins a race whose log-probs are the draft's plus a fresh Gumbel
    error. Log q alone would rank q's likely tokens above a close race's runner-up."""
    from specpilot.spec_decode.coupling import coupled_row_scores
    from specpilot.runtime.sampling import race_scores

    params = SamplingParams(temperature=1.0)
    logits = torch.tensor([2.0, 1.5, 0.0, -1.0, -3.0])
    noise = torch.tensor([2.0, 3.0, 0.05, 0.08, 5.0])  # E: the race's winner is token 2, its runner-up token 3
    scores = coupled_row_scores(logits, params, noise)
    race = race_scores(logits, params, noise)
    assert scores.topk(5).indices.tolist() == race.topk(5).indices.tolist() == [2, 3, 0, 1, 4]
    assert (scores <= 0).all() and torch.allclose(scores.exp().sum(), torch.tensor(1.0))
    gen = torch.Generator().manual_seed(0)
    fresh = -torch.empty(200_000, 5).exponential_(generator=gen).log()  # Gumbel rows g'
    wins = torch.bincount((race + fresh).argmax(-1), minlength=5).float() / fresh.shape[0]
    assert (wins - scores.exp()).abs().max() < 0.005
    filtered = coupled_row_scores(logits, SamplingParams(temperature=1.0, top_k=2), noise)
    assert filtered.topk(2).indices.tolist() == [0, 1] and torch.isinf(filtered[2:]).all()


def _mtp_target(path):
    """A random Qwen3.5 target with an MTP layer, written to `path`."""
    from specpilot.models.random_checkpoint import add_mtp_layer
    from tests.checkpoints import write_checkpoint

    path.mkdir()
    write_checkpoint("qwen3_5", path)
    add_mtp_layer(path, seed=3)
    return load_model(str(path), "cpu", "float32")


@pytest.mark.parametrize("lengths", [(5, 9), (20, 9)])  # the one-call chain step; an eager feed, then the levels
@pytest.mark.parametrize("vocab", ["mtp", "mtp:FILE"])
def test_mtp_draws_its_q_with_the_noise_per_depth(vocab, lengths, tmp_path):
    """The MTP layer, coupled: a sampling request's draft at depth 1 is the race's draw of its filtered q (over the
    target's ids, zero outside a draft vocabulary) with noise row 0, at depth 2 (its pair with that draw) with row 1;
    a tree's first children are those draws; the greedy request beside it proposes what it proposes without noise.
    mtp:FILE: 150 target ids in no particular order (their noise is the target ids' columns, not the first 150)."""
    from specpilot.spec_decode.drafters.draft_vocab import DraftVocab
    from specpilot.spec_decode.drafters.registry import build_drafter
    from specpilot.spec_decode.tree import DraftTree

    target = _mtp_target(tmp_path / "target")
    if vocab == "mtp:FILE":
        DraftVocab(torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(2))[:150]).save(
            tmp_path / "hot.safetensors")
        vocab = f"mtp:{tmp_path / 'hot.safetensors'}"
    layer = (target.config.num_hidden_layers - 1,)
    runner = ModelRunner(target)
    runner.allocate(2, 64)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in lengths]
    with torch.inference_mode():
        feats = [runner.prefill_features(s, p, layer)[1] for s, p in enumerate(prompts)]
    roots = [17, 40]

    def started():
        d = build_drafter(vocab, target)
        d.allocate(2, 64)
        for s, (p, f) in enumerate(zip(prompts, feats)):
            d.start(s, p, f)
        return d

    params = SamplingParams(temperature=1.0, top_k=50)
    rows = torch.empty(3, target.config.vocab_size).exponential_(generator=torch.Generator().manual_seed(5))
    probe = started()
    with torch.inference_mode():
        h = probe.feed([0, 1], roots)
        q = probe.draft_probs(h, params)
        want = int((q[0] / rows[0]).argmax())
        chain = DraftTree.chain([roots[0], want])
        h2 = probe._tree_hidden(0, chain, {0: h[0]})[0]
        want2 = int((probe.draft_probs(h2, params) / rows[1]).argmax())
    assert want != int(q[0].argmax())  # the race's draw is not the greedy token: ignoring the noise fails
    noise = [(params, rows), None]
    for spec in (TreeSpec.parse("chain:3"), TreeSpec.parse("static:3,2,1")):
        coupled = started().propose([0, 1], roots, spec, noise=noise)
        first = coupled[0].children(0)[0]
        assert [coupled[0].tokens[first], coupled[0].tokens[coupled[0].children(first)[0]]] == [want, want2]
        assert coupled[1] == started().propose([0, 1], roots, spec)[1]
    (tree, _) = started().propose([0, 1], roots, TreeSpec.parse("static:3,1"), noise=noise)
    assert len(set(tree.tokens[c] for c in tree.children(0))) == 3


def test_mtp_tree_scores_are_the_coupled_scores_at_its_logit_error(tmp_path):
    """A sampling request's tree children after the root: the race's first draws, scored at the drafter's logit error
    (not the unit scores)."""
    from specpilot.spec_decode.coupling import coupled_row_scores
    from specpilot.spec_decode.drafters.mtp import MTPDrafter
    from specpilot.spec_decode.drafters.registry import build_drafter
    from specpilot.spec_decode.tree import DraftTree

    target = _mtp_target(tmp_path / "target")
    drafter = build_drafter("mtp", target)
    e = inspect.signature(MTPDrafter).parameters["logit_error"].default
    assert e is not None and drafter.logit_error == e
    h = torch.randn(1, target.config.hidden_size, generator=torch.Generator().manual_seed(3))
    rows = torch.empty(2, target.config.vocab_size).exponential_(generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        logits = drafter.draft_logits(h)
        [(ids, scores)] = drafter._score(0, DraftTree((17,), (-1,)), [0], {0: h[0]}, TreeSpec.parse("static:3"),
                                         (PARAMS, rows))
    want = coupled_row_scores(logits[0], PARAMS, rows[0], e).topk(3)
    assert ids == want.indices.tolist() and torch.allclose(torch.tensor(scores), want.values)
    assert not torch.allclose(torch.tensor(scores), coupled_row_scores(logits[0], PARAMS, rows[0]).topk(3).values)
