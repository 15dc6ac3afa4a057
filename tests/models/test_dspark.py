"""DSpark: the public `Qwen3DSparkModel` layout (DeepSpec's config keys and full state dict, bf16) loads through the
real loader; the drafter's chain (anchor-as-first-prediction block, Markov walk) and its per-slot confidence equal an
independent re-implementation written from the published description; wrong or missing keys and fields are named."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specpilot.checkpoint.errors import CheckpointError
from specpilot.config import ConfigError
from specpilot.models.loader import load_model
from specpilot.runtime.runner import ModelRunner
from specpilot.spec_decode.drafters.dspark import load_dspark
from specpilot.spec_decode.tree import TreeSpec

H, I, NH, NKV, HD, LAYERS, BLOCK, VOCAB, MASK, RANK = 64, 96, 4, 2, 16, 2, 5, 320, 317, 8
TARGET_LAYERS = [0, 2]


def dspark_tensors(seed: int = 3, dtype=torch.bfloat16, markov: bool = True, confidence: bool = True,
                   embeddings: bool = True) -> dict:
    """Random weights under exactly DeepSpec's key names and shapes (its full state dict)."""
    gen = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.08, centre=0.0):
        return (centre + torch.randn(*shape, generator=gen) * scale).to(dtype)

    t = {"fc.weight": w(H, len(TARGET_LAYERS) * H), "hidden_norm.weight": w(H, scale=0.2, centre=1),
         "norm.weight": w(H, scale=0.2, centre=1)}
    if embeddings:
        t |= {"embed_tokens.weight": w(VOCAB, H, scale=0.5), "lm_head.weight": w(VOCAB, H, scale=0.3)}
    if markov:
        t |= {"markov_head.markov_w1.weight": w(VOCAB, RANK, scale=0.5),
              "markov_head.markov_w2.weight": w(VOCAB, RANK, scale=0.5)}
    if confidence:
        t |= {"confidence_head.proj.weight": w(1, H + RANK, scale=0.3), "confidence_head.proj.bias": w(1, scale=0.3)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        t |= {p + "input_layernorm.weight": w(H, scale=0.2, centre=1),
              p + "post_attention_layernorm.weight": w(H, scale=0.2, centre=1),
              p + "self_attn.q_proj.weight": w(NH * HD, H), p + "self_attn.k_proj.weight": w(NKV * HD, H),
              p + "self_attn.v_proj.weight": w(NKV * HD, H), p + "self_attn.o_proj.weight": w(H, NH * HD),
              p + "self_attn.q_norm.weight": w(HD, scale=0.2, centre=1),
              p + "self_attn.k_norm.weight": w(HD, scale=0.2, centre=1),
              p + "mlp.gate_proj.weight": w(I, H), p + "mlp.up_proj.weight": w(I, H),
              p + "mlp.down_proj.weight": w(H, I)}
    return t


def dspark_config(**overrides) -> dict:
    """DeepSpec's build_draft_config fields: the target's Qwen3 config plus the drafter's, at top level."""
    cfg = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": LAYERS, "num_attention_heads": NH, "num_key_value_heads": NKV,
           "head_dim": HD, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
           "layer_types": ["full_attention"] * LAYERS, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "num_target_layers": 3, "block_size": BLOCK, "mask_token_id": MASK, "target_layer_ids": TARGET_LAYERS,
           "num_anchors": 512, "enable_confidence_head": True, "confidence_head_with_markov": True,
           "markov_rank": RANK, "markov_head_type": "vanilla"}
    cfg.update(overrides)
    return {k: v for k, v in cfg.items() if v is not None}


def write_dspark(path, tensors=None, **overrides):
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors if tensors is not None else dspark_tensors(), str(path / "model.safetensors"),
              metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(dspark_config(**overrides)))
    return path


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from tests.checkpoints import write_checkpoint

    path = tmp_path_factory.mktemp("qwen3")
    write_checkpoint("qwen3", path)
    return load_model(str(path), "cpu", "float32")


