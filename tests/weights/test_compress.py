"""specpilot compress / inspect and transparent loading of W12N directories."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpilot.checkpoint.errors import CheckpointError
from specpilot.checkpoint.file import CheckpointFile
from specpilot.cli import main
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
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
    from tests.runtimes import cpu_runtime, set_paths

    # prompts over 16 tokens: prefill goes through decode + F.linear in both, decode steps through the GEMVs
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (20, 25)]
    params = SamplingParams(max_new_tokens=16)
    bf16 = ModelRunner(load_model(str(bf16_checkpoint), "cpu", "bfloat16"))
    set_paths(bf16, "decode", gemv=True)  # fp32-accumulated single-row products, as the W12N GEMV computes them
    w12 = ModelRunner(load_model(str(bf16_checkpoint), "cpu", "bfloat16"), cpu_runtime(weight_format="w12n"))
    # the projections compress leaves in bf16 take the same GEMV (with plain F.linear there, bf16 rounding flipped a
    # near-tie of these flat random logits for some prompts)
    set_paths(w12, "decode", gemv=True)
    assert sum(getattr(m, "w12n", None) is not None for m in w12.model.modules()) > 0
    a = [r.token_ids for r in Generator(bf16).generate(prompts, params)]
    b = [r.token_ids for r in Generator(w12).generate(prompts, params)]
    assert a == b
    with pytest.raises(ValueError, match="needs a bf16 model"):
        ModelRunner(load_model(str(bf16_checkpoint), "cpu", "float32"), cpu_runtime(weight_format="w12n"))


def test_w12n_only_drops_the_bf16_copies_and_generates_the_same(bf16_checkpoint):
    """weight_format w12n_only: every encoded projection's bf16 weight is released (the model holds its planes
    only) and every product goes through them, prefill included; the tokens are the bf16 model's."""
    from specpilot.layers.linear import Linear
    from tests.runtimes import cpu_runtime, set_paths

    prompts = [torch.randint(0, 300, (n,)).tolist() for n in (20, 25)]
    params = SamplingParams(max_new_tokens=16)
    bf16 = ModelRunner(load_model(str(bf16_checkpoint), "cpu", "bfloat16"))
    set_paths(bf16, "decode", gemv=True)  # fp32-accumulated single-row products, as the W12N GEMV computes them
    before = sum(p.numel() for p in bf16.model.parameters())
    only = ModelRunner(load_model(str(bf16_checkpoint), "cpu", "bfloat16"), cpu_runtime(weight_format="w12n_only"))
    encoded = [m for m in only.model.modules() if isinstance(m, Linear) and m.w12n is not None]
    assert encoded and all(m.weight is None for m in encoded)
    dropped = sum(m.w12n.n * m.w12n.k for m in encoded)
    assert sum(p.numel() for p in only.model.parameters()) == before - dropped
    a = [r.token_ids for r in Generator(bf16).generate(prompts, params)]
    b = [r.token_ids for r in Generator(only).generate(prompts, params)]
    assert a == b
    x = torch.randn(40, encoded[0].in_features).bfloat16()  # past 16 rows, no step paths: W decoded from its planes
    assert torch.equal(encoded[0](x), torch.nn.functional.linear(x, w12n.decode(encoded[0].w12n)))


ZOO = Path(__file__).resolve().parents[2] / "zoo"


