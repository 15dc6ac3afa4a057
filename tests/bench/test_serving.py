"""The serving benchmark (specpilot/bench/serving.py): Poisson arrivals, percentiles, the closed and open loop drivers
over a fake engine on a fake clock, the rows, JSON and plots of `specpilot bench serve`, its bad flags."""

from __future__ import annotations

import itertools
import json
import random
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest

from specpilot.bench import commands, serving
from specpilot.bench.serving import closed_loop, open_loop, percentile, poisson_arrivals, summarize
from specpilot.cli import main
from specpilot.runtime.sampling import SamplingParams


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class FakeStats:
    steps: int = 0
    emitted: int = 0
    drafted_per_depth: list[int] = field(default_factory=list)
    accepted_per_depth: list[int] = field(default_factory=list)
    seconds: dict = field(default_factory=lambda: {"draft": 0.0, "verify": 0.0})


@dataclass
class FakeOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None


def continuation(prompt: list[int], n: int) -> list[int]:
    """The fake model's greedy output: a function of the prompt alone."""
    return [(sum(prompt) * 7 + i * 13) % 97 for i in range(n)]


class FakeEngine:
    """The engine API over a fake model: at most max_num_seqs requests run (the rest wait, first come first served),
    each step gives every running request `per_step` tokens of its continuation and takes `dt` on the clock."""

    def __init__(self, clock: FakeClock, max_num_seqs: int = 64, per_step: int = 1, dt: float = 0.01,
                 corrupt: bool = False):
        self.clock, self.max_num_seqs, self.per_step, self.dt, self.corrupt = clock, max_num_seqs, per_step, dt, corrupt
        self.ids = itertools.count()
        self.waiting, self.running, self.reqs = [], [], {}
        self.steps = 0
        self.added_at_step: dict[str, int] = {}
        self.most_running = 0
        self.step_log = []

    def warmup(self):
        return {"graphs": 0, "bytes": 0}

    def add_request(self, prompt_ids, params, request_id=None):
        rid = request_id or f"r{next(self.ids)}"
        self.reqs[rid] = {"out": continuation(prompt_ids, params.max_new_tokens), "sent": 0, "stats": FakeStats()}
        self.waiting.append(rid)
        self.added_at_step[rid] = self.steps
        return rid

    def step(self):
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.pop(0))
        self.most_running = max(self.most_running, len(self.running))
        self.clock.t += self.dt
        self.steps += 1
        outs = []
        for rid in list(self.running):
            r = self.reqs[rid]
            new = r["out"][r["sent"]:r["sent"] + self.per_step]
            if self.corrupt and r["sent"] == 0:
                new = [new[0] + 1] + new[1:]
            r["sent"] += len(new)
            s = r["stats"]
            s.steps, s.emitted = s.steps + 1, s.emitted + len(new)
            s.drafted_per_depth = [s.steps * (self.per_step - 1)] if self.per_step > 1 else []
            done = r["sent"] >= len(r["out"])
            if done:
                self.running.remove(rid)
            outs.append(FakeOutput(rid, new, done, "length" if done else None))
        return outs

    def abort(self, request_id):
        self.running = [r for r in self.running if r != request_id]

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def stats(self, request_id):
        return self.reqs[request_id]["stats"]


PROMPTS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [11, 12]]


# ------------------------------------------------------------------------------------------- arrivals, percentiles
def test_poisson_arrivals_are_seeded_increasing_and_at_the_rate():
    a = poisson_arrivals(20000, 5.0, seed=3)
    assert a == poisson_arrivals(20000, 5.0, seed=3) and a != poisson_arrivals(20000, 5.0, seed=4)
    assert all(x < y for x, y in zip(a, a[1:])) and a[0] > 0
    assert abs(a[-1] / len(a) - 1 / 5.0) < 0.01  # mean gap 1 / rate
    in_100s = sum(t < 100 for t in a)
    assert abs(in_100s - 500) < 3 * 500**0.5  # count in a window: Poisson(rate x window)
    # the same draws at every rate, scaled: loads are comparable request for request
    b = poisson_arrivals(50, 10.0, seed=3)
    assert b == pytest.approx([t / 2 for t in poisson_arrivals(50, 5.0, seed=3)])
    with pytest.raises(ValueError, match="arrival rate 0: must be > 0"):
        poisson_arrivals(3, 0, seed=0)


