"""Drafter registry: names, draft-LM checkpoints, and the clear errors for checkpoints that cannot draft."""

import json
import shutil

import pytest

from specpilot.checkpoint.errors import CheckpointError
from specpilot.config import ConfigError
from specpilot.models.loader import load_model, load_tokenizer
from specpilot.models.random_checkpoint import write_tokenizer
from specpilot.spec_decode.drafters.registry import build_drafter


def test_named_drafters(checkpoint_factory):
    path, _ = checkpoint_factory("llama")
    target = load_model(str(path), "cpu", "float32")
    assert build_drafter("none", target) is None
    assert build_drafter("ngram", target).name == "ngram"


def test_draft_lm_sharing_the_tokenizer(checkpoint_factory):
    path, _ = checkpoint_factory("qwen3")
    draft_path, _ = checkpoint_factory("qwen3", num_hidden_layers=1)
    target = load_model(str(path), "cpu", "float32")
    assert build_drafter(str(draft_path), target, load_tokenizer(str(path))).name == "draft-lm"


def test_draft_lm_with_another_tokenizer_is_refused(checkpoint_factory, tmp_path):
    path, _ = checkpoint_factory("qwen3")
    other = shutil.copytree(checkpoint_factory("qwen3", num_hidden_layers=1)[0], tmp_path / "d")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (other / f).unlink()
    write_tokenizer(other, 320, ["completely different text " * 50, "zzz yyy xxx " * 40])
    target = load_model(str(path), "cpu", "float32")
    with pytest.raises(CheckpointError, match="drafter's tokenizer differs from the target's"):
        build_drafter(str(other), target, load_tokenizer(str(path)))


def test_checkpoint_that_is_no_drafter(checkpoint_factory, tmp_path):
    path, _ = checkpoint_factory("llama")
    target = load_model(str(path), "cpu", "float32")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(ConfigError, match="not a drafter specpilot can run"):
        build_drafter(str(bad), target)
    with pytest.raises(ConfigError, match="no config.json"):
        build_drafter(str(tmp_path), target)


@pytest.mark.parametrize("vocab", [300, 400])
def test_draft_lm_of_another_vocab_size_is_refused_before_its_weights_load(vocab, checkpoint_factory, tmp_path,
                                                                            monkeypatch):
    """Smaller, it crashed mid-generation embedding a target token it lacks (IndexError, nothing named the
    drafter); larger, it could propose ids the target lacks. Refused from its config, its weights never read."""
    from specpilot.spec_decode.drafters import registry

    path, _ = checkpoint_factory("qwen3")
    draft = shutil.copytree(checkpoint_factory("qwen3", num_hidden_layers=1)[0], tmp_path / "d")
    cfg = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps(cfg | {"vocab_size": vocab}))  # the target's tokenizer kept
    target = load_model(str(path), "cpu", "float32")

    def no_load(*a, **k):
        raise AssertionError("the draft model's weights were read")

    monkeypatch.setattr(registry, "load_model", no_load)
    with pytest.raises(CheckpointError) as err:
        build_drafter(str(draft), target, load_tokenizer(str(path)))
    assert str(err.value) == (f"{draft}: the draft model's vocab_size {vocab} differs from the target's 320; a draft "
                              "model must have the target's vocabulary")


def test_build_drafter_hands_the_runtime_over(checkpoint_factory, tmp_path):
    """The target runner's runtime reaches the drafters that run a model: a draft LM's runner takes it, DFlash its
    draft paths and its CUDA graph setting; without one they build the default for the target's device."""
    import dataclasses

    from specpilot.layers.paths import PLAIN, KernelPaths
    from tests.runtimes import cpu_runtime
    from tests.spec_decode.test_dflash import write_dflash

    path, _ = checkpoint_factory("qwen3")
    draft_path, _ = checkpoint_factory("qwen3", num_hidden_layers=1)
    target = load_model(str(path), "cpu", "float32")
    runtime = cpu_runtime(block_attention="tree")
    assert build_drafter(str(draft_path), target, runtime=runtime).runner.runtime is runtime
    assert build_drafter(str(draft_path), target).runner.runtime == cpu_runtime()
    dflash_dir = write_dflash(tmp_path / "d")
    chosen = dataclasses.replace(runtime, draft=KernelPaths(gemv=True, block_kernel=True, compiled=True))
    drafter = build_drafter(str(dflash_dir), target, runtime=chosen)
    assert not drafter.use_graphs and drafter.paths == KernelPaths(gemv=True, block_kernel=True)  # compiled: graphs
    graphs = dataclasses.replace(chosen, cuda_graphs=True)
    drafter = build_drafter(str(dflash_dir), target, runtime=graphs)
    assert drafter.use_graphs and drafter.paths is graphs.draft
    assert build_drafter(str(dflash_dir), target).paths == PLAIN
