"""EAGLE-3 training and inference compute the same step-0 draft logits: for one target and one token sequence, the
training forward (eagle3_forward on the target's full-sequence features) and the head as the engine drives it
(prefill features at start, verify features at each commit, a checkpoint saved by training and loaded for
inference) give the same logits at every position the head is fed."""

import torch

from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.models.loader import load_model
from specpilot.models.eagle3 import Eagle3Head, eagle3_target_layers, head_config
from specpilot.spec_decode.drafters.eagle3 import Eagle3Drafter
from specpilot.spec_decode.tree import TreeSpec
from specpilot.train.dflash import _features
from specpilot.train.eagle3 import eagle3_forward, head_raw_config, save_eagle3, tap_inputs
from tests.checkpoints import VOCAB
from tests.train.test_dflash_consistency import _Oracle

DEPTH, NEW, DRAFT_VOCAB = 5, 18, 200


def _random_head(target, taps) -> tuple[Eagle3Head, dict]:
    gen = torch.Generator().manual_seed(13)
    selected = torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB].sort().values
    raw = head_raw_config(target.config, DRAFT_VOCAB, taps)
    head = Eagle3Head(head_config(raw, "test"), target.config.hidden_size, DRAFT_VOCAB, False, False)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name not in ("d2t", "t2d"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen) if p.ndim == 1
                        else 0.08 * torch.randn(p.shape, generator=gen))
        head.d2t.copy_(selected - torch.arange(DRAFT_VOCAB))
        head.t2d.zero_()
        head.t2d[selected] = True
    return head.eval(), raw


def test_inference_logits_equal_the_training_forward(checkpoint_factory, tmp_path):
    path, _ = checkpoint_factory("qwen3")
    target = load_model(str(path), "cpu", "float32")
    taps = tap_inputs(target.config.num_hidden_layers)
    head, raw = _random_head(target, taps)
    save_eagle3(head, raw, tmp_path / "e", {}, "float32")
    drafter = Eagle3Drafter.from_pretrained(tmp_path / "e", target)
    layers = eagle3_target_layers(target.config.num_hidden_layers, taps)
    assert drafter.target_layers == layers == tuple(i - 1 for i in taps)

    recorded, feed = [], drafter.feed

    def _record(slot, root):  # every committed pair the head is fed: (slot, head position, logits)
        before = drafter.seen[slot]
        h = feed(slot, root)
        recorded.extend((slot, before + i, lg) for i, lg in enumerate(drafter.draft_logits(h)))
        return h

    drafter.feed = _record
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, 300, (n,), generator=gen).tolist() for n in (13, 7)]
    ref = Generator(ModelRunner(target)).generate(prompts, SamplingParams(max_new_tokens=NEW + DEPTH + 1))
    sequences = [p + r.token_ids for p, r in zip(prompts, ref)]
    out = SpecEngine(ModelRunner(target), _Oracle(drafter, sequences), TreeSpec.parse(f"chain:{DEPTH}")).generate(
        prompts, SamplingParams(max_new_tokens=NEW))
    emitted = [p + r.token_ids for p, (r, _) in zip(prompts, out)]
    assert emitted == [s[:len(p) + NEW] for p, s in zip(prompts, sequences)]

    trainer = Eagle3Drafter(head, target, layers)  # as train_eagle3 builds it
    for slot, seq in enumerate(sequences):
        tokens = torch.tensor(seq)[None]
        with torch.no_grad():
            features, _ = _features(target, tokens, layers)
            theirs = eagle3_forward(trainer, features, tokens)[0]
        mine = [(p, lg) for s, p, lg in recorded if s == slot]
        assert [p for p, _ in mine] == list(range(len(mine))) and len(mine) > len(prompts[slot]) + NEW // 2
        torch.testing.assert_close(torch.stack([lg for _, lg in mine]), theirs[:len(mine)], rtol=1e-4, atol=1e-4)
