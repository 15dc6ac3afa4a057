"""EAGLE-3 head drafter on tiny random checkpoints in the SafeAILab key format (CPU, fp32).

The target is the tiny "llama" case with 8 layers (EAGLE-3 taps the inputs of layers 2, L//2, L-3, which
needs L >= 7), so the head reads the outputs of layers (1, 3, 4).
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specpilot.checkpoint.errors import CheckpointError
from specpilot.config import ConfigError
from specpilot.engine.engine import SpecEngine
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.models.loader import load_model
from specpilot.models.eagle3 import eagle3_target_layers
from specpilot.spec_decode.drafters.eagle3 import Eagle3Drafter
from specpilot.spec_decode.drafters.registry import build_drafter
from specpilot.spec_decode.tree import DraftTree, TreeSpec

H, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, DRAFT_VOCAB, TARGET_LAYERS = 64, 4, 2, 16, 96, 320, 200, 8
EPS, THETA = 1e-6, 10000.0
PARAMS = SamplingParams(max_new_tokens=24)


def eagle3_tensors(seed: int = 0, own_embedding: bool = False) -> dict[str, torch.Tensor]:
    """Random tensors with exactly the public key names and shapes; a non-identity d2t/t2d draft vocabulary."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=None):
        return torch.randn(*shape, generator=g) * (scale or shape[-1] ** -0.5)

    def norm():
        return 1.0 + 0.2 * torch.randn(H, generator=g)

    ids = torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB].sort().values  # target id of each draft id
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    out = {
        "midlayer.self_attn.q_proj.weight": w(HEADS * HEAD_DIM, 2 * H),
        "midlayer.self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, 2 * H),
        "midlayer.self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, 2 * H),
        "midlayer.self_attn.o_proj.weight": w(H, HEADS * HEAD_DIM),
        "midlayer.mlp.gate_proj.weight": w(INTER, H),
        "midlayer.mlp.up_proj.weight": w(INTER, H),
        "midlayer.mlp.down_proj.weight": w(H, INTER),
        "midlayer.input_layernorm.weight": norm(),
        "midlayer.hidden_norm.weight": norm(),
        "midlayer.post_attention_layernorm.weight": norm(),
        "fc.weight": w(H, 3 * H),
        "norm.weight": norm(),
        "lm_head.weight": w(DRAFT_VOCAB, H, scale=0.5),
        "d2t": ids - torch.arange(DRAFT_VOCAB),
        "t2d": t2d,
    }
    if own_embedding:
        out["embed_tokens.weight"] = w(VOCAB, H, scale=1.0)
    return out


def eagle3_config(**overrides) -> dict:
    cfg = dict(architectures=["LlamaForCausalLMEagle3"], hidden_size=H, intermediate_size=INTER,
               num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, rms_norm_eps=EPS,
               rope_theta=THETA, vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB, num_hidden_layers=1,
               max_position_embeddings=512, torch_dtype="float32")
    return {**cfg, **overrides}


def write_eagle3(path, tensors=None, **config):
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors if tensors is not None else eagle3_tensors(), str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(eagle3_config(**config)))
    return path


@pytest.fixture(scope="module")
def target(checkpoint_factory):
    path, _ = checkpoint_factory("llama", num_hidden_layers=TARGET_LAYERS)
    return load_model(str(path), "cpu", "float32")


@pytest.fixture(scope="module")
def eagle_dir(tmp_path_factory):
    return write_eagle3(tmp_path_factory.mktemp("eagle3"))


def _prompts():
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (4, 15, 9)]


def test_target_layers_follow_eagle3_taps():
    assert eagle3_target_layers(32) == (1, 15, 28)  # inputs of 2, 16, 29 = outputs of 1, 15, 28
    assert eagle3_target_layers(8) == (1, 3, 4)
    assert eagle3_target_layers(3, [1, 2, 3]) == (0, 1, 2)
    with pytest.raises(ConfigError, match="at least 7 layers"):
        eagle3_target_layers(3)


