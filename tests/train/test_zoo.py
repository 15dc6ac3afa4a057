"""`specpilot train zoo` end to end on CPU with the recipe shrunk to a few steps of tiny batches: every job runs
as its own process, the zoo comes out W12N with a summary, loads through our loader and drives the demo. The
committed zoo stays under its 32 MB cap and holds the models the recipe names."""

import dataclasses
import json
from pathlib import Path

import pytest

from specpilot.cli import main
from specpilot.train import zoo

ZOO = Path(__file__).resolve().parents[2] / "zoo"
ZOO_NAMES = {"dense", "hybrid", "draft-lm", "dense-dflash", "dense-eagle3", "hybrid-dflash"}
ZOO_CAP_BYTES = 32_000_000


def _tiny(job: zoo.Job) -> zoo.Job:
    args = list(job.args)
    for flag, value in (("--batch-size", "2"), ("--seq-len", "32"), ("--warmup", "1"), ("--rollouts", "4"),
                        ("--rollout-prompt-len", "16"), ("--anchors", "4")):
        if flag in args:
            args[args.index(flag) + 1] = value
    return dataclasses.replace(job, args=tuple(args) + ("--eval-batches", "1", "--save-every", "1000"), steps=2)


def _tiny_recipe():
    return tuple(tuple(_tiny(j) for j in stage) for stage in zoo.ZOO_RECIPE)


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    for i in range(150):  # enough files that the 2% held-out split is not empty
        (corpus / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" * 4)
    out = tmp_path_factory.mktemp("z") / "zoo"
    mp = pytest.MonkeyPatch()
    mp.setattr(zoo, "ZOO_RECIPE", _tiny_recipe())
    mp.setattr(zoo, "VOCAB_SIZE", 300)
    try:
        summary = zoo.build_zoo(out, corpus=str(corpus), max_files=None, device="cpu", jobs=4)
    finally:
        mp.undo()
    return out, summary, corpus


def test_zoo_holds_every_model_in_w12n(tiny_zoo):
    out, summary, _ = tiny_zoo
    assert set(summary["models"]) == ZOO_NAMES
    assert json.loads((out / "zoo.json").read_text())["total_bytes"] == summary["total_bytes"]
    for name in ZOO_NAMES:
        assert (out / name / "w12n.json").exists() and (out / name / "training.json").exists()
    assert not list(out.parent.glob(".zoo.tmp*"))
    # the hybrid target carries its MTP layer in its own W12N file, listed in its manifest; its training record is
    # the target's, with the MTP's under "mtp"
    hybrid = summary["models"]["hybrid"]["training"]
    assert hybrid["preset"] == "hybrid" and hybrid["mtp"]["kind"] == "mtp"
    listed = {t["name"] for t in json.loads((out / "hybrid" / "w12n.json").read_text())["tensors"]}
    assert "mtp.fc.weight" in listed and "model.embed_tokens.weight" in listed
    assert sorted(f.name for f in (out / "hybrid").glob("*.safetensors")) == ["model.safetensors"]


def test_the_committed_zoo_is_under_its_cap():
    assert {p.name for p in ZOO.iterdir() if p.is_dir()} == ZOO_NAMES
    summary = json.loads((ZOO / "zoo.json").read_text())
    sizes = {name: sum(f.stat().st_size for f in (ZOO / name).iterdir()) for name in ZOO_NAMES}
    assert {n: m["bytes"] for n, m in summary["models"].items()} == sizes
    assert sum(f.stat().st_size for f in ZOO.rglob("*") if f.is_file()) <= ZOO_CAP_BYTES
    config = json.loads((ZOO / "hybrid" / "config.json").read_text())
    assert config["mtp_num_hidden_layers"] == 1  # `--target zoo/hybrid --drafter mtp`


def test_demo_runs_on_the_zoo(tiny_zoo, monkeypatch, capsys):
    out, _, _ = tiny_zoo
    monkeypatch.setenv("SPECPILOT_ZOO", str(out))
    for model, drafter in (("hybrid", "dflash"), ("dense", "eagle3"), ("hybrid", "mtp")):
        rc = main(["demo", "--model", model, "--drafter", drafter, "--max-new-tokens", "10", "--json"])
        spec = json.loads(capsys.readouterr().out)["speculative"]
        assert rc == 0 and spec["identical"] and spec["forcing"]["passed"] and spec["forcing"]["tokens"] == 10


def test_an_existing_output_is_refused(tiny_zoo):
    with pytest.raises(FileExistsError):
        zoo.build_zoo(tiny_zoo[0])


def test_a_zoo_rebuilds_drafters_on_an_earlier_zoos_targets(tiny_zoo, tmp_path, monkeypatch):
    import shutil

    import torch
    from safetensors import safe_open

    old, _, corpus = tiny_zoo
    work = tmp_path / "work"
    for name in ("dense", "hybrid", "draft-lm"):
        shutil.copytree(old / name, work / name)
    (work / "tokenizer").mkdir()
    for f in (old / "dense").glob("tokenizer*"):
        shutil.copy2(f, work / "tokenizer" / f.name)
    monkeypatch.setattr(zoo, "ZOO_RECIPE", _tiny_recipe())
    monkeypatch.setattr(zoo, "VOCAB_SIZE", 300)
    summary = zoo.build_zoo(tmp_path / "zoo", work, corpus=str(corpus), max_files=None, device="cpu", jobs=4)
    for name in ("dense", "draft-lm"):  # carried over untouched
        new, before = tmp_path / "zoo" / name / "model.safetensors", old / name / "model.safetensors"
        assert new.read_bytes() == before.read_bytes()
    # the hybrid target's tensors carried over as stored; its MTP layer retrained (one copy of each mtp.* key)
    with safe_open(str(old / "hybrid" / "model.safetensors"), "pt") as a, \
            safe_open(str(tmp_path / "zoo" / "hybrid" / "model.safetensors"), "pt") as b:
        assert set(a.keys()) == set(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys() if not k.startswith("mtp."))
    assert summary["models"]["dense-dflash"]["training"]["steps"] == 2
    assert summary["models"]["hybrid"]["training"]["mtp"]["steps"] == 2