def _flip_byte(file, key, index=0):
    """Flips the low bit of byte `index` of tensor `key` in a safetensors file, in place."""
    data = bytearray(file.read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    start = 8 + header_len + json.loads(data[8:8 + header_len])[key]["data_offsets"][0]
    data[start + index] ^= 1
    file.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_w12n_plane_fails_its_checksum(bf16_checkpoint, tmp_path, capsys):
    """A corrupted plane decodes to other weights without any structural error: only the checksum stored at
    compress time catches it, at load (generate) and in inspect."""
    out = tmp_path / "w"
    compress(str(bf16_checkpoint), out)
    name = "model.layers.0.mlp.down_proj.weight"
    _flip_byte(out / "model.safetensors", f"{name}.w12n_b", 5)
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' fails its checksum .*re-run `specpilot compress`"):
        load_model(str(out), "cpu", "bfloat16")
    capsys.readouterr()
    for argv in (["inspect", str(out)], ["generate", "--target", str(out), "--prompt", "hi", "--device", "cpu"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {out / 'model.safetensors'}: tensor '{name}' fails its checksum"), err
    compress(str(bf16_checkpoint), tmp_path / "w2")  # a tensor kept as it was is checked too
    _flip_byte(tmp_path / "w2" / "model.safetensors", "model.embed_tokens.weight")
    with pytest.raises(CheckpointError, match="'model.embed_tokens.weight' fails its checksum"):
        inspect(tmp_path / "w2")


def _strip_checksums(directory):
    """The directory as specpilot wrote it before checksums (format version 1)."""
    f = directory / "model.safetensors"
    tensors = load_file(str(f))
    for k in [k for k in tensors if k.endswith(".w12n_meta")]:
        tensors[k][4] = 1
    save_file(tensors, str(f), metadata={"format": "pt", "specpilot": "w12n"})


def test_a_w12n_file_without_checksums_is_refused_and_compress_rewrites_it(bf16_checkpoint, tmp_path, capsys):
    old = tmp_path / "old"
    compress(str(bf16_checkpoint), old)
    _strip_checksums(old)
    with pytest.raises(CheckpointError, match=rf"without checksums .*`specpilot compress {old} NEW_DIR`"):
        load_model(str(old), "cpu", "bfloat16")
    capsys.readouterr()
    assert main(["inspect", str(old)]) == 2 and "older specpilot" in capsys.readouterr().err
    compress(str(old), tmp_path / "new")
    ref, got = load_model(str(bf16_checkpoint), "cpu", "bfloat16"), load_model(str(tmp_path / "new"), "cpu", "bfloat16")
    for (n1, p1), (n2, p2) in zip(ref.named_parameters(), got.named_parameters()):
        assert n1 == n2 and torch.equal(p1.view(torch.int16), p2.view(torch.int16)), n1


def test_compress_of_a_zoo_model_decodes_and_re_encodes_bit_exact(tmp_path, capsys):
    """Every zoo model is W12N already: compressing one again (here an EAGLE-3 head with verbatim segments, whose
    bf16 pool a plain pass would re-encode as a matrix) gives the same planes, and a drafter that loads."""
    from specpilot.spec_decode.drafters.eagle3 import Eagle3Drafter

    out = tmp_path / "dense-eagle3"
    assert main(["compress", str(ZOO / "dense-eagle3"), str(out), "--json"]) == 0
    capsys.readouterr()
    before = load_file(str(ZOO / "dense-eagle3" / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    assert any(v.numel() for k, v in before.items() if k.endswith(".w12n_verbatim"))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    target = load_model(str(ZOO / "dense"), "cpu", "float32")
    ref = Eagle3Drafter.from_pretrained(ZOO / "dense-eagle3", target).head
    got = Eagle3Drafter.from_pretrained(out, target).head
    for (n1, p1), (n2, p2) in zip(ref.named_parameters(), got.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2), n1


def test_the_zoo_carries_checksums():
    for f in ZOO.glob("*/model.safetensors"):
        with CheckpointFile(f) as ckpt:
            assert ckpt.sums is not None and set(ckpt.sums) == set(ckpt.names), f


def test_compress_and_inspect_name_a_truncated_file(bf16_checkpoint, tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint, src)
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[:1000])
    capsys.readouterr()
    assert main(["compress", str(src), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {src / 'model.safetensors'}: truncated (1,000 bytes, inside its"), err
    assert "download it again" in err and not list(tmp_path.glob("*out*"))
    assert main(["inspect", str(src)]) == 2 and "truncated" in capsys.readouterr().err
    out = tmp_path / "w"
    compress(str(bf16_checkpoint), out)
    data = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(data[: len(data) - 100])
    assert main(["inspect", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"truncated ({len(data) - 100:,} of {len(data):,} bytes); re-run `specpilot compress`" in err, err


def test_inspect_takes_a_hub_id(bf16_checkpoint, tmp_path, monkeypatch, capsys):
    """Resolved by the same helper as compress and generate: here from a local cache with HF_HUB_OFFLINE=1."""
    import huggingface_hub

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--tiny-w12n"
    compress(str(bf16_checkpoint), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    capsys.readouterr()
    assert main(["inspect", "acme/tiny-w12n", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"]["w12n_tensors"] > 0
    assert main(["inspect", "acme/absent"]) == 2 and "HF_HUB_OFFLINE is set" in capsys.readouterr().err