@pytest.mark.parametrize("arch", ["LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"])
def test_registry_builds_eagle3(arch, target, tmp_path):
    drafter = build_drafter(str(write_eagle3(tmp_path / arch, architectures=[arch])), target)
    assert isinstance(drafter, Eagle3Drafter)
    assert drafter.target_layers == (1, 3, 4)
    assert drafter.embed is target.model.embed_tokens  # no embed_tokens.weight in the checkpoint: borrowed
    ids = eagle3_tensors()["d2t"] + torch.arange(DRAFT_VOCAB)
    assert torch.equal(drafter.draft_to_target, ids) and not torch.equal(ids, torch.arange(DRAFT_VOCAB))


class _Recorder:
    """Wraps a drafter, recording the trees it proposes."""

    def __init__(self, inner):
        self.inner, self.trees = inner, []
        self.name, self.target_layers = inner.name, inner.target_layers

    def allocate(self, *a):
        self.inner.allocate(*a)

    def start(self, *a):
        self.inner.start(*a)

    def commit(self, *a):
        self.inner.commit(*a)

    def propose(self, slots, roots, spec):
        trees = self.inner.propose(slots, roots, spec)
        self.trees += trees
        return trees


@pytest.mark.parametrize("tree", ["chain:4", "dynamic:3,4,8", "static:3,2,1"])
def test_speculative_equals_autoregressive(tree, target, eagle_dir):
    prompts = _prompts()
    reference = [r.token_ids for r in Generator(ModelRunner(target)).generate(prompts, PARAMS)]
    drafter = _Recorder(build_drafter(str(eagle_dir), target))
    spec = TreeSpec.parse(tree)
    engine = SpecEngine(ModelRunner(target), drafter, spec, scheduler=SchedulerConfig(adaptive=False))
    out = engine.generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == reference
    t2d = eagle3_tensors()["t2d"]
    drafted = [tok for t in drafter.trees for tok in t.tokens[1:]]
    assert drafted and all(t2d[tok] for tok in drafted)  # drafts are target ids of draft-vocab entries
    assert all(t.num_nodes <= spec.max_tree_nodes and max(t.depths) <= spec.depth for t in drafter.trees)
    if spec.kind == "dynamic":
        assert any(len(set(t.parents[1:])) < t.num_nodes - 1 for t in drafter.trees)  # real branching

    _check_head_cache(engine, out, drafter.inner, target)


class _Oracle(_Recorder):
    """Lets the EAGLE-3 head feed and draft as usual, then proposes a chain that starts with the true continuation
    (a random number of right tokens, then a wrong one), so that commits carry accepted drafts."""

    def __init__(self, inner, truth, seed=0):
        super().__init__(inner)
        self.truth, self.emitted, self.rng = truth, {}, torch.Generator().manual_seed(seed)

    def start(self, slot, prompt_ids, features):
        self.emitted[slot] = 0
        self.inner.start(slot, prompt_ids, features)

    def commit(self, slot, accepted, features):
        self.emitted[slot] += len(accepted)
        self.inner.commit(slot, accepted, features)

    def propose(self, slots, roots, spec):
        self.inner.propose(slots, roots, spec)
        trees = []
        for slot, root in zip(slots, roots):
            self.emitted[slot] += 1
            future = self.truth[slot][self.emitted[slot]:]
            right = int(torch.randint(0, spec.depth, (1,), generator=self.rng))
            chain = future[:right] + [(future[right] + 1) % VOCAB] if right < len(future) else future[:right]
            trees.append(DraftTree.chain([root] + chain))
        self.trees += trees
        return trees


def test_commits_of_accepted_drafts_keep_the_head_cache_exact(target, eagle_dir):
    prompts = _prompts()
    reference = [r.token_ids for r in Generator(ModelRunner(target)).generate(prompts, PARAMS)]
    drafter = _Oracle(build_drafter(str(eagle_dir), target), reference)
    engine = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse("chain:4"),
                        scheduler=SchedulerConfig(adaptive=False))
    out = engine.generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == reference
    assert all(s.tau > 1.5 for _, s in out)
    _check_head_cache(engine, out, drafter.inner, target)


