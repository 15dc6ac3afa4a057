"""Runtime behaviour on tiny random checkpoints: ragged batches, sampling, stops, chunked prefill, cache ops."""

import pytest
import torch

from specpilot.runtime.cache import ModelCache
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams, filtered_probs
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.loader import load_model, load_tokenizer
from specpilot.ops.path_index import PathIndex
from tests.runtimes import set_paths

FAMILIES = ["llama", "qwen3_5"]


def _gen(checkpoint_factory, name, prefill_together=False, **runner_kw):
    path, hf = checkpoint_factory(name)
    model = load_model(str(path), "cpu", "float32")
    return Generator(ModelRunner(model, **runner_kw), prefill_together=prefill_together), hf


@pytest.mark.parametrize("prefill_together", [False, True])
@pytest.mark.parametrize("name", FAMILIES)
def test_ragged_batch_equals_single_runs(name, prefill_together, checkpoint_factory):
    """A ragged batch gives each prompt's single-run output, with one prefill per request or all in one
    (Generator(prefill_together=True): padded on the dense model; the hybrid one keeps per-request prefills)."""
    gen, hf = _gen(checkpoint_factory, name, prefill_together)
    prompts = [torch.randint(0, 300, (n,)).tolist() for n in (3, 29, 11)]
    params = SamplingParams(max_new_tokens=24)
    batched = [r.token_ids for r in gen.generate(prompts, params)]
    singles = [gen.generate([p], params)[0].token_ids for p in prompts]
    assert batched == singles


@pytest.mark.parametrize("prefill_together", [False, True])
@pytest.mark.parametrize("name", FAMILIES)
def test_sampled_batch_equals_each_prompt_sampled_alone(name, prefill_together, checkpoint_factory):
    """Each request samples from its own stream: a sampled batch gives each prompt the tokens it draws alone with
    its seed (what the speculative engine emits for it in any batch), whatever shares its steps."""
    gen, _ = _gen(checkpoint_factory, name, prefill_together)
    prompts = [torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (3, 29, 11)]
    params = SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.95, seed=6, ignore_eos=True)
    batched = [r.token_ids for r in gen.generate(prompts, params)]
    singles = [gen.generate([p], params)[0].token_ids for p in prompts]
    assert batched == singles
    assert batched != [r.token_ids for r in gen.generate(prompts, SamplingParams(max_new_tokens=16))]  # it sampled


@pytest.mark.parametrize("name", FAMILIES)
def test_chunked_prefill_equals_one_shot(name, checkpoint_factory):
    """Prefill in chunks of 7 tokens (prefix attention + carried recurrent state) == one pass."""
    gen, _ = _gen(checkpoint_factory, name)
    chunked, _ = _gen(checkpoint_factory, name, prefill_chunk=7)
    prompt = torch.randint(0, 300, (40,)).tolist()
    params = SamplingParams(max_new_tokens=16)
    assert gen.generate([prompt], params)[0].token_ids == chunked.generate([prompt], params)[0].token_ids


def test_sampling_is_seeded_and_greedy_ignores_seed(checkpoint_factory):
    gen, _ = _gen(checkpoint_factory, "qwen3")
    p = [torch.randint(0, 300, (9,)).tolist()] * 2
    s1 = SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=7)
    a, b = gen.generate(p, s1), gen.generate(p, s1)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert a[0].token_ids == a[1].token_ids  # each request's stream is its seed's
    unseeded = gen.generate(p, SamplingParams(max_new_tokens=20, temperature=1.0))
    assert unseeded[0].token_ids != unseeded[1].token_ids  # without a seed each request draws its own
    c = gen.generate(p, SamplingParams(max_new_tokens=20, temperature=1.0, seed=8))
    assert c[0].token_ids != a[0].token_ids
    g1 = gen.generate(p, SamplingParams(max_new_tokens=20, seed=1))
    g2 = gen.generate(p, SamplingParams(max_new_tokens=20, seed=2))
    assert g1[0].token_ids == g2[0].token_ids == g1[1].token_ids
    top1 = gen.generate(p, SamplingParams(max_new_tokens=20, temperature=0.7, top_k=1, seed=3))
    assert top1[0].token_ids == g1[0].token_ids


