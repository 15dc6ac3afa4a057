"""The Qwen3.5 MTP layer: loads the public `mtp.*` layout from the target's own checkpoint, matches the same layer
computed with transformers' Qwen3.5 classes, and names each wrong or missing key and config field."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from specpilot.checkpoint.errors import CheckpointError
from specpilot.config import ConfigError
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.loader import load_model
from specpilot.models.mtp import load_mtp
from specpilot.models.random_checkpoint import add_mtp_layer, mtp_tensors
from specpilot.runtime.cache import ModelCache


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    from tests.checkpoints import write_checkpoint

    path = tmp_path_factory.mktemp("qwen3_5_mtp")
    hf_model = write_checkpoint("qwen3_5", path)
    add_mtp_layer(path, seed=1)
    return path, hf_model


def _copy(target_dir, tmp_path):
    path = tmp_path / "t"
    shutil.copytree(target_dir, path)
    return path


def test_public_layout_keys_and_config(target_dir):
    path, _ = target_dir
    from safetensors import safe_open

    with safe_open(str(path / "model-mtp.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
            "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.down_proj.weight"} <= keys
    assert json.loads((path / "config.json").read_text())["mtp_num_hidden_layers"] == 1
    # the target itself loads as before: its loader skips mtp.*
    assert load_model(str(path), "cpu", "float32").config.num_hidden_layers == 4


def test_forward_matches_transformers_layer(target_dir):
    path, hf_model = target_dir
    target = load_model(str(path), "cpu", "float32")
    model = load_mtp(path, target)
    from safetensors.torch import load_file

    t = load_file(str(path / "model-mtp.safetensors"))
    cfg = hf_model.config
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        out = hf_model(ids, output_hidden_states=True)
        h = out.hidden_states[-1]  # final-normed
        nxt = torch.randint(0, 300, (1, 12))
        # reference: transformers' own Qwen3.5 norm and full-attention decoder layer with the mtp.* weights
        def norm(key):
            n = hf.Qwen3_5RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            n.weight.copy_(t[key])
            return n
        layer = hf.Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention")).eval()
        layer.load_state_dict({k[len("mtp.layers.0."):]: v for k, v in t.items() if k.startswith("mtp.layers.0.")})
        x = torch.cat((norm("mtp.pre_fc_norm_embedding.weight")(hf_model.model.embed_tokens(nxt)),
                       norm("mtp.pre_fc_norm_hidden.weight")(h)), -1) @ t["mtp.fc.weight"].T
        pos = torch.arange(12)[None]
        x = layer(x, position_embeddings=hf_model.model.rotary_emb(x, pos), position_ids=pos)
        ref = norm("mtp.norm.weight")(x)

        cache = ModelCache(model.config, 1, 32, "cpu", torch.float32)
        meta = BatchMetadata.contiguous(nxt, torch.tensor([0]), torch.tensor([0]), 0)
        ours = model(target.model.embed_tokens(nxt), h, meta, cache)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


def test_missing_and_misshaped_keys_are_named(target_dir, tmp_path):
    path, _ = target_dir
    target = load_model(str(path), "cpu", "float32")
    t = mtp_tensors(target.config, torch.Generator().manual_seed(2))
    missing = _copy(path, tmp_path / "a")
    save_file({k: v for k, v in t.items() if k != "mtp.pre_fc_norm_hidden.weight"},
              str(missing / "model-mtp.safetensors"))
    with pytest.raises(CheckpointError, match=r"MTP layer: checkpoint is missing tensors \['mtp.pre_fc_norm_hidden"):
        load_mtp(missing, target)
    bad = _copy(path, tmp_path / "b")
    save_file(dict(t, **{"mtp.fc.weight": torch.zeros(64, 64)}), str(bad / "model-mtp.safetensors"))
    with pytest.raises(CheckpointError, match=r"tensor 'mtp.fc.weight' has shape \(64, 64\), expected \(64, 128\)"):
        load_mtp(bad, target)
    extra = _copy(path, tmp_path / "c")
    save_file(dict(t, **{"mtp.layers.1.input_layernorm.weight": torch.zeros(64)}), str(extra / "model-mtp.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected tensor 'mtp.layers.1.input_layernorm.weight'"):
        load_mtp(extra, target)


def test_config_fields_are_named(target_dir, tmp_path, checkpoint_factory):
    path, _ = target_dir
    target = load_model(str(path), "cpu", "float32")
    none = _copy(path, tmp_path / "a")
    (none / "model-mtp.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no mtp.\\* tensors"):
        load_mtp(none, target)
    for value, match in ((None, "no mtp_num_hidden_layers"), (2, "mtp_num_hidden_layers=2")):
        d = _copy(path, tmp_path / f"n{value}")
        raw = json.loads((d / "config.json").read_text())
        raw.pop("mtp_num_hidden_layers") if value is None else raw.update(mtp_num_hidden_layers=value)
        (d / "config.json").write_text(json.dumps(raw))
        with pytest.raises(ConfigError, match=match):
            load_mtp(d, target)
    dense, _ = checkpoint_factory("qwen3")
    with pytest.raises(ConfigError, match="Qwen3ForCausalLM has none"):
        load_mtp(dense, load_model(str(dense), "cpu", "float32"))
