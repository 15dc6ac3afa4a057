"""--drafter mtp: the target's own MTP layer drafts chains and trees in the engine, and speculative greedy output
equals plain greedy output on a hybrid (Qwen3.5) target; a chain's batched levels equal the same MTP run request
by request. `--drafter mtp:FILE` / `mtp:N` (a reduced draft vocabulary): proposals are the whole head's with every
other id at -inf, output stays exact, q lives on the set, bad files are one error line."""

import pytest
import torch

from specpilot.config import ConfigError
from specpilot.engine.engine import SpecEngine
from specpilot.layers.paths import PLAIN
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.engine.generator import Generator
from specpilot.models.loader import load_model
from specpilot.models.random_checkpoint import add_mtp_layer
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.spec_decode.drafters.mtp import ChainGraph
from specpilot.spec_decode.drafters.registry import build_drafter
from specpilot.spec_decode.tree import TreeSpec

SMALL = SchedulerConfig(max_model_len=64)  # slots of 64 tokens: the proposals' attention reads no more


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from tests.checkpoints import write_checkpoint

    path = tmp_path_factory.mktemp("qwen3_5_mtp")
    write_checkpoint("qwen3_5", path)
    add_mtp_layer(path, seed=3)
    return load_model(str(path), "cpu", "float32")


def _prompts():
    gen = torch.Generator().manual_seed(9)
    return [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (5, 16, 9)]


_AR: dict[str, list[list[int]]] = {}  # a target checkpoint's plain greedy output of _prompts(), computed once


def check_sampled(target, drafter, tree: str, mixed: bool = False) -> None:
    """At temperature > 0 the engine's raced rule keeps any proposal exact (a greedy walk, or a coupled drafter's
    race draws): the output is what plain sampling draws with the same seeds. mixed: a greedy request and one with
    top-k and top-p join the batch, the greedy one's output is plain greedy."""
    params = [SamplingParams(max_new_tokens=12, temperature=0.6, seed=s, ignore_eos=True) for s in (3, 4)]
    if mixed:
        params += [SamplingParams(max_new_tokens=12, ignore_eos=True)]
        params[1] = SamplingParams(max_new_tokens=12, temperature=0.9, top_k=20, top_p=0.9, seed=4, ignore_eos=True)
    prompts = _prompts()[:len(params)]
    plain = [Generator(ModelRunner(target)).generate([p], q)[0].token_ids for p, q in zip(prompts, params)]
    engine = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(tree), scheduler=SMALL)
    ids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
    got = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id].extend(out.new_token_ids)
    assert [got[i] for i in ids] == plain


def check_greedy(target, drafter, tree: str) -> None:
    """The engine's speculative greedy output with `drafter` and `tree` equals the target's plain greedy output."""
    params = SamplingParams(max_new_tokens=16)
    key = str(target.checkpoint_dir)
    if key not in _AR:
        _AR[key] = [r.token_ids for r in Generator(ModelRunner(target)).generate(_prompts(), params)]
    out = SpecEngine(ModelRunner(target), drafter, TreeSpec.parse(tree), scheduler=SMALL).generate(_prompts(), params)
    assert [r.token_ids for r, _ in out] == _AR[key]


@pytest.mark.parametrize("tree", ["chain:4", "dynamic:2,3,4"])
def test_speculative_equals_autoregressive(tree, target):
    drafter = build_drafter("mtp", target)
    assert drafter.name == "mtp" and drafter.target_layers == (3,)
    check_greedy(target, drafter, tree)


@pytest.mark.parametrize("tree", ["chain:4", "static:2,1", "dynamic:2,3,4"])
def test_sampled_output_is_plain_sampling(tree, target):
    """Coupled (the MTP drafts a sampling request's race draws), in a batch with a greedy request."""
    check_sampled(target, build_drafter("mtp", target), tree, mixed=True)


def test_batched_chain_equals_one_request_at_a_time(target):
    runner = ModelRunner(target)
    runner.allocate(4, 64)
    batched, single = build_drafter("mtp", target), build_drafter("mtp", target)
    for d in (batched, single):
        d.allocate(4, 64)
    prompts = _prompts()
    with torch.no_grad():
        for slot, p in enumerate(prompts):
            _, feats = runner.prefill_features(slot, p, (3,))
            for d in (batched, single):
                d.start(slot, p, feats)
    spec = TreeSpec.parse("chain:5")
    both = batched.propose([0, 1, 2], [7, 8, 9], spec)
    one = [single.propose([s], [r], spec)[0] for s, r in zip([0, 1, 2], [7, 8, 9])]
    assert both == one


