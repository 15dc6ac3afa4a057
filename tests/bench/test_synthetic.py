"""SyntheticDrafter under continuous batching (truth by prompt, slots reused, any subset of slots per step, a
preempted request resumed) and with a per-request acceptance variation; profiles with a variation block."""

import json
import random

import pytest

from specpilot.bench.synthetic import AcceptanceProfile, SyntheticDrafter
from specpilot.bench.variation import VariationModel, pooled_per_depth, trace_stats
from specpilot.spec_decode.tree import TreeSpec

ALWAYS = AcceptanceProfile("always", (1.0,) * 7)
CHAIN2 = TreeSpec.parse("chain:2")


class _Inner:
    target_layers = ()

    def __init__(self, max_depth=None):
        self.max_depth = max_depth

    def start(self, slot, prompt, features=None): ...

    def commit(self, slot, accepted, features=None): ...

    def propose(self, slots, roots, spec): ...


def test_truth_is_looked_up_by_prompt_and_a_reused_slot_follows_its_new_request():
    truth = {(1, 2): [10, 11, 12, 13], (3, 4): [20, 21, 22, 23]}
    d = SyntheticDrafter(_Inner(), truth, ALWAYS, 100)
    d.start(0, [1, 2])
    assert d.propose([0], [10], CHAIN2)[0].tokens == (10, 11, 12)
    d.commit(0, [11, 12])
    d.start(0, [3, 4])  # the first request left; a new one takes its slot
    assert d.propose([0], [20], CHAIN2)[0].tokens == (20, 21, 22)


def test_slots_in_any_order_and_any_subset_follow_their_own_requests():
    truth = {(1,): list(range(100, 140)), (2,): list(range(200, 240)), (3,): list(range(300, 340))}
    d = SyntheticDrafter(_Inner(), truth, ALWAYS, 1000)
    for slot, prompt in ((0, [1]), (1, [2])):
        d.start(slot, prompt)
    roots = {0: 100, 1: 200}
    for slots in ([1, 0], [0], [1], [0, 1]):  # requests skip steps, the batch order changes
        trees = d.propose(slots, [roots[s] for s in slots], CHAIN2)
        for s, t in zip(slots, trees):
            assert t.tokens == (roots[s], roots[s] + 1, roots[s] + 2)
            d.commit(s, [roots[s] + 1, roots[s] + 2])
            roots[s] += 3
    d.start(0, [3])  # joins while slot 1 runs on
    roots[0] = 300
    trees = d.propose([1, 0], [roots[1], roots[0]], CHAIN2)
    assert [t.tokens for t in trees] == [(209, 210, 211), (300, 301, 302)]


def test_a_resumed_request_keeps_its_truth_and_its_acceptance_state():
    """After a preemption the engine starts the request again with its prompt and every token it emitted but
    the last: the oracle picks up where it was, and the request's variation state goes on."""
    truth = {(1, 2): list(range(10, 40))}
    profile = AcceptanceProfile("always", (1.0,) * 7).with_variation(VariationModel(1.0, 1.0, 0.5, 2.0), "test")
    d = SyntheticDrafter(_Inner(), truth, profile, 100)
    d.start(3, [1, 2])
    d.propose([3], [10], CHAIN2)
    d.commit(3, [11, 12])
    state = d.state[3]
    d.start(5, [1, 2, 10, 11, 12])  # resumed in another slot; 13 (the bonus) is its root
    assert d.propose([5], [13], CHAIN2)[0].tokens == (13, 14, 15)
    assert d.state[5] is state


def test_a_requests_state_path_does_not_depend_on_its_batch():
    """The state path comes from the seed and the prompt: alone, or in a reused slot beside other requests in
    another order, the request passes through the same states."""
    profile = AcceptanceProfile.load("dflash2-gsm8k")
    truth = {(i,): list(range(50)) for i in range(4)}

    def path(d, slot, steps=60):
        out = []
        for _ in range(steps):
            out.append(d.state[slot][0].easy)
            d.propose([slot], [0], CHAIN2)
        return out

    alone = SyntheticDrafter(_Inner(), dict(truth), profile, 100, seed=7)
    alone.start(0, [3])
    busy = SyntheticDrafter(_Inner(), dict(truth), profile, 100, seed=7)
    busy.start(2, [1])
    busy.start(0, [2])
    busy.propose([0, 2], [0, 0], CHAIN2)
    busy.start(2, [3])  # slot 2 reused
    assert path(alone, 0) == path(busy, 2)
    assert len(set(path(busy, 2, 400))) == 2  # it does switch