def _rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    f = pos[:, None].float() * inv[None]
    cos, sin = torch.cat([f, f], -1).cos()[:, None], torch.cat([f, f], -1).sin()[:, None]
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_chain(t, features, root, depth):
    """DSpark from the published description: the DFlash backbone over [root, MASK x (B-1)] with the target context
    injected as keys/values; slot i predicts the token i+1 after the root through its own lm_head plus the Markov
    bias W2 W1[previous token], walked left to right; confidence sigmoid(proj([h ; W1[previous]]))."""
    t = {k: v.float() for k, v in t.items()}
    n = features.shape[0]
    ctx = _rms(features @ t["fc.weight"].T, t["hidden_norm.weight"])
    x = t["embed_tokens.weight"][torch.tensor([root] + [MASK] * (BLOCK - 1))]
    pos_ctx, pos_blk = torch.arange(n), torch.arange(n, n + BLOCK)
    for i in range(LAYERS):
        p = f"layers.{i}."
        h = _rms(x, t[p + "input_layernorm.weight"])
        q = _rope(_rms((h @ t[p + "self_attn.q_proj.weight"].T).view(BLOCK, NH, HD), t[p + "self_attn.q_norm.weight"]),
                  pos_blk)
        kb = (torch.cat([ctx, h]) @ t[p + "self_attn.k_proj.weight"].T).view(n + BLOCK, NKV, HD)
        k = _rope(_rms(kb, t[p + "self_attn.k_norm.weight"]), torch.cat([pos_ctx, pos_blk]))
        v = (torch.cat([ctx, h]) @ t[p + "self_attn.v_proj.weight"].T).view(n + BLOCK, NKV, HD)
        k, v = k.repeat_interleave(NH // NKV, 1), v.repeat_interleave(NH // NKV, 1)
        att = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
        x = x + att.transpose(0, 1).reshape(BLOCK, NH * HD) @ t[p + "self_attn.o_proj.weight"].T
        h = _rms(x, t[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(h @ t[p + "mlp.gate_proj.weight"].T) * (h @ t[p + "mlp.up_proj.weight"].T)) @ \
            t[p + "mlp.down_proj.weight"].T
    hidden = _rms(x, t["norm.weight"])
    prev, tokens, conf = root, [], []
    for s in range(depth):
        e = t["markov_head.markov_w1.weight"][prev]
        logits = hidden[s] @ t["lm_head.weight"].T + t["markov_head.markov_w2.weight"] @ e
        conf.append(torch.sigmoid(torch.cat([hidden[s], e]) @ t["confidence_head.proj.weight"][0]
                                  + t["confidence_head.proj.bias"][0]).item())
        prev = int(logits.argmax())
        tokens.append(prev)
    return tokens, conf


def _started(target, drafter, prompt):
    runner = ModelRunner(target)
    runner.allocate(1, 32)
    with torch.no_grad():
        _, features = runner.prefill_features(0, prompt, tuple(TARGET_LAYERS))
    drafter.allocate(2, 64)
    drafter.start(1, prompt, features)
    return features


def test_public_layout_loads_and_matches_the_reference(target, tmp_path):
    tensors = dspark_tensors(seed=4)
    drafter = load_dspark(write_dspark(tmp_path / "d", tensors), target)
    assert drafter.name == "dspark" and drafter.max_depth == BLOCK and drafter.target_layers == (0, 2)
    prompt = torch.randint(0, 300, (11,), generator=torch.Generator().manual_seed(1)).tolist()
    features = _started(target, drafter, prompt)
    for depth in (BLOCK, 2):
        tree = drafter.propose([1], [42], TreeSpec.parse(f"chain:{depth}"))[0]
        tokens, conf = reference_chain(tensors, features, 42, depth)
        assert list(tree.tokens[1:]) == tokens
        torch.testing.assert_close(torch.tensor(drafter.confidence[1][1:]), torch.tensor(conf), rtol=1e-4, atol=1e-5)
        survival = torch.tensor(conf).cumprod(0)
        torch.testing.assert_close(torch.tensor(drafter.survival[1][1:]), survival, rtol=1e-4, atol=1e-5)


def test_tree_children_carry_their_parents_markov_bias(target, tmp_path):
    """A width-1 tree is the chain; a wider tree's first-child path is the chain's prefix; every child of one node
    shares that node's confidence; survival multiplies along paths."""
    drafter = load_dspark(write_dspark(tmp_path / "d", dspark_tensors(seed=5)), target)
    _started(target, drafter, list(range(3, 12)))
    chain = drafter.propose([1], [7], TreeSpec.parse("chain:3"))[0]
    chain_conf = drafter.confidence[1]
    assert drafter.propose([1], [7], TreeSpec.parse("static:1,1,1"))[0] == chain
    torch.testing.assert_close(torch.tensor(drafter.confidence[1]), torch.tensor(chain_conf))
    tree = drafter.propose([1], [7], TreeSpec.parse("static:3,2"))[0]
    assert tree.parents == (-1, 0, 0, 0, 1, 1, 2, 2, 3, 3)
    assert tree.tokens[1] == chain.tokens[1] and tree.tokens[4] == chain.tokens[2]
    c, s = drafter.confidence[1], drafter.survival[1]
    assert c[1] == c[2] == c[3] and c[4] == c[5] and c[4] != c[6]
    assert s[5] == pytest.approx(c[5] * c[1])


def test_without_heads_and_with_the_targets_embedding(target, tmp_path):
    """DeepSpec's DFlash checkpoints: the DSpark layout with markov_rank 0 and no confidence head; embed_tokens /
    lm_head may be left to the target (confidence then 1.0)."""
    t = dspark_tensors(seed=6, markov=False, confidence=False, embeddings=False)
    drafter = load_dspark(write_dspark(tmp_path / "d", t, markov_rank=0, enable_confidence_head=False,
                                       confidence_head_with_markov=None, markov_head_type=None), target)
    _started(target, drafter, list(range(3, 12)))
    tree = drafter.propose([1], [7], TreeSpec.parse("chain:4"))[0]
    logits = drafter.block_logits([1], [7])[0]
    assert list(tree.tokens[1:]) == logits.argmax(-1)[:4].tolist()
    assert drafter.confidence[1] == [1.0] * 5


@pytest.mark.parametrize("case,match", [
    ("missing", r"missing tensors \['markov_head.markov_w2.weight'\] for Qwen3DSparkModel"),
    ("conf_shape", r"'confidence_head.proj.weight' has shape \(1, 64\), expected \(1, 72\)"),
    ("no_rank", "a DSpark config needs markov_rank"),
    ("gated", "markov_head_type='gated'"),
    ("embedding_tap", r"target_layer_ids \[-1, 2\] reads the embedding output"),
    ("no_with_markov", "enable_confidence_head needs confidence_head_with_markov"),
    ("layers", r"target_layer_ids \[0, 5\] out of range for a 3-layer target"),
])
def test_bad_checkpoints_are_named(case, match, target, tmp_path):
    t = dspark_tensors(seed=7)
    kw = {}
    if case == "missing":
        t.pop("markov_head.markov_w2.weight")
    elif case == "conf_shape":
        t["confidence_head.proj.weight"] = torch.zeros(1, H, dtype=torch.bfloat16)
    elif case == "no_rank":
        kw["markov_rank"] = None
    elif case == "gated":
        kw["markov_head_type"] = "gated"
    elif case == "embedding_tap":
        kw["target_layer_ids"] = [-1, 2]
    elif case == "no_with_markov":
        kw["confidence_head_with_markov"] = None
    elif case == "layers":
        kw["target_layer_ids"] = [0, 5]
    with pytest.raises((CheckpointError, ConfigError), match=match):
        load_dspark(write_dspark(tmp_path / "d", t, **kw), target)