def _check_head_cache(engine, out, head, target):
    """The head cache of every slot equals a fresh feed of its committed tokens with prefill features."""
    for req, (res, _) in zip(engine.requests, out):
        seen = head.seen[req.slot]
        tokens = req.prompt + res.token_ids
        assert len(tokens) > seen > len(req.prompt)
        runner = ModelRunner(target)
        runner.allocate(1, len(tokens) + 1)
        with torch.inference_mode():
            _, feats = runner.prefill_features(0, tokens[:seen], head.target_layers)
        fresh = Eagle3Drafter(head.head, target, head.target_layers)
        fresh.allocate(1, seen + 1)
        fresh.start(0, tokens[:seen], feats)
        with torch.inference_mode():
            fresh.feed(0, tokens[seen])
        torch.testing.assert_close(head.cache.k[:, req.slot, :, :seen], fresh.cache.k[:, 0, :, :seen],
                                   rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(head.cache.v[:, req.slot, :, :seen], fresh.cache.v[:, 0, :, :seen],
                                   rtol=1e-4, atol=1e-5)


# --- an independent plain-torch head step ------------------------------------------------------------------


def _rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def _rope(x, positions):
    """x [T, heads, D], rotate-half layout."""
    inv = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
    ang = positions[:, None].float() * inv[None]
    cos, sin = torch.cat((ang, ang), -1).cos()[:, None], torch.cat((ang, ang), -1).sin()[:, None]
    x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
    return x * cos + torch.cat((-x2, x1), -1) * sin


def reference_head(W, embedding, token_ids, fused, positions, mask, norm_before_residual=False):
    """h [T, H] and draft logits [T, draft_vocab] of EAGLE-3's midlayer: fused [T, H] paired with token_ids,
    attention under mask [T, T] (the whole sequence is recomputed: no cache)."""
    p = "midlayer."
    normed = _rms(fused, W[p + "hidden_norm.weight"])
    x = torch.cat((_rms(embedding[token_ids], W[p + "input_layernorm.weight"]), normed), -1)
    T = x.shape[0]
    q = (x @ W[p + "self_attn.q_proj.weight"].T).view(T, HEADS, HEAD_DIM)
    k = (x @ W[p + "self_attn.k_proj.weight"].T).view(T, KV_HEADS, HEAD_DIM)
    v = (x @ W[p + "self_attn.v_proj.weight"].T).view(T, KV_HEADS, HEAD_DIM)
    q, k = _rope(q, positions), _rope(k, positions)
    k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(HEAD_DIM)
    scores = scores.masked_fill(~mask[None], float("-inf"))
    attn = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, HEADS * HEAD_DIM)
    r = (normed if norm_before_residual else fused) + attn @ W[p + "self_attn.o_proj.weight"].T
    n = _rms(r, W[p + "post_attention_layernorm.weight"])
    h = r + (F.silu(n @ W[p + "mlp.gate_proj.weight"].T) * (n @ W[p + "mlp.up_proj.weight"].T)) @ W[
        p + "mlp.down_proj.weight"].T
    return h, _rms(h, W["norm.weight"]) @ W["lm_head.weight"].T


