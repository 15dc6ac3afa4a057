"""Every tree spec the parser accepts runs with every drafter (n-gram, draft LM, DFlash, EAGLE-3) on a dense and a
hybrid target, and speculative output equals plain greedy output token for token (fp32, CPU).

Specs are drawn over the whole accepted range (MAX_TREE_DEPTH levels, MAX_TREE_NODES while the tree grows),
degenerate ones included: depth 1, NODES below TOPK or above TOPK x DEPTH, widths past the EAGLE-3 draft vocabulary (200 ids),
depths past the DFlash block. Hypothesis runs derandomized, without a database: CI sees the same examples.
"""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.models.loader import load_model, load_tokenizer
from specpilot.spec_decode.drafters.registry import build_drafter
from specpilot.spec_decode.tree import MAX_TREE_DEPTH, MAX_TREE_NODES, TreeSpec
from tests.spec_decode.test_dflash import write_dflash
from tests.spec_decode.test_eagle3 import DRAFT_VOCAB, write_eagle3

PARAMS = SamplingParams(max_new_tokens=6, ignore_eos=True)
# a repeated phrase (the n-gram drafter finds matches) and a short prompt: a batch of two unequal lengths
PROMPTS = [[5, 6, 7, 8, 9] * 3 + [5, 6], [40, 3, 77, 120, 9, 310]]
DRAFTERS = ("ngram", "draft-lm", "dflash", "eagle3")


@st.composite
def tree_specs(draw) -> str:
    """A spec text the parser accepts, over its whole range; small sizes more often (deep trees draft level by
    level: their cost grows with the depth)."""
    budget = MAX_TREE_NODES - 1  # draft nodes while the tree grows

    def size(hi):
        return draw(st.one_of(st.integers(1, min(hi, 8)), st.integers(1, min(hi, 8)), st.integers(1, hi)))

    kind = draw(st.sampled_from(["chain", "static", "dynamic"]))
    if kind == "chain":
        return f"chain:{size(MAX_TREE_DEPTH)}"
    if kind == "static":
        branching, width = [], 1
        for _ in range(size(MAX_TREE_DEPTH)):
            room = budget // width  # children per node that keep the next level within the budget
            if room < 1:
                break
            branching.append(size(room))
            width *= branching[-1]
            budget -= width
        return "static:" + ",".join(map(str, branching))
    depth = size(MAX_TREE_DEPTH)
    top_k = size(budget // depth)
    return f"dynamic:{top_k},{depth},{size(top_k * depth + 3)}"


@pytest.fixture(scope="module")
def setups(checkpoint_factory, tmp_path_factory):
    """(target, drafter) per target kind and drafter name, and the target's plain greedy output of PROMPTS."""
    out = {}
    for kind, name, ckpt, dflash_cfg in (
            ("dense", "qwen3", {}, {"num_target_layers": 3}),
            ("hybrid", "qwen3_5", {},
             {"num_target_layers": 4, "dflash_config": {"mask_token_id": 300, "target_layer_ids": [1, 3]}})):
        path, _ = checkpoint_factory(name, **ckpt)
        target = load_model(str(path), "cpu", "float32")
        tmp = tmp_path_factory.mktemp(f"drafters-{kind}")
        drafters = {
            "ngram": "ngram",
            "draft-lm": str(path),  # the target drafting for itself: long accepted paths, real commits
            "dflash": str(write_dflash(tmp / "dflash", **dflash_cfg)),  # taps layers 0, 2 (dense)
            # taps the inputs of layers 1, 2, 3: a 3-layer target has them
            "eagle3": str(write_eagle3(tmp / "eagle3", eagle_aux_hidden_state_layer_ids=[1, 2, 3])),
        }
        reference = [r.token_ids for r in Generator(ModelRunner(target)).generate(PROMPTS, PARAMS)]
        tokenizer = load_tokenizer(str(path))
        for d, source in drafters.items():
            out[kind, d] = target, build_drafter(source, target, tokenizer), reference
    return out


CASES = [(kind, drafter) for kind in ("dense", "hybrid") for drafter in DRAFTERS]


@given(case=st.sampled_from(CASES), spec=tree_specs())
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
# every (target, drafter) at least once: the specs that crashed EAGLE-3 in store_kv (the tree while it grows
# outgrew the drafter's cache), a chain past the DFlash block, widths past the draft vocabulary, NODES < TOPK
@example(case=("dense", "eagle3"), spec="dynamic:8,3,2")
@example(case=("hybrid", "eagle3"), spec="dynamic:4,7,2")
@example(case=("dense", "eagle3"), spec=f"static:{DRAFT_VOCAB + 20}")
@example(case=("hybrid", "eagle3"), spec="dynamic:8,3,8")
@example(case=("dense", "draft-lm"), spec="dynamic:8,3,2")
@example(case=("hybrid", "draft-lm"), spec="dynamic:4,7,2")
@example(case=("dense", "dflash"), spec="chain:20")
@example(case=("hybrid", "dflash"), spec=f"static:{MAX_TREE_NODES - 1}")
@example(case=("dense", "ngram"), spec=f"dynamic:{MAX_TREE_NODES - 1},1,1")
@example(case=("hybrid", "ngram"), spec="static:1,2,3,4,1,1,1,1")
def test_every_accepted_spec_runs_and_equals_greedy(setups, case, spec):
    target, drafter, reference = setups[case]
    out = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(spec)).generate(PROMPTS, PARAMS)
    assert [r.token_ids for r, _ in out] == reference, (case, spec)


