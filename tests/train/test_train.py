"""Training recipes on a tiny corpus (CPU): the loss falls, runs repeat and resume exactly, checkpoints load in
our loader and in transformers with the same logits."""

import json

import pytest
import torch
import transformers

from specpilot.cli import main
from specpilot.runtime.cache import ModelCache
from specpilot.layers.metadata import BatchMetadata
from specpilot.models.loader import load_model
from specpilot.train.corpus import load_corpus
from specpilot.train.lm import TrainConfig, train_lm
from specpilot.train.tokenizer import train_tokenizer

TINY = {"dense": dict(arch="Qwen3ForCausalLM", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32),
        "hybrid": dict(arch="Qwen3_5ForCausalLM", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=32, linear_num_key_heads=2,
                       linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                       full_attention_interval=2)}
CFG = TrainConfig(steps=12, batch_size=4, seq_len=32, lr=3e-3, warmup=2, save_every=6, eval_batches=2, device="cpu")


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for i in range(40):
        (root / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" * 8
                                       + "for i in range(10):\n    print(i)\n")
    return root


@pytest.fixture(scope="module")
def tokenizer_dir(corpus_dir, tmp_path_factory):
    return train_tokenizer(load_corpus(str(corpus_dir), held_out_percent=20), tmp_path_factory.mktemp("tok"), 300)


def test_corpus_split_is_by_hash_and_recorded(corpus_dir):
    a = load_corpus(str(corpus_dir), held_out_percent=20)
    b = load_corpus(str(corpus_dir), held_out_percent=20)
    assert a == b and a.held_out and a.train and len(a.files_hash) == 16
    with pytest.raises(FileNotFoundError):
        load_corpus(str(corpus_dir / "nope"))


def test_default_corpus_is_the_python_installation():
    corpus = load_corpus(None, max_files=20)
    assert "python" in corpus.source and len(corpus.train) + len(corpus.held_out) > 0


@pytest.mark.parametrize("arch", ["dense", "hybrid"])
def test_training_lowers_the_loss_and_loads_everywhere(arch, corpus_dir, tokenizer_dir, tmp_path):
    corpus = load_corpus(str(corpus_dir), held_out_percent=20)
    report = train_lm(corpus, tokenizer_dir, tmp_path / "m", TINY[arch], CFG)
    untrained = train_lm(corpus, tokenizer_dir, tmp_path / "u", TINY[arch],
                         TrainConfig(**{**CFG.__dict__, "steps": 1}))
    assert report["held_out_loss"] < untrained["held_out_loss"] - 0.3
    ours = load_model(str(tmp_path / "m"), "cpu", "float32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"), dtype=torch.float32).eval()
    ids = torch.randint(0, 300, (1, 20))
    cache = ModelCache(ours.config, 1, 24, "cpu", torch.float32)
    with torch.no_grad():
        a = ours.logits(ours(BatchMetadata.contiguous(ids, torch.tensor([0]), torch.tensor([0]), 0), cache))
        b = hf(ids).logits
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert json.loads((tmp_path / "m" / "training.json").read_text())["parameters"] > 0


