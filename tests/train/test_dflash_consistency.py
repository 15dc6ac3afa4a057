"""DFlash training and inference compute the same draft logits: for one target, one token sequence and one anchor,
the training forward (dflash_forward on the target's full-sequence features) and the drafter as the engine drives
it (prefill features at start, verify features at each commit, a checkpoint saved by training and loaded for
inference) give the same block logits. A mismatch in any convention (context positions, target layers, RoPE
positions, mask id, which slot predicts which token) would train weights for a forward that inference never runs."""

import pytest
import torch

from specpilot.engine.engine import SpecEngine
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.models.loader import load_model
from specpilot.models.dflash import DFlashModel
from specpilot.spec_decode.drafters.dflash import load_dflash
from specpilot.spec_decode.tree import DraftTree, TreeSpec
from specpilot.train.dflash import _features, dflash_forward, draft_config, save_dflash
from tests.checkpoints import VOCAB

BLOCK, MASK, NEW = 6, 317, 18
HITS = (0, 3, 5, 1, 2, 0, 4)  # drafted tokens the oracle gets right per step (5 = the whole chain)


class _Oracle:
    """Drives the drafter under test exactly as the engine does, but replaces its chain with the target's own
    continuation for HITS[step] tokens and then a wrong one, so that commits of 1 .. BLOCK tokens all happen (a
    random drafter is never accepted)."""

    def __init__(self, inner, sequences):
        self.inner, self.sequences = inner, sequences
        self.name, self.target_layers = inner.name, inner.target_layers
        self.position, self.steps = {}, 0

    def allocate(self, num_slots, max_seq_len):
        self.inner.allocate(num_slots, max_seq_len)

    def start(self, slot, prompt_ids, features):
        self.position[slot] = len(prompt_ids)
        self.inner.start(slot, prompt_ids, features)

    def commit(self, slot, accepted, features):
        self.position[slot] += 1 + len(accepted)
        self.inner.commit(slot, accepted, features)

    def propose(self, slots, roots, spec):
        self.inner.propose(slots, roots, spec)  # the forward under test (recorded by _record)
        trees = []
        for slot, root in zip(slots, roots):
            seq, at = self.sequences[slot], self.position[slot]
            assert seq[at] == root
            hits = HITS[self.steps % len(HITS)]
            right = seq[at + 1:at + 1 + hits]
            chain = right + [(seq[at + 1 + len(right)] + 1) % VOCAB] if len(right) < spec.depth else right
            trees.append(DraftTree.chain([root] + chain[:spec.depth]))
        self.steps += 1
        return trees


def _random_dflash(target, layers) -> DFlashModel:
    gen = torch.Generator().manual_seed(11)
    model = DFlashModel(draft_config(target.config, 2), len(layers))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen) if p.ndim == 1
                    else 0.08 * torch.randn(p.shape, generator=gen))
    return model.eval()