def test_top_k_top_p_filtering():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_k=3))
    assert (probs[0, 3:] == 0).all() and torch.allclose(probs.sum(), torch.tensor(1.0))
    full = torch.softmax(logits, -1)[0]
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_p=float(full[0]) + 1e-3))
    assert (probs[0, :2] > 0).all() and (probs[0, 2:] == 0).all()


def test_sampling_distribution_matches_softmax():
    from specpilot.runtime.sampling import race

    logits = torch.tensor([[1.0, 0.0, -0.5, 2.0]]).expand(20000, 4)
    gen = torch.Generator().manual_seed(0)
    draws = race(filtered_probs(logits, SamplingParams(temperature=1.0)), gen)
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    assert (freq - torch.softmax(logits[0], -1)).abs().max() < 0.015


def test_eos_and_stop_strings(checkpoint_factory):
    path, _ = checkpoint_factory("llama")
    model = load_model(str(path), "cpu", "float32")
    tok = load_tokenizer(str(path))
    prompt = tok.encode("def add(a, b):")
    free = Generator(ModelRunner(model), (), tok).generate([prompt], SamplingParams(max_new_tokens=12))[0]
    eos = free.token_ids[4]
    stopped = Generator(ModelRunner(model), (eos,), tok).generate([prompt], SamplingParams(max_new_tokens=12))
    assert stopped[0].finish_reason == "eos" and stopped[0].token_ids == free.token_ids[:free.token_ids.index(eos) + 1]
    stop = free.text[3:6]
    res = Generator(ModelRunner(model), (), tok).generate([prompt], SamplingParams(max_new_tokens=12,
                                                                                stop=(stop,)))[0]
    assert res.finish_reason == "stop" and res.text == free.text[:free.text.find(stop)]


def test_prompt_longer_than_context_is_rejected(checkpoint_factory):
    gen, _ = _gen(checkpoint_factory, "llama")
    with pytest.raises(ValueError, match="exceeds the model's context of 512"):
        gen.generate([[1] * 500], SamplingParams(max_new_tokens=20))


@pytest.mark.parametrize("name", FAMILIES)
def test_block_write_keep_and_state_restore(name, checkpoint_factory):
    """A block of T tokens written under a custom mask, some kept (compacted) and recurrent state restored,
    leaves the cache as if only the kept tokens had been prefilled."""
    path, _ = checkpoint_factory(name)
    model = load_model(str(path), "cpu", "float32")
    prompt = torch.randint(0, 300, (1, 12))
    extra = torch.randint(0, 300, (1, 4))
    fresh = ModelCache(model.config, 1, 32, "cpu", torch.float32)
    with torch.no_grad():
        model(BatchMetadata.contiguous(torch.cat([prompt, extra[:, :2]], 1), torch.tensor([0]), torch.tensor([0]), 0),
              fresh)
        cache = ModelCache(model.config, 1, 32, "cpu", torch.float32)
        model(BatchMetadata.contiguous(prompt, torch.tensor([0]), torch.tensor([0]), 0), cache)
        snap = cache.snapshot(torch.tensor([0]))
        # a 4-token block stored at 12..15, run as one causal block; keep tokens 0 and 1
        model(BatchMetadata.contiguous(extra, torch.tensor([12]), torch.tensor([0]), 12), cache)
        cache.keep(PathIndex.build([0], [0], [[0, 1]], "cpu", bases=[12]))  # in place: nothing moves
        if model.config.is_hybrid:
            cache.restore(snap)
            model(BatchMetadata.contiguous(extra[:, :2], torch.tensor([12]), torch.tensor([0]), 12), cache)
    torch.testing.assert_close(cache.k[:, :, :, :14], fresh.k[:, :, :, :14], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cache.v[:, :, :, :14], fresh.v[:, :, :, :14], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cache.ssm, fresh.ssm, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cache.conv, fresh.conv, rtol=1e-4, atol=1e-5)