def test_resume_continues_exactly(corpus_dir, tokenizer_dir, tmp_path):
    corpus = load_corpus(str(corpus_dir), held_out_percent=20)
    train_lm(corpus, tokenizer_dir, tmp_path / "a", TINY["dense"], CFG)
    assert (tmp_path / "a" / "checkpoint" / "trainer_state.json").exists()
    # a second run resumes from the step-6 checkpoint of the first and must end on the same weights
    (tmp_path / "b").mkdir()
    import shutil

    shutil.copytree(tmp_path / "a" / "checkpoint", tmp_path / "b" / "checkpoint")
    train_lm(corpus, tokenizer_dir, tmp_path / "b", TINY["dense"], CFG, resume=True)
    a = load_model(str(tmp_path / "a"), "cpu", "float32")
    b = load_model(str(tmp_path / "b"), "cpu", "float32")
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=n)


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_drafter_resume_continues_exactly(kind, corpus_dir, tokenizer_dir, tmp_path):
    """A drafter run stopped at its step-6 checkpoint and resumed ends on the weights of the uninterrupted run."""
    import shutil

    from safetensors.torch import load_file

    from specpilot.train.dflash import train_dflash
    from specpilot.train.eagle3 import train_eagle3

    corpus = load_corpus(str(corpus_dir), held_out_percent=20)
    train_lm(corpus, tokenizer_dir, tmp_path / "t", dict(TINY["dense"], num_hidden_layers=3),
             TrainConfig(**{**CFG.__dict__, "steps": 20}))

    def run(out, resume=False):
        if kind == "dflash":
            return train_dflash(corpus, tmp_path / "t", out, CFG, block=4, num_layers=1, resume=resume)
        return train_eagle3(corpus, tmp_path / "t", out, CFG, draft_vocab_size=200, resume=resume)

    run(tmp_path / "a")
    assert (tmp_path / "a" / "checkpoint" / "trainer_state.json").exists()
    shutil.copytree(tmp_path / "a" / "checkpoint", tmp_path / "b" / "checkpoint")
    run(tmp_path / "b", resume=True)
    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # the same from a nudged checkpoint must end elsewhere: the run did start from the checkpoint, not from scratch
    from safetensors.torch import save_file

    shutil.copytree(tmp_path / "a" / "checkpoint", tmp_path / "c" / "checkpoint")
    weights = load_file(str(tmp_path / "c" / "checkpoint" / "weights.safetensors"))
    save_file({k: v + 0.01 if v.is_floating_point() else v for k, v in weights.items()},
              str(tmp_path / "c" / "checkpoint" / "weights.safetensors"))
    run(tmp_path / "c", resume=True)
    c = load_file(str(tmp_path / "c" / "model.safetensors"))
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_cli_train_tokenizer_and_draft_lm(corpus_dir, tmp_path, capsys):
    assert main(["train", "tokenizer", "--corpus", str(corpus_dir), "--out", str(tmp_path / "t"),
                 "--vocab-size", "280"]) == 0
    with pytest.raises(SystemExit):
        main(["train", "drafter", "--target", str(tmp_path / "t"), "--out", str(tmp_path / "x"), "--kind", "nope"])
    rc = main(["train", "drafter", "--kind", "eagle3", "--target", str(tmp_path / "nope"), "--out", str(tmp_path / "d"),
               "--corpus", str(corpus_dir)])
    assert rc == 2 and "no such directory" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="comma-separated integers"):
        main(["train", "drafter", "--kind", "dflash", "--target", str(tmp_path / "t"), "--out", str(tmp_path / "d"),
              "--corpus", str(corpus_dir), "--target-layers", "1,a"])


@pytest.mark.parametrize("arch", ["dense", "hybrid"])
def test_dflash_training_learns_and_loads(arch, corpus_dir, tokenizer_dir, tmp_path):
    """A DFlash drafter trained against a trained target: its loss falls, it saves in the z-lab layout, our
    loader reads it back with the same weights, and speculative output still equals AR output."""
    from specpilot.engine.engine import SpecEngine
    from specpilot.engine.generator import Generator
    from specpilot.runtime.runner import ModelRunner
    from specpilot.runtime.sampling import SamplingParams
    from specpilot.spec_decode.drafters.dflash import load_dflash
    from specpilot.spec_decode.tree import TreeSpec
    from specpilot.models.loader import unpacked_state_dict
    from specpilot.train.dflash import train_dflash

    corpus = load_corpus(str(corpus_dir), held_out_percent=20)
    train_lm(corpus, tokenizer_dir, tmp_path / "t", TINY[arch], TrainConfig(**{**CFG.__dict__, "steps": 30}))
    short = TrainConfig(**{**CFG.__dict__, "steps": 1})
    long = TrainConfig(**{**CFG.__dict__, "steps": 40})
    # self-distillation data (long prompts, anchors in the continuation, chosen target layers) on one of the
    # two, and labels kept along the target's greedy path on the other
    rollouts = 8 if arch == "hybrid" else 0
    gpl = arch == "dense"
    kw = dict(block=4, num_layers=1, rollouts=rollouts, greedy_path_labels=gpl, anchors=6)
    if rollouts:
        kw.update(rollout_prompt_len=20, target_layers=(1,))
    first = train_dflash(corpus, tmp_path / "t", tmp_path / "d0", short, **kw)
    report = train_dflash(corpus, tmp_path / "t", tmp_path / "d", long, **kw)
    assert report["held_out_loss"] < first["held_out_loss"] - 0.5 and report["rollouts"] == rollouts
    assert report["greedy_path_labels"] == gpl and report["anchors"] == 6
    assert report["target_layer_ids"] == ([1] if rollouts else [0, 1]) and report["rollout_prompt_len"] == (
        20 if rollouts else 0)
    with pytest.raises(ValueError, match="out of range"):
        train_dflash(corpus, tmp_path / "t", tmp_path / "bad", short, block=4, num_layers=1, target_layers=(2,))
    target = load_model(str(tmp_path / "t"), "cpu", "float32")
    drafter = load_dflash(tmp_path / "d", target)
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "d" / "model.safetensors"))
    for key, value in unpacked_state_dict(drafter.model).items():
        assert torch.equal(saved[key], value), key
    prompts = [torch.randint(0, 280, (n,)).tolist() for n in (6, 11)]
    params = SamplingParams(max_new_tokens=16)
    ref = [r.token_ids for r in Generator(ModelRunner(target)).generate(prompts, params)]
    out = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse("chain:3")).generate(prompts, params)
    assert [r.token_ids for r, _ in out] == ref