def _both_sides(target, layers, tmp_path, train_layers=None, train_mask=MASK):
    """(inference logits, training logits), each [steps, BLOCK - 1, vocab], for every proposal of a 2-request
    engine run; the training side may be perturbed (its target layers, its mask id)."""
    model = _random_dflash(target, layers)
    save_dflash(model, target.config, layers, BLOCK, MASK, tmp_path / "d", {}, "float32")
    drafter = load_dflash(tmp_path / "d", target)
    assert drafter.target_layers == tuple(layers) and drafter.mask_token_id == MASK

    recorded, logits_fn = [], drafter._logits

    def _record(inputs, depth, max_prefix_len):
        out = logits_fn(inputs, depth, max_prefix_len)
        recorded.extend(zip(inputs[1].tolist(), inputs[2].tolist(), out.clone()))  # (slot, root position, logits)
        return out

    drafter._logits = _record
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, 300, (n,), generator=gen).tolist() for n in (13, 7)]  # 13 > BLOCK: an eager flush
    ref = Generator(ModelRunner(target)).generate(prompts, SamplingParams(max_new_tokens=NEW + BLOCK))
    sequences = [p + r.token_ids for p, r in zip(prompts, ref)]
    oracle = _Oracle(drafter, sequences)
    out = SpecEngine(ModelRunner(target), oracle, TreeSpec.parse(f"chain:{BLOCK - 1}"),
                     scheduler=SchedulerConfig(adaptive=False)).generate(
        prompts, SamplingParams(max_new_tokens=NEW))
    emitted = [p + r.token_ids for p, (r, _) in zip(prompts, out)]
    assert emitted == [s[:len(p) + NEW] for p, s in zip(prompts, sequences)]
    anchors = {0: [], 1: []}
    for slot, at, _ in recorded:
        anchors[slot].append(at)
    assert max(b - a for a, b in zip(anchors[0], anchors[0][1:])) == BLOCK  # a whole accepted block was committed

    ours, theirs = [], []
    for slot, seq in enumerate(sequences):
        tokens = torch.tensor(seq)[None]  # the ref run goes BLOCK tokens past the last anchor's block
        with torch.no_grad():
            features, _ = _features(target, tokens, train_layers or layers)
            logits = dflash_forward(model, target, features, tokens, torch.tensor([anchors[slot]]), BLOCK, train_mask)
        theirs.append(logits)
        ours.append(torch.stack([lg for s, _, lg in recorded if s == slot]))
    return torch.cat(ours), torch.cat(theirs)


@pytest.fixture(params=["dense", "hybrid"])
def target_and_layers(request, checkpoint_factory):
    if request.param == "dense":
        path, _ = checkpoint_factory("qwen3")
        return load_model(str(path), "cpu", "float32"), (0, 2)
    path, _ = checkpoint_factory("qwen3_5", hidden_size=64)
    return load_model(str(path), "cpu", "float32"), (1, 3)


def test_inference_block_logits_equal_the_training_forward(target_and_layers, tmp_path):
    target, layers = target_and_layers
    ours, theirs = _both_sides(target, layers, tmp_path)
    assert ours.shape == theirs.shape and ours.shape[1:] == (BLOCK - 1, VOCAB)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("perturb", ["layer 2 read as its input", "mask id"])
def test_the_comparison_sees_a_wrong_convention(perturb, checkpoint_factory, tmp_path):
    """The guard above can fail: one convention changed on the training side moves the logits far past its
    tolerance."""
    path, _ = checkpoint_factory("qwen3")
    target = load_model(str(path), "cpu", "float32")
    kw = {"train_layers": (0, 1)} if perturb.startswith("layer") else {"train_mask": MASK - 1}
    ours, theirs = _both_sides(target, (0, 2), tmp_path, **kw)
    assert (ours - theirs).abs().max() > 1e-2


def test_the_training_forward_stores_through_the_kernel_under_no_grad(checkpoint_factory, monkeypatch):
    """Held-out evaluation runs the training forward under no_grad, where a CUDA run stores the block's K/V with the
    Triton kernel (it asks for dense caches): interpreted here, it gives the logits of the autograd path."""
    import specpilot.ops.store_kv as store_kv

    path, _ = checkpoint_factory("qwen3")
    target = load_model(str(path), "cpu", "float32")
    model = _random_dflash(target, (0, 2))
    tokens = torch.randint(2, 300, (2, 40), generator=torch.Generator().manual_seed(3))
    features, _ = _features(target, tokens, (0, 2))
    anchors = torch.tensor([[3, 17, 30], [1, 9, 33]])
    want = dflash_forward(model, target, features, tokens, anchors, BLOCK, MASK)  # parameters with grad: reference
    calls = []
    monkeypatch.setattr(store_kv, "use_triton", lambda x: calls.append(1) or True)
    with torch.no_grad():
        got = dflash_forward(model, target, features, tokens, anchors, BLOCK, MASK)
    assert calls
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
