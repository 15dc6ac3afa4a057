"""The host side of a speculative step: the component timer, the packed verify-graph inputs, the commit's moves."""

import random
import time

import pytest
import torch

from specpilot.config import EngineConfig
from tests.runtimes import cpu_runtime, set_runtime
from specpilot.runtime import runner as runner_module
from specpilot.engine.engine import SpecEngine, _Timer
from specpilot.runtime.graphs import VerifyGraph
from specpilot.runtime.runner import ModelRunner
from specpilot.spec_decode.drafters.draft_lm import DraftLMDrafter
from specpilot.spec_decode.tree import DraftTree, TreeSpec
from specpilot.spec_decode.verify import host_tree_metadata
from tests.cuda_graph_fakes import fake_cuda_graphs
from tests.engine.test_engine import FIXED, PARAMS, RandomTreeDrafter, _models, _prompts, _reference


def test_step_times_are_charged_to_every_component(checkpoint_factory):
    target, _ = _models(checkpoint_factory, "qwen3")
    out = SpecEngine(ModelRunner(target), DraftLMDrafter(target), TreeSpec.parse("static:2,1"), scheduler=FIXED).generate(
        _prompts()[:2], PARAMS)
    for _, stats in out:
        assert set(stats.seconds) == {"start", "draft", "verify", "accept", "commit", "other"}
        assert all(s > 0 for s in stats.seconds.values()), stats.seconds


class _Req:
    def __init__(self):
        self.stats = type("S", (), {"seconds": dict.fromkeys(("a", "b"), 0.0)})()


def test_timer_splits_a_step_evenly_and_reads_marks_once():
    timer, reqs, records = _Timer(torch.device("cpu")), [_Req(), _Req()], [{} for _ in range(3)]
    for record in records:
        timer.start(reqs, record)
        assert timer.run("a", lambda x: x + 1, 1) == 2
        timer.run("b", sum, [1, 2])
    assert all(r.stats.seconds["a"] == 0 for r in reqs)  # nothing is charged before the end
    timer.charge()
    assert reqs[0].stats.seconds == reqs[1].stats.seconds and reqs[0].stats.seconds["a"] > 0
    assert timer.steps == []
    assert all(set(r["seconds"]) == {"a", "b"} for r in records)  # each step's record has its own seconds
    assert sum(r["seconds"]["a"] for r in records) == pytest.approx(2 * reqs[0].stats.seconds["a"])


def test_timer_charges_excluded_work_to_no_component():
    """A benchmark's oracle run inside a component (excluded) is not the component's time; the component's time
    before and after it is."""
    timer, reqs = _Timer(torch.device("cpu")), [_Req()]
    timer.start(reqs, {})

    def draft():
        time.sleep(0.01)
        timer.excluded(time.sleep, 0.05)
        time.sleep(0.01)

    timer.run("a", draft)
    timer.run("b", lambda: None)
    (info, seconds), = timer.charge()
    assert 0.02 <= seconds["a"] < 0.045 and seconds["b"] < 0.01
    assert set(seconds) == {"a", "b"}


class _Event:
    """A CUDA event stand-in: records the wall clock; elapsed_time in milliseconds like torch.cuda.Event."""

    synced = 0

    def __init__(self, enable_timing=False):
        assert enable_timing

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3

    def synchronize(self):
        _Event.synced += 1


