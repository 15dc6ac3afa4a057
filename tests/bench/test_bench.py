"""specpilot bench end to end on a tiny model (CPU): real and synthetic acceptance, JSON, table and plot."""

import json

import pytest

from specpilot.bench.harness import BenchConfig
from specpilot.bench.synthetic import AcceptanceProfile, SyntheticDrafter, shape
from specpilot.cli import main


@pytest.fixture
def data_dir(tmp_path):
    root = tmp_path / "data"
    (root / "eagle").mkdir(parents=True)
    rows = [{"question_id": i, "category": "coding", "turns": [f"def add{i}(a, b):\n    return a + b\n" * 2]}
            for i in range(3)]
    (root / "eagle" / "humaneval_question.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (root / "eagle" / "gsm8k_question.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:2]))
    return root


@pytest.mark.parametrize("acceptance", ["real", "synthetic:dflash2-gsm8k"])
def test_bench_end_to_end(acceptance, checkpoint_factory, data_dir, tmp_path, capsys):
    path, _ = checkpoint_factory("qwen3")
    out = tmp_path / "bench.json"
    rc = main(["bench", "--target", str(path), "--drafter", "ngram", "--workloads", "humaneval", "gsm8k",
               "--data-dir", str(data_dir), "--batch-sizes", "1", "2", "--max-new-tokens", "12",
               "--configs", "tree=tree:static:2,2", "--stock-tree", "chain:3", "--acceptance", acceptance,
               "--out", str(out), "--no-chat"])
    assert rc == 0
    report = json.loads(out.read_text())
    rows = report["results"]
    assert {r["config"] for r in rows} == {"ar", "stock", "tree"} and len(rows) == 2 * 2 * 3
    assert all(r["forcing"]["passed"] for r in rows if r["config"] != "ar")
    assert all(r["synthetic"] == (acceptance != "real") for r in rows)
    assert (tmp_path / "bench.png").stat().st_size > 1000
    captured = capsys.readouterr()
    assert "12/12 rows" in captured.err  # the progress bar ends full: 2 workloads x 2 batch sizes x 3 rows
    if acceptance != "real":
        # the oracle follows the profile: tau well above 1 on a chain of 3 (expected about 3.4)
        # (a few steps per row, each group with its own draws: seeded, so deterministic)
        assert all(r["tau"] > 2.0 for r in rows if r["config"] == "stock")
        assert "SYNTHETIC" in captured.out


def test_half_precision_runs_calibrate_the_forcing_tolerance(checkpoint_factory, data_dir, tmp_path):
    """Two correct bf16 kernels (AR decode, the verify block) round near-ties apart: a bf16 run's forcing uses a
    tolerance measured on the target, an fp32 run the stated one."""
    path, _ = checkpoint_factory("qwen3")
    sources = {}
    for dtype in ("bfloat16", "float32"):
        out = tmp_path / f"{dtype}.json"
        main(["bench", "--target", str(path), "--drafter", "ngram", "--workloads", "gsm8k", "--data-dir",
              str(data_dir), "--batch-sizes", "1", "--max-new-tokens", "6", "--stock-tree", "chain:3", "--dtype",
              dtype, "--device", "cpu", "--out", str(out), "--no-chat"])
        rows = json.loads(out.read_text())["results"]
        sources[dtype] = {r["forcing"]["tolerance_source"] for r in rows if "forcing" in r}
    assert all(s.startswith("calibrated") for s in sources["bfloat16"]) and sources["bfloat16"]
    assert sources["float32"] == {"stated"}


def test_profiles_match_their_published_tau():
    for name, tau in (("dflash2-gsm8k", 5.46), ("dflash2-mixed", 3.58)):
        assert AcceptanceProfile.load(name).expected_chain_tau(7) == pytest.approx(tau, abs=0.01)
    with pytest.raises(ValueError, match="shipped profiles"):
        AcceptanceProfile.load("nope")


def test_zoo_profiles_reproduce_the_measured_tau():
    import json
    from pathlib import Path

    rows = json.loads((Path(__file__).parents[2] / "bench/results/zoo_acceptance.json").read_text())["rows"]
    chains = [r for r in rows if r["tree"] == "chain:7"]
    assert chains
    for r in chains:
        name = r["drafter"] if r["drafter"].startswith(r["target"]) else f"{r['target']}-{r['drafter']}"
        # the bonus token of a request's last step may be cut by max_new_tokens: a little below the expectation
        assert AcceptanceProfile.load(f"zoo-{name}").expected_chain_tau(7) == pytest.approx(r["tau"], abs=0.05)