def test_custom_block_mask_matches_separate_paths(checkpoint_factory):
    """Two branches in one block under an ancestor mask give each branch's chain logits (dense target)."""
    path, _ = checkpoint_factory("qwen3")
    model = load_model(str(path), "cpu", "float32")
    prompt = torch.randint(0, 300, (1, 10))
    a, b = torch.randint(0, 300, (2,)).tolist()
    with torch.no_grad():
        cache = ModelCache(model.config, 1, 32, "cpu", torch.float32)
        model(BatchMetadata.contiguous(prompt, torch.tensor([0]), torch.tensor([0]), 0), cache)
        # nodes: 0 = a (depth 0), 1 = b (depth 0, sibling of a): each sees only itself
        ids = torch.tensor([[a, b]])
        mask = torch.eye(2, dtype=torch.bool)[None]
        pos = torch.tensor([[10, 10]])
        meta = BatchMetadata(ids, pos, torch.tensor([[10, 11]]), torch.tensor([0]), torch.tensor([10]), 10, mask)
        tree = model.logits(model(meta, cache))
        for j, tok in enumerate((a, b)):
            c = ModelCache(model.config, 1, 32, "cpu", torch.float32)
            model(BatchMetadata.contiguous(prompt, torch.tensor([0]), torch.tensor([0]), 0), c)
            chain = model.logits(model(BatchMetadata.contiguous(torch.tensor([[tok]]), torch.tensor([10]),
                                                                torch.tensor([0]), 10), c))
            torch.testing.assert_close(tree[0, j], chain[0, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_decode_gemv_path_matches_transformers(name, checkpoint_factory):
    """The decode GEMV path (every single-row projection through ops.gemv; its reference on CPU) keeps greedy
    output identical to transformers."""
    path, hf = checkpoint_factory(name)
    runner = ModelRunner(load_model(str(path), "cpu", "float32"))
    set_paths(runner, "decode", gemv=True)
    prompt = torch.randint(0, 300, (13,)).tolist()
    ours = Generator(runner).generate([prompt], SamplingParams(max_new_tokens=32))[0].token_ids
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == ref


def test_hybrid_tree_block_matches_separate_paths(checkpoint_factory):
    """Two sibling branches of a tree block on a hybrid target give each branch's own chain logits, and the
    recurrent state is left untouched by the tree pass."""
    path, _ = checkpoint_factory("qwen3_5")
    model = load_model(str(path), "cpu", "float32")
    prompt = torch.randint(0, 300, (1, 10))
    a, b, c = torch.randint(0, 300, (3,)).tolist()
    with torch.no_grad():
        cache = ModelCache(model.config, 1, 32, "cpu", torch.float32)
        model(BatchMetadata.contiguous(prompt, torch.tensor([0]), torch.tensor([0]), 0), cache)
        before = cache.ssm.clone()
        # nodes: 0 = a, 1 = b (sibling of a), 2 = c (child of b)
        mask = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 1, 1]], dtype=torch.bool)[None]
        meta = BatchMetadata(torch.tensor([[a, b, c]]), torch.tensor([[10, 10, 11]]), torch.tensor([[10, 11, 12]]),
                             torch.tensor([0]), torch.tensor([10]), 10, mask, parents=torch.tensor([[-1, -1, 1]]))
        tree = model.logits(model(meta, cache))
        assert torch.equal(cache.ssm, before)
        for nodes, tokens in (([0], [a]), ([1, 2], [b, c])):
            fresh = ModelCache(model.config, 1, 32, "cpu", torch.float32)
            model(BatchMetadata.contiguous(prompt, torch.tensor([0]), torch.tensor([0]), 0), fresh)
            chain = model.logits(model(BatchMetadata.contiguous(torch.tensor([tokens]), torch.tensor([10]),
                                                                torch.tensor([0]), 10), fresh))
            torch.testing.assert_close(tree[0, nodes], chain[0], rtol=1e-4, atol=1e-5)
