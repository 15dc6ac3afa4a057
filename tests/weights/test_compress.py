"""specpilot compress / inspect and transparent loading of W12N directories."""

import json

import pytest
import torch

from specpilot.cli import main
from specpilot.engine.generator import Generator
from specpilot.engine.runner import ModelRunner
from specpilot.engine.sampling import SamplingParams
from specpilot.models.loader import load_model
from specpilot.weights import w12n
from specpilot.weights.compress import compress, inspect, totals


@pytest.fixture
def bf16_checkpoint(checkpoint_factory, tmp_path):
    _, hf = checkpoint_factory("qwen3_5", intermediate_size=1024)
    path = tmp_path / "bf16"
    hf.to(torch.bfloat16).save_pretrained(path)
    hf.to(torch.float32)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (path / f).write_text((checkpoint_factory("qwen3_5", intermediate_size=1024)[0] / f).read_text())
    return path


def test_compressed_model_loads_bit_exact_and_generates_the_same(bf16_checkpoint, tmp_path):
    out = tmp_path / "w12n"
    reports = compress(str(bf16_checkpoint), out)
    assert (out / "w12n.json").exists() and (out / "tokenizer.json").exists() and (out / "config.json").exists()
    assert any(r.fmt == "w12n" for r in reports)
    assert all(r.fmt != "w12n" for r in reports if "embed_tokens" in r.name or len(r.shape) == 1)
    ref = load_model(str(bf16_checkpoint), "cpu", "bfloat16")
    got = load_model(str(out), "cpu", "bfloat16")
    for (n1, p1), (n2, p2) in zip(ref.named_parameters(), got.named_parameters()):
        assert n1 == n2 and torch.equal(p1.view(torch.int16), p2.view(torch.int16)), n1
    prompt = torch.randint(0, 300, (9,)).tolist()
    params = SamplingParams(max_new_tokens=12)
    a = Generator(ModelRunner(load_model(str(bf16_checkpoint), "cpu", "float32"))).generate([prompt], params)
    b = Generator(ModelRunner(load_model(str(out), "cpu", "float32"))).generate([prompt], params)
    assert a[0].token_ids == b[0].token_ids
    again = totals(inspect(out))
    assert again["w12n_tensors"] == sum(r.fmt == "w12n" for r in reports)


def test_compress_refuses_an_existing_destination_and_leaves_nothing(bf16_checkpoint, tmp_path):
    out = tmp_path / "exists"
    out.mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        compress(str(bf16_checkpoint), out)
    assert list(out.iterdir()) == []
    with pytest.raises(Exception, match="no such directory"):
        compress(str(tmp_path / "missing"), tmp_path / "x")
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.tmp-*"))


def test_cli_compress_and_inspect_json(bf16_checkpoint, tmp_path, capsys):
    out = tmp_path / "w"
    assert main(["compress", str(bf16_checkpoint), str(out), "--format", "w12n", "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert main(["inspect", str(out), "--json"]) == 0
    seen = json.loads(capsys.readouterr().out)
    assert seen["total"]["w12n_tensors"] == written["total"]["w12n_tensors"] > 0
    assert 12.0 < seen["total"]["w12n_bits_per_weight"] < 16.0
    assert main(["inspect", str(out)]) == 0
    assert "bits/weight" in capsys.readouterr().out


def test_w12n_weight_format_generates_what_bf16_generates(bf16_checkpoint):
    """Projections through W12N planes (the fused GEMV path; its reference on CPU) give the bf16 model's output:
    bit-identical weights, and the same fp32-accumulated product as the bf16 decode GEMV path."""
    from specpilot.config import EngineConfig

    # prompts over 16 tokens: prefill goes through decode + F.linear in both, decode steps through the GEMVs
    prompts = [torch.randint(0, 300, (n,)).tolist() for n in (20, 25)]
    params = SamplingParams(max_new_tokens=16)
    bf16 = ModelRunner(load_model(str(bf16_checkpoint), "cpu", "bfloat16"))
    bf16.gemv = True  # fp32-accumulated single-row products, as the W12N GEMV computes them
    w12 = ModelRunner(load_model(str(bf16_checkpoint), "cpu", "bfloat16"), EngineConfig(weight_format="w12n"))
    assert sum(getattr(m, "w12n", None) is not None for m in w12.model.modules()) > 0
    a = [r.token_ids for r in Generator(bf16).generate(prompts, params)]
    b = [r.token_ids for r in Generator(w12).generate(prompts, params)]
    assert a == b
    with pytest.raises(ValueError, match="needs a bf16 model"):
        ModelRunner(load_model(str(bf16_checkpoint), "cpu", "float32"), EngineConfig(weight_format="w12n"))


def test_w12n_only_drops_the_bf16_copies_and_generates_the_same(bf16_checkpoint):
    """weight_format w12n_only: every encoded projection's bf16 weight is released (the model holds its planes
    only) and every product goes through them, prefill included; the tokens are the bf16 model's."""
    from specpilot.config import EngineConfig
    from specpilot.layers.linear import Linear

    prompts = [torch.randint(0, 300, (n,)).tolist() for n in (20, 25)]
    params = SamplingParams(max_new_tokens=16)
    bf16 = ModelRunner(load_model(str(bf16_checkpoint), "cpu", "bfloat16"))
    bf16.gemv = True  # fp32-accumulated single-row products, as the W12N GEMV computes them
    before = sum(p.numel() for p in bf16.model.parameters())
    only = ModelRunner(load_model(str(bf16_checkpoint), "cpu", "bfloat16"), EngineConfig(weight_format="w12n_only"))
    encoded = [m for m in only.model.modules() if isinstance(m, Linear) and m.w12n is not None]
    assert encoded and all(m.weight is None for m in encoded)
    dropped = sum(m.w12n.n * m.w12n.k for m in encoded)
    assert sum(p.numel() for p in only.model.parameters()) == before - dropped
    a = [r.token_ids for r in Generator(bf16).generate(prompts, params)]
    b = [r.token_ids for r in Generator(only).generate(prompts, params)]
    assert a == b
    x = torch.randn(40, encoded[0].in_features).bfloat16()  # past 16 rows, outside any weight_format region
    assert torch.equal(encoded[0](x), torch.nn.functional.linear(x, w12n.decode(encoded[0].w12n)))