def test_config_parsing():
    cfg = BenchConfig.parse("w=tree:dynamic:4,5,16;weight_format:w12n;decode_gemv:false", "chain:7")
    assert cfg.tree == "dynamic:4,5,16" and dict(cfg.engine) == {"weight_format": "w12n", "decode_gemv": False}
    with pytest.raises(ValueError, match="unknown key"):
        BenchConfig.parse("x=speed:9", "chain:7")


def test_bench_random_real_shape_target(data_dir, tmp_path):
    """random:SHAPE targets (here the tiny shape) with a random DFlash drafter under synthetic acceptance;
    real acceptance is refused on random weights."""
    out = tmp_path / "r.json"
    args = ["bench", "--target", "random:tiny-dense", "--drafter", "random-dflash", "--workloads", "gsm8k",
            "--data-dir", str(data_dir), "--max-new-tokens", "10", "--stock-tree", "chain:7", "--out", str(out),
            "--device", "cpu"]
    assert main(args + ["--acceptance", "synthetic:dflash2-mixed"]) == 0
    rows = json.loads(out.read_text())["results"]
    assert all(r["synthetic"] and r.get("forcing", {"passed": True})["passed"] for r in rows)
    assert main(args + ["--acceptance", "real"]) == 2


def test_multi_turn_conversations_keep_answers_in_context(checkpoint_factory, tmp_path):
    """MT-Bench style: turn 2 is generated after turn 1's answer, and every configuration replays those turns."""
    from specpilot.bench.harness import bench, load_workloads
    from specpilot.models.loader import load_model, load_tokenizer
    from specpilot.spec_decode.drafters.ngram import NgramDrafter

    path, _ = checkpoint_factory("llama")
    root = tmp_path / "d"
    root.mkdir()
    rows = [{"question_id": 81, "category": "writing", "turns": ["def add(a, b):", "for i in range(3):"]},
            {"question_id": 82, "category": "math", "turns": ["the quick brown fox"]}]
    (root / "mt_bench_question.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    model, tok = load_model(str(path), "cpu", "float32"), load_tokenizer(str(path))
    out = bench(model, tok, lambda runtime: NgramDrafter(), load_workloads(["mt-bench"], root), [1], [], "chain:3", 6,
                None)
    assert all(r["prompts"] == 2 and r["turns"] == 3 for r in out)
    assert {r["config"] for r in out} == {"ar", "stock"} and all(r["tokens"] == out[0]["tokens"] for r in out)
    assert out[1]["forcing"]["passed"]


def test_failing_configuration_is_recorded_and_the_others_run(data_dir, tmp_path):
    """A configuration that raises (here W12N on an fp32 model) becomes an error row; the rest still run and the
    command exits 1. Bad field values still fail up front (exit 2)."""
    out = tmp_path / "r.json"
    args = ["bench", "--target", "random:tiny-dense", "--drafter", "random-dflash", "--workloads", "gsm8k",
            "--data-dir", str(data_dir), "--max-new-tokens", "6", "--stock-tree", "chain:3", "--out", str(out),
            "--device", "cpu", "--acceptance", "synthetic:dflash2-mixed", "--plot", str(tmp_path / "p.png")]
    assert main(args + ["--configs", "bad=weight_format:w12n", "tree=tree:static:2,1",
                        "--engine", "decode_gemv:false"]) == 1
    report = json.loads(out.read_text())
    by_name = {r["config"]: r for r in report["results"]}
    assert "needs a bf16 model" in by_name["bad"]["error"] and "partial" not in report
    assert by_name["tree"]["forcing"]["passed"] and by_name["tree"]["speedup_vs_stock"] > 0
    # --engine fields sit under stock and every configuration
    assert report["engine"] == {"decode_gemv": False} == by_name["stock"]["engine"]
    assert by_name["tree"]["engine"] == {"decode_gemv": False}
    assert main(args + ["--configs", "x=block_attention:flash"]) == 2
    assert main(args + ["--engine", "tree:chain:3"]) == 2


def test_synthetic_trees_are_no_deeper_than_the_drafters_block():
    """A DFlash block of 8 drafts 7 deep: the oracle's tree for chain:10 is a chain of 7 (no credit for depths
    the real drafter never proposes); a drafter without a block keeps the spec's depth."""
    from specpilot.bench.synthetic import SyntheticDrafter
    from specpilot.spec_decode.tree import TreeSpec

    class Inner:
        target_layers = ()

        def __init__(self, block_size=None):
            if block_size is not None:
                self.block_size = block_size

        def propose(self, slots, roots, spec):
            return []

    profile = AcceptanceProfile.load("dflash2-gsm8k")
    for inner, depth in ((Inner(8), 7), (Inner(), 10)):
        d = SyntheticDrafter(inner, {0: list(range(40))}, profile, 100)
        for spec, nodes in (("chain:10", depth + 1), ("static:2,1,1,1,1,1,1,1,1,1", 2 * depth + 1)):
            (tree,) = d.propose([0], [5], TreeSpec.parse(spec))
            assert max(tree.depths) == depth and tree.num_nodes == nodes


class _HashTarget:
    """A stand-in target whose greedy token after a node is a hash of the whole sequence up to it: nothing like
    the oracle's stock continuation, as a bf16 verify after a flipped near-tie is nothing like AR's."""

    def __init__(self, vocab: int):
        self.vocab, self.context, self.calls = vocab, [], 0

    def greedy(self, tree) -> list[int]:
        out = []
        for node in range(tree.num_nodes):
            path = [node]
            while tree.parents[path[-1]] >= 0:
                path.append(tree.parents[path[-1]])
            out.append(hash(tuple(self.context) + tuple(tree.tokens[n] for n in reversed(path))) % self.vocab)
        return out

    def probe(self, slots, trees):
        self.calls += 1
        return [self.greedy(t) for t in trees]


class _NoDrafter:
    target_layers = ()

    def start(self, slot, prompt, features=None): ...

    def commit(self, slot, accepted, features=None): ...

    def propose(self, slots, roots, spec): ...


@pytest.mark.parametrize("tree", ["chain:7", "static:2,2,1,1", "dynamic:4,7,15"])
def test_probed_oracle_realizes_the_profile_whatever_the_stock_continuation(tree):
    """With a probe, the oracle's right drafts are the target's own answers: the accepted depth follows the
    profile although the stock continuation it was given is wrong from the first token; without one it would
    accept nothing. At most one probe per depth, plus the one that confirms."""
    import statistics

    from specpilot.spec_decode.tree import TreeSpec
    from specpilot.spec_decode.verify import accept_greedy

    spec, profile, vocab = TreeSpec.parse(tree), AcceptanceProfile.load("dflash2-gsm8k"), 1000
    target = _HashTarget(vocab)
    d = SyntheticDrafter(_NoDrafter(), {0: [vocab + 1] * 5000}, profile, vocab, probe=target.probe)
    d.start(0, [1, 2, 3])
    root, accepted, steps = 7, [], 300
    target.context = [1, 2, 3]
    for _ in range(steps):
        calls = target.calls
        (t,) = d.propose([0], [root], spec)
        assert target.calls - calls <= max(t.depths) + 1
        (acc,) = accept_greedy([t], [target.greedy(t)])
        accepted.append(acc.num_accepted)
        d.commit(0, list(acc.tokens[:-1]))
        target.context += [root] + list(acc.tokens[:-1])
        root = acc.tokens[-1]
    # the expected accepted depth is the profile's tau of the tree's shape - 1 (a chain of 7: 4.46)
    assert statistics.mean(accepted) == pytest.approx(profile.expected_tau(shape(spec, 0, profile)) - 1, abs=0.35)
    assert d.truth[0][:len(d.out[0])] == d.out[0]  # the truth now follows what the target answered


def test_synthetic_dynamic_trees_keep_the_nodes_the_profile_accepts_most():
    """A dynamic tree is shaped as if the drafter were calibrated to the profile: at 15 draft nodes it beats a chain
    and the static tree of 14, and it is the best closed set of 15 nodes that dynamic:4,7 can grow (brute force
    over the full 28-node tree: any kept set must contain its ancestors)."""
    import itertools

    from specpilot.spec_decode.tree import DraftTree, TreeSpec

    profile = AcceptanceProfile.load("dflash2-gsm8k")
    tau = {t: profile.expected_tau(shape(TreeSpec.parse(t), 0, profile))
           for t in ["chain:7", "static:2,1,1,1,1,1,1", "dynamic:4,7,15", "dynamic:4,7,28"]}
    assert tau["chain:7"] == pytest.approx(profile.expected_chain_tau(7)) == pytest.approx(5.46, abs=0.01)
    assert tau["chain:7"] < tau["static:2,1,1,1,1,1,1"] < tau["dynamic:4,7,15"] < tau["dynamic:4,7,28"]
    # small enough to brute-force: dynamic:2,3,4 against every ancestor-closed 4-node subset of its full tree
    full = shape(TreeSpec.parse("dynamic:2,3,6"), 0, profile)
    best = 0.0
    for keep in itertools.combinations(range(1, full.num_nodes), 4):
        kept = (0,) + keep
        if all(full.parents[n] in kept for n in keep):
            index = {n: i for i, n in enumerate(kept)}
            sub = DraftTree(tuple(full.tokens[n] for n in kept),
                            tuple(-1 if n == 0 else index[full.parents[n]] for n in kept))
            best = max(best, profile.expected_tau(sub))
    assert profile.expected_tau(shape(TreeSpec.parse("dynamic:2,3,4"), 0, profile)) == pytest.approx(best)


def test_only_the_inner_drafter_is_timed():
    """The oracle's drawing and probing run inside `untimed` (a benchmark's clock leaves them out); the inner
    drafter's proposal, the step's real draft cost, runs outside it."""
    from specpilot.spec_decode.tree import TreeSpec

    target, where = _HashTarget(50), []

    class Inner(_NoDrafter):
        def propose(self, slots, roots, spec):
            where.append(("drafter", bool(untimed)))

    untimed = []

    def clock(fn, *args):
        untimed.append(fn)
        try:
            return fn(*args)
        finally:
            untimed.pop()

    def probe(slots, trees):
        where.append(("probe", bool(untimed)))
        return target.probe(slots, trees)

    d = SyntheticDrafter(Inner(), {}, AcceptanceProfile.load("dflash2-gsm8k"), 50, probe=probe, untimed=clock)
    d.start(0, [1])
    d.propose([0], [3], TreeSpec.parse("chain:4"))
    assert ("drafter", False) in where and ("drafter", True) not in where
    assert ("probe", True) in where and ("probe", False) not in where


def test_oracle_without_probe_drafts_the_stock_continuation():
    """No probe (fp32 CPU runs): right drafts are the stock continuation's tokens, while the emitted prefix
    follows it; once it has left it, no draft is right (the truth is unknown)."""
    from specpilot.spec_decode.tree import TreeSpec

    d = SyntheticDrafter(_NoDrafter(), {0: [1, 2, 3, 4, 5, 6]}, AcceptanceProfile("always", (1.0,) * 7), 200)
    d.start(0, [7, 8])
    (tree,) = d.propose([0], [1], TreeSpec.parse("chain:2"))
    assert tree.tokens == (1, 2, 3)
    d.commit(0, [2])
    (tree,) = d.propose([0], [9], TreeSpec.parse("chain:2"))  # the bonus token flipped: 9, not 3
    assert tree.tokens[0] == 9 and tree.tokens[1] != 4 and tree.tokens[2] != 5
    assert d.truth[0] == [1, 2, 3, 4, 5, 6]


def test_probed_bench_accepts_every_draft_on_a_bf16_target(tmp_path):
    """On a GPU, AR decode and the verify block of a bf16 random target flip near-ties (~20% of tokens at the
    27B shape), and a stock-continuation oracle then leaves the profile. Here the flips are forced: the oracle's
    stock continuation has every fifth token wrong. With the probe a profile of certain acceptance still gives
    every step the full chain, the output passes forcing, and the probes are counted and not timed."""
    import torch

    from specpilot.bench.harness import BenchConfig, _run_config, calibrate
    from specpilot.bench.shapes import hf_config, random_model
    from specpilot.engine.generator import Generator
    from specpilot.runtime.runner import ModelRunner
    from specpilot.runtime.sampling import SamplingParams
    from specpilot.spec_decode.drafters.ngram import NgramDrafter

    cfg = hf_config("tiny-dense", hidden_size=256, intermediate_size=512, num_hidden_layers=4, vocab_size=4096,
                    head_dim=64)
    model = random_model(cfg, "cpu", torch.bfloat16)
    prompts = [list(range(3 + i, 40 + i)) for i in range(3)]
    params = SamplingParams(max_new_tokens=1 + 8 * 4, ignore_eos=True)  # the prefill's token + 8 steps of 4
    stock = ModelRunner(model)
    truth = [r.token_ids for r in Generator(stock).generate(prompts, params)]
    tolerance = calibrate(stock, prompts, truth, 1e-3)
    flipped = [[(t + 1) % cfg.vocab_size if i % 5 == 4 else t for i, t in enumerate(out)] for out in truth]
    always = AcceptanceProfile("always", (1.0,) * 7)
    row = _run_config(model, lambda runtime: NgramDrafter(), BenchConfig("stock", "chain:3"), prompts, flipped, 1,
                      params, always, (), stock, tolerance, torch.device("cpu"))
    assert row["tau"] == 4.0 and row["accepted_per_depth"] == [3 * 8] * 3
    assert row["forcing"]["passed"]
    assert row["oracle"]["probes"] >= 3 * 8 and row["oracle"]["seconds_excluded"] > 0


def test_tolerance_is_calibrated_on_a_bf16_random_target():
    """bf16 on CPU: AR decode and the teacher-forced pass disagree by a few ulps of the logits, so a random
    target's flat logits flip near-ties; the calibrated tolerance covers that noise (forcing of AR's own output
    passes), is labelled, and never drops below the stated one. fp32 is exact: the stated tolerance stays."""
    import torch

    from specpilot.bench.harness import calibrate, forcing
    from specpilot.bench.shapes import hf_config, random_model
    from specpilot.engine.generator import Generator
    from specpilot.runtime.runner import ModelRunner
    from specpilot.runtime.sampling import SamplingParams

    cfg = hf_config("tiny-dense", hidden_size=256, intermediate_size=512, num_hidden_layers=4, vocab_size=4096,
                    head_dim=64)
    prompts = [list(range(3 + i, 40 + i)) for i in range(3)]
    for dtype in (torch.bfloat16, torch.float32):
        runner = ModelRunner(random_model(cfg, "cpu", dtype))
        outputs = [r.token_ids for r in Generator(runner).generate(prompts, SamplingParams(max_new_tokens=32,
                                                                                            ignore_eos=True))]
        tol = calibrate(runner, prompts, outputs, 1e-3)
        assert tol.stated == 1e-3 and tol.source.startswith("calibrated")
        if dtype == torch.float32:
            assert tol.value == 1e-3
            continue
        assert tol.value > 4e-3  # a few bf16 ulps of logits of this size, not a fp32 rounding
        report = forcing(runner, prompts, outputs, tol)
        assert report["passed"] and report["tolerance"] == tol.value and report["failures_at_stated"] >= 0


def test_path_noise_copies_each_decode_step():
    """A decode graph returns one static logits buffer, rewritten every step: the calibration must keep a copy
    of each step's logits (it once compared every step with the last). fp32 paths agree to rounding."""
    import torch

    from specpilot.bench.harness import path_noise
    from specpilot.bench.shapes import hf_config, random_model
    from specpilot.runtime.runner import ModelRunner

    cfg = hf_config("tiny-dense", hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=512,
                    head_dim=16)
    runner = ModelRunner(random_model(cfg, "cpu", torch.float32))
    decode, static = runner.decode, torch.empty(1, cfg.vocab_size)

    def graph_like_decode(ids, positions):  # what DecodeGraph.replay hands back
        static.copy_(decode(ids, positions))
        return static

    runner.decode = graph_like_decode
    prompt, output = list(range(5, 30)), list(range(40, 56))
    assert path_noise(runner, prompt, output) < 1e-4


def test_timed_runs_never_grow_a_cache(checkpoint_factory, data_dir, tmp_path, monkeypatch):
    """The warm-up allocates every cache at its final size and passes through every batch size: a cache that
    grew inside a timed run would drop its captured graphs and time their capture (and compiles)."""
    import specpilot.bench.harness as harness
    from specpilot.runtime.cache import ModelCache

    created, timed = [], []
    real_init, real_run = ModelCache.__init__, harness.run_generation

    def init(self, *a, **k):
        real_init(self, *a, **k)
        created.append(timed[-1] if timed else None)

    def run(make, prompts, batch, params, *a, **k):
        timed.append(params.max_new_tokens == 12)  # the bench's own length; warm-ups use 4 and 16
        try:
            return real_run(make, prompts, batch, params, *a, **k)
        finally:
            timed.pop()

    monkeypatch.setattr(ModelCache, "__init__", init)
    monkeypatch.setattr(harness, "run_generation", run)
    path, _ = checkpoint_factory("qwen3")
    rc = main(["bench", "--target", str(path), "--drafter", "ngram", "--workloads", "humaneval",
               "--data-dir", str(data_dir), "--batch-sizes", "1", "2", "--max-new-tokens", "12",
               "--configs", "tree=tree:static:2,2", "--stock-tree", "chain:3", "--acceptance",
               "synthetic:dflash2-gsm8k", "--out", str(tmp_path / "b.json"), "--no-chat"])
    assert rc == 0 and created and True not in created, created


def test_random_model_clean_weights_never_escape_w12n():
    """clean_weights raises tiny magnitudes so that no weight leaves the W12N exponent window: the encodings
    have no escapes and no verbatim segments (the GEMV's fast path), while the plain draw does escape."""
    import torch

    from specpilot.bench.shapes import hf_config, random_model
    from specpilot.weights import w12n

    cfg = hf_config("tiny-dense", hidden_size=256, intermediate_size=512)
    for clean in (False, True):
        model = random_model(cfg, "cpu", torch.bfloat16, clean_weights=clean)
        mats = [p.detach() for n, p in model.named_parameters() if p.ndim == 2 and "embed" not in n]
        escapes = sum(w12n.stats(w12n.encode(m, segment=128))["escape_rate"] for m in mats)
        assert (escapes == 0) == clean, (clean, escapes)
        if clean:
            assert all(m.abs().min() >= 1e-4 * 0.99 for m in mats)


# ---- workloads and bad inputs ----------------------------------------------------------------------------------


def test_every_workload_resolves_from_the_shipped_data(monkeypatch, tmp_path):
    """No SPECPILOT_DATA_DIR, no --data-dir, another working directory: every workload name loads."""
    from specpilot.bench.harness import WORKLOADS, load_workloads
    from specpilot.prompts import DATA_DIR_ENV

    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    loaded = load_workloads(list(WORKLOADS) + ["math500", "Eagle_QA"], limit=2)
    assert list(loaded) == list(WORKLOADS) + ["math500", "Eagle_QA"]
    assert all(len(conversations) == 2 for conversations in loaded.values())
    # humaneval and gsm8k are EAGLE's 80-prompt subsets, whatever the spelling
    assert len(load_workloads(["HumanEval", "gsm8k"])["HumanEval"]) == 80
    assert len(load_workloads(["gsm8k"])["gsm8k"]) == 80


def test_a_workload_given_as_a_prompt_file(tmp_path, capsys):
    """--workloads takes a prompt file; --out into a missing directory creates it once rows can be measured."""
    prompts = tmp_path / "mine.txt"
    prompts.write_text("def add(a, b):\nthe quick brown fox\nfor i in range(10):\n")
    out = tmp_path / "new" / "dir" / "r.json"
    rc = main(["bench", "--target", "random:tiny-dense", "--drafter", "random-dflash", "--workloads", str(prompts),
               "--limit", "2", "--max-new-tokens", "6", "--stock-tree", "chain:3", "--out", str(out), "--device",
               "cpu", "--acceptance", "synthetic:dflash2-mixed", "--no-chat"])
    assert rc == 0
    rows = json.loads(out.read_text())["results"]
    assert {r["workload"] for r in rows} == {str(prompts)} and all(r["prompts"] == 2 for r in rows if "prompts" in r)
    assert (out.parent / "r.png").exists()


def _bad_bench_cases(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    out = ["--out", str(tmp_path / "r.json")]
    return {
        "limit 0": (["--limit", "0"] + out, "--limit 0: must be >= 1"),
        "limit negative": (["--limit", "-3"] + out, "--limit -3: must be >= 1"),
        "batch size 0": (["--batch-sizes", "1", "0"] + out, "--batch-sizes 0: must be >= 1"),
        "max-new-tokens 0": (["--max-new-tokens", "0"] + out, "--max-new-tokens 0: must be >= 1"),
        "max-new-tokens negative": (["--max-new-tokens", "-5"] + out, "--max-new-tokens -5: must be >= 1"),
        "stock tree": (["--stock-tree", "chain"] + out, "--stock-tree 'chain': use chain:D, static:C1,C2,... or "
                       "dynamic:TOPK,DEPTH,NODES with positive integers"),
        "stock tree not a chain": (["--stock-tree", "static:2,2"] + out,
                                   "--stock-tree 'static:2,2': stock is a chain; use chain:D, e.g. chain:7"),
        "config without =": (["--configs", "garbage"] + out,
                             "--configs 'garbage': use NAME=tree:SPEC;FIELD:VALUE, e.g. 'tree16=tree:dynamic:4,5,16'"),
        "config without name": (["--configs", "=tree:chain:3"] + out, "--configs '=tree:chain:3': use NAME=tree:SPEC"),
        "config named stock": (["--configs", "stock=tree:chain:2"] + out,
                               "--configs 'stock=tree:chain:2': the name 'stock' is a built-in row; pick another NAME"),
        "config named twice": (["--configs", "a=tree:chain:2", "a=tree:chain:3"] + out,
                               "--configs 'a=tree:chain:3': the name 'a' is given twice; pick another NAME"),
        "unknown workload": (["--workloads", "gsm8k", "nope"] + out,
                             "workload 'nope': unknown; use a workload (mt-bench, humaneval, gsm8k, alpaca, cnndm, "
                             "spec-bench), another shipped prompt set (math500, mbpp"),
        "missing workload file": (["--workloads", str(tmp_path / "q.jsonl")] + out,
                                  f"workload '{tmp_path / 'q.jsonl'}': no such prompt file"),
        "workload directory": (["--workloads", str(tmp_path / "adir")] + out,
                               f"workload '{tmp_path / 'adir'}': not a file"),
        "missing data dir": (["--data-dir", str(tmp_path / "none")] + out,
                             f"data directory {tmp_path / 'none'}: no such directory"),
        "out under a file": (["--out", str(tmp_path / "afile" / "sub" / "r.json")],
                             f"--out {tmp_path / 'afile' / 'sub' / 'r.json'}: {tmp_path / 'afile'} is not a directory"),
        "out is a directory": (["--out", str(tmp_path / "adir")],
                               f"--out {tmp_path / 'adir'}: is a directory; give a file path in it"),
        "plot under a file": (["--plot", str(tmp_path / "afile" / "p.png")] + out,
                              f"--plot {tmp_path / 'afile' / 'p.png'}: {tmp_path / 'afile'} is not a directory"),
    }


BAD_BENCH = ["limit 0", "limit negative", "batch size 0", "max-new-tokens 0", "max-new-tokens negative",
             "stock tree", "config without =", "config without name", "config named stock", "config named twice", "unknown workload",
             "missing workload file", "workload directory", "missing data dir", "out under a file",
             "out is a directory", "plot under a file"]


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded before the bad flag was refused")


@pytest.mark.parametrize("case", BAD_BENCH)
def test_bench_bad_input_fails_up_front_with_one_line(case, tmp_path, capsys, monkeypatch):
    """Each bad flag: exit 2, one `error:` line on stderr naming it, before any model loads or file is written."""
    from specpilot.bench import commands

    monkeypatch.setattr(commands, "_bench_models", _no_model)
    flags, message = _bad_bench_cases(tmp_path)[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    rc = main(["bench", "--target", "random:tiny-dense", "--drafter", "random-dflash", "--device", "cpu",
               "--acceptance", "synthetic:dflash2-mixed", *flags])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no report, no plot, no folder


def test_bench_out_in_a_read_only_folder_fails_up_front(tmp_path, capsys, monkeypatch):
    import os
    from pathlib import Path

    from specpilot.bench import commands

    monkeypatch.setattr(commands, "_bench_models", _no_model)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    if os.geteuid() == 0:  # root writes anywhere: the folder denies writes as it would to a user
        access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode: access(path, mode) and Path(path) != locked)
    rc = main(["bench", "--target", "random:tiny-dense", "--acceptance", "synthetic:dflash2-mixed",
               "--out", str(locked / "sub" / "r.json")])
    assert rc == 2 and f"cannot write in {locked} (permission denied)" in capsys.readouterr().err


# --- margin targets (specpilot/bench/shapes.py) and forcing on them --------------------------------------------


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-hybrid"])
def test_margin_target_generates_its_chain_with_wide_gaps(shape):
    """A margin target's greedy output is its codebook's chain (the previous token's code copied by attention,
    on the hybrid one recalled by the recurrent state), and its top-1 logit leads the runner-up by a good part of
    the planted margin at every position after the first (fp32; the tiny shapes have the least room for codes)."""
    import torch

    from specpilot.bench.shapes import MARGIN, hf_config, margin_model
    from specpilot.engine.generator import Generator
    from specpilot.runtime.runner import ModelRunner
    from specpilot.runtime.sampling import SamplingParams
    from specpilot.layers.metadata import BatchMetadata

    model = margin_model(hf_config(shape), "cpu", torch.float32)
    codes, memory = model.margin_codes, model.config.is_hybrid
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (2, 11, 40)]
    params = SamplingParams(max_new_tokens=48, ignore_eos=True)
    out = [r.token_ids for r in Generator(ModelRunner(model)).generate(prompts, params)]
    assert out == [codes.chain(p, 48, memory) for p in prompts]
    assert len(set(out[2])) > 30  # no short cycle
    runner = ModelRunner(model)
    ids = torch.tensor(prompts[2] + out[2])[None]
    runner.allocate(1, ids.shape[1] + 1)
    zero = torch.zeros(1, dtype=torch.long)
    logits = runner.logits(runner.forward(BatchMetadata.contiguous(ids, zero, zero, 0)))[0, 1:]
    top = logits.topk(2, dim=-1).values
    assert (top[:, 0] - top[:, 1]).min() > MARGIN / 4


def test_margin_target_keeps_flat_ones_shapes_and_random_matrices():
    """The same parameter names and shapes as the flat target; each matrix keeps most of its random draw (the
    circuit sets a few rows and columns, the LM head and the norm gains)."""
    import torch

    from specpilot.bench.shapes import hf_config, margin_model, random_model

    cfg = hf_config("tiny-hybrid")
    margin, flat = dict(margin_model(cfg, "cpu", torch.float32).named_parameters()), \
        dict(random_model(cfg, "cpu", torch.float32).named_parameters())
    assert {k: v.shape for k, v in margin.items()} == {k: v.shape for k, v in flat.items()}
    kept = [float((margin[k] == flat[k]).float().mean()) for k in flat
            if flat[k].ndim == 2 and "lm_head" not in k and "embed" not in k]
    assert sorted(kept)[len(kept) // 2] > 0.5


def test_random_target_specs_and_their_errors(tmp_path, capsys):
    from specpilot.bench.shapes import RandomTarget

    assert RandomTarget.parse("random:Qwen3-8B") == RandomTarget("Qwen3-8B", "margin")
    assert RandomTarget.parse("random:Qwen3-8B", "flat") == RandomTarget("Qwen3-8B", "flat")
    assert RandomTarget.parse("margin:Qwen3.5-27B:layers=8", "flat") == RandomTarget("Qwen3.5-27B", "margin", 8)
    assert RandomTarget.parse("flat:Qwen3.5-27B:layers=2").label == "flat:Qwen3.5-27B:layers=2"
    assert RandomTarget.parse("Qwen/Qwen3-8B") is None and RandomTarget.parse("/models/x") is None
    cases = {"random:Nope": "target 'random:Nope': unknown shape 'Nope'; use one of tiny-dense, tiny-hybrid, "
                            "Qwen3-8B, Qwen3.5-27B",
             "random:Qwen3-8B:depth=4": "target 'random:Qwen3-8B:depth=4': options are layers=N with N >= 1, got "
                                        "'depth=4'",
             "margin:Qwen3-8B:layers=0": "options are layers=N with N >= 1, got 'layers=0'",
             "random:Qwen3.5-27B:layers=2": "target 'random:Qwen3.5-27B:layers=2': a margin target needs a "
                                            "full-attention layer; use layers >= 4 (or a flat target)"}
    for spec, message in cases.items():
        with pytest.raises(ValueError, match="target"):
            RandomTarget.parse(spec)
        rc = main(["bench", "--target", spec, "--acceptance", "synthetic:dflash2-mixed", "--device", "cpu",
                   "--workloads", "gsm8k", "--out", str(tmp_path / "r.json")])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and message in err, err
        assert not (tmp_path / "r.json").exists()


def test_bench_rows_name_their_target_kind_and_force_margin_targets_at_the_stated_tolerance(data_dir, tmp_path):
    """random:SHAPE is a margin target unless --target-kind flat: its rows force at the stated 1e-3; a flat one's
    rows use the calibrated tolerance, labelled; every row and the report say which kind ran."""
    out = tmp_path / "r.json"
    args = ["bench", "--target", "random:tiny-hybrid", "--drafter", "random-dflash", "--workloads", "gsm8k",
            "--data-dir", str(data_dir), "--max-new-tokens", "12", "--stock-tree", "chain:4", "--out", str(out),
            "--device", "cpu", "--acceptance", "synthetic:dflash2-mixed", "--configs", "tree=tree:dynamic:3,4,10"]
    for kind in ("margin", "flat"):
        assert main(args + ["--target-kind", kind]) == 0
        report = json.loads(out.read_text())
        assert report["target_kind"] == kind
        rows = report["results"]
        assert {r["target_kind"] for r in rows} == {kind}
        forced = [r["forcing"] for r in rows if "forcing" in r]
        assert forced and all(f["passed"] for f in forced)
        if kind == "margin":
            assert {(f["tolerance"], f["tolerance_source"]) for f in forced} == {(1e-3, "stated")}
        else:
            assert all(f["tolerance_source"].startswith("calibrated") for f in forced)


def test_config_parsing_takes_the_node_budget_and_batch_sizes():
    cfg = BenchConfig.parse("r=tree:chain:3;adaptive:true;batches:1,8", "chain:7")
    assert cfg.adaptive and cfg.batches == (1, 8) and cfg.tree == "chain:3" and cfg.engine == ()
    plain = BenchConfig.parse("r=tree:chain:3", "chain:7")
    assert plain.batches == () and not plain.adaptive
    with pytest.raises(ValueError, match="adaptive:yes: use adaptive:true or adaptive:false"):
        BenchConfig.parse("r=adaptive:yes", "chain:7")
    with pytest.raises(ValueError, match="batches:0: use batch sizes >= 1"):
        BenchConfig.parse("r=batches:0", "chain:7")
