"""Continuous batching (CPU, fp32, tiny random checkpoints): requests that join mid-generation, leave, are aborted
or preempted emit exactly what each emits alone; prefill chunks ride in the verify forward; every drafter and
both target kinds."""

import pytest
import torch

from specpilot.engine.cost_curve import VerifyCostCurve
from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.models.loader import load_model
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.drafters.dflash import load_dflash
from specpilot.spec_decode.drafters.draft_lm import DraftLMDrafter
from specpilot.spec_decode.drafters.eagle3 import Eagle3Drafter
from specpilot.spec_decode.drafters.ngram import NgramDrafter
from specpilot.spec_decode.tree import TreeSpec
from tests.spec_decode.test_dflash import write_dflash
from tests.spec_decode.test_eagle3 import TARGET_LAYERS as EAGLE_TARGET_LAYERS
from tests.spec_decode.test_eagle3 import write_eagle3

PARAMS = SamplingParams(max_new_tokens=20, ignore_eos=True)


def _prompts(n=5, vocab=300, seed=5):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for length in (4, 15, 9, 22, 7, 12)[:n]:
        base = torch.randint(0, vocab, (length,), generator=gen).tolist()
        out.append(base + base[:length // 2])  # repeats give the n-gram drafter matches
    return out


def _target(checkpoint_factory, name, **overrides):
    path, _ = checkpoint_factory(name, **overrides)
    return load_model(str(path), "cpu", "float32")


def _alone(target, prompts, params=PARAMS):
    """Each prompt generated on its own by the plain AR generator: the reference."""
    return [Generator(ModelRunner(target)).generate([p], params)[0].token_ids for p in prompts]


def _drafter(kind, target, checkpoint_factory, tmp_path):
    if kind == "ngram":
        return NgramDrafter(), "chain:4"
    if kind == "draft-lm":
        name = "qwen3_5" if target.config.is_hybrid else "qwen3"
        return DraftLMDrafter(_target(checkpoint_factory, name, num_hidden_layers=1)), "static:2,2,1"
    if kind == "dflash":
        return load_dflash(write_dflash(tmp_path / "dflash"), target), "chain:5"
    if kind == "eagle3":
        return Eagle3Drafter.from_pretrained(write_eagle3(tmp_path / "eagle3"), target), "static:2,1,1"
    return None, None


def _staggered(engine, prompts, params=PARAMS, every=2, **add):
    """Adds the first prompt, then one more every `every` steps while the earlier ones run; returns each
    request's tokens as the step outputs delivered them."""
    got, ids, pending, steps = {}, [], list(prompts), 0
    while pending or engine.has_unfinished():
        if pending and steps % every == 0:
            ids.append(engine.add_request(pending.pop(0), params, **add))
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
        steps += 1
    return [got[i] for i in ids]


CASES = [("qwen3", "ngram"), ("qwen3", "draft-lm"), ("qwen3", "dflash"), ("llama", "eagle3"),
         ("qwen3_5", "ngram"), ("qwen3_5", "draft-lm"), ("qwen3", None), ("qwen3_5", None)]


@pytest.mark.parametrize("name,drafter", CASES)
def test_joining_mid_generation_emits_what_it_emits_alone(name, drafter, checkpoint_factory, tmp_path):
    overrides = {"num_hidden_layers": EAGLE_TARGET_LAYERS} if drafter == "eagle3" else {}
    target = _target(checkpoint_factory, name, **overrides)
    draft, tree = _drafter(drafter, target, checkpoint_factory, tmp_path)
    engine = SpecEngine(ModelRunner(target), draft, TreeSpec.parse(tree) if tree else None,
                        scheduler=SchedulerConfig(max_num_seqs=3, max_prefill_tokens=8))
    prompts = _prompts(6, vocab=target.config.vocab_size)
    assert _staggered(engine, prompts) == _alone(target, prompts)
    assert not engine.has_unfinished() and sorted(engine.scheduler.free) == [0, 1, 2]


def test_prefill_chunks_ride_in_the_verify_forward(checkpoint_factory, monkeypatch):
    target = _target(checkpoint_factory, "qwen3_5")
    runner = ModelRunner(target)
    calls = []
    mixed = runner.mixed
    monkeypatch.setattr(runner, "mixed", lambda v, c, layers=(), logits=False: calls.append((v is not None, len(c)))
                        or mixed(v, c, layers, logits))
    engine = SpecEngine(runner, NgramDrafter(), TreeSpec.parse("chain:3"),
                        scheduler=SchedulerConfig(max_num_seqs=4, max_prefill_tokens=5))
    prompts = _prompts(4)
    assert _staggered(engine, prompts, every=3) == _alone(target, prompts)
    assert (True, 1) in calls  # a verify block and a prompt chunk in one forward
    assert all(n <= 5 for _, n in calls)


def test_abort_frees_the_slot_for_a_waiting_request(checkpoint_factory):
    target = _target(checkpoint_factory, "qwen3")
    engine = SpecEngine(ModelRunner(target), NgramDrafter(), TreeSpec.parse("chain:3"),
                        scheduler=SchedulerConfig(max_num_seqs=2))
    prompts = _prompts(3)
    a, b, c = (engine.add_request(p, PARAMS) for p in prompts)
    got = {}

    def step():
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)

    step()
    step()
    assert [r.request_id for r in engine.scheduler.running] == [a, b] and engine.scheduler.waiting
    slot = engine.scheduler.by_id[a].slot
    engine.abort(a)
    assert slot in engine.scheduler.free and a not in engine.scheduler.by_id
    step()
    assert engine.scheduler.by_id[c].slot == slot
    while engine.has_unfinished():
        step()
    ref = _alone(target, prompts)
    assert engine.stats(b) is not None
    assert got[c] == ref[2]
    with pytest.raises(KeyError):
        engine.abort(a)
    assert engine.stats(a).steps > 0  # an aborted request keeps its stats


def test_a_request_aborted_before_the_first_step_keeps_its_stats(checkpoint_factory):
    engine = SpecEngine(ModelRunner(_target(checkpoint_factory, "qwen3")), NgramDrafter(), TreeSpec.parse("chain:3"))
    rid = engine.add_request(_prompts(1)[0], PARAMS)
    engine.abort(rid)
    assert engine.stats(rid).steps == 0 and not engine.has_unfinished()


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_preempted_and_resumed_equals_uninterrupted(name, checkpoint_factory):
    target = _target(checkpoint_factory, name)
    engine = SpecEngine(ModelRunner(target), NgramDrafter(), TreeSpec.parse("chain:3"),
                        scheduler=SchedulerConfig(max_num_seqs=2, max_prefill_tokens=6))
    prompts = _prompts(3)
    low = [engine.add_request(p, PARAMS) for p in prompts[:2]]
    got = {}

    def run(steps):
        for _ in range(steps):
            for out in engine.step():
                got.setdefault(out.request_id, []).extend(out.new_token_ids)

    run(6)
    high = engine.add_request(prompts[2], PARAMS, priority=1)
    run(1)
    victim = engine.scheduler.by_id[low[1]]
    assert victim.stats.preempted == 1 and victim.slot == -1 and victim.result.token_ids
    while engine.has_unfinished():
        run(1)
    assert [got[i] for i in low + [high]] == _alone(target, prompts)


def test_budget_falls_back_to_plain_decoding(checkpoint_factory):
    """A verify curve where every extra token costs a full forward: no draft node pays, every request decodes one
    token per step, and the output is unchanged."""
    target = _target(checkpoint_factory, "qwen3")
    steep = VerifyCostCurve((1,), (0,), ((1, 2),), (((1.0, 2.0),),))
    engine = SpecEngine(ModelRunner(target), DraftLMDrafter(target), TreeSpec.parse("chain:4"), cost=steep)
    prompts = _prompts(3)
    out = engine.generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == _alone(target, prompts)
    assert all(s.tau == 1.0 for _, s in out)
    assert all(all(n == 0 for n in step["nodes"]) for step in engine.step_log)


def test_budget_follows_acceptance(checkpoint_factory):
    """With a flat verify curve a drafter that is always right (the target itself) keeps its full depth (the curve's
    100 s per forward makes the drafter's measured CPU time negligible however loaded the machine is)."""
    target = _target(checkpoint_factory, "qwen3")
    flat = VerifyCostCurve((1,), (0,), ((1, 64),), (((100.0, 100.0),),))
    engine = SpecEngine(ModelRunner(target), DraftLMDrafter(target), TreeSpec.parse("chain:4"), cost=flat)
    out = engine.generate(_prompts(2), PARAMS)
    assert all(s.tau > 3 for _, s in out)
    assert max(max(step["nodes"], default=0) for step in engine.step_log) == 4


def test_step_outputs_add_up_to_the_results(checkpoint_factory):
    target = _target(checkpoint_factory, "qwen3")
    engine = SpecEngine(ModelRunner(target), NgramDrafter(), TreeSpec.parse("chain:3"))
    streamed = {}
    out = engine.generate(_prompts(3), PARAMS, on_token=lambda i, t: streamed.setdefault(i, []).append(t))
    assert [streamed[i] for i in range(3)] == [r.token_ids for r, _ in out]


def test_bad_requests_get_clear_errors(checkpoint_factory):
    target = _target(checkpoint_factory, "qwen3")
    engine = SpecEngine(ModelRunner(target), NgramDrafter(), TreeSpec.parse("chain:3"),
                        scheduler=SchedulerConfig(max_model_len=64))
    with pytest.raises(ValueError, match="at least one token"):
        engine.add_request([], PARAMS)
    rid = engine.add_request([1, 2, 3], PARAMS, request_id="x")
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([1, 2, 3], PARAMS, request_id=rid)
    engine.step()
    with pytest.raises(ValueError, match="raise max_model_len"):
        engine.add_request([1] * 60, PARAMS)
    with pytest.raises(ValueError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0)


@pytest.mark.parametrize("target_name,kind", [("qwen3", "draft-lm"), ("qwen3_5", "draft-lm"), ("qwen3", "dflash")])
def test_a_skippable_drafter_sits_out_plain_steps(target_name, kind, checkpoint_factory, tmp_path, monkeypatch):
    """Steps whose every budget is 0 run no proposal (Drafter.skip); the drafter picks up after them in step: output
    unchanged, and a draft model that is the target itself still has every draft of the next steps accepted."""
    target = _target(checkpoint_factory, target_name)
    if kind == "draft-lm":
        drafter, tree = DraftLMDrafter(target), "chain:3"
    else:
        drafter, tree = _drafter(kind, target, checkpoint_factory, tmp_path)
    engine = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(tree), scheduler=SchedulerConfig(adaptive=False))
    full, steps, proposals = engine.budget, [0], []
    monkeypatch.setattr(engine, "budget", lambda active, chunks=(): [0] * len(active) if steps[0] % 3 else
                        full(active, chunks))
    real = drafter.propose
    monkeypatch.setattr(drafter, "propose", lambda *a: proposals.append(1) or real(*a))
    prompts = _prompts(3)
    ids = [engine.add_request(p, PARAMS) for p in prompts]
    got = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
        steps[0] += 1
    assert [got[i] for i in ids] == _alone(target, prompts)
    skipped = sum(1 for s in engine.step_log if s["batch"] and not any(s["nodes"]))
    assert skipped > 3 and len(proposals) == sum(1 for s in engine.step_log if any(s["nodes"]))
    if kind == "draft-lm":  # the draft model is the target: every draft it proposes after a skipped step is right
        for i in ids:
            st = engine.stats(i)
            assert sum(st.drafted_per_depth) > 0 and sum(st.accepted_per_depth) >= 0.9 * sum(st.drafted_per_depth)