def test_mtp_needs_a_checkpoint_directory(target, checkpoint_factory):
    from specpilot.models.loader import build_empty

    bare = build_empty(target.config, torch.device("cpu"), torch.float32)
    with pytest.raises(ConfigError, match="--drafter mtp reads the MTP layer from the target's checkpoint"):
        build_drafter("mtp", bare)


@pytest.mark.parametrize("tree", ["chain:4", "static:3,2"])
def test_commits_keep_the_cache_equal_to_feeding_the_sequence_at_once(target, tree):
    """A request that advanced by commits proposes what one started on the whole committed sequence proposes."""
    runner = ModelRunner(target)
    runner.allocate(2, 64)
    seq = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(4)).tolist()
    with torch.no_grad():
        _, feats = runner.prefill_features(0, seq, (3,))
    stepped, whole = build_drafter("mtp", target), build_drafter("mtp", target)
    for d in (stepped, whole):
        d.allocate(2, 64)
    spec = TreeSpec.parse(tree)
    stepped.start(1, seq[:10], feats[:10])
    stepped.propose([1], [seq[10]], spec)
    stepped.commit(1, seq[11:13], feats[10:13])
    whole.start(0, seq[:13], feats[:13])
    assert stepped.propose([1], [seq[13]], spec) == whole.propose([0], [seq[13]], spec)