def _chain_run(d: SyntheticDrafter, requests: int, steps: int, slots: int = 3) -> list[list[int]]:
    """A continuous batch on a chain of 7 without a probe: `slots` slots, each request `steps` steps, a finished
    request's slot taken by the next one. Returns each request's accepted drafts per step."""
    spec, traces, running, next_request = TreeSpec.parse("chain:7"), [], {}, 0
    while next_request < requests or running:
        for slot in range(slots):
            if slot not in running and next_request < requests:
                prompt = (next_request,)
                d.start(slot, list(prompt))
                running[slot] = [prompt, 0, []]  # prompt, emitted count, trace
                next_request += 1
        slots_now = sorted(running, reverse=len(traces) % 2 == 1)
        roots = [d.truth[running[s][0]][running[s][1]] for s in slots_now]
        for s, tree in zip(slots_now, d.propose(slots_now, roots, spec)):
            prompt, done, trace = running[s]
            truth = d.truth[prompt]
            k = 0
            while k < 7 and tree.tokens[k + 1] == truth[done + k + 1]:
                k += 1
            d.commit(s, list(tree.tokens[1:k + 1]))
            trace.append(k)
            running[s][1] = done + k + 1
            if len(trace) == steps:
                traces.append(trace)
                del running[s]
    return traces


def test_the_drafter_realizes_the_variation_and_keeps_the_profiles_means():
    """Through the drafter, in a continuous batch: requests differ, steps correlate within a request (the i.i.d.
    profile shows neither), and the pooled per-depth acceptance is the profile's."""
    base = AcceptanceProfile("zoo-like", (0.77, 0.73, 0.62, 0.49, 0.56, 0.70, 0.88))
    varied = base.with_variation(VariationModel(2.0, 1.0, 0.15, 3.0), "test")
    truth = {(i,): [random.Random(i).randrange(1000) for _ in range(500)] for i in range(200)}
    stats = {}
    for name, profile in (("iid", base), ("varied", varied)):
        traces = _chain_run(SyntheticDrafter(_Inner(), dict(truth), profile, 1000), 200, 50)
        stats[name] = trace_stats(traces, 7)
        if name == "varied":
            # steps of equal count per request: the pooled acceptance is the stationary one (no token budget)
            assert pooled_per_depth(traces, 7) == pytest.approx(base.per_depth, abs=0.06)
    assert stats["varied"]["lag1_within"] > 0.15 > abs(stats["iid"]["lag1_within"])
    assert stats["varied"]["request_tau_std"] > 2 * stats["iid"]["request_tau_std"]


def test_max_depth_comes_from_the_inner_drafter_and_caps_the_tree():
    d = SyntheticDrafter(_Inner(max_depth=3), {0: list(range(40))}, ALWAYS, 100)
    assert d.max_depth == 3
    (tree,) = d.propose([0], [5], TreeSpec.parse("chain:10"))
    assert max(tree.depths) == 3
    assert SyntheticDrafter(_Inner(), {}, ALWAYS, 100).max_depth is None


def test_shipped_dflash2_profiles_carry_the_zoo_variation_and_say_so():
    for name in ("dflash2-gsm8k", "dflash2-mixed"):
        p = AcceptanceProfile.load(name)
        assert isinstance(p.variation, VariationModel) and p.variation.contrast > 0
        assert p.label.startswith(f"{name} (synthetic, ") and "Markov" in p.label
        json.dumps(p.__dict__)  # the bench writes the profile as JSON data
        assert AcceptanceProfile.load(name).to_dict()["variation"] == p.variation.to_dict()
    assert AcceptanceProfile.load("zoo-dense-dflash").variation is None
    assert AcceptanceProfile.load("zoo-dense-dflash").label == "zoo-dense-dflash (synthetic, i.i.d. per step)"


@pytest.mark.parametrize("block, message", [
    ({"mix_a": 1.0}, "variation: needs exactly the keys mix_a, mix_b, redraw, contrast"),
    ({"mix_a": 1.0, "mix_b": 1.0, "redraw": 2.0, "contrast": 1.0}, "needs mix_a > 0, mix_b > 0, 0 <= redraw <= 1"),
    ({"mix_a": "x", "mix_b": 1.0, "redraw": 0.5, "contrast": 1.0}, "variation: mix_a must be a number, got 'x'"),
])
def test_a_bad_variation_block_is_one_clear_error(tmp_path, block, message):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"name": "p", "per_depth": [0.5] * 7, "variation": block}))
    with pytest.raises(ValueError, match=message) as e:
        AcceptanceProfile.load(str(path))
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)
