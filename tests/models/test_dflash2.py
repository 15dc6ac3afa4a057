"""DFlash2: the public `DFlash2DraftModel` layout (the z-lab fixture's config keys, bare codebook tensors, bf16)
loads through the real loader, the drafter's block forward and selector walk equal an independent re-implementation
written from the published description, and each wrong or missing key / config field is named."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specpilot.checkpoint.errors import CheckpointError
from specpilot.config import ConfigError
from specpilot.models.loader import load_model
from specpilot.runtime.runner import ModelRunner
from specpilot.spec_decode.drafters.dflash2 import load_dflash2
from specpilot.spec_decode.tree import TreeSpec

H, I, NH, NKV, HD, LAYERS, BLOCK, VOCAB, MASK = 64, 96, 4, 2, 16, 2, 6, 320, 317
TAPS, GROUP, RANK, TOPK = 2, 16, 8, 5
TARGET_LAYERS = [0, 2]


def dflash2_tensors(seed: int = 3, dtype=torch.bfloat16) -> dict:
    """Random weights under exactly the public key names and shapes (z-lab DFlash2DraftModel)."""
    gen = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.08, centre=0.0):
        return (centre + torch.randn(*shape, generator=gen) * scale).to(dtype)

    G = H // GROUP
    t = {"fc.weight": w(H, len(TARGET_LAYERS) * H), "hidden_norm.weight": w(H, scale=0.2, centre=1),
         "norm.weight": w(H, scale=0.2, centre=1),
         "candidate_selector.hidden_projection.weight": w(RANK, H, scale=0.3),
         "candidate_selector.predecessor_codebook": w(VOCAB, RANK, scale=0.5),
         "candidate_selector.successor_codebook": w(VOCAB, RANK, scale=0.5)}
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
        for conv in ("attention_conv", "mlp_conv"):
            t |= {f"{p}{conv}.base_kernel": w(2, TAPS, H, scale=0.3, centre=0.5),
                  f"{p}{conv}.kernel_projection.weight": w(2 * TAPS * G, H, scale=0.1)}
    return t


def dflash2_config(**overrides) -> dict:
    """The fixture's config keys (dflash2-config.json), at tiny sizes."""
    cfg = {"architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "is_causal": False,
           "vocab_size": VOCAB, "hidden_size": H, "intermediate_size": I, "num_hidden_layers": LAYERS,
           "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "rms_norm_eps": 1e-6,
           "max_position_embeddings": 512, "num_target_layers": 3, "sliding_window": 2048,
           "layer_types": ["sliding_attention"] * LAYERS,
           "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
           "torch_dtype": "bfloat16", "tie_word_embeddings": False,
           "dflash_config": {"block_size": BLOCK, "conv_group_size": GROUP, "conv_kernel_size": TAPS,
                             "final_logit_softcapping": 20.0, "mask_token_id": MASK, "output_multiplier": 0.7,
                             "input_embedding_scale": 1.3, "selector_rank": RANK, "selector_top_k": TOPK,
                             "target_layer_ids": TARGET_LAYERS}}
    for k, v in overrides.items():
        if k == "dflash_config":
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    return cfg


def write_dflash2(path, tensors=None, drop_config=(), **overrides):
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors if tensors is not None else dflash2_tensors(), str(path / "model.safetensors"),
              metadata={"format": "pt"})
    cfg = dflash2_config(**overrides)
    for key in drop_config:
        cfg["dflash_config"].pop(key)
    (path / "config.json").write_text(json.dumps(cfg))
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


def _conv(x, dyn, base):
    """y[i, c] = sum_t (base[t, c] + dyn[i, t, c // GROUP]) * x[i - t, c], zero before the block."""
    y = torch.zeros_like(x)
    for i in range(x.shape[0]):
        for t in range(TAPS):
            if i - t >= 0:
                y[i] += (base[t] + dyn[i, t].repeat_interleave(GROUP)) * x[i - t]
    return y


