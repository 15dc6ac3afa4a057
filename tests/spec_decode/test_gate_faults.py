"""The correctness gate catches injected faults: speculative output must equal the same runtime's AR output token
for token, and a drafter's context (its cache of target features) must equal one rebuilt from a prefill of the
committed tokens. Each fault is monkeypatched at the narrowest seam of the path it breaks:

  second_choice   the verify answers the target's second choice at every 5th position (ModelRunner._verify_eager)
  skip_kv_keep    a commit that skips the K/V compaction of the kept tree path (ModelCache.keep)
  fold_short      the recurrent state folded one node short of the kept path (the commit_paths ModelCache calls;
                  the conv windows stay right)
  feature_row     the drafter gets the feature row of the node after the last kept one (SpecEngine._paths_features)

On the CPU the gate runs on the trained zoo in fp32, where both paths agree exactly; tests/gpu/test_gate_gpu.py runs
the same faults on margin targets in bf16. Each test first checks that the run exercises the faulted path (a fault
test that cannot fail is no test), then that the gate passes without the fault and fails with it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from specpilot.bench.probing import ProbingEngine
from specpilot.bench.shapes import hf_config, margin_model, random_dflash
from specpilot.bench.synthetic import AcceptanceProfile, SyntheticDrafter
from specpilot.config import EngineConfig
from specpilot.runtime import cache as cache_module
from specpilot.runtime.cache import ModelCache
from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.runtime.settings import Runtime
from specpilot.ops.path_index import PathIndex
from specpilot.spec_decode.drafters.dflash import DFlashDrafter
from specpilot.spec_decode.drafters.eagle3 import Eagle3Drafter
from specpilot.spec_decode.tree import TreeSpec

ZOO = Path(__file__).resolve().parents[2] / "zoo"
TEXTS = ["def fibonacci(n):\n    if n < 2:\n        return n\n",
         "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"]


# ------------------------------------------------------------------------------------------------ the faults
def second_choice(monkeypatch) -> None:
    real = ModelRunner._verify_eager

    def faulty(self, meta, layers, as_logits=False):
        model, plain = self.model, self.model.logits

        def logits(hidden, paths):  # the argmax knocked out at positions 0 mod 5: the second choice wins there
            out = plain(hidden, paths)
            first = out.argmax(-1, keepdim=True)
            hit = (meta.positions % 5 == 0)[..., None]
            return out.scatter(-1, first, torch.where(hit, float("-inf"), out.gather(-1, first)))

        model.logits = logits  # an instance attribute for this call only (a captured graph keeps what it traced)
        try:
            return real(self, meta, layers, as_logits)
        finally:
            del model.logits

    monkeypatch.setattr(ModelRunner, "_verify_eager", faulty)


def skip_kv_keep(monkeypatch) -> None:
    monkeypatch.setattr(ModelCache, "keep", lambda self, index: None)


def fold_short(monkeypatch) -> None:
    real = cache_module.commit_paths

    def faulty(ssm, conv, stash, index: PathIndex):
        short = index.packed.clone()
        short[:, 3] = (short[:, 3] - 1).clamp(min=0)  # NODES = 4: row, slot, base, length, nodes...
        window = conv.clone()
        real(ssm, conv, stash, PathIndex(short))  # the state folded one node short
        conv.copy_(window)
        real(ssm.clone(), conv, stash, index)  # the conv windows of the whole path (this state copy is dropped)

    monkeypatch.setattr(cache_module, "commit_paths", faulty)


def feature_row(monkeypatch) -> None:
    def faulty(self, accepted):
        T = self._features.shape[1]
        out = []
        for row, acc in enumerate(accepted):
            path = acc.path
            last = min(path[-1] + 1, T - 1)
            out.append(self._features[row, torch.tensor(list(path[:-1]) + [last], device=self._features.device)])
        return out

    monkeypatch.setattr(SpecEngine, "_paths_features", faulty)


FAULTS = {"second_choice": second_choice, "skip_kv_keep": skip_kv_keep, "fold_short": fold_short,
          "feature_row": feature_row}


# -------------------------------------------------------------------------------------------------- the gate
def run_pair(target, make_drafter, tree: str, prompts, params: SamplingParams, engine: EngineConfig = EngineConfig(),
             oracle: AcceptanceProfile | None = None):
    """(AR outputs, speculative outputs, the speculative engine) of one runtime on the same prompts. With an
    `oracle` profile the drafter runs inside the synthetic oracle (bench/synthetic.py: its proposals replaced by
    drafts that follow the profile, probed against this verify), as a synthetic-acceptance benchmark runs it."""
    runtime = Runtime.build(engine, next(target.parameters()).device)
    ar = [r.token_ids for r in Generator(ModelRunner(target, runtime)).generate(prompts, params)]
    drafter = make_drafter()
    if oracle is not None:
        drafter = SyntheticDrafter(drafter, dict(enumerate(ar)), oracle, target.config.vocab_size)
    make_engine = SpecEngine if oracle is None else ProbingEngine  # ProbingEngine hands the oracle its probe
    spec_engine = make_engine(ModelRunner(target, runtime), drafter, TreeSpec.parse(tree))
    spec = [r.token_ids for r, _ in spec_engine.generate(prompts, params)]
    return ar, spec, spec_engine


def gate_failures(ar, spec, engine, target, tolerance: float = 1e-3) -> list[str]:
    """What the gate finds wrong: outputs that differ from AR (first differing token), drafter contexts that differ
    from a rebuild (largest relative error of a position's K or V)."""
    fails = []
    for i, (a, s) in enumerate(zip(ar, spec)):
        if a != s:
            at = next((k for k, (x, y) in enumerate(zip(a, s)) if x != y), min(len(a), len(s)))
            fails.append(f"request {i}: speculative output differs from AR from token {at}")
    fails += [f"request {i}: drafter context differs from a prefill rebuild (relative error {err:.3g})"
              for i, err in enumerate(drafter_context_errors(engine, target)) if err > tolerance]
    return fails


@torch.inference_mode()
def drafter_context_errors(engine: SpecEngine, target) -> list[float]:
    """Per request, for drafters that cache target features (DFlash, EAGLE-3; also inside a synthetic oracle): the
    largest relative error, over positions, between the drafter's cached K/V and those of a fresh drafter started
    on a prefill of the same committed tokens (commit = prefill for the drafter too). Empty for other drafters."""
    drafter = getattr(engine.drafter, "inner", engine.drafter)
    if not isinstance(drafter, (DFlashDrafter, Eagle3Drafter)):
        return []
    errors = []
    for req in engine.requests:
        # the last step's kept path may run past max_new_tokens: only emitted tokens can be checked
        tokens = req.prompt + req.result.token_ids
        if isinstance(drafter, DFlashDrafter):
            drafter._flush()
            n = min(drafter.context_len[req.slot], len(tokens))
            fresh = DFlashDrafter(drafter.model, target, drafter.target_layers, drafter.block_size,
                                  drafter.mask_token_id, use_graphs=False)
        else:
            n = min(drafter.seen[req.slot], len(tokens) - 1)
            fresh = Eagle3Drafter(drafter.head, target, drafter.target_layers)
        eager = EngineConfig(cuda_graphs=False, verify_graphs=False)
        runner = ModelRunner(target, Runtime.build(eager, next(target.parameters()).device))
        runner.allocate(1, n + 1)
        _, feats = runner.prefill_features(0, tokens[:n], drafter.target_layers)
        fresh.allocate(1, n + 1)
        fresh.start(0, tokens[:n], feats)
        if isinstance(fresh, DFlashDrafter):
            fresh._flush()
        else:
            fresh.feed(0, tokens[n])
        worst = 0.0
        for mine, ref in ((drafter.cache.k, fresh.cache.k), (drafter.cache.v, fresh.cache.v)):
            a, b = (x.float().transpose(0, 2).reshape(n, -1) for x in (mine[:, req.slot, :, :n], ref[:, 0, :, :n]))
            err = (a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-6)  # per position, all layers and heads
            worst = max(worst, float(err.max()))
        errors.append(worst)
    return errors


@contextlib.contextmanager
def exercised(counts: dict):
    """Counts, while the block runs, what the faults break: commits whose kept path moves (K/V compaction), tree
    folds of the recurrent state, accepted drafts (feature rows past the root)."""
    real = ModelCache.commit

    def spy(self, slots, bases, paths, fold):
        counts["moves"] = counts.get("moves", 0) + sum(bool(p) and p[-1] != len(p) - 1 for p in paths)
        counts["folds"] = counts.get("folds", 0) + (len(paths) if fold else 0)
        counts["accepted"] = counts.get("accepted", 0) + sum(max(len(p) - 1, 0) for p in paths)
        return real(self, slots, bases, paths, fold=fold)

    ModelCache.commit = spy
    try:
        yield counts
    finally:
        ModelCache.commit = real


NEEDS = {"second_choice": "accepted", "skip_kv_keep": "moves", "fold_short": "folds", "feature_row": "accepted"}


# -------------------------------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def zoo():
    from specpilot.models.loader import load_model, load_tokenizer

    tok = load_tokenizer(str(ZOO / "dense"))
    models = {name: load_model(str(ZOO / name), "cpu", "float32") for name in ("dense", "hybrid")}
    return models, [tok.encode(t) for t in TEXTS]


CASES = {  # fault -> (target, drafter, tree)
    "second_choice": ("dense", "dense-dflash", "dynamic:4,5,16"),
    "skip_kv_keep": ("dense", "dense-dflash", "dynamic:4,5,16"),
    "fold_short": ("hybrid", "hybrid-dflash", "dynamic:4,5,16"),
    "feature_row": ("dense", "dense-dflash", "dynamic:4,5,16"),
    "feature_row-eagle3": ("dense", "dense-eagle3", "dynamic:4,5,16"),
}
PARAMS = SamplingParams(max_new_tokens=16)


def _drafter(target, name):
    from specpilot.spec_decode.drafters.registry import build_drafter

    return lambda: build_drafter(str(ZOO / name), target)


@pytest.fixture(scope="module")
def clean_runs():
    """Per (target, drafter, tree): what a clean run exercised and the gate's findings (run once, shared)."""
    return {}


def _clean(cache: dict, key, target, make, tree, prompts, params, oracle=None):
    if key not in cache:
        with exercised({}) as counts:
            ar, spec, engine = run_pair(target, make, tree, prompts, params, oracle=oracle)
        cache[key] = counts, gate_failures(ar, spec, engine, target)
    return cache[key]


@pytest.mark.parametrize("case", list(CASES))
def test_the_gate_fails_on_each_injected_fault(case, zoo, clean_runs, monkeypatch):
    models, prompts = zoo
    name, drafter, tree = CASES[case]
    fault = case.split("-")[0]
    target, make = models[name], _drafter(models[name], drafter)
    counts, found = _clean(clean_runs, (name, drafter, tree), target, make, tree, prompts, PARAMS)
    assert found == []  # main passes
    assert counts.get(NEEDS[fault], 0) > 0, counts  # the run takes the path the fault breaks
    FAULTS[fault](monkeypatch)
    ar, spec, engine = run_pair(target, make, tree, prompts, PARAMS)
    assert gate_failures(ar, spec, engine, target), f"{case}: the gate passed a faulty run"


# ------------------------------------------------------------------------ the same faults on margin targets
MARGIN_CASES = {  # fault -> (shape, tree): a random DFlash drafter inside the synthetic oracle
    "second_choice": ("tiny-dense", "chain:4"),
    "skip_kv_keep": ("tiny-dense", "dynamic:4,5,16"),
    "fold_short": ("tiny-hybrid", "dynamic:4,5,16"),
    "fold_short-chain": ("tiny-hybrid", "chain:4"),
    "feature_row": ("tiny-dense", "dynamic:4,5,16"),
}


@pytest.fixture(scope="module")
def margin_targets():
    return {shape: margin_model(hf_config(shape), "cpu", torch.float32) for shape in ("tiny-dense", "tiny-hybrid")}


def margin_prompts(target, lengths=(7, 30, 2)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, target.config.vocab_size, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("case", list(MARGIN_CASES))
def test_margin_targets_catch_each_injected_fault(case, margin_targets, clean_runs, monkeypatch):
    """The faults tests/gpu/test_gate_gpu.py injects on the real shapes in bf16, here on the tiny shapes in fp32:
    the margin circuit's output depends on the K/V of the previous position and on the recurrent state, so a
    wrong entry changes it."""
    shape, tree = MARGIN_CASES[case]
    fault = case.split("-")[0]
    target = margin_targets[shape]
    make = lambda: random_dflash(target, shape)  # noqa: E731
    profile = AcceptanceProfile.load("dflash2-gsm8k")
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    prompts = margin_prompts(target)
    counts, found = _clean(clean_runs, (shape, tree), target, make, tree, prompts, params, oracle=profile)
    assert found == []
    assert counts.get(NEEDS[fault], 0) > 0, counts
    FAULTS[fault](monkeypatch)
    ar, spec, engine = run_pair(target, make, tree, prompts, params, oracle=profile)
    assert gate_failures(ar, spec, engine, target), f"{case}: the gate passed a faulty run"
