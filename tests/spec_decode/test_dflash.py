"""DFlash block drafter: loads the z-lab checkpoint layout, matches an independent re-implementation of its
forward, and keeps speculative output equal to AR output."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specpilot.checkpoint.errors import CheckpointError
from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.models.loader import load_model
from specpilot.models.dflash import default_target_layers
from specpilot.spec_decode.drafters.dflash import load_dflash
from specpilot.spec_decode.tree import TreeSpec

H, I, NH, NKV, HD, LAYERS, BLOCK = 64, 96, 4, 2, 16, 2, 6
TARGET_LAYERS = [0, 2]


def dflash_tensors(gen: torch.Generator) -> dict:
    """Random weights under exactly the public key names and shapes (z-lab DFlashDraftModel)."""
    def w(*shape, scale=0.08):
        return torch.randn(*shape, generator=gen) * scale

    t = {"fc.weight": w(H, len(TARGET_LAYERS) * H), "hidden_norm.weight": 1 + w(H, scale=0.2),
         "norm.weight": 1 + w(H, scale=0.2)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        t |= {p + "input_layernorm.weight": 1 + w(H, scale=0.2), p + "post_attention_layernorm.weight": 1 + w(H, scale=0.2),
              p + "self_attn.q_proj.weight": w(NH * HD, H), p + "self_attn.k_proj.weight": w(NKV * HD, H),
              p + "self_attn.v_proj.weight": w(NKV * HD, H), p + "self_attn.o_proj.weight": w(H, NH * HD),
              p + "self_attn.q_norm.weight": 1 + w(HD, scale=0.2), p + "self_attn.k_norm.weight": 1 + w(HD, scale=0.2),
              p + "mlp.gate_proj.weight": w(I, H), p + "mlp.up_proj.weight": w(I, H), p + "mlp.down_proj.weight": w(H, I)}
    return t


def write_dflash(path, tensors=None, **config_overrides):
    path.mkdir(parents=True, exist_ok=True)
    tensors = tensors if tensors is not None else dflash_tensors(torch.Generator().manual_seed(3))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": 320, "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": LAYERS, "num_attention_heads": NH, "num_key_value_heads": NKV,
           "head_dim": HD, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
           "block_size": BLOCK, "num_target_layers": 3,
           "dflash_config": {"mask_token_id": 317, "target_layer_ids": TARGET_LAYERS}}
    cfg.update(config_overrides)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture
def target(checkpoint_factory):
    path, _ = checkpoint_factory("qwen3")
    return load_model(str(path), "cpu", "float32")


def _prompts():
    gen = torch.Generator().manual_seed(9)
    return [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (5, 16, 9)]


@pytest.mark.parametrize("tree", ["chain:5", "chain:3", "static:2,2,1", "dynamic:3,4,8"])
def test_speculative_equals_autoregressive(tree, target, tmp_path):
    drafter = load_dflash(write_dflash(tmp_path / "d"), target)
    params = SamplingParams(max_new_tokens=24)
    ref = [r.token_ids for r in Generator(ModelRunner(target)).generate(_prompts(), params)]
    out = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(tree)).generate(_prompts(), params)
    assert [r.token_ids for r, _ in out] == ref


@pytest.mark.parametrize("tree", ["chain:5", "dynamic:3,4,8"])
def test_hybrid_target(tree, checkpoint_factory, tmp_path):
    path, _ = checkpoint_factory("qwen3_5", hidden_size=H)
    target = load_model(str(path), "cpu", "float32")
    drafter = load_dflash(write_dflash(tmp_path / "d", num_target_layers=4, dflash_config={
        "mask_token_id": 300, "target_layer_ids": [1, 3]}), target)
    params = SamplingParams(max_new_tokens=20)
    ref = [r.token_ids for r in Generator(ModelRunner(target)).generate(_prompts(), params)]
    out = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(tree)).generate(_prompts(), params)
    assert [r.token_ids for r, _ in out] == ref


def _rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    f = pos[:, None].float() * inv[None]
    cos, sin = torch.cat([f, f], -1).cos()[:, None], torch.cat([f, f], -1).sin()[:, None]
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_block_logits(t, target, features, root, mask_id):
    """DFlash v1 forward written from the published description: KV injection of the projected target context
    into every layer, bidirectional attention inside the block."""
    n = features.shape[0]
    ctx = _rms(features @ t["fc.weight"].T, t["hidden_norm.weight"])
    x = target.model.embed_tokens(torch.tensor([root] + [mask_id] * (BLOCK - 1)))
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
    return target.logits(_rms(x, t["norm.weight"]))[1:]


def test_forward_matches_independent_reference(target, tmp_path):
    tensors = dflash_tensors(torch.Generator().manual_seed(4))
    drafter = load_dflash(write_dflash(tmp_path / "d", tensors), target)
    drafter.allocate(2, 64)
    prompt = torch.randint(0, 300, (11,)).tolist()
    with torch.no_grad():
        runner = ModelRunner(target)
        runner.allocate(1, 32)
        _, features = runner.prefill_features(0, prompt, tuple(TARGET_LAYERS))
        drafter.start(1, prompt, features)
        ours = drafter.block_logits([1], [42])[0]
        ref = reference_block_logits(tensors, target, features, 42, 317)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


def test_bad_checkpoints_are_named(target, tmp_path):
    tensors = dflash_tensors(torch.Generator().manual_seed(5))
    missing = dict(tensors)
    missing.pop("layers.1.mlp.up_proj.weight")
    with pytest.raises(CheckpointError, match="missing tensors.*layers.1.mlp.up_proj.weight"):
        load_dflash(write_dflash(tmp_path / "a", missing), target)
    bad = dict(tensors, **{"fc.weight": torch.zeros(H, 3 * H)})
    with pytest.raises(CheckpointError, match="'fc.weight' has shape"):
        load_dflash(write_dflash(tmp_path / "b", bad), target)
    with pytest.raises(CheckpointError, match="mask_token_id 999 is outside"):
        load_dflash(write_dflash(tmp_path / "c", dflash_config={"mask_token_id": 999,
                                                                 "target_layer_ids": TARGET_LAYERS}), target)
    with pytest.raises(CheckpointError, match="hidden_size 32 differs"):
        load_dflash(write_dflash(tmp_path / "e", hidden_size=32), target)


def test_default_target_layers_follow_the_reference_spread():
    assert default_target_layers(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layers(36, 1) == (18,)


def test_registry_builds_dflash_and_rejects_other_vocabularies(target, tmp_path):
    from specpilot.spec_decode.drafters.registry import build_drafter

    assert build_drafter(str(write_dflash(tmp_path / "d")), target).name == "dflash"
    with pytest.raises(CheckpointError, match="vocab_size 300 differs"):
        build_drafter(str(write_dflash(tmp_path / "v", vocab_size=300)), target)


def test_a_reallocated_cache_drops_the_pending_extensions_of_the_old_one(target, tmp_path):
    """A finished request's last commit stays pending until its slot restarts; when the cache is allocated anew
    (another engine of other sizes on the same drafter) those extensions belong to a cache that is gone."""
    drafter = load_dflash(write_dflash(tmp_path / "d"), target)
    width = drafter.model.fc.weight.shape[1]
    drafter.allocate(4, 64)
    drafter.start(3, list(range(6)), torch.randn(6, width))  # slot 3 never proposes again
    drafter.allocate(2, 128)  # fewer slots, longer: a new cache
    prompt = list(range(2 * BLOCK + 3))  # longer than a block: its extension flushes everything pending
    drafter.start(0, prompt, torch.randn(len(prompt), width))
    tree = drafter.propose([0], [5], TreeSpec.parse("chain:3"))[0]
    assert tree.num_nodes == 4