def test_label_mask_keeps_labels_only_along_the_greedy_path():
    """Slot k's label (the target's answer after the corpus through a+k) counts only while the corpus tokens
    a+1 .. a+k are the target's own greedy tokens; slot 0 always counts."""
    from specpilot.train.dflash import label_mask

    tokens = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    greedy = torch.tensor([[6, 7, 0, 9, 10, 11, 12, 13]])  # the corpus leaves the greedy path at position 3
    at = torch.tensor([[0, 1, 2, 3], [3, 4, 5, 6]])  # anchors 0 and 3, block 5
    mask = label_mask(tokens, greedy, torch.tensor([0, 0]), at)
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]


def test_eagle3_training_learns_and_loads(corpus_dir, tokenizer_dir, tmp_path):
    """An EAGLE-3 head trained against a trained 3-layer target: loss falls, the SafeAILab layout loads through
    the registry, and speculative output equals AR output."""
    from specpilot.engine.engine import SpecEngine
    from specpilot.engine.generator import Generator
    from specpilot.runtime.runner import ModelRunner
    from specpilot.runtime.sampling import SamplingParams
    from specpilot.spec_decode.drafters.registry import build_drafter
    from specpilot.spec_decode.tree import TreeSpec
    from specpilot.train.eagle3 import train_eagle3

    corpus = load_corpus(str(corpus_dir), held_out_percent=20)
    three = dict(TINY["dense"], num_hidden_layers=3)
    train_lm(corpus, tokenizer_dir, tmp_path / "t", three, TrainConfig(**{**CFG.__dict__, "steps": 30}))
    first = train_eagle3(corpus, tmp_path / "t", tmp_path / "e0", TrainConfig(**{**CFG.__dict__, "steps": 1}),
                         draft_vocab_size=200, rollouts=8)
    report = train_eagle3(corpus, tmp_path / "t", tmp_path / "e", TrainConfig(**{**CFG.__dict__, "steps": 40}),
                          draft_vocab_size=200, rollouts=8)
    assert report["held_out_loss"] < first["held_out_loss"] - 0.5
    target = load_model(str(tmp_path / "t"), "cpu", "float32")
    drafter = build_drafter(str(tmp_path / "e"), target)
    assert drafter.name == "eagle3"
    prompts = [torch.randint(0, 280, (n,)).tolist() for n in (6, 11)]
    params = SamplingParams(max_new_tokens=16)
    ref = [r.token_ids for r in Generator(ModelRunner(target)).generate(prompts, params)]
    for tree in ("chain:3", "dynamic:2,3,5"):
        out = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(tree)).generate(prompts, params)
        assert [r.token_ids for r, _ in out] == ref