def test_percentile_matches_numpy_linear():
    rng = random.Random(0)
    for n in (1, 2, 7, 100):
        xs = [rng.random() for _ in range(n)]
        for q in (0, 25, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


# --------------------------------------------------------------------------------------------------- drivers
def test_closed_loop_keeps_one_request_in_flight_per_client_and_totals_add_up():
    clock = FakeClock()
    engine = FakeEngine(clock, per_step=2, dt=0.01)
    params = SamplingParams(max_new_tokens=6)
    done = []
    res = closed_loop(engine, PROMPTS, clients=3, per_client=4, params=params, clock=clock, on_finish=done.append)
    assert len(res.records) == 12 and len(done) == 12
    assert engine.most_running == 3  # one in flight per client, never more
    assert res.steps == engine.steps == 4 * 3  # 3 steps a request (6 tokens, 2 a step), 4 in a row per client
    assert res.seconds == pytest.approx(0.12)
    # request k of client c takes prompt (k * clients + c) mod len(prompts), and gets that prompt's continuation
    recs = sorted(res.records, key=lambda r: int(r.request_id[1:]))
    order = [r.prompt for r in recs]
    assert sorted(order) == sorted((k * 3 + c) % len(PROMPTS) for k in range(4) for c in range(3))
    assert all(r.tokens == continuation(PROMPTS[r.prompt], 6) for r in recs)
    # each client's next request is sent when its last one finished: its arrival is that finish
    finishes = sorted(r.finish for r in recs)
    assert sorted(r.arrival for r in recs) == pytest.approx([0.0] * 3 + finishes[:9])
    row = summarize(res)
    assert row["tokens"] == 72 and row["requests"] == 12
    assert row["throughput_tok_s"] == pytest.approx(72 / 0.12) and row["throughput_req_s"] == pytest.approx(100)
    assert row["ttft_p50_ms"] == pytest.approx(10) and row["tpot_p50_ms"] == pytest.approx(20 / 5)
    assert row["tau"] == pytest.approx(2.0) and row["tokens_per_step"] == pytest.approx(6.0)


def test_closed_loop_waits_for_the_engine_when_clients_exceed_its_seats():
    """More clients than the engine runs at once: the extra ones queue inside the engine, TTFT grows."""
    clock = FakeClock()
    engine = FakeEngine(clock, max_num_seqs=2, dt=1.0)
    res = closed_loop(engine, PROMPTS, clients=4, per_client=1, params=SamplingParams(max_new_tokens=3), clock=clock)
    assert sorted(r.ttft for r in res.records) == [1.0, 1.0, 4.0, 4.0]
    assert res.seconds == 6.0 and summarize(res)["tokens"] == 12


def test_open_loop_adds_requests_only_once_they_arrived_and_skips_idle_time():
    clock = FakeClock()
    engine = FakeEngine(clock, dt=0.1)
    res = open_loop(engine, PROMPTS, [0.5, 0.52, 3.0], SamplingParams(max_new_tokens=2), clock=clock)
    by_arrival = sorted(res.records, key=lambda r: r.arrival)
    # 0.5 arrives first (the clock jumps there), 0.52 after the first step (t=0.6), 3.0 after the idle jump
    assert [engine.added_at_step[r.request_id] for r in by_arrival] == [0, 1, 3]
    assert [r.ttft for r in by_arrival] == pytest.approx([0.1, 0.18, 0.1])
    assert all(r.first >= r.arrival for r in res.records)
    assert clock.t == pytest.approx(0.5)  # five steps: no time spent waiting for arrivals
    assert res.seconds == pytest.approx(3.2)  # the span counts the skipped idle time
    assert [r.prompt for r in by_arrival] == [0, 1, 2]


def test_open_loop_queues_arrivals_behind_a_long_step():
    """Requests that arrive during a step are all added before the next one, with TTFT from their arrival."""
    clock = FakeClock()
    engine = FakeEngine(clock, dt=1.0)
    res = open_loop(engine, PROMPTS, [0.1, 0.2, 0.3, 0.4], SamplingParams(max_new_tokens=1), clock=clock)
    assert sorted(engine.added_at_step.values()) == [0, 1, 1, 1]
    assert sorted(r.ttft for r in res.records) == pytest.approx([1.0, 1.7, 1.8, 1.9])  # second step ends at 2.1


# ------------------------------------------------------------------------------------------- rows, JSON, plots
class FakeEngines:
    """serving.Engines over fake engines: AR one token a step, the speculative engine three, on one fake clock."""

    def __init__(self, cfg: serving.ServeConfig, corrupt: bool = False, profile=None):
        self.cfg, self.profile, self.oracle, self.corrupt = cfg, profile, None, corrupt
        self.clock = FakeClock()
        self.built = []

    def ar(self, batch):
        self.built.append(("ar", batch))
        return FakeEngine(self.clock, batch, per_step=1)

    def spec(self, batch, truth):
        self.built.append(("spec", batch))
        self.truth = truth
        return FakeEngine(self.clock, batch, per_step=3, corrupt=self.corrupt)

    def oracle_mark(self):
        return 0.0, 0


def test_closed_rows_pair_ar_and_spec_with_speedup_and_exactness():
    cfg = serving.ServeConfig("closed", (1, 4), max_new_tokens=9, per_client=2)
    engines = FakeEngines(cfg)
    rows = serving.serve_closed(engines, PROMPTS, "margin")
    assert [(r["engine"], r["batch"]) for r in rows] == [("ar", 1), ("spec", 1), ("ar", 4), ("spec", 4)]
    spec = rows[1]
    assert spec["exact"] is True and spec["mismatched_requests"] == 0
    assert spec["speedup_vs_ar"] == pytest.approx(3.0)
    # TPOT counts the tokens after the first: AR's 8 take 8 steps, the speculative engine's 8 come in 2 more steps
    assert spec["tpot_p50_vs_ar"] == pytest.approx(4.0)
    assert spec["target_kind"] == "margin" and spec["synthetic"] is False and spec["tree"] == "chain:7"
    # the speculative engine's truth is AR's output, keyed by prompt
    assert engines.truth == {tuple(p): continuation(p, 9) for p in PROMPTS[:5]}
    bad = serving.serve_closed(FakeEngines(cfg, corrupt=True), PROMPTS, "margin")
    assert bad[1]["exact"] is False and bad[1]["mismatched_requests"] == 2


def test_open_rows_measure_capacity_then_each_load():
    cfg = serving.ServeConfig("open", (2, 4), max_new_tokens=4, per_client=2, loads=(0.3, 0.9), requests=10)
    engines = FakeEngines(cfg)
    rows = serving.serve_open(engines, PROMPTS, "margin")
    cap = rows[0]
    assert cap["role"] == "capacity" and cap["engine"] == "ar" and cap["batch"] == 4
    assert cap["throughput_req_s"] == pytest.approx(8 / 0.08)  # 4 clients x 2 requests of 4 steps of 0.01 s
    assert [(r["engine"], r.get("load")) for r in rows[1:]] == [("ar", 0.3), ("spec", 0.3), ("ar", 0.9), ("spec", 0.9)]
    for r in rows[1:]:
        assert r["rate_req_s"] == pytest.approx(r["load"] * cap["throughput_req_s"]) and r["requests"] == 10
        assert r["ttft_p99_ms"] is not None and r["tpot_p50_ms"] is not None
    assert all(r["exact"] for r in rows if r["engine"] == "spec")
    given = serving.serve_open(FakeEngines(cfg), PROMPTS, "margin", capacity=2.0)
    assert given[0]["rate_req_s"] == pytest.approx(0.6)


def test_a_failing_speculative_engine_is_a_row_and_the_run_goes_on():
    cfg = serving.ServeConfig("closed", (1, 2), max_new_tokens=3, per_client=1)
    engines = FakeEngines(cfg)

    def broken(batch, truth):
        raise RuntimeError("graph capture failed")

    engines.spec = broken
    rows = serving.serve_closed(engines, PROMPTS)
    assert [r["engine"] for r in rows] == ["ar", "spec", "ar", "spec"]
    assert rows[1]["error"] == "RuntimeError: graph capture failed" and "throughput_tok_s" in rows[2]


def _png(path) -> bool:
    return path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_are_written(tmp_path):
    from specpilot.bench.serving_plot import plot

    closed = serving.serve_closed(FakeEngines(serving.ServeConfig("closed", (1, 2, 4), 6)), PROMPTS)
    plot(closed, tmp_path / "closed.png", "closed loop")
    opened = serving.serve_open(FakeEngines(serving.ServeConfig("open", (2,), 4, loads=(0.3, 0.6), requests=6)),
                                PROMPTS)
    plot(opened, tmp_path / "open.png", "open loop")
    assert _png(tmp_path / "closed.png") and _png(tmp_path / "open.png")


# ------------------------------------------------------------------------------------------------------ the CLI
class _FakeModel:
    class config:
        eos_token_ids = ()


def _fake_models(monkeypatch):
    """`bench serve` on fake engines: no model is built, the run's Engines are FakeEngines."""
    from specpilot.bench import commands
    from specpilot.bench.shapes import ByteTokenizer

    monkeypatch.setattr(commands, "_bench_models",
                        lambda args, device, profile, *flag: (_FakeModel(), ByteTokenizer(), None))
    monkeypatch.setattr(serving, "Engines", lambda model, make, eos, cfg, profile: FakeEngines(cfg, profile=profile))


@pytest.mark.parametrize("mode", ["closed", "open"])
def test_serve_writes_its_json_and_plot(mode, tmp_path, monkeypatch, capsys):
    _fake_models(monkeypatch)
    monkeypatch.setenv("SPECPILOT_COMMIT", "abc123")
    flags = ["--batch", "1", "2"] if mode == "closed" else ["--batch", "2", "--load", "0.5", "--requests", "4"]
    out = tmp_path / "new" / "dir"
    argv = ["bench", "serve", "--target", "random:tiny-dense", "--profile", "dflash2-gsm8k", "--mode", mode,
            "--max-new-tokens", "5", "--requests-per-client", "1", "--workloads", "gsm8k", "--out", str(out),
            "--device", "cpu", *flags]
    monkeypatch.setattr(sys, "argv", ["specpilot", *argv])  # the report's command
    rc = main(argv)
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((out / f"{mode}.json").read_text())
    assert doc["commit"] == "abc123" and doc["gpu"] == "cpu" and doc["command"] == " ".join(["specpilot", *argv])
    assert doc["target"] == "random:tiny-dense" and doc["profile"]["name"] == "dflash2-gsm8k"
    assert doc["config"]["mode"] == mode and "partial" not in doc
    rows = doc["results"]
    for r in rows:
        for key in ("engine", "batch", "throughput_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
                    "tau", "target_kind", "synthetic"):
            assert key in r, key
        if r["engine"] == "spec":
            assert r["exact"] is True and r["speedup_vs_ar"] > 1
        if r["mode"] == "open":
            assert r["load"] == 0.5 and r["rate_req_s"] > 0
    assert _png(out / f"{mode}.png")
    assert not list(out.glob("*.tmp"))


def test_append_splits_a_run_over_several_commands(tmp_path, monkeypatch, capsys):
    """--append keeps an earlier run's rows of other batch sizes (re-measured ones replaced) and its command; a run
    of another configuration is refused before any model is built, the report left as it was."""
    _fake_models(monkeypatch)
    out = tmp_path / "o"
    base = ["bench", "serve", "--target", "random:tiny-dense", "--profile", "dflash2-gsm8k", "--max-new-tokens", "5",
            "--requests-per-client", "1", "--device", "cpu", "--out", str(out)]

    def run(*flags):
        monkeypatch.setattr(sys, "argv", ["specpilot", *base, *flags])
        return main([*base, *flags])

    assert run("--batch", "1", "2") == 0
    assert run("--batch", "4", "2", "--append") == 0
    doc = json.loads((out / "closed.json").read_text())
    assert [(r["engine"], r["batch"]) for r in doc["results"]] == [("ar", 1), ("spec", 1), ("ar", 4), ("spec", 4),
                                                                  ("ar", 2), ("spec", 2)]
    assert [r["command"].split("--batch ")[1] for r in doc["runs"]] == ["1 2", "4 2 --append"]
    capsys.readouterr()
    before = (out / "closed.json").read_text()
    monkeypatch.setattr(commands, "_bench_models", _no_model)
    assert run("--batch", "8", "--append", "--tree", "chain:3") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --append: the report there is of another run (config: ") and err.count("\n") == 1
    assert "give another --out" in err and (out / "closed.json").read_text() == before


def test_append_in_the_open_loop_keeps_the_capacity(tmp_path, monkeypatch, capsys):
    _fake_models(monkeypatch)
    out = tmp_path / "o"
    base = ["bench", "serve", "--target", "random:tiny-dense", "--profile", "dflash2-gsm8k", "--mode", "open",
            "--max-new-tokens", "4", "--requests", "4", "--batch", "2", "--device", "cpu", "--out", str(out)]
    assert main([*base, "--load", "0.3"]) == 0
    capacity = json.loads((out / "open.json").read_text())["results"][0]["throughput_req_s"]
    capsys.readouterr()
    assert main([*base, "--load", "0.6", "--append"]) == 2
    assert capsys.readouterr().err == (f"error: --append: the earlier loads are fractions of a capacity of "
                                       f"{capacity:.6g} requests/s; give --capacity {capacity:.6g}\n")
    assert main([*base, "--load", "0.6", "--append", "--capacity", repr(capacity)]) == 0
    rows = json.loads((out / "open.json").read_text())["results"]
    assert [(r["engine"], r.get("load")) for r in rows] == [("ar", None), ("ar", 0.3), ("spec", 0.3), ("ar", 0.6),
                                                            ("spec", 0.6)]
    assert rows[3]["capacity_req_s"] == capacity


def _bad_serve_cases(tmp_path):
    return {
        "batch 0": (["--batch", "4", "0"], "--batch 0: must be >= 1"),
        "max-new-tokens 0": (["--max-new-tokens", "0"], "--max-new-tokens 0: must be >= 1"),
        "requests-per-client 0": (["--requests-per-client", "0"], "--requests-per-client 0: must be >= 1"),
        "requests 0": (["--mode", "open", "--requests", "0"], "--requests 0: must be >= 1"),
        "load in closed mode": (["--load", "0.3"], "--load goes with --mode open (the closed loop sets its load by "
                                                   "--batch)"),
        "capacity in closed mode": (["--capacity", "3"], "--capacity goes with --mode open"),
        "load 0": (["--mode", "open", "--load", "0.3", "0"], "--load 0.0: must be > 0"),
        "capacity negative": (["--mode", "open", "--capacity", "-1"], "--capacity -1.0: must be > 0 requests/s"),
        "bad tree": (["--tree", "chain"], "--tree 'chain': use chain:D"),
        "scheduler item": (["--scheduler", "max_prefill_tokens"],
                           "--scheduler 'max_prefill_tokens': use FIELD:VALUE;FIELD:VALUE, got 'max_prefill_tokens'"),
        "scheduler field": (["--scheduler", "max_prefill_tokens:64;nope:1"],
                            "--scheduler: unknown field 'nope' (max_num_seqs comes from --batch); fields: "
                            "max_prefill_tokens, max_model_len, memory_fraction, adaptive"),
        "scheduler max_num_seqs": (["--scheduler", "max_num_seqs:4"], "--scheduler: unknown field 'max_num_seqs'"),
        "scheduler value": (["--scheduler", "max_prefill_tokens:0"], "max_prefill_tokens=0: must be >= 1"),
        "engine field": (["--engine", "nope:1"], "EngineConfig: unknown key 'nope'"),
        "out under a file": (["--out", str(tmp_path / "afile" / "sub")],
                             f"--out {tmp_path / 'afile' / 'sub'}: {tmp_path / 'afile'} is not a directory"),
        "out is a file": (["--out", str(tmp_path / "afile")], f"--out {tmp_path / 'afile'}: {tmp_path / 'afile'} is "
                                                              "not a directory"),
        "unknown profile": (["--profile", "nope"], "acceptance profile 'nope': no such file; shipped profiles:"),
        "unknown workload": (["--workloads", "nope"], "workload 'nope': unknown"),
    }


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded before the bad flag was refused")


BAD_SERVE = ["batch 0", "max-new-tokens 0", "requests-per-client 0", "requests 0", "load in closed mode",
             "capacity in closed mode", "load 0", "capacity negative", "bad tree", "scheduler item", "scheduler field",
             "scheduler max_num_seqs", "scheduler value", "engine field",
             "out under a file", "out is a file", "unknown profile", "unknown workload"]


@pytest.mark.parametrize("case", BAD_SERVE)
def test_serve_bad_input_fails_up_front_with_one_line(case, tmp_path, capsys, monkeypatch):
    from specpilot.bench import commands

    monkeypatch.setattr(commands, "_bench_models", _no_model)
    (tmp_path / "afile").write_text("x")
    flags, message = _bad_serve_cases(tmp_path)[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    out = [] if "--out" in flags else ["--out", str(tmp_path / "o")]
    rc = main(["bench", "serve", "--target", "random:tiny-dense", "--profile", "dflash2-gsm8k", "--device", "cpu",
               *out, *flags])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_bench_without_target_is_one_line(capsys):
    """`specpilot bench` (the harness) still needs --target, now checked by its command: `bench serve` has its own."""
    rc = main(["bench", "--acceptance", "synthetic:dflash2-mixed"])
    err = capsys.readouterr().err
    assert rc == 2 and err == "error: --target is required: a model directory, Hub repo id or random:SHAPE\n"


# ------------------------------------------------------------------------------------------- on the real engine
@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_closed_loop_on_the_engine_emits_ar_output(name, checkpoint_factory):
    """A tiny random checkpoint (fp32, CPU), the n-gram drafter, real acceptance: the speculative engine's closed
    loop at 1 and 3 clients emits, request for request, AR's output through the same scheduler."""
    from specpilot.models.loader import load_model
    from specpilot.spec_decode.drafters.ngram import NgramDrafter

    path, _ = checkpoint_factory(name)
    model = load_model(str(path), "cpu", "float32")
    gen = random.Random(1)
    prompts = []
    for n in (5, 12, 8, 17):
        base = [gen.randrange(300) for _ in range(n)]
        prompts.append(base + base[:n // 2])  # repeats give the n-gram drafter matches
    cfg = serving.ServeConfig("closed", (1, 3), max_new_tokens=12, tree="chain:4", per_client=2, warmup_tokens=2)
    engines = serving.Engines(model, lambda runtime: NgramDrafter(), (), cfg, None)
    rows = serving.serve_closed(engines, prompts, "checkpoint")
    assert [(r["engine"], r["batch"]) for r in rows] == [("ar", 1), ("spec", 1), ("ar", 3), ("spec", 3)]
    assert all("error" not in r for r in rows), rows
    for r in rows:
        assert r["requests"] == 2 * r["batch"] and r["tokens"] == 12 * r["requests"]
    assert all(r["exact"] and r["tau"] >= 1 for r in rows if r["engine"] == "spec")
    assert rows[0]["tau"] == pytest.approx(1.0)  # AR: one token a step


def test_serve_on_a_margin_target_under_synthetic_acceptance_is_exact(tmp_path, capsys):
    """`bench serve` end to end: a margin target (random weights, planted greedy margins), its random DFlash drafter
    under the synthetic oracle keyed by prompt: the speculative engine's output is AR's, row by row."""
    out = tmp_path / "serve"
    rc = main(["bench", "serve", "--target", "random:tiny-dense", "--profile", "dflash2-gsm8k", "--batch", "2",
               "--max-new-tokens", "10", "--requests-per-client", "2", "--device", "cpu", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rows = json.loads((out / "closed.json").read_text())["results"]
    ar, spec = rows
    assert ar["engine"] == "ar" and ar["tokens"] == 40 and ar["tau"] == pytest.approx(1.0)
    assert spec["engine"] == "spec" and spec["exact"] is True and spec["tokens"] == 40 and spec["tau"] > 1
    assert spec["synthetic"].startswith("dflash2-gsm8k") and spec["oracle"]["probes"] > 0
    assert _png(out / "closed.png")
    # the oracle's work is in no component: the split adds up to about the timed wall, not past it
    split = spec["seconds_split"]
    assert all(v >= 0 for v in split.values())
    assert sum(v for k, v in split.items() if k != "start") <= 1.1 * spec["seconds"]
    profile = spec["step_profile"]["decode"]
    assert profile["steps"] > 0 and profile["batch_p50"] >= 1 and profile["ms_p50"]["verify"] > 0


def test_step_profile_summarises_the_engine_step_log():
    log = [{"batch": 0, "nodes": [], "prefill": 9, "predicted": 0.01, "seconds": {"verify": 0.02, "draft": 0.0}},
           {"batch": 2, "nodes": [3, 1], "prefill": 0, "predicted": 0.01, "seconds": {"verify": 0.012, "draft": 0.002}},
           {"batch": 2, "nodes": [0, 0], "prefill": 0, "predicted": 0.01, "seconds": {"verify": 0.010}},
           {"batch": 2, "nodes": [5, 5], "prefill": 0}]  # the last step: not measured yet
    p = serving.step_profile(log)
    d, m = p["decode"], p["mixed"]
    assert d["steps"] == 3 and d["plain_steps"] == 1 and d["batch_p50"] == 2 and d["nodes_p50"] == 4
    assert d["tokens_p50"] == 6 and d["ms_p50"]["verify"] == pytest.approx(11.0)
    assert d["ms_p50"]["draft"] == pytest.approx(1.0)  # a component a step did not run counts 0
    assert d["verify_over_predicted_p50"] == pytest.approx(1.1)
    assert m["steps"] == 1 and m["tokens_p50"] == 9 and m["ms_p50"]["verify"] == pytest.approx(20.0)


@pytest.mark.parametrize("drafter", ["random-dflash2", "random-mtp", "random-mtp:64", "random-mtp:64+fp8"])
def test_serve_takes_the_published_random_drafters(drafter, tmp_path, capsys):
    out = tmp_path / "serve"
    rc = main(["bench", "serve", "--target", "random:tiny-hybrid", "--drafter", drafter, "--profile", "dflash2-gsm8k",
               "--batch", "2", "--max-new-tokens", "8", "--requests-per-client", "1", "--device", "cpu",
               "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    spec = json.loads((out / "closed.json").read_text())["results"][1]
    assert spec["engine"] == "spec" and spec["exact"] is True and spec["tau"] > 1
    assert json.loads((out / "closed.json").read_text())["drafter"] == drafter


@pytest.mark.parametrize("name,line", [("random-mtp:x", "--drafter random-mtp:x: give random-mtp:N"),
                                       ("random-mtp:0", "--drafter random-mtp:0: N = 0; a draft vocabulary needs N >= 1")])
def test_a_bad_random_mtp_vocabulary_is_one_line(name, line, tmp_path, capsys):
    rc = main(["bench", "serve", "--target", "random:tiny-hybrid", "--drafter", name, "--profile", "dflash2-gsm8k",
               "--device", "cpu", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and line in err and len(err.strip().splitlines()) == 1, err


def test_a_random_drafter_needs_a_random_target(tmp_path, capsys):
    rc = main(["bench", "serve", "--target", str(tmp_path), "--drafter", "random-dspark", "--out", str(tmp_path / "o")])
    assert rc == 2 and "--drafter random-dspark goes with a random:SHAPE target" in capsys.readouterr().err


@pytest.mark.parametrize("probe", [True, False])
def test_engines_probe_only_when_asked(probe):
    """probe=False (a margin target, bench/server_load.py): the synthetic drafter takes the truth as given in a
    plain SpecEngine, and its output still equals AR's (the truth)."""
    import torch

    from specpilot.bench.probing import ProbingEngine
    from specpilot.bench.shapes import RANDOM_DRAFTERS, RandomTarget
    from specpilot.bench.synthetic import AcceptanceProfile

    target = RandomTarget.parse("random:tiny-dense")
    model = target.build("cpu", torch.float32)
    cfg = serving.ServeConfig("closed", (2,), max_new_tokens=12, per_client=1)
    engines = serving.Engines(model, lambda rt: RANDOM_DRAFTERS["random-dflash"](model, target.shape, rt),
                              tuple(model.config.eos_token_ids), cfg, AcceptanceProfile.load("dflash2-gsm8k"),
                              probe=probe)
    prompts = [[5, 9, 13, 2], [7, 1, 4]]
    params = serving.SamplingParams(max_new_tokens=12, ignore_eos=True)
    truth = {tuple(p): r.token_ids for p, (r, _) in zip(prompts, engines.ar(2).generate(prompts, params))}
    engine = engines.spec(2, truth)
    assert isinstance(engine, ProbingEngine) == probe
    out = [r.token_ids for r, _ in engine.generate(prompts, params)]
    assert out == [truth[tuple(p)] for p in prompts]
    assert (engines.drafters[-1].probes > 0) == probe


def test_random_target_without_a_profile_names_the_serve_flag(tmp_path, capsys):
    from specpilot.cli import main

    rc = main(["bench", "serve", "--target", "random:tiny-dense", "--device", "cpu", "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == "error: acceptance on random weights means nothing: use --profile PROFILE (e.g. " \
                              "dflash2-gsm8k)"
    assert not (tmp_path / "x.json").exists()
