"""ProbingEngine: the synthetic oracle's probe is a verify that commits nothing, and the benchmark's hooks stay in
the benchmark (no probe on SpecEngine or the drafters, no attributes poked onto them by the harness)."""

import ast
from pathlib import Path

import pytest
import torch

import specpilot
from specpilot.config import EngineConfig
from specpilot.engine.engine import SpecEngine
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.engine.generator import Generator
from specpilot.models.loader import load_model
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.settings import Runtime
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.drafters.ngram import NgramDrafter
from specpilot.spec_decode.tree import TreeSpec

PACKAGE = Path(specpilot.__file__).parent
PARAMS = SamplingParams(max_new_tokens=24)
# the names of the synthetic oracle's hooks: none of them is a name in the engine, the runtime or the drafters
HOOKS = {"peek", "probe", "probes", "untimed", "oracle", "truth"}
# the harness sets attributes only on `self` and on these objects of its own making (none a drafter or engine)
OWNED = {"OracleClock", "ModelRunner"}


def _prompts():
    gen = torch.Generator().manual_seed(5)
    base = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (4, 15, 9)]
    return [b + b[: len(b) // 2] + b for b in base]  # repeats give the n-gram drafter matches


@pytest.mark.parametrize("name,commit,tree", [("qwen3_5", "replay", "chain:4"), ("qwen3_5", "fold", "chain:4"),
                                              ("qwen3_5", "fold", "static:2,2"), ("qwen3", "fold", "dynamic:3,4,8")])
def test_probe_commits_nothing(name, commit, tree, checkpoint_factory):
    """The probe runs the step's verify on the step's trees and leaves the cache as it found it: a replayed hybrid
    chain advances the recurrent state in place, and the probe rewinds it. With probes before every verify, and
    the proposals made of probed answers, output still equals AR."""
    from specpilot.bench.probing import ProbingEngine
    from specpilot.bench.synthetic import AcceptanceProfile, SyntheticDrafter

    path, _ = checkpoint_factory(name)
    target, prompts = load_model(str(path), "cpu", "float32"), _prompts()
    truth = [r.token_ids for r in Generator(ModelRunner(target)).generate(prompts, PARAMS)]
    drafter = SyntheticDrafter(NgramDrafter(), {}, AcceptanceProfile("mostly", (0.8,) * 7), target.config.vocab_size)
    runtime = Runtime.build(EngineConfig(hybrid_chain_commit=commit), "cpu")
    engine = ProbingEngine(ModelRunner(target, runtime), drafter, TreeSpec.parse(tree),
                           scheduler=SchedulerConfig(adaptive=False))
    out = engine.generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == truth
    assert drafter.probes > 0 and any(s.tau > 2 for _, s in out)


@pytest.mark.parametrize("name,tree", [("qwen3_5", "chain:4"), ("qwen3", "static:2,2")])
def test_sampled_probe_answers_the_race(name, tree, checkpoint_factory):
    """At temperature > 0 the probe answers the target's raced token at every node (its position's noise row), so
    the oracle follows AR's sampled output with the same seed: the output equals it (not the greedy output) and the
    profile's right drafts are accepted (tau well above 1). A probe that answered the argmax would have the oracle
    propose the greedy continuation, which the race rejects."""
    from specpilot.bench.probing import ProbingEngine
    from specpilot.bench.synthetic import AcceptanceProfile, SyntheticDrafter

    path, _ = checkpoint_factory(name)
    target, prompts = load_model(str(path), "cpu", "float32"), _prompts()
    sampled = SamplingParams(max_new_tokens=24, temperature=0.7, seed=11)
    truth = [r.token_ids for r in Generator(ModelRunner(target)).generate(prompts[:1], sampled)]
    greedy = [r.token_ids for r in Generator(ModelRunner(target)).generate(prompts[:1], PARAMS)]
    assert truth != greedy
    drafter = SyntheticDrafter(NgramDrafter(), {}, AcceptanceProfile("mostly", (0.9,) * 7), target.config.vocab_size)
    engine = ProbingEngine(ModelRunner(target), drafter, TreeSpec.parse(tree), scheduler=SchedulerConfig(adaptive=False))
    (result, stats), = engine.generate(prompts[:1], sampled)
    assert result.token_ids == truth[0]
    assert drafter.probes > 0 and stats.tau > 2


def test_synthetic_drafter_is_coupled_as_its_inner_drafter():
    """A coupled inner drafter gets the step's noise through the wrapper (a sampled step pays its coupled draft);
    an uncoupled one is called as before."""
    from specpilot.bench.synthetic import AcceptanceProfile, SyntheticDrafter

    calls = []

    class Inner:
        target_layers = ()

        def __init__(self, coupled):
            self.coupled = coupled

        def start(self, slot, prompt_ids, features=None):
            pass

        def propose(self, slots, roots, spec, **kw):
            calls.append(kw)
            return []

    profile = AcceptanceProfile("p", (0.5,) * 3)
    for coupled in (True, False):
        drafter = SyntheticDrafter(Inner(coupled), {0: [1, 2, 3]}, profile, 16)
        assert drafter.coupled is coupled
        drafter.start(0, [5])
        noise = [(SamplingParams(temperature=1.0), torch.ones(3, 16))] if coupled else None
        trees = drafter.propose([0], [5], TreeSpec.parse("chain:3"), **({"noise": noise} if coupled else {}))
        assert trees[0].num_nodes == 4
    assert [list(c) for c in calls] == [["noise"], []]


def _names(path: Path) -> set[str]:
    """Every identifier a module defines or uses: functions, attributes, variables, arguments."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def test_the_core_has_no_benchmark_hooks():
    """The oracle's probe and clock belong to the benchmark (bench/probing.py, bench/synthetic.py): SpecEngine has no
    peek, and no module of the engine, the runtime or the drafters names a hook."""
    assert not hasattr(SpecEngine, "peek")
    files = [p for folder in ("engine", "runtime", "spec_decode") for p in sorted((PACKAGE / folder).rglob("*.py"))]
    assert files
    found = {str(p.relative_to(PACKAGE)): sorted(_names(p) & HOOKS) for p in files}
    assert not {k: v for k, v in found.items() if v}


def _stores(function: ast.AST):
    """(target, the names bound in `function` to an expression that constructs an OWNED class) for every attribute
    the function assigns."""
    owned = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                                                and c.func.id in OWNED for c in ast.walk(node.value)):
            owned |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(function):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                        yield sub, owned


def test_the_harness_sets_no_attribute_on_a_drafter_or_engine():
    """The harness hands the oracle its truth, probe and clock through constructors, never by setting attributes
    on drafters or engines after the fact: it assigns attributes only to `self` in its own classes and to its own
    clock and runners."""
    tree = ast.parse((PACKAGE / "bench" / "harness.py").read_text())
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    poked = set()
    for function in functions:
        for target, owned in _stores(function):
            base = target.value
            if not (isinstance(base, ast.Name) and (base.id == "self" or base.id in owned)):
                poked.add(f"line {target.lineno}: {ast.unparse(target)}")
    assert not poked, sorted(poked)
