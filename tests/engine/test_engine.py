"""SpecEngine on tiny random checkpoints (CPU, fp32): speculative greedy output == AR greedy output."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.runtimes import cpu_runtime, set_paths, set_runtime
from specpilot.runtime.cache import ModelCache
from specpilot.engine.engine import BATCH_BUCKETS, SpecEngine
from specpilot.engine.generator import Generator
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.loader import load_model
from specpilot.spec_decode.drafters.draft_lm import DraftLMDrafter
from specpilot.spec_decode.drafters.ngram import NgramDrafter
from specpilot.spec_decode.tree import DraftTree, TreeSpec

DENSE_TREES = ["chain:4", "static:3,2,1", "dynamic:3,4,8"]
PARAMS = SamplingParams(max_new_tokens=24)
FIXED = SchedulerConfig(adaptive=False)  # every request verifies the tree spec's full tree every step


def _models(checkpoint_factory, name):
    path, _ = checkpoint_factory(name)
    draft_path, _ = checkpoint_factory(name, num_hidden_layers=1)
    return load_model(str(path), "cpu", "float32"), load_model(str(draft_path), "cpu", "float32")


def _prompts():
    gen = torch.Generator().manual_seed(5)
    base = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (4, 15, 9)]
    return [b + b[: len(b) // 2] + b for b in base]  # repeats give the n-gram drafter matches


def _reference(target, prompts, params=PARAMS):
    return [r.token_ids for r in Generator(ModelRunner(target)).generate(prompts, params)]


DRAFTERS = {
    "ngram": lambda target, draft: NgramDrafter(),
    "draft-lm": lambda target, draft: DraftLMDrafter(draft),
    "self-draft": lambda target, draft: DraftLMDrafter(target),
}


@pytest.mark.parametrize("tree", DENSE_TREES)
@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_speculative_equals_autoregressive_dense(drafter, tree, checkpoint_factory):
    target, draft = _models(checkpoint_factory, "qwen3")
    prompts = _prompts()
    engine = SpecEngine(ModelRunner(target), DRAFTERS[drafter](target, draft), TreeSpec.parse(tree), scheduler=FIXED)
    out = engine.generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == _reference(target, prompts)
    if drafter == "self-draft":  # the target drafting for itself is always right: tau at the tree's depth
        assert all(s.tau > TreeSpec.parse(tree).depth * 0.7 for _, s in out)


@pytest.mark.parametrize("commit", ["fold", "replay"])
@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_speculative_equals_autoregressive_hybrid_chain(drafter, commit, checkpoint_factory):
    target, draft = _models(checkpoint_factory, "qwen3_5")
    prompts = _prompts()
    runner = ModelRunner(target, cpu_runtime(hybrid_chain_commit=commit))
    engine = SpecEngine(runner, DRAFTERS[drafter](target, draft), TreeSpec.parse("chain:3"), scheduler=FIXED)
    out = engine.generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == _reference(target, prompts)


@pytest.mark.parametrize("tree", ["static:3,2,1", "dynamic:3,4,8"])
@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_speculative_equals_autoregressive_hybrid_tree(drafter, tree, checkpoint_factory):
    """Trees on a Gated DeltaNet target: tree-masked delta rule + parent-pointer conv in the verify pass, fold
    commit of the kept path; the draft LMs are hybrid too (their trees run the same tree path)."""
    target, draft = _models(checkpoint_factory, "qwen3_5")
    prompts = _prompts()
    engine = SpecEngine(ModelRunner(target), DRAFTERS[drafter](target, draft), TreeSpec.parse(tree), scheduler=FIXED)
    out = engine.generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == _reference(target, prompts)
    if drafter == "self-draft":  # a hybrid drafting trees for itself is always right
        assert all(s.tau > TreeSpec.parse(tree).depth * 0.7 for _, s in out)


@pytest.mark.parametrize("tree", ["chain:4", "static:3,2,1", "dynamic:3,4,8"])
@pytest.mark.parametrize("shape", [dict(num_hidden_layers=6, full_attention_interval=3, linear_num_value_heads=2),
                                   dict(num_hidden_layers=4, full_attention_interval=4, linear_num_value_heads=6)],
                         ids=["interval3-ratio1", "interval4-ratio3"])
def test_hybrid_shapes_keep_output_exact(shape, tree, checkpoint_factory):
    """Other layer mixes and value/key head ratios (1 and 3; the default checkpoint has interval 2, ratio 2): a
    draft LM of the same family (and for the static tree, wide enough for it, a random-tree drafter) gives the
    plain greedy output."""
    path, _ = checkpoint_factory("qwen3_5", **shape)
    draft_path, _ = checkpoint_factory("qwen3_5", **{**shape, "num_hidden_layers": 1})
    target, draft = load_model(str(path), "cpu", "float32"), load_model(str(draft_path), "cpu", "float32")
    assert target.config.linear_num_value_heads // target.config.linear_num_key_heads in (1, 3)
    prompts = _prompts()
    truth = _reference(target, prompts)
    drafters = [DraftLMDrafter(draft)] + ([RandomTreeDrafter(7, truth, prompts)] if tree.startswith("static") else [])
    for drafter in drafters:
        out = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(tree), scheduler=FIXED).generate(prompts, PARAMS)
        assert [r.token_ids for r, _ in out] == truth


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_trees_keep_output_exact_on_hybrid_target(seed, checkpoint_factory):
    target, _ = _models(checkpoint_factory, "qwen3_5")
    prompts = _prompts()
    truth = _reference(target, prompts)
    engine = SpecEngine(ModelRunner(target), RandomTreeDrafter(seed, truth, prompts), TreeSpec.parse("static:4,3"), scheduler=FIXED)
    out = engine.generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == truth
    assert any(s.tau > 1.5 for _, s in out)


class RandomTreeDrafter:
    """Proposes random trees whose tokens are sometimes the right ones (from a reference continuation)."""

    name = "random"
    target_layers = ()

    def __init__(self, seed: int, truth: list[list[int]], prompts: list[list[int]]):
        self.rng, self.truth, self.prompts, self.emitted = random.Random(seed), truth, prompts, {}

    def allocate(self, num_slots, max_seq_len):
        pass

    def start(self, slot, prompt_ids, features=None):
        self.emitted[slot] = 0

    def commit(self, slot, accepted, features=None):
        self.emitted[slot] += len(accepted)

    def propose(self, slots, roots, spec):
        trees = []
        for slot, root in zip(slots, roots):
            self.emitted[slot] += 1
            n = self.rng.randint(1, 12)
            parents = [-1] + [self.rng.randint(max(0, i - 3), i - 1) for i in range(1, n)]
            depths = [0] * n
            for i in range(1, n):
                depths[i] = depths[parents[i]] + 1
            future = self.truth[slot][self.emitted[slot]:]
            tokens = [root] + [future[depths[i] - 1] if depths[i] - 1 < len(future) and self.rng.random() < 0.7
                               else self.rng.randint(0, 299) for i in range(1, n)]
            trees.append(DraftTree(tuple(tokens), tuple(parents)))
        return trees


@pytest.mark.parametrize("name", ["llama", "qwen3_5"])
@given(seed=st.integers(0, 10_000))
@settings(max_examples=6, deadline=None)
def test_random_trees_keep_output_exact(name, seed):
    """Hypothesis-drawn random trees on a dense and a hybrid (Gated DeltaNet) target."""
    target = _HYPOTHESIS_TARGETS[name]
    prompts = _prompts()
    truth = _reference(target, prompts)
    engine = SpecEngine(ModelRunner(target), RandomTreeDrafter(seed, truth, prompts), TreeSpec.parse("static:4,3"), scheduler=FIXED)
    out = engine.generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == truth
    assert any(s.tau > 1 for _, s in out)


_HYPOTHESIS_TARGETS = {}


@pytest.fixture(autouse=True)
def _hypothesis_targets(checkpoint_factory):
    for name in ("llama", "qwen3_5"):
        if name not in _HYPOTHESIS_TARGETS:
            _HYPOTHESIS_TARGETS[name] = _models(checkpoint_factory, name)[0]


@pytest.mark.parametrize("name,tree", [("qwen3", "dynamic:3,4,8"), ("qwen3_5", "chain:3"), ("qwen3_5", "static:4,3")])
def test_commit_equals_prefill(name, tree, checkpoint_factory):
    """After speculative steps, each request's cache equals a fresh prefill of its committed tokens."""
    target, draft = _models(checkpoint_factory, name)
    prompts = _prompts()
    if tree.startswith("static"):  # hybrid trees: drafts that are often right, so that paths get kept
        drafter = RandomTreeDrafter(7, _reference(target, prompts, SamplingParams(max_new_tokens=17)), prompts)
    else:
        drafter = DraftLMDrafter(draft)
    engine = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(tree), scheduler=FIXED)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=17))
    cache = engine.runner.cache
    for req, (res, _) in zip(engine.requests, out):
        committed = req.prompt + res.token_ids[: req.committed - len(req.prompt)]
        fresh = ModelCache(target.config, 1, len(committed) + 1, "cpu", torch.float32)
        ids = torch.tensor([committed])
        with torch.no_grad():
            target(BatchMetadata.contiguous(ids, torch.tensor([0]), torch.tensor([0]), 0), fresh)
        n = len(committed)
        torch.testing.assert_close(cache.k[:, req.slot, :, :n], fresh.k[:, 0, :, :n], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(cache.v[:, req.slot, :, :n], fresh.v[:, 0, :, :n], rtol=1e-4, atol=1e-5)
        if target.config.is_hybrid:
            torch.testing.assert_close(cache.ssm[:, req.slot], fresh.ssm[:, 0], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(cache.conv[:, req.slot], fresh.conv[:, 0], rtol=1e-4, atol=1e-5)


def test_stats_count_drafts_and_acceptance(checkpoint_factory):
    target, _ = _models(checkpoint_factory, "qwen3")
    prompts = _prompts()[:1]
    _, stats = SpecEngine(ModelRunner(target), DraftLMDrafter(target), TreeSpec.parse("chain:3"),
                          scheduler=FIXED).generate(prompts, SamplingParams(max_new_tokens=13))[0]
    assert stats.drafted_per_depth == [stats.steps] * 3
    assert stats.accepted_per_depth[0] <= stats.steps
    assert stats.emitted == 12  # the first token comes from the prefill
    assert set(stats.seconds) == {"start", "draft", "verify", "accept", "commit", "other"}


def test_while_verifying_runs_once_per_step_between_verify_and_accept(checkpoint_factory):
    target, _ = _models(checkpoint_factory, "qwen3")
    engine = SpecEngine(ModelRunner(target), DraftLMDrafter(target), TreeSpec.parse("chain:3"), scheduler=FIXED)
    calls = []
    verify, accept = engine.verify, engine.accept
    engine.verify = lambda *a: (calls.append("verify"), verify(*a))[1]
    engine.accept = lambda *a: (calls.append("accept"), accept(*a))[1]
    engine.while_verifying = lambda: calls.append("hook")
    out, _ = engine.generate(_prompts()[:2], SamplingParams(max_new_tokens=9))[0]
    assert calls and calls == ["verify", "hook", "accept"] * (len(calls) // 3)
    assert out.token_ids == _reference(target, _prompts()[:1], SamplingParams(max_new_tokens=9))[0]


def test_eos_and_max_tokens_cut_the_emitted_block(checkpoint_factory):
    target, _ = _models(checkpoint_factory, "qwen3")
    prompts = _prompts()
    ref = _reference(target, prompts, SamplingParams(max_new_tokens=10))
    eos = ref[1][6]
    out = SpecEngine(ModelRunner(target), DraftLMDrafter(target), TreeSpec.parse("chain:4"), eos_ids=(eos,), scheduler=FIXED).generate(
        prompts, SamplingParams(max_new_tokens=10))
    for (res, _), r in zip(out, ref):
        expect = r[: r.index(eos) + 1] if eos in r else r
        assert res.token_ids == expect


@pytest.mark.parametrize("tree", ["chain:4", "dynamic:3,4,8"])
def test_tree_attention_op_path_keeps_output_exact(tree, checkpoint_factory):
    """EngineConfig.block_attention="tree": prefill and verify blocks through the tree-attention op (its
    reference on CPU, Triton on GPU) give the same greedy output."""
    target, draft = _models(checkpoint_factory, "qwen3")
    prompts = _prompts()
    runner = ModelRunner(target, cpu_runtime(block_attention="tree"))
    out = SpecEngine(runner, DraftLMDrafter(draft), TreeSpec.parse(tree), scheduler=FIXED).generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == _reference(target, prompts)


@pytest.mark.parametrize("name,tree", [("qwen3", "dynamic:3,4,8"), ("qwen3_5", "chain:4"), ("qwen3_5", "static:3,2")])
def test_fixed_width_verify_blocks_keep_output_exact(name, tree, checkpoint_factory):
    """What verify graphs change on the host side: every step padded to a bucket of batch (rows verifying a lone
    root on the scratch slot) and of width (a power of two, or the tree spec's full width) (the graph replay itself
    is stood in for by the eager forward here; CUDA graphs need a GPU)."""
    target, draft = _models(checkpoint_factory, name)
    prompts = _prompts()
    runner = ModelRunner(target)
    set_runtime(runner, verify_graphs=True)
    shapes = []
    runner.verify = lambda meta, layers=(), logits=False: shapes.append(tuple(meta.input_ids.shape)) or \
        runner._verify_eager(meta, layers, logits)
    engine = SpecEngine(runner, NgramDrafter(), TreeSpec.parse(tree), scheduler=FIXED)
    out = engine.generate(prompts, PARAMS)
    full = TreeSpec.parse(tree).max_tree_nodes
    assert all(b in BATCH_BUCKETS and (w & (w - 1) == 0 or w == full) and w <= full for b, w in shapes)
    assert (4, 1) in shapes or any(b == 4 for b, _ in shapes)  # three requests padded to four rows
    assert [r.token_ids for r, _ in out] == _reference(target, prompts)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_verify_on_the_decode_gemv_path_keeps_output(name, checkpoint_factory, monkeypatch):
    """Verify blocks of up to 16 rows through the decode GEMV path (ops.gemv; the references on CPU) give the plain
    greedy output; the gated down projection stays single-row."""
    import specpilot.layers.linear as linear

    rows_seen, gated_rows = [], []
    real, real_gated = linear.gemv, linear.gated_gemv
    monkeypatch.setattr(linear, "gemv", lambda x, w, **k: (rows_seen.append(x.shape[0]), real(x, w, **k))[1])
    monkeypatch.setattr(linear, "gated_gemv",
                        lambda x, w, **k: (gated_rows.append(x.shape[0]), real_gated(x, w, **k))[1])
    target, _ = _models(checkpoint_factory, name)
    prompts = _prompts()
    truth = _reference(target, prompts)
    runner = ModelRunner(target)
    set_paths(runner, "verify", gemv=True, gated_down=True)
    engine = SpecEngine(runner, RandomTreeDrafter(2, truth, prompts), TreeSpec.parse("static:2,2"), scheduler=FIXED)
    assert [r.token_ids for r, _ in engine.generate(prompts, PARAMS)] == truth
    assert any(1 < n <= 16 for n in rows_seen)  # multi-row verify blocks took the GEMV path
    assert set(gated_rows) <= {1}