def test_timer_on_a_gpu_reads_events_after_one_sync(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    timer, reqs = _Timer(torch.device("cuda")), [_Req()]
    timer.start(reqs, {})
    timer.run("a", time.sleep, 0.01)
    timer.run("b", lambda: None)
    timer.charge()
    assert _Event.synced == 1  # on the last mark only: earlier ones precede it on the stream
    assert 0.01 <= reqs[0].stats.seconds["a"] < 1 and reqs[0].stats.seconds["b"] < 0.01


def test_inference_decorator_enters_inference_mode_only_where_it_is_off(monkeypatch):
    from specpilot.runtime.runner import inference

    @inference
    def make():
        return torch.ones(2), torch.is_inference_mode_enabled()

    out, on = make()
    assert on and out.is_inference()  # as under @torch.inference_mode()
    entered = []
    real = torch.inference_mode
    monkeypatch.setattr(torch, "inference_mode", lambda *a: entered.append(1) or real(*a))
    with real():
        assert make()[1] and not entered  # nested: no second entry
    make()
    assert entered == [1]


@pytest.mark.parametrize("seed", range(4))
def test_commit_moves_exactly_where_a_path_leaves_its_place(seed, monkeypatch):
    """ModelCache.commit's in-place test (a root-first path ends at node len - 1) against the node-by-node one."""
    from specpilot.runtime.cache import ModelCache

    rng = random.Random(seed)
    kept = []
    monkeypatch.setattr(ModelCache, "keep", lambda self, index: kept.append(index.packed.clone()))
    cache = ModelCache.__new__(ModelCache)
    cache._device = torch.device("cpu")
    for _ in range(20):
        trees = [_random_tree(rng, rng.randint(1, 9)) for _ in range(3)]
        paths = [tuple(rng.choice(t.paths())[:rng.randint(0, 4)]) for t in trees]
        want = any(any(node != j for j, node in enumerate(p)) for p in paths)
        kept.clear()
        cache.commit([0, 1, 2], [5, 6, 7], paths, fold=False)
        assert bool(kept) == want


def test_paths_features_gathers_each_rows_kept_path():
    """The batched gather of every row's path features against indexing row by row; a copy, not a view."""
    from specpilot.spec_decode.verify import Acceptance

    engine = SpecEngine.__new__(SpecEngine)
    engine._features = torch.randn(3, 5, 4)
    paths = [(0, 1, 2), (0,), (0, 2, 4)]
    accepted = [Acceptance(p, (0,) * len(p)) for p in paths]
    got = engine._paths_features(accepted)
    for row, (p, g) in enumerate(zip(paths, got)):
        assert torch.equal(g, engine._features[row, list(p)])
    engine._features.zero_()
    assert got[0].abs().sum() > 0


class ReplayedVerifyGraph(VerifyGraph):
    """A VerifyGraph whose replay re-runs the eager forward on its static metadata and writes the captured
    outputs in place, as a real replay does: what is checked is that the one packed copy refreshes every input."""

    def __init__(self, run, meta, cache, warmup: int = 2, **cut):
        super().__init__(run, meta, cache, warmup, **cut)

        def rerun():
            tokens, features = run(self.meta)
            self.tokens.copy_(tokens)
            if features is not None:
                self.features.copy_(features)
            for index, terms in cache.tree_stash.items():  # a replay rewrites the captured stash tensors
                for dst, src in zip(self.stash[index], terms):
                    dst.copy_(src)

        self.graph.graphs[-1].rerun = rerun  # the chain's last graph redoes the whole forward


@pytest.fixture
def replayed_verify_graphs(monkeypatch):
    fake_cuda_graphs(monkeypatch)
    monkeypatch.setattr(runner_module, "VerifyGraph", ReplayedVerifyGraph)


def _graph_case(checkpoint_factory, name: str, tree: str):
    """(prompts, AR truth, a runner with verify graphs on the tree-attention path, a drafter: the target itself for
    a chain spec, random trees otherwise)."""
    target, _ = _models(checkpoint_factory, name)
    prompts = _prompts()
    truth = _reference(target, prompts)
    runner = ModelRunner(target, cpu_runtime(block_attention="tree"))
    set_runtime(runner, verify_graphs=True)
    drafter = DraftLMDrafter(target) if tree.startswith("chain") else RandomTreeDrafter(3, truth, prompts)
    return prompts, truth, runner, drafter


@pytest.mark.parametrize("name,tree", [("qwen3", "static:4,3"), ("qwen3_5", "static:4,3"), ("qwen3_5", "chain:4")])
def test_verify_graph_packed_inputs_keep_output_exact(name, tree, checkpoint_factory, replayed_verify_graphs):
    """Random trees (padded to the spec's width) or the target drafting chains for itself, through verify graphs."""
    prompts, truth, runner, drafter = _graph_case(checkpoint_factory, name, tree)
    engine = SpecEngine(runner, drafter, TreeSpec.parse(tree), scheduler=FIXED)
    out = engine.generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == truth
    assert runner.verify_graphs and all(isinstance(g, ReplayedVerifyGraph) for g in runner.verify_graphs.values())
    assert any(s.tau > 1.2 for _, s in out)


@pytest.mark.parametrize("name,tree", [("qwen3", "static:4,3"), ("qwen3_5", "chain:4")])
def test_sampled_steps_replay_a_verify_graph_of_the_logits(name, tree, checkpoint_factory, replayed_verify_graphs):
    """A sampling request's steps replay a verify graph of the logits (not the greedy graph, not an eager pass),
    refreshed by the step's one packed copy: the output is plain sampling's with the same seed."""
    from specpilot.engine.generator import Generator
    from specpilot.runtime.sampling import SamplingParams

    prompts, _, runner, drafter = _graph_case(checkpoint_factory, name, tree)
    params = SamplingParams(max_new_tokens=PARAMS.max_new_tokens, temperature=0.8, seed=7, ignore_eos=True)
    plain = [Generator(ModelRunner(runner.model)).generate([p], params)[0].token_ids for p in prompts]
    engine = SpecEngine(runner, drafter, TreeSpec.parse(tree), scheduler=FIXED)
    out = [r.token_ids for r, _ in engine.generate(prompts, params)]
    assert out == plain
    sampled = [k for k in runner.verify_graphs if k[-1]]
    assert sampled and all(isinstance(runner.verify_graphs[k], ReplayedVerifyGraph) for k in sampled)


def _graph_and_eager_runners(checkpoint_factory, name):
    """Two runners of one target on the tree-attention path: one with verify graphs (faked on CPU), one eager."""
    target, _ = _models(checkpoint_factory, name)
    graphs, eager = (ModelRunner(target, cpu_runtime(block_attention="tree")) for _ in range(2))
    set_runtime(graphs, verify_graphs=True)
    return graphs, eager


def _prefill(prompts, *runners):
    for runner in runners:
        runner.allocate(len(prompts), 64)
        for slot, prompt in enumerate(prompts):
            runner.prefill(slot, prompt)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_verify_graph_loads_host_metadata_into_its_static_inputs(name, checkpoint_factory, replayed_verify_graphs):
    """Once a graph of the shape exists, verify_inputs copies the host buffer straight into the graph's static
    inputs (no device staging copy, no unpack), and the replay gives the eager verify's tokens."""
    graphs, eager = _graph_and_eager_runners(checkpoint_factory, name)
    rng, prompts, width = random.Random(3), _prompts()[:2], 9
    _prefill(prompts, graphs, eager)
    for step in range(3):
        trees = [_random_tree(rng, rng.randint(2, width)) for _ in prompts]
        host = host_tree_metadata(trees, [len(p) for p in prompts], [0, 1], "cpu", width)
        meta = graphs.verify_inputs(host)
        if step:
            (graph,) = graphs.verify_graphs.values()
            assert meta is graph.meta and torch.equal(graph.packed, host.packed)
            assert graph.packed.data_ptr() != host.packed.data_ptr()
        got = graphs.verify(meta)[0].clone()
        want = eager.verify(host.to("cpu"))[0]
        assert torch.equal(got, want)
    assert len(graphs.verify_graphs) == 1


def _random_tree(rng: random.Random, n: int) -> DraftTree:
    return DraftTree(tuple(rng.randrange(300) for _ in range(n)), tuple([-1] + [rng.randrange(i) for i in range(1, n)]))


def test_layer_cuts():
    from specpilot.runtime.graphs import layer_cuts

    assert layer_cuts(36, 4) == (0, 4, 8, 12, 16, 20, 24, 28, 32)
    assert layer_cuts(5, 2) == (0, 2)
    assert layer_cuts(3, 1) == (0, 1)  # never after the last layer: nothing would follow
    assert layer_cuts(1, 4) == ()
    assert layer_cuts(36, 0) == ()


@pytest.mark.parametrize("per_graph,graphs", [(0, 1), (1, 3), (2, 2), (4, 2)])
def test_verify_graph_is_cut_between_layers(per_graph, graphs, checkpoint_factory, replayed_verify_graphs):
    """The capture starts a new graph after the cut layers (the tiny target has 3 layers), the model's hook is
    cleared afterwards, and the chain's replay gives the plain output."""
    from tests.cuda_graph_fakes import FakeGraph

    target, _ = _models(checkpoint_factory, "qwen3")
    assert target.config.num_hidden_layers == 3
    prompts = _prompts()
    truth = _reference(target, prompts)
    runner = ModelRunner(target, cpu_runtime(block_attention="tree", verify_layers_per_graph=per_graph))
    set_runtime(runner, verify_graphs=True)
    engine = SpecEngine(runner, RandomTreeDrafter(3, truth, prompts), TreeSpec.parse("static:2,2"), scheduler=FIXED)
    out = engine.generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == truth
    chains = [g.graph.graphs for g in runner.verify_graphs.values()]
    assert chains and all(len(c) == graphs for c in chains) and FakeGraph.captures == graphs * len(chains)
    assert target.after_layer is None


def test_block_attention_auto_is_the_captured_tree_op_on_a_gpu_only():
    """The defaults give a GPU the captured tree-attention verify and the CPU the SDPA path; "sdpa" keeps the
    verify eager even on a GPU (a captured graph cannot follow its host-side prefix length)."""
    from specpilot.runtime.settings import Runtime

    def block_path(engine, on_gpu):
        rt = Runtime.build(engine, "cuda" if on_gpu else "cpu")
        return rt.verify.block_kernel, rt.verify_graphs

    assert block_path(EngineConfig(), on_gpu=True) == (True, True)
    assert block_path(EngineConfig(), on_gpu=False) == (False, False)
    assert block_path(EngineConfig(block_attention="sdpa"), on_gpu=True) == (False, False)
    assert block_path(EngineConfig(block_attention="tree", verify_graphs=False), on_gpu=True) == (True, False)
    assert block_path(EngineConfig(block_attention="tree"), on_gpu=False) == (True, False)
    with pytest.raises(ValueError, match="block_attention"):
        EngineConfig(block_attention="flash")


def test_engine_config_rejects_negative_layers_per_graph():
    with pytest.raises(ValueError, match="verify_layers_per_graph"):
        EngineConfig(verify_layers_per_graph=-1)


def test_staging_hands_a_buffer_out_again_only_after_a_sync():
    from specpilot.runtime.runner import HostStaging

    staging = HostStaging(torch.device("cpu"), depth=2)
    a, b, c, d = staging.take(10), staging.take(10), staging.take(10), staging.take(4)
    assert len({t.data_ptr() for t in (a, b, c, d)}) == 4  # none handed out twice before a sync
    assert staging.inputs[10] == [a, b]  # past `depth`, a fresh buffer that is not kept
    assert staging.read_tokens(torch.tensor([[3, 4]])) == [[3, 4]]
    assert staging.take(10) is a and staging.take(4) is d and staging.take(10) is b
    assert staging.take(10) is not c


def test_staging_buffers_first_taken_in_inference_mode_are_written_outside_it():
    """A probe of the synthetic oracle (inference mode) may take a buffer size first; the next step's accept
    writes it outside inference mode, which an inference tensor refuses (the 27B bench failed so on the GPU at
    5551485)."""
    from specpilot.runtime.runner import HostStaging, _host_buffer

    staging = HostStaging(torch.device("cpu"))
    with torch.inference_mode():
        buf, out = staging.take(6), _host_buffer((2, 3), torch.long, False)
    staging.read_tokens(torch.tensor([1]))
    assert staging.take(6) is buf
    buf.fill_(7)
    out.copy_(torch.ones(2, 3, dtype=torch.long))
    assert not buf.is_inference() and not out.is_inference()


def test_staged_metadata_equals_fresh_metadata_and_outlives_the_refill():
    """Staged buffers refilled with trees of other shapes (and the same shape) hold exactly what fresh buffers
    would, and device metadata taken from one (on the CPU: a copy) is not changed by the next refill."""
    from specpilot.runtime.runner import HostStaging

    rng, staging, seen, kept = random.Random(5), HostStaging(torch.device("cpu")), {}, []
    for step in range(12):
        trees = [_random_tree(rng, rng.randint(1, 7)) for _ in range(2)]
        args = (trees, [9 + step, 4], [1, 0], "cpu", 7 if step % 2 else None)
        host, fresh = host_tree_metadata(*args, alloc=staging.take), host_tree_metadata(*args)
        assert torch.equal(host.packed, fresh.packed)
        seen.setdefault(host.packed.numel(), set()).add(host.packed.data_ptr())
        kept.append((host.to("cpu"), fresh))
        staging.read_tokens(torch.zeros(2, 7, dtype=torch.long))
    assert all(len(ptrs) == 1 for ptrs in seen.values()) and len(seen) > 1  # one buffer per size, reused
    for meta, fresh in kept:
        assert torch.equal(meta.packed, fresh.packed)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_verify_graph_from_a_reused_staging_buffer_gives_the_fresh_buffers_tokens(name, checkpoint_factory,
                                                                                  replayed_verify_graphs):
    """Step after step one staging buffer holds different trees; the graph's tokens, read back through the staging,
    are the eager verify's on fresh buffers."""
    graphs, eager = _graph_and_eager_runners(checkpoint_factory, name)
    rng, prompts, width, buffers = random.Random(4), _prompts()[:2], 9, set()
    _prefill(prompts, graphs, eager)
    for _ in range(4):
        trees = [_random_tree(rng, rng.randint(2, width)) for _ in prompts]
        args = (trees, [len(p) for p in prompts], [0, 1], "cpu", width)
        host = host_tree_metadata(*args, alloc=graphs.staging.take)
        buffers.add(host.packed.data_ptr())
        got = graphs.staging.read_tokens(graphs.verify(graphs.verify_inputs(host))[0])
        assert got == eager.verify(host_tree_metadata(*args).to("cpu"))[0].tolist()
    assert len(buffers) == 1


@pytest.mark.parametrize("graphs", [False, True])
def test_engine_steps_reuse_their_staging_buffers_with_exact_output(graphs, checkpoint_factory,
                                                                     replayed_verify_graphs):
    target, _ = _models(checkpoint_factory, "qwen3")
    prompts = _prompts()
    truth = _reference(target, prompts)
    runner = ModelRunner(target, cpu_runtime(block_attention="tree"))
    set_runtime(runner, verify_graphs=graphs)
    taken, take = [], runner.staging.take
    runner.staging.take = lambda words: taken.append(take(words)) or taken[-1]
    out = SpecEngine(runner, RandomTreeDrafter(3, truth, prompts), TreeSpec.parse("static:3,2"), scheduler=FIXED).generate(
        prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == truth
    by_size = {}
    for t in taken:
        by_size.setdefault(t.numel(), set()).add(t.data_ptr())
    assert len(taken) > len(by_size) and all(len(p) == 1 for p in by_size.values())  # one buffer per size


class _OnDevice(torch.Tensor):
    """A CPU tensor that reports itself on a GPU: read_tokens' pinned path, run on the CPU."""

    @property
    def is_cuda(self):
        return True


def test_read_tokens_through_a_pinned_buffer_equals_tolist(monkeypatch):
    from specpilot.runtime.runner import HostStaging

    pinned, synced, empty = [], [], torch.empty

    def fake_empty(*args, pin_memory=False, **kwargs):
        pinned.append(pin_memory)
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", fake_empty)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type(
        "S", (), {"synchronize": lambda self: synced.append(1)})())
    staging, rng = HostStaging(torch.device("cpu")), random.Random(0)
    for step in range(3):
        tokens = torch.tensor([[rng.randrange(1000) for _ in range(5)] for _ in range(2)])
        assert staging.read_tokens(tokens.as_subclass(_OnDevice)) == tokens.tolist()
        assert len(synced) == step + 1
    assert pinned == [True] and len(staging.outputs) == 1  # one pinned buffer, reused