def test_an_overestimated_draft_cost_fades_while_proposals_are_skipped(checkpoint_factory):
    """A draft cost once measured far too high (a compile, say) keeps every budget at 0, and skipped steps measure
    nothing: the estimate fades with each of them, so speculation is tried again; a drafter that proposes every
    step keeps its measured cost."""
    target = _target(checkpoint_factory, "qwen3")
    skipped = ({"batch": 2, "nodes": [0, 0]}, {"draft": 0.0, "verify": 0.01})
    for drafter, kept in ((DraftLMDrafter(target), 0.8 ** 10), (NgramDrafter(), 1.0)):
        engine = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse("chain:4"))
        engine._calibrate([({"batch": 2, "nodes": [4, 4], "levels": 4}, {"draft": 300.0, "verify": 0.01})] * 3)
        engine._calibrate([skipped] * 10)
        assert engine._draft_seconds(4) == pytest.approx(300.0 * kept)
        assert engine.skippable == (kept < 1)


def test_one_slow_draft_does_not_move_the_draft_cost():
    """The budget reads the lower median of the recent draft times (seeded with a free one): one proposal that
    captured a graph (a slow outlier), even the first, does not switch speculation off."""
    engine = SpecEngine.__new__(SpecEngine)
    engine._draft_s, engine.sequential, engine.skippable = {}, True, True
    engine._calibrate([({"batch": 4, "levels": 3}, {"draft": 5.0})])  # the first proposal captured its graph
    assert engine._draft_seconds(3) == 0.0
    for sec in (0.002, 0.002, 5.0, 0.002):
        engine._calibrate([({"batch": 4, "levels": 3}, {"draft": sec})])
    assert engine._draft_seconds(3) == pytest.approx(0.002)
    for _ in range(9):  # a lasting cost is read in full once it fills the window
        engine._calibrate([({"batch": 4, "levels": 3}, {"draft": 0.01})])
    assert engine._draft_seconds(3) == pytest.approx(0.01)