def test_generate_with_drafter_mtp(target, checkpoint_factory, capsys):
    import json

    from specpilot.cli import main

    args = ["generate", "--target", str(target.checkpoint_dir), "--prompt", "def add(a, b):", "--max-new-tokens",
            "8", "--json", "--ignore-eos"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(args + ["--drafter", "mtp", "--tree", "chain:3"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["token_ids"] == plain["token_ids"] and spec["stats"]["drafter"] == "mtp"
    dense, _ = checkpoint_factory("qwen3")
    capsys.readouterr()
    assert main(["generate", "--target", str(dense), "--prompt", "x", "--drafter", "mtp"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Qwen3ForCausalLM has none" in err and err.count("\n") == 1


def test_one_call_chain_step_equals_feed_then_levels(target, monkeypatch):
    """_chain_step (a chain's feed and levels in one device-only call, what a CUDA graph captures) proposes what
    the eager feed followed by one batched step per level proposes, on the same pending blocks."""
    from specpilot.spec_decode.drafters import mtp

    runner = ModelRunner(target)
    runner.allocate(2, 64)
    seqs = [torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (20, 27)]
    spec = TreeSpec.parse("chain:4")
    out, kv = [], []
    for block in (mtp.CHAIN_BLOCK, 64):  # 20- and 27-token blocks: fed eagerly, then in one call (W = 32)
        monkeypatch.setattr(mtp, "CHAIN_BLOCK", block)
        d = build_drafter("mtp", target)
        d.allocate(2, 64)
        with torch.no_grad():
            for slot, seq in enumerate(seqs):
                _, feats = runner.prefill_features(slot, seq[:-1], (3,))
                d.start(slot, seq[:-1], feats)
        calls = []
        monkeypatch.setattr(d, "_chain_block", lambda *a, d=d, f=d._chain_block: calls.append(1) or f(*a))
        out.append(d.propose([0, 1], [s[-1] for s in seqs], spec))
        assert bool(calls) == (block == 64)
        # the pairs and the chain's levels (the last level's K/V is never written) at the same positions
        kv.append([d.cache.k[0, slot, :, :d.seen[slot] + spec.depth - 2].clone() for slot in (0, 1)])
    assert out[0] == out[1]
    for a, b in zip(*kv):
        torch.testing.assert_close(a, b)


def test_chain_levels_store_their_pairs_right_after_the_fed_ones(target):
    """Level d >= 1 of a chain stores its pair at position seen - 1 + d (seen counting the fed pairs, the root's
    included): on a fresh cache, a depth-3 chain after one request's feed writes exactly positions 0 .. seen + 1."""
    runner = ModelRunner(target)
    runner.allocate(1, 64)
    seq = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(6)).tolist()
    d = build_drafter("mtp", target)
    d.allocate(1, 64)
    with torch.no_grad():
        _, feats = runner.prefill_features(0, seq[:-1], (3,))
    d.start(0, seq[:-1], feats)
    d.propose([0], [seq[-1]], TreeSpec.parse("chain:3"))
    written = d.cache.k[0, 0].abs().sum(dim=(0, 2)) != 0  # [positions]
    assert d.seen[0] == 19
    assert written[:21].all() and not written[21:].any()


# ---- a reduced draft vocabulary (`--drafter mtp:FILE`, `mtp:N`) ----------------------------------------------------

ODD = dict(vocab_size=331, hidden_size=48, intermediate_size=72)  # odd vocabulary and widths


@pytest.fixture(scope="module")
def odd_target(tmp_path_factory):
    from tests.checkpoints import write_checkpoint

    path = tmp_path_factory.mktemp("qwen3_5_mtp_odd")
    write_checkpoint("qwen3_5", path, **ODD)
    add_mtp_layer(path, seed=5)
    return load_model(str(path), "cpu", "float32")


def _hot(vocab: int, n: int, seed: int = 1) -> torch.Tensor:
    """n distinct target ids in no particular order (a mapping that skips draft_to_target proposes other ids)."""
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:n]


def _hot_file(tmp_path, ids: torch.Tensor) -> str:
    from specpilot.spec_decode.drafters.draft_vocab import DraftVocab

    path = tmp_path / "hot.safetensors"
    DraftVocab(ids).save(path)
    return str(path)


def _masked(monkeypatch, target, hot: torch.Tensor) -> None:
    """The plain reference of a reduced vocabulary: the target's whole head with every other id at -inf."""
    keep = torch.zeros(target.config.vocab_size, dtype=torch.bool)
    keep[hot] = True
    full = target.logits
    monkeypatch.setattr(target, "logits", lambda h, paths=PLAIN: full(h, paths).masked_fill(~keep, float("-inf")))


def _steps(target, drafter, spec: TreeSpec) -> list:
    """Two proposals for three requests: a prompt's eager feed, then a short accepted block (the one-call chain
    step for chains) -> the proposed trees' (tokens, parents)."""
    runner = ModelRunner(target)
    runner.allocate(3, 64)
    drafter.allocate(3, 64)
    seqs = [torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (20, 27, 9)]
    with torch.no_grad():
        for slot, seq in enumerate(seqs):
            _, feats = runner.prefill_features(slot, seq[:-3], (target.config.num_hidden_layers - 1,))
            drafter.start(slot, seq[:-3], feats)
        out = drafter.propose([0, 1, 2], [s[-3] for s in seqs], spec)
        feats = torch.randn(3, 2, target.config.hidden_size, generator=torch.Generator().manual_seed(2))
        for slot, seq in enumerate(seqs):
            drafter.commit(slot, [seq[-2]], feats[slot])
        out += drafter.propose([0, 1, 2], [s[-1] for s in seqs], spec)
    return [(t.tokens, t.parents) for t in out]


def _coupled_steps(target, drafter, spec: TreeSpec, params: list) -> list:
    """Three proposals for three requests (params: per request SamplingParams, or None for a greedy one), each step
    with fresh race noise: a prompt's eager feed, then two short accepted blocks (the one-call chain step, replayed
    from one graph where graphs are on) -> the proposed trees' (tokens, parents)."""
    runner = ModelRunner(target)
    runner.allocate(3, 64)
    drafter.allocate(3, 64)
    seqs = [torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (22, 29, 11)]
    vocab, layer = target.config.vocab_size, (target.config.num_hidden_layers - 1,)
    out = []
    with torch.no_grad():
        for slot, seq in enumerate(seqs):
            drafter.start(slot, seq[:-5], runner.prefill_features(slot, seq[:-5], layer)[1])
        for step, at in enumerate((-5, -3, -1)):
            if step:
                feats = torch.randn(3, 2, target.config.hidden_size, generator=torch.Generator().manual_seed(step))
                for slot, seq in enumerate(seqs):
                    drafter.commit(slot, [seq[at - 1]], feats[slot])
            gen = torch.Generator().manual_seed(10 + step)
            noise = [None if p is None else (p, torch.empty(spec.depth, vocab).exponential_(generator=gen))
                     for p in params]
            out += drafter.propose([0, 1, 2], [s[at] for s in seqs], spec, noise=noise)
    return [(t.tokens, t.parents) for t in out]


@pytest.mark.parametrize("cap", [None, 0])
@pytest.mark.parametrize("vocab", ["full", "file"])
def test_coupled_chain_graph_proposes_what_the_eager_step_proposes(vocab, cap, odd_target, tmp_path, monkeypatch):
    """A coupled chain step replayed from its graph (static noise rows refilled before each replay, a graph per row
    filter settings) proposes what the eager levels propose with each step's noise, a greedy row beside the sampling
    ones included; with no room for noise rows (cap 0) the coupled step runs eagerly. The noise changes the
    sampling rows' chains and leaves the greedy row's alone."""
    from specpilot.spec_decode import coupling
    from specpilot.spec_decode.drafters import mtp
    from tests.cuda_graph_fakes import fake_cuda_graphs

    name = "mtp" if vocab == "full" else "mtp:" + _hot_file(tmp_path, _hot(ODD["vocab_size"], 37))
    spec = TreeSpec.parse("chain:4")
    params = [SamplingParams(temperature=0.8), None, SamplingParams(temperature=1.2, top_k=30, top_p=0.9)]
    want = _coupled_steps(odd_target, build_drafter(name, odd_target), spec, params)
    fake_cuda_graphs(monkeypatch)
    monkeypatch.setattr(mtp, "ChainGraph", ReplayedChainGraph)
    if cap is not None:
        monkeypatch.setattr(coupling, "MAX_GRAPH_NOISE_BYTES", cap)
    graphed = build_drafter(name, odd_target)
    graphed.use_graphs = True
    assert _coupled_steps(odd_target, graphed, spec, params) == want
    filters = (None if p is None else (p.temperature, p.top_k, p.top_p) for p in params)
    assert list(graphed.graphs) == ([] if cap == 0 else [(3, 4, 2) + tuple(filters)])
    greedy = _coupled_steps(odd_target, build_drafter(name, odd_target), spec, [None] * 3)
    assert [w for i, w in enumerate(want) if i % 3 == 1] == [g for i, g in enumerate(greedy) if i % 3 == 1]
    assert all(w != g for i, (w, g) in enumerate(zip(want, greedy)) if i % 3 != 1)


class ReplayedChainGraph(ChainGraph):
    """A ChainGraph whose (faked) replay re-runs the captured step on the static inputs, as a real replay does."""

    def __init__(self, run, inputs, feats, noise=None):
        super().__init__(run, inputs, feats, noise)
        self.graph.graphs[-1].rerun = lambda: self.output.copy_(run(self.inputs, self.feats))


@pytest.mark.parametrize("tree", ["chain:4", "static:3,2", "dynamic:2,3,5"])
@pytest.mark.parametrize("graphs", [False, True])
def test_draft_vocab_proposes_what_the_masked_full_head_proposes(tree, graphs, odd_target, tmp_path, monkeypatch):
    """Over a draft vocabulary the chain (eager feed and levels, the one-call step, its CUDA graph) and the trees
    propose what the whole head proposes with every id outside the set at -inf; every proposal is in the set."""
    from specpilot.spec_decode.drafters import mtp
    from tests.cuda_graph_fakes import fake_cuda_graphs

    hot = _hot(ODD["vocab_size"], 37)
    reduced = build_drafter("mtp:" + _hot_file(tmp_path, hot), odd_target)
    assert reduced.head_weight.shape == (37, ODD["hidden_size"]) and reduced.head_weight.is_contiguous()
    if graphs:
        fake_cuda_graphs(monkeypatch)
        monkeypatch.setattr(mtp, "ChainGraph", ReplayedChainGraph)
        reduced.use_graphs = True
    got = _steps(odd_target, reduced, TreeSpec.parse(tree))
    assert bool(reduced.graphs) == (graphs and tree.startswith("chain"))
    reference = build_drafter("mtp", odd_target)
    _masked(monkeypatch, odd_target, hot)
    assert got == _steps(odd_target, reference, TreeSpec.parse(tree))
    assert set(t for tokens, _ in got for t in tokens[1:]) <= set(hot.tolist())


@pytest.mark.parametrize("tree", ["chain:4", "dynamic:2,3,4"])
def test_draft_vocab_keeps_greedy_output_exact(tree, odd_target, tmp_path):
    drafter = build_drafter("mtp:" + _hot_file(tmp_path, _hot(ODD["vocab_size"], 37)), odd_target)
    check_greedy(odd_target, drafter, tree)


def test_draft_vocab_first_n_ids(target):
    drafter = build_drafter("mtp:40", target)
    assert drafter.draft_to_target.tolist() == list(range(40))
    check_greedy(target, drafter, "chain:3")


def test_full_vocabulary_is_the_default(target):
    drafter = build_drafter("mtp", target)
    assert drafter.lm_head is None and drafter.draft_to_target is None
    assert drafter.head_weight is target.lm_head.weight


@pytest.mark.parametrize("tree", ["chain:4", "static:2,1"])
def test_draft_vocab_sampled_output_is_plain_sampling(tree, odd_target, tmp_path):
    check_sampled(odd_target, build_drafter("mtp:" + _hot_file(tmp_path, _hot(ODD["vocab_size"], 37)), odd_target),
                  tree, mixed=True)


@pytest.mark.parametrize("params", [None, SamplingParams(temperature=0.7),
                                    SamplingParams(temperature=1.3, top_k=5, top_p=0.9)])
def test_draft_probs_are_over_the_draft_vocab_only(params, odd_target, tmp_path, monkeypatch):
    """q, the distribution the drafter draws from: sums to 1, zero outside the draft vocabulary, and equal to the
    whole head's with every other id at -inf."""
    from specpilot.runtime.sampling import filtered_probs

    hot = _hot(ODD["vocab_size"], 37)
    drafter = build_drafter("mtp:" + _hot_file(tmp_path, hot), odd_target)
    h = torch.randn(4, ODD["hidden_size"], generator=torch.Generator().manual_seed(3))
    q = drafter.draft_probs(h, params)
    assert q.shape == (4, ODD["vocab_size"]) and q.dtype == torch.float32
    torch.testing.assert_close(q.sum(-1), torch.ones(4))
    outside = torch.ones(ODD["vocab_size"], dtype=torch.bool)
    outside[hot] = False
    assert (q[:, outside] == 0).all() and (q[:, hot] > 0).any(-1).all()
    _masked(monkeypatch, odd_target, hot)
    logits = odd_target.logits(h).float()
    want = torch.softmax(logits, -1) if params is None else filtered_probs(logits, params)
    torch.testing.assert_close(q, want)
    full = build_drafter("mtp", odd_target)
    assert full.draft_probs(h, params).shape == (4, ODD["vocab_size"])


def test_generate_with_a_draft_vocab_file(target, tmp_path, capsys):
    import json

    from specpilot.cli import main

    args = ["generate", "--target", str(target.checkpoint_dir), "--prompt", "def add(a, b):", "--max-new-tokens",
            "8", "--json", "--ignore-eos"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    hot = _hot_file(tmp_path, _hot(target.config.vocab_size, 50))
    assert main(args + ["--drafter", f"mtp:{hot}", "--tree", "chain:3"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["token_ids"] == plain["token_ids"] and spec["stats"]["drafter"] == f"mtp:{hot}"


def _bad_files():
    V = 320
    return {"out_of_range": ({"token_ids": torch.tensor([3, V], dtype=torch.int64)}, f"token id {V} is outside"),
            "negative": ({"token_ids": torch.tensor([3, -1], dtype=torch.int64)}, "token id -1 is negative"),
            "duplicate": ({"token_ids": torch.tensor([5, 9, 5], dtype=torch.int64)}, "token ids repeat"),
            "int32": ({"token_ids": torch.tensor([1, 2], dtype=torch.int32)}, "torch.int32, not int64"),
            "empty": ({"token_ids": torch.zeros(0, dtype=torch.int64)}, "needs N >= 1"),
            "2d": ({"token_ids": torch.zeros(2, 2, dtype=torch.int64)}, "has shape [2, 2]"),
            "key": ({"ids": torch.tensor([1, 2], dtype=torch.int64)}, "holds tensors ['ids']")}


@pytest.mark.parametrize("case", sorted(_bad_files()) + ["missing", "not_safetensors", "n0", "n_past_vocab", "none"])
def test_bad_draft_vocab_is_one_error_line(case, target, tmp_path, capsys):
    from safetensors.torch import save_file

    from specpilot.cli import main

    path = tmp_path / "hot.safetensors"
    spec, match = str(path), None
    if case in _bad_files():
        tensors, match = _bad_files()[case]
        save_file(tensors, str(path))
    elif case == "missing":
        match = "no such draft vocabulary file"
    elif case == "not_safetensors":
        path.write_text("token_ids = [1, 2]\n")
        match = "not a safetensors file"
    elif case == "n0":
        spec, match = "0", "--drafter mtp:0: N = 0; a draft vocabulary needs N >= 1"
    elif case == "n_past_vocab":
        spec, match = "321", "token id 320 is outside the target's vocabulary (vocab_size 320)"
    else:
        spec, match = "", "--drafter mtp: none given"
    rc = main(["generate", "--target", str(target.checkpoint_dir), "--prompt", "x", "--max-new-tokens", "2",
               "--drafter", f"mtp:{spec}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error:") and err.count("\n") == 1 and match in err, err


def test_draft_vocab_rows_of_a_head_whose_bf16_weight_was_dropped():
    """Weight format w12n_only drops the LM head's bf16 weight: the draft vocabulary's rows are decoded from its
    W12N planes, bit for bit."""
    from specpilot.layers.linear import Linear
    from specpilot.spec_decode.drafters.mtp import _head_rows
    from specpilot.weights import w12n

    weight = (torch.randn(331, 48, generator=torch.Generator().manual_seed(0)) * 0.05).bfloat16()
    head = Linear(48, 331, bias=False)
    head.w12n, head.weight = w12n.encode(weight), None
    ids = _hot(331, 37)
    rows = _head_rows(head, ids)
    assert torch.equal(rows.weight, weight[ids]) and rows.weight.is_contiguous()


# ---- an FP8 copy of the head (`--drafter mtp+fp8`, `mtp:N+fp8`) ------------------------------------------------------

@pytest.mark.parametrize("name", ["mtp+fp8", "mtp:40+fp8"])
def test_fp8_head_is_an_fp8_copy_of_the_head_rows(name, target):
    from specpilot.layers.fp8_linear import Fp8Linear
    from specpilot.ops.fp8_linear import fp8_linear_ref

    drafter = build_drafter(name, target)
    rows = 40 if ":" in name else target.config.vocab_size
    assert isinstance(drafter.lm_head, Fp8Linear) and drafter.head_format == "fp8"
    assert drafter.head_weight.dtype == torch.float8_e4m3fn and drafter.head_weight.shape == (rows, 64)
    exact = target.lm_head.weight[:rows]
    assert float((drafter.head_weight.float() * drafter.lm_head.scale - exact).abs().max()) <= \
        2.0 ** -4 * float(exact.abs().max())
    h = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(drafter.draft_logits(h), fp8_linear_ref(h, drafter.head_weight, drafter.lm_head.scale))


@pytest.mark.parametrize(("name", "tree"), [("mtp+fp8", "chain:4"), ("mtp+fp8", "dynamic:2,3,4"),
                                            ("mtp:40+fp8", "chain:3")])
def test_fp8_head_keeps_greedy_output_exact(name, tree, target):
    check_greedy(target, build_drafter(name, target), tree)


@pytest.mark.parametrize("tree", ["chain:4", "static:2,1"])
def test_fp8_head_sampled_output_is_plain_sampling(tree, target):
    check_sampled(target, build_drafter("mtp+fp8", target), tree, mixed=True)


def test_fp8_head_one_call_chain_graph_proposes_what_the_eager_step_proposes(target, monkeypatch):
    """The FP8 head inside the one-call chain step, replayed from its (faked) CUDA graph, proposes what the eager
    step proposes."""
    from specpilot.spec_decode.drafters import mtp
    from tests.cuda_graph_fakes import fake_cuda_graphs

    spec = TreeSpec.parse("chain:4")
    eager = _steps(target, build_drafter("mtp+fp8", target), spec)
    fake_cuda_graphs(monkeypatch)
    monkeypatch.setattr(mtp, "ChainGraph", ReplayedChainGraph)
    graphed = build_drafter("mtp+fp8", target)
    graphed.use_graphs = True
    assert _steps(target, graphed, spec) == eager and graphed.graphs


def test_fp8_suffix_on_another_drafter_is_one_error_line(target, capsys):
    from specpilot.cli import main

    rc = main(["generate", "--target", str(target.checkpoint_dir), "--prompt", "x", "--max-new-tokens", "2",
               "--drafter", "ngram+fp8"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "applies to the MTP drafter only" in err, err