def test_ab_layers_per_graph_takes_one_spacing_or_two():
    from bench.verify_cost import ab_spacings

    assert ab_spacings([4]) == (0, 4) and ab_spacings([4, 8]) == (4, 8) and ab_spacings([0, 4]) == (0, 4)
    assert ab_spacings(None) is None and ab_spacings([0]) is None
    for bad in ([4, 8, 12], [-1], [4, -2]):
        with pytest.raises(SystemExit):
            ab_spacings(bad)


@pytest.mark.parametrize("name,tree", [("qwen3", "chain:4"), ("qwen3_5", "static:2,2"), ("qwen3", "dynamic:2,3,5")])
def test_warmup_captures_every_bucket_before_requests_run(name, tree, checkpoint_factory, replayed_verify_graphs):
    """SpecEngine.warmup captures the verify graph of every (batch, width) bucket a step can take: the requests
    that follow capture none, and their output is exact."""
    from specpilot.engine.scheduler import SchedulerConfig

    prompts, truth, runner, drafter = _graph_case(checkpoint_factory, name, tree)
    engine = SpecEngine(runner, drafter, TreeSpec.parse(tree), scheduler=SchedulerConfig(max_num_seqs=3,
                                                                                        adaptive=False))
    report = engine.warmup()
    shapes = {(b, w) for b, w, _, _, sampled in runner.verify_graphs if not sampled}
    assert not any(key[-1] for key in runner.verify_graphs), "greedy warm-up captures no graph of the logits"
    full = TreeSpec.parse(tree).max_tree_nodes
    widths = {w for w in (1, 2, 4, 8, 16) if w < full} | {full}
    assert report["graphs"] == len(runner.verify_graphs) and {b for b, _ in shapes} == {1, 2, 4}
    assert {w for _, w in shapes} == widths
    captured = dict(runner.verify_graphs)
    out = engine.generate(prompts, PARAMS)
    assert [r.token_ids for r, _ in out] == truth
    assert runner.verify_graphs.keys() == captured.keys()