@pytest.mark.parametrize("own_embedding,norm_before_residual", [(False, False), (True, True)])
def test_head_matches_plain_torch_reference(own_embedding, norm_before_residual, target, tmp_path):
    W = eagle3_tensors(seed=3, own_embedding=own_embedding)
    path = write_eagle3(tmp_path / "e3", W, norm_before_residual=norm_before_residual)
    drafter = build_drafter(str(path), target)
    embedding = W["embed_tokens.weight"] if own_embedding else target.model.embed_tokens.weight
    assert (drafter.embed is target.model.embed_tokens) == (not own_embedding)
    prompt, root = _prompts()[2], 17
    runner = ModelRunner(target)
    runner.allocate(1, 32)
    drafter.allocate(1, 32)
    with torch.inference_mode():
        _, feats = runner.prefill_features(0, prompt, drafter.target_layers)
        drafter.start(0, prompt, feats)
        h = drafter.feed(0, root)
        logits = drafter.draft_logits(h)
    P = len(prompt)
    # pair (feature of position p, token p+1) at position p; the root pairs with the last prompt feature
    fused = feats @ W["fc.weight"].T
    ids = torch.tensor(prompt[1:] + [root])
    causal = torch.ones(P, P, dtype=torch.bool).tril()
    ref_h, ref_logits = reference_head(W, embedding, ids, fused, torch.arange(P), causal, norm_before_residual)
    torch.testing.assert_close(h, ref_h, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)

    # depth 1 (training-time test): the drafted token pairs with the head's own output h at position P
    d2t = W["d2t"]
    first = int(ref_logits[-1].argmax())
    tok1 = first + int(d2t[first])
    ids2 = torch.cat((ids, torch.tensor([tok1])))
    fused2 = torch.cat((fused, ref_h[-1:]))
    ref_h2, ref_logits2 = reference_head(W, embedding, ids2, fused2, torch.arange(P + 1),
                                         torch.ones(P + 1, P + 1, dtype=torch.bool).tril(), norm_before_residual)
    with torch.inference_mode():
        tree_h = drafter._tree_hidden(0, DraftTree((root, tok1), (-1, 0)), {0: h[-1]})
        chain = drafter._greedy_chain(0, h[-1], 2)
    torch.testing.assert_close(drafter.draft_logits(tree_h)[0], ref_logits2[-1], rtol=1e-4, atol=1e-4)
    second = int(ref_logits2[-1].argmax())
    assert chain == [tok1, second + int(d2t[second])]

    # a two-branch tree: siblings at the same position do not see each other
    alt = int(ref_logits[-1].topk(2).indices[1])
    tok_alt = alt + int(d2t[alt])
    with torch.inference_mode():
        tree_h = drafter._tree_hidden(0, DraftTree((root, tok1, tok_alt), (-1, 0, 0)), {0: h[-1]})
    ref_alt, _ = reference_head(W, embedding, torch.cat((ids, torch.tensor([tok_alt]))), fused2,
                                torch.arange(P + 1), torch.ones(P + 1, P + 1, dtype=torch.bool).tril(),
                                norm_before_residual)
    torch.testing.assert_close(tree_h[0], ref_h2[-1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(tree_h[1], ref_alt[-1], rtol=1e-4, atol=1e-4)


# --- checkpoint errors -------------------------------------------------------------------------------------


def _broken(kind):
    W = eagle3_tensors()
    if kind == "missing":
        del W["midlayer.hidden_norm.weight"]
    elif kind == "extra":
        W["midlayer.extra.weight"] = torch.zeros(3)
    elif kind == "shape":
        W["fc.weight"] = torch.zeros(H, 2 * H)
    elif kind == "d2t":
        W["d2t"] = W["d2t"] + VOCAB
    return W


@pytest.mark.parametrize("kind,config,match", [
    ("missing", {}, r"missing tensors \['midlayer\.hidden_norm\.weight'\]"),
    ("extra", {}, r"model\.safetensors: unexpected tensor 'midlayer\.extra\.weight'"),
    ("shape", {}, r"model\.safetensors: tensor 'fc\.weight' has shape \(64, 128\), expected \(64, 192\)"),
    ("d2t", {}, r"d2t maps draft ids outside the target vocabulary"),
    ("none", {"vocab_size": VOCAB + 1}, r"EAGLE-3 vocab_size 321 differs from the target's 320"),
    ("none", {"num_hidden_layers": 2}, r"EAGLE-3 heads have one decoder layer"),
])
def test_bad_checkpoints_fail_clearly(kind, config, match, target, tmp_path):
    path = write_eagle3(tmp_path / kind, _broken(kind), **config)
    with pytest.raises((CheckpointError, ConfigError), match=match) as err:
        build_drafter(str(path), target)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("tree", ["chain:4", "dynamic:3,4,8"])
def test_hybrid_target(tree, checkpoint_factory, eagle_dir):
    """The head on a Qwen3.5 hybrid target (8 layers, full attention every 4th, the rest Gated DeltaNet): the taps
    come from the tree verify pass like a dense target's, and greedy output equals AR for a batch of 3."""
    path, _ = checkpoint_factory("qwen3_5", num_hidden_layers=TARGET_LAYERS, full_attention_interval=4)
    hybrid = load_model(str(path), "cpu", "float32")
    assert hybrid.config.is_hybrid
    prompts = _prompts()
    reference = [r.token_ids for r in Generator(ModelRunner(hybrid)).generate(prompts, PARAMS)]
    engine = SpecEngine(ModelRunner(hybrid), build_drafter(str(eagle_dir), hybrid), TreeSpec.parse(tree),
                        scheduler=SchedulerConfig(adaptive=False))
    assert [r.token_ids for r, _ in engine.generate(prompts, PARAMS)] == reference