def reference_proposal(t, target, features, root, depth):
    """DFlash2 written from the published description: DFlash v1's KV-injected bidirectional block with the
    grouped dynamic convolutions around each sublayer, logits x multiplier, tanh cap, then the selector's greedy
    walk over the top-K candidates."""
    t = {k: v.float() for k, v in t.items()}
    n = features.shape[0]
    ctx = _rms(features @ t["fc.weight"].T, t["hidden_norm.weight"])
    x = target.model.embed_tokens(torch.tensor([root] + [MASK] * (BLOCK - 1))) * 1.3
    pos_ctx, pos_blk = torch.arange(n), torch.arange(n, n + BLOCK)
    G = H // GROUP
    for i in range(LAYERS):
        p = f"layers.{i}."

        def conv_pair(name, h):
            dyn = (h @ t[f"{p}{name}.kernel_projection.weight"].T).view(BLOCK, 2, TAPS, G)
            return _conv(h, dyn[:, 0], t[f"{p}{name}.base_kernel"][0]), dyn[:, 1]

        h, dyn = conv_pair("attention_conv", _rms(x, t[p + "input_layernorm.weight"]))
        q = _rope(_rms((h @ t[p + "self_attn.q_proj.weight"].T).view(BLOCK, NH, HD), t[p + "self_attn.q_norm.weight"]),
                  pos_blk)
        kb = (torch.cat([ctx, h]) @ t[p + "self_attn.k_proj.weight"].T).view(n + BLOCK, NKV, HD)
        k = _rope(_rms(kb, t[p + "self_attn.k_norm.weight"]), torch.cat([pos_ctx, pos_blk]))
        v = (torch.cat([ctx, h]) @ t[p + "self_attn.v_proj.weight"].T).view(n + BLOCK, NKV, HD)
        k, v = k.repeat_interleave(NH // NKV, 1), v.repeat_interleave(NH // NKV, 1)
        att = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
        a = att.transpose(0, 1).reshape(BLOCK, NH * HD) @ t[p + "self_attn.o_proj.weight"].T
        x = x + _conv(a, dyn, t[f"{p}attention_conv.base_kernel"][1])
        h, dyn = conv_pair("mlp_conv", _rms(x, t[p + "post_attention_layernorm.weight"]))
        m = (F.silu(h @ t[p + "mlp.gate_proj.weight"].T) * (h @ t[p + "mlp.up_proj.weight"].T)) @ \
            t[p + "mlp.down_proj.weight"].T
        x = x + _conv(m, dyn, t[f"{p}mlp_conv.base_kernel"][1])
    hidden = _rms(x, t["norm.weight"])[1:1 + depth]
    logits = torch.tanh(target.logits(hidden) * 0.7 / 20.0) * 20.0
    unary, cand = logits.topk(TOPK, dim=-1)
    proj = hidden @ t["candidate_selector.hidden_projection.weight"].T
    prev, out = root, []
    for s in range(depth):
        scores = unary[s] + (t["candidate_selector.predecessor_codebook"][prev] * proj[s]) @ \
            t["candidate_selector.successor_codebook"][cand[s]].T
        prev = int(cand[s][scores.argmax()])
        out.append(prev)
    return out


def test_public_layout_loads_and_matches_the_reference(target, tmp_path):
    tensors = dflash2_tensors(seed=4)
    drafter = load_dflash2(write_dflash2(tmp_path / "d", tensors), target)
    assert drafter.name == "dflash2" and drafter.max_depth == BLOCK - 1 and drafter.target_layers == (0, 2)
    drafter.allocate(2, 64)
    prompt = torch.randint(0, 300, (11,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        runner = ModelRunner(target)
        runner.allocate(1, 32)
        _, features = runner.prefill_features(0, prompt, tuple(TARGET_LAYERS))
        drafter.start(1, prompt, features)
        for depth in (BLOCK - 1, 3):
            ours = drafter.propose([1], [42], TreeSpec.parse(f"chain:{depth}"))[0].tokens[1:]
            assert list(ours) == reference_proposal(tensors, target, features, 42, depth)


def test_tree_children_follow_the_selector_given_each_parent(target, tmp_path):
    """A tree's root children are the slot-0 candidates ranked by the pair score given the root; the first child's
    own children are ranked given that child; a width-1 static tree is the chain."""
    drafter = load_dflash2(write_dflash2(tmp_path / "d", dflash2_tensors(seed=5)), target)
    drafter.allocate(2, 64)
    prompt = list(range(3, 12))
    with torch.no_grad():
        runner = ModelRunner(target)
        runner.allocate(1, 32)
        _, features = runner.prefill_features(0, prompt, tuple(TARGET_LAYERS))
        drafter.start(0, prompt, features)
        chain = drafter.propose([0], [7], TreeSpec.parse("chain:4"))[0]
        assert drafter.propose([0], [7], TreeSpec.parse("static:1,1,1,1"))[0] == chain
        tree = drafter.propose([0], [7], TreeSpec.parse("static:3,2"))[0]
    assert tree.parents == (-1, 0, 0, 0, 1, 1, 2, 2, 3, 3)
    assert tree.tokens[1] == chain.tokens[1] and tree.tokens[4] == chain.tokens[2]
    assert len(set(tree.tokens[1:4])) == 3


def test_causal_layers_mask_the_block(target, tmp_path):
    """is_causal: true masks the block causally; sliding layers are causal unless is_causal says otherwise, full
    ones bidirectional (the reference's rule)."""
    drafter = load_dflash2(write_dflash2(tmp_path / "d", is_causal=True), target)
    assert bool(drafter._full_mask[0, 0, 1]) is False
    drafter = load_dflash2(write_dflash2(tmp_path / "e", layer_types=["full_attention"] * LAYERS,
                                         **{"is_causal": None}), target)
    assert bool(drafter._full_mask[0, 0, 1]) is True


@pytest.mark.parametrize("case,match", [
    ("missing", r"missing tensors \['candidate_selector.successor_codebook'\]"),
    ("suffixed", "candidate_selector.predecessor_codebook.weight: the public layout stores the selector's codebooks "
                 "as bare tensors"),
    ("unknown", "unexpected tensor 'layers.0.attention_conv.bias' for DFlash2DraftModel"),
    ("conv_shape", r"'layers.1.mlp_conv.kernel_projection.weight' has shape \(8, 64\), expected \(16, 64\)"),
    ("no_top_k", "a DFlash2 config needs dflash_config.selector_top_k"),
    ("group", "conv_group_size=24 does not divide hidden_size=64"),
    ("mask", "mask_token_id 999 is outside the target vocabulary"),
])
def test_bad_checkpoints_are_named(case, match, target, tmp_path):
    t = dflash2_tensors(seed=6)
    kw = {}
    if case == "missing":
        t.pop("candidate_selector.successor_codebook")
    elif case == "suffixed":
        t["candidate_selector.predecessor_codebook.weight"] = t.pop("candidate_selector.predecessor_codebook")
    elif case == "unknown":
        t["layers.0.attention_conv.bias"] = torch.zeros(H, dtype=torch.bfloat16)
    elif case == "conv_shape":
        t["layers.1.mlp_conv.kernel_projection.weight"] = torch.zeros(8, H, dtype=torch.bfloat16)
    elif case == "no_top_k":
        kw["drop_config"] = ("selector_top_k",)
    elif case == "group":
        kw["dflash_config"] = {"conv_group_size": 24}
    elif case == "mask":
        kw["dflash_config"] = {"mask_token_id": 999}
    with pytest.raises((CheckpointError, ConfigError), match=match):
        load_dflash2(write_dflash2(tmp_path / "d", t, **kw), target)
