"""Loader: every tensor consumed once, clear errors for tensors that do not fit the model, sharded and prefixed
layouts, the tokenizer (finding and reading the files: tests/checkpoint/)."""

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from specpilot.checkpoint.errors import CheckpointError
from specpilot.config import ConfigError, ModelConfig
from specpilot.models.loader import build_empty, load_model, load_tokenizer, plan_load


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _rewrite(path, fn):
    f = path / "model.safetensors"
    tensors = load_file(str(f))
    fn(tensors)
    save_file(tensors, str(f), metadata={"format": "pt"})


def test_missing_tensor_is_named(checkpoint_factory, tmp_path):
    path = _copy(checkpoint_factory("qwen3")[0], tmp_path / "m")
    _rewrite(path, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensors \['model.layers.1.self_attn.k_proj.weight'\]"):
        load_model(str(path))


def test_unexpected_tensor_is_named(checkpoint_factory, tmp_path):
    path = _copy(checkpoint_factory("qwen3")[0], tmp_path / "m")
    _rewrite(path, lambda t: t.__setitem__("model.layers.0.extra.weight", torch.ones(3)))
    with pytest.raises(CheckpointError, match=r"model.safetensors: unexpected tensor 'model.layers.0.extra.weight'"):
        load_model(str(path))


def test_misshaped_tensor_is_named(checkpoint_factory, tmp_path):
    path = _copy(checkpoint_factory("llama")[0], tmp_path / "m")
    _rewrite(path, lambda t: t.__setitem__("model.norm.weight", torch.ones(65)))
    with pytest.raises(CheckpointError, match=r"'model.norm.weight' has shape \(65,\), expected \(64,\)"):
        load_model(str(path))


def test_unknown_architecture(checkpoint_factory, tmp_path):
    path = _copy(checkpoint_factory("llama")[0], tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="MambaForCausalLM.*not supported"):
        load_model(str(path))


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="no such directory"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="no config.json"):
        load_model(str(tmp_path))


def test_every_tensor_loaded_exactly_once(checkpoint_factory):
    path, hf = checkpoint_factory("qwen3_5")
    ours = load_model(str(path), "cpu", "float32")
    ref = hf.state_dict()
    params = dict(ours.named_parameters())
    # packed projections are row blocks of our weights, in checkpoint order
    for name, tensor in ref.items():
        layer = name.rsplit(".", 2)
        for packed, parts in {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"],
                              "in_proj": ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"]}.items():
            if layer[1] in parts:
                mod = dict(ours.named_modules())[f"{layer[0]}.{packed}"]
                start, rows = mod.shard_rows(layer[1])
                assert torch.equal(params[f"{layer[0]}.{packed}.weight"][start:start + rows], tensor), name
                break
        else:
            assert torch.equal(params[name], tensor), name


def test_sharded_checkpoint(checkpoint_factory, tmp_path):
    _, hf = checkpoint_factory("llama")
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ours = load_model(str(tmp_path), "cpu", "float32")
    assert torch.equal(ours.model.norm.weight, hf.model.norm.weight)


def test_conditional_generation_text_tower(checkpoint_factory, tmp_path):
    """Qwen3_5ForConditionalGeneration: text keys under model.language_model.*, vision and MTP ignored."""
    src, hf = checkpoint_factory("qwen3_5")
    tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
               for k, v in load_file(str(src / "model.safetensors")).items()}
    tensors["model.visual.blocks.0.attn.qkv.weight"] = torch.randn(6, 2)
    tensors["mtp.fc.weight"] = torch.randn(2, 4)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((src / "config.json").read_text())
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": text}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ours = load_model(str(tmp_path), "cpu", "float32")
    ref = load_model(str(src), "cpu", "float32")
    for (n1, p1), (n2, p2) in zip(ours.named_parameters(), ref.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)


REAL_CONFIGS = {
    "Qwen3-8B": (transformers.Qwen3Config, dict(
        architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=4096, intermediate_size=12288,
        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rope_theta=1000000.0, tie_word_embeddings=False), 8_190_735_360),
    "Llama-3.1-8B": (transformers.LlamaConfig, dict(
        architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=8192)), 8_030_261_248),
    "Qwen3.5-27B": (transformers.Qwen3_5TextConfig, dict(
        architectures=["Qwen3_5ForCausalLM"], vocab_size=248320, hidden_size=5120, intermediate_size=17408,
        num_hidden_layers=64, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
        full_attention_interval=4, max_position_embeddings=262144), None),
}


@pytest.mark.parametrize("name", list(REAL_CONFIGS))
def test_real_size_configs_load_shape_correct(name):
    """Every tensor transformers would save for the real config maps onto our model with the right shape."""
    config_cls, kw, num_params = REAL_CONFIGS[name]
    hf_cfg = config_cls(**kw)
    with torch.device("meta"):
        hf = getattr(transformers, kw["architectures"][0])(hf_cfg)
    ours = build_empty(ModelConfig.from_dict(hf_cfg.to_dict()), torch.device("meta"), torch.bfloat16)
    entries = [("model.safetensors", k, tuple(v.shape)) for k, v in hf.state_dict().items()]
    plan = plan_load(ours, entries)
    assert len(plan) == len(entries) - (1 if hf_cfg.tie_word_embeddings else 0)
    total = sum(p.numel() for p in ours.parameters())
    assert total == sum(p.numel() for p in hf.parameters())
    if num_params is not None:
        assert total == num_params


def test_tokenizer_loads_with_the_model(checkpoint_factory):
    path, _ = checkpoint_factory("llama")
    tok = load_tokenizer(str(path))
    ids = tok.encode("def add(a, b):")
    assert tok.decode(ids) == "def add(a, b):"


def test_chat_template_is_available_when_present(checkpoint_factory, tmp_path):
    src, _ = checkpoint_factory("llama")
    path = _copy(src, tmp_path / "m")
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    from specpilot.cli import encode_prompt

    tok = load_tokenizer(str(path))
    ids = encode_prompt(tok, "hello", chat=True)
    assert tok.decode(ids) == "<user>hello<assistant>"
    with pytest.raises(ValueError, match="no chat template"):
        encode_prompt(load_tokenizer(str(src)), "hello", chat=True)