@pytest.mark.parametrize("spec", [f"chain:{MAX_TREE_DEPTH}", f"dynamic:7,{MAX_TREE_DEPTH},{MAX_TREE_NODES - 1}",
                                  "static:3" + ",1" * (MAX_TREE_DEPTH - 1)])
@pytest.mark.parametrize("case", [("dense", "eagle3"), ("hybrid", "draft-lm")])
def test_the_deepest_accepted_trees_run(setups, case, spec):
    """At the bounds, the drafters that store their tree as it grows: one prompt, a few steps."""
    target, drafter, reference = setups[case]
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    out = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(spec)).generate(PROMPTS[1:], params)
    assert out[0][0].token_ids == reference[1][:3]


@pytest.mark.parametrize("spec", [f"static:{MAX_TREE_NODES - 1}", f"dynamic:{MAX_TREE_NODES - 1},1,3"])
@pytest.mark.parametrize("drafter", ["draft-lm", "dflash"])
def test_trees_wider_than_the_vocabulary_run(checkpoint_factory, tmp_path, drafter, spec):
    """A 200-token target: a node has at most 200 distinct children, whatever width the spec asks for."""
    path, _ = checkpoint_factory("qwen3", vocab_size=200)
    target = load_model(str(path), "cpu", "float32")
    source = str(path) if drafter == "draft-lm" else str(write_dflash(
        tmp_path / "dflash", vocab_size=200, dflash_config={"mask_token_id": 190, "target_layer_ids": [0, 2]}))
    reference = Generator(ModelRunner(target)).generate(PROMPTS[:1], PARAMS)[0].token_ids
    out = SpecEngine(ModelRunner(target), build_drafter(source, target), TreeSpec.parse(spec)).generate(PROMPTS[:1],
                                                                                                          PARAMS)
    assert out[0][0].token_ids == reference


@pytest.mark.parametrize("text,nodes", [("static:16,15", 1 + 16 + 240),
                                        ("static:2,2,2,2,2,2,2,2", 511),
                                        ("dynamic:16,16,1", 1 + 16 * 16)])
def test_trees_that_grow_past_the_bound_are_refused(text, nodes):
    with pytest.raises(ValueError, match=rf"--tree '{text}': the tree grows to {nodes} nodes per step \(root "
                                         rf"included\); at most {MAX_TREE_NODES}: use a smaller tree"):
        TreeSpec.parse(text)


@pytest.mark.parametrize("text", [f"chain:{MAX_TREE_DEPTH + 1}", f"static:{','.join(['1'] * (MAX_TREE_DEPTH + 1))}",
                                  f"dynamic:1,{MAX_TREE_DEPTH + 1},1"])
def test_trees_deeper_than_the_bound_are_refused(text):
    with pytest.raises(ValueError, match=rf"--tree '{text}': {MAX_TREE_DEPTH + 1} levels deep; at most "
                                         rf"{MAX_TREE_DEPTH}: use a shallower tree"):
        TreeSpec.parse(text)


@given(spec=tree_specs())
@settings(max_examples=200, deadline=None, derandomize=True, database=None)
def test_the_strategy_draws_only_accepted_specs(spec):
    parsed = TreeSpec.parse(spec)
    assert str(parsed) == spec and parsed.max_tree_nodes <= parsed.max_grown_nodes <= MAX_TREE_NODES
    assert parsed.depth <= MAX_TREE_DEPTH
