"""The benchmark harness: per workload and batch size, AR, "stock" and the given configurations run side by
side in one process, on the same prompts, after a warm-up; every output is token-forced against the plain
model; results carry tok/s, speedups, tau, per-depth acceptance and the step-time split.

"stock" is the published baseline's setting: chain verification, bf16, fixed block, no tuning. A
configuration is `name=key:value;key:value`, keys: tree (chain:D | static:... | dynamic:...), adaptive (true: the
engine's node budget instead of every request's full tree), batches (B1,B2,...: the batch sizes it runs at) and any
EngineConfig field or ablation switch (weight_format, block_attention, decode_gemv, ...).

Forcing is the gate: on checkpoints in fp32 and on margin targets (random weights in a real shape with a
planted circuit that gives every greedy token a lead of many logits, bench/shapes.py) every emitted token must
be the stock argmax within the stated tolerance (1e-3 by default). Flat random targets and half-precision
checkpoints may instead use a tie tolerance calibrated on the target (2 x the largest logit gap between AR
decode and the teacher-forced pass over the same tokens), recorded in each row with its source; such a row
shows the run did not break the model outright, not that it is exact. Each row names its target kind (margin,
flat, checkpoint). Under synthetic acceptance the oracle probes the target (a verify pass over the step's trees
that commits nothing, outside the timing: bench/probing.py), so that its right drafts are what this verify answers.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from specpilot.bench.probing import ProbingEngine
from specpilot.bench.synthetic import AcceptanceProfile, SyntheticDrafter
from specpilot.config import EngineConfig
from specpilot.engine.engine import SpecEngine
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.settings import Runtime
from specpilot.runtime.sampling import SamplingParams
from specpilot.layers.metadata import BatchMetadata
from specpilot.prompts import PROMPT_SETS, Prompt, load_prompts, resolve_prompt_set, set_name
from specpilot.spec_decode.forcing import ForcingReport, force_check
from specpilot.spec_decode.tree import TreeSpec

# a configuration names its tree: every request verifies that tree every step (the node budget is `bench serve`'s)
FIXED_TREE = SchedulerConfig(adaptive=False)
# bench workload -> prompt set: EAGLE's 80-prompt subsets (alpaca is CC BY-NC 4.0 data, non-commercial)
WORKLOADS = {"mt-bench": "mt-bench", "humaneval": "eagle-humaneval", "gsm8k": "eagle-gsm8k",
             "alpaca": "eagle-alpaca", "cnndm": "eagle-sum", "spec-bench": "spec-bench"}


@dataclass(frozen=True)
class BenchConfig:
    name: str
    tree: str
    engine: tuple[tuple[str, object], ...] = ()
    adaptive: bool = False  # the engine's node budget instead of every request's full tree
    batches: tuple[int, ...] = ()  # the batch sizes it runs at (empty: every one)

    @staticmethod
    def parse(text: str, default_tree: str) -> BenchConfig:
        name, _, body = text.partition("=")
        tree, engine, adaptive, batches = default_tree, [], False, ()
        fields = EngineConfig.field_names()
        for item in filter(None, body.split(";")):
            key, sep, value = item.partition(":")
            if not sep:
                raise ValueError(f"config {text!r}: items are key:value, got {item!r}")
            if key == "tree":
                TreeSpec.parse(value)
                tree = value
            elif key == "adaptive":
                if value not in ("true", "false"):
                    raise ValueError(f"config {text!r}: adaptive:{value}: use adaptive:true or adaptive:false")
                adaptive = value == "true"
            elif key == "batches":
                if not all(v.isdigit() and int(v) >= 1 for v in value.split(",")):
                    raise ValueError(f"config {text!r}: batches:{value}: use batch sizes >= 1, e.g. batches:1,8")
                batches = tuple(int(v) for v in value.split(","))
            elif key in fields:
                engine.append((key, _coerce(value)))
            else:
                raise ValueError(f"config {text!r}: unknown key {key!r} (tree, adaptive, batches or an EngineConfig "
                                 f"field: {', '.join(fields)})")
        return BenchConfig(name, tree, tuple(engine), adaptive, batches)


def _coerce(value: str):
    if value in ("true", "false"):
        return value == "true"
    try:
        return int(value)
    except ValueError:
        return value


def encode_turn(tokenizer, turns: list[str], answers: list[str], chat: bool) -> list[int]:
    """The ids of a conversation's next turn: user turns and the model's earlier answers (FastChat style: each
    answer stays in the context), through the chat template when there is one."""
    if chat and getattr(tokenizer, "chat_template", None):
        messages = []
        for i, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    else:
        text = "".join(t + (answers[i] if i < len(answers) else "") for i, t in enumerate(turns))
        ids = tokenizer.encode(text, add_special_tokens=True)
    return list(ids)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class OracleClock:
    """Times the synthetic oracle's work (synced) so that run_generation can take its seconds out of the
    speculative run's: it is the benchmark's own work, not the engine's."""

    def __init__(self, device):
        self.device = device
        self.seconds = 0.0

    def __call__(self, fn, *args):
        _sync(self.device)
        t0 = time.perf_counter()
        out = fn(*args)
        _sync(self.device)
        self.seconds += time.perf_counter() - t0
        return out


def run_generation(make, prompts: list[list[int]], batch: int, params: SamplingParams, device, truth=None,
                   clock: OracleClock | None = None):
    """Generates every prompt in batches; returns (outputs, per-request stats or None, seconds). make(truth)
    builds a group's engine: with `truth` (synthetic acceptance) it gets the group's stock continuations by slot
    (requests start at slot 0 in every group), else None; the clock's seconds (the oracle's work, not the
    engine's) are not counted."""
    outputs, stats = [], []
    hidden = clock.seconds if clock is not None else 0.0
    _sync(device)
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        group = prompts[i:i + batch]
        engine = make(None if truth is None else dict(enumerate(truth[i:i + len(group)])))
        for res in engine.generate(group, params):
            result, s = res if isinstance(res, tuple) else (res, None)
            outputs.append(result.token_ids)
            stats.append(s)
    _sync(device)
    hidden = clock.seconds - hidden if clock is not None else 0.0
    return outputs, stats, time.perf_counter() - t0 - hidden


def _engine_steps(stats, batch: int) -> int:
    """Engine steps of a run in groups of `batch`: a step serves every running request of its group."""
    return sum(max((s.steps for s in stats[i:i + batch] if s is not None), default=0)
               for i in range(0, len(stats), batch))


def summarize(outputs, stats, seconds: float) -> dict:
    tokens = sum(map(len, outputs))
    row = {"tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds}
    real = [s for s in stats if s is not None]
    if real:
        steps = sum(s.steps for s in real)
        row["tau"] = sum(s.emitted for s in real) / max(steps, 1)
        depth = max(len(s.drafted_per_depth) for s in real)
        row["drafted_per_depth"] = [sum(s.drafted_per_depth[d] for s in real if d < len(s.drafted_per_depth))
                                    for d in range(depth)]
        row["accepted_per_depth"] = [sum(s.accepted_per_depth[d] for s in real if d < len(s.accepted_per_depth))
                                     for d in range(depth)]
        row["seconds_split"] = {k: sum(s.seconds[k] for s in real) for k in real[0].seconds}
    return row


@dataclass(frozen=True)
class Forcing:
    """How a run is forced: the stated tie tolerance, whether to calibrate one on the target instead, and the
    target's kind (margin, flat, checkpoint) that the rows record."""

    stated: float
    calibrate: bool
    target_kind: str


@dataclass(frozen=True)
class Tolerance:
    """The forcing tie tolerance: the stated one, or (random targets) one calibrated on the target."""

    value: float
    source: str
    stated: float


def forcing(runner: ModelRunner, prompts, outputs, tolerance: Tolerance) -> dict:
    report = ForcingReport()
    for i, (p, out) in enumerate(zip(prompts, outputs)):
        force_check(runner, p, out, report, prompt_index=i)
    fails = report.failures(tolerance.value)
    return {"tokens": report.tokens, "mismatches": len(report.mismatches), "failures": len(fails),
            "max_margin": report.max_margin, "passed": not fails, "tolerance": tolerance.value,
            "tolerance_source": tolerance.source, "failures_at_stated": len(report.failures(tolerance.stated))}


@torch.inference_mode()
def path_noise(runner: ModelRunner, prompt: list[int], output: list[int]) -> float:
    """The largest |logit| difference between AR decode (one token a step) and one teacher-forced block over
    the same tokens: how far two equally valid kernels disagree on this target."""
    seq = list(prompt) + list(output)
    runner.allocate(1, len(seq) + 1)
    decoded = [runner.prefill(0, prompt)]
    for i, tok in enumerate(output[:-1]):
        # a copy: a decode graph returns the same static logits buffer every step
        decoded.append(runner.decode(torch.tensor([tok], device=runner.device),
                                     torch.tensor([len(prompt) + i], device=runner.device))[0].float().clone())
    runner.cache.reset(torch.tensor([0], device=runner.device))
    ids = torch.tensor(seq[:-1], device=runner.device)[None]
    zero = torch.tensor([0], device=runner.device)
    meta = BatchMetadata.contiguous(ids, zero, zero, 0, runner.runtime.prefill)
    forced = runner.logits(runner.forward(meta))[0, len(prompt) - 1:]
    return float((forced.float() - torch.stack(decoded)).abs().max())


def calibrate(runner: ModelRunner, prompts, outputs, stated: float, samples: int = 2,
              max_tokens: int = 256) -> Tolerance:
    """A margin above 2 x the path noise cannot be a tie: the emitted token led on its own path, and each of
    the two logits compared moves by at most the noise between paths. Never below the stated tolerance. The
    noise is sampled on the first `max_tokens` of each output (each token costs an AR decode step)."""
    noise = max(path_noise(runner, p, o[:max_tokens]) for p, o in list(zip(prompts, outputs))[:samples] if o)
    source = (f"calibrated: 2 x max |AR decode - teacher-forced| logit = 2 x {noise:.4g} ({samples} AR outputs, "
              f"first {max_tokens} tokens)")
    return Tolerance(max(stated, 2 * noise), source, stated)


def load_workloads(names: list[str], data_dir=None, limit: int | None = None) -> dict[str, list[Prompt]]:
    """Workload -> its first `limit` conversations. A workload is a name in WORKLOADS, any other shipped prompt
    set (math500, eagle-qa, ...) or a prompt file; names resolve in data_dir, $SPECPILOT_DATA_DIR or the
    shipped folder."""
    return {name: load_prompts(_workload_path(name, data_dir), limit=limit) for name in names}


def _workload_path(name: str, data_dir):
    key = set_name(name)
    if key in WORKLOADS or key in PROMPT_SETS:
        return resolve_prompt_set(WORKLOADS.get(key, key), data_dir)
    path = Path(name).expanduser()
    if path.is_file():
        return path
    if path.exists() or "/" in name or "." in name:  # names never hold either: the user meant a file
        raise ValueError(f"workload {name!r}: {'not a file' if path.exists() else 'no such prompt file'}")
    raise ValueError(f"workload {name!r}: unknown; use a workload ({', '.join(WORKLOADS)}), another shipped "
                     f"prompt set ({', '.join(k for k in PROMPT_SETS if k not in WORKLOADS)}) or a prompt file")


def bench(model, tokenizer, make_drafter, workloads: dict[str, list[Prompt]], batch_sizes: list[int],
          configs: list[BenchConfig], stock_tree: str, max_new_tokens: int, profile: AcceptanceProfile | None,
          chat: bool = True, tie_tolerance: float = 1e-3, progress=None, base_engine: tuple = (),
          calibrate_tolerance: bool = False, target_kind: str = "checkpoint",
          sampling: SamplingParams | None = None) -> list[dict]:
    """All rows of the report: one per workload x batch size x configuration (AR and stock included).
    make_drafter(runtime): the drafter of a configuration, built for its runner's runtime.
    workloads: name -> conversations, from load_workloads.
    base_engine: EngineConfig fields under AR, stock and every configuration (a configuration's own win).
    calibrate_tolerance (flat random targets, half-precision checkpoints): forcing's tolerance from the target's
    own path noise. target_kind (margin, flat, checkpoint): recorded in every row. sampling: temperature, top-k,
    top-p and seed of every run (default greedy); sampled rows are checked by same_as_ar instead of forcing."""
    device = next(model.parameters()).device
    s = sampling or SamplingParams()
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                            seed=s.seed, ignore_eos=profile is not None)
    eos = tuple(model.config.eos_token_ids) + ((tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
    stock_runner = ModelRunner(model, Runtime.build(EngineConfig.from_dict(dict(base_engine)), device))
    if base_engine:
        configs = [dataclasses.replace(c, engine=tuple({**dict(base_engine), **dict(c.engine)}.items()))
                   for c in configs]
    rows = []
    for workload, conversations in workloads.items():
        for batch in batch_sizes:
            try:
                rows += _bench_one(model, tokenizer, eos, make_drafter, workload, conversations, batch, configs,
                                   BenchConfig("stock", stock_tree, tuple(base_engine)), params, profile,
                                   stock_runner, Forcing(tie_tolerance, calibrate_tolerance, target_kind), chat,
                                   device, progress)
            except (ValueError, NotImplementedError):  # bad input (a prompt too long, ...): one clear error
                raise
            except Exception as e:  # noqa: BLE001 - AR itself failed: no truth for this batch size, go on
                row = {"workload": workload, "batch": batch, "config": "ar", **_error(e)}
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


def _error(e: Exception) -> dict:
    """The row fields of a configuration that raised: its message, and the traceback on stderr."""
    traceback.print_exc()
    return {"error": f"{type(e).__name__}: {e}"[:2000]}


def ar_turns(make, tokenizer, conversations, batch, params, chat: bool, device):
    """AR over every turn of every conversation (turn k sees the AR answers of turns < k). Returns the flat
    list of turn prompts, their outputs, stats and total seconds: the other configurations replay the same
    prompts, which is exact because speculative output equals AR output."""
    prompts, outputs, stats, seconds = [], [], [], 0.0
    answers = [[] for _ in conversations]
    for k in range(max(len(c.turns) for c in conversations)):
        live = [i for i, c in enumerate(conversations) if len(c.turns) > k]
        ids = [encode_turn(tokenizer, list(conversations[i].turns[:k + 1]), answers[i], chat) for i in live]
        out, st, sec = run_generation(make, ids, batch, params, device)
        for i, o in zip(live, out):
            answers[i].append(tokenizer.decode(o, skip_special_tokens=True))
        prompts, outputs, stats, seconds = prompts + ids, outputs + out, stats + st, seconds + sec
    return prompts, outputs, stats, seconds


def _ar_cache_len(tokenizer, conversations, chat: bool, max_new_tokens: int) -> int:
    """An upper bound on the cache length AR needs over every turn, so the cache can be allocated once before
    timing: each conversation's turns with every earlier answer counted at max_new_tokens plus slack for
    re-encoding its text (the answers are not known yet), plus the new tokens of the last turn."""
    longest = 0
    for c in conversations:
        text_only = len(encode_turn(tokenizer, list(c.turns), [""] * (len(c.turns) - 1), chat))
        longest = max(longest, text_only + (len(c.turns) - 1) * (max_new_tokens + 16))
    return longest + max_new_tokens + 1


def _bench_one(model, tokenizer, eos, make_drafter, workload, conversations, batch, configs, stock: BenchConfig,
               params, profile, stock_runner, policy: Forcing, chat, device, progress) -> list[dict]:
    ar_make = lambda _truth: Generator(stock_runner, eos)  # noqa: E731
    firsts = [encode_turn(tokenizer, [c.turns[0]], [], chat) for c in conversations[:batch]]
    # the cache at its final size first: a cache that grows inside the timed run drops its captured graphs
    stock_runner.allocate(batch, _ar_cache_len(tokenizer, conversations, chat, params.max_new_tokens))
    run_generation(ar_make, firsts, batch, SamplingParams(max_new_tokens=4), device)  # warm-up: the decode graph
    prompts, ar_out, ar_stats, ar_s = ar_turns(ar_make, tokenizer, conversations, batch, params, chat, device)
    truth = ar_out
    stated = policy.stated
    tolerance = (calibrate(stock_runner, prompts, ar_out, stated) if policy.calibrate
                 else Tolerance(stated, "stated", stated))
    base = {"workload": workload, "batch": batch, "prompts": len(conversations), "turns": len(prompts),
            "target_kind": policy.target_kind, "synthetic": profile is not None,
            "acceptance": f"synthetic:{profile.name}" if profile else "real",
            "acceptance_label": profile.label_at(params.temperature) if profile else "real",
            "temperature": params.temperature}
    rows = [{**base, "config": "ar", **summarize(ar_out, ar_stats, ar_s), "speedup_vs_ar": 1.0}]
    if progress is not None:
        progress(rows[0])
    for cfg in [stock] + [c for c in configs if not c.batches or batch in c.batches]:
        row = {**base, "config": cfg.name, "tree": cfg.tree, "engine": dict(cfg.engine), "adaptive": cfg.adaptive}
        try:  # one failing configuration (a kernel, a graph capture) is recorded; the others still run
            row.update(_run_config(model, make_drafter, cfg, prompts, truth, batch, params, profile, eos,
                                   stock_runner, tolerance, device))
            row["speedup_vs_ar"] = row["tok_per_s"] / rows[0]["tok_per_s"]
        except Exception as e:  # noqa: BLE001
            row.update(_error(e))
        rows.append(row)
        if progress is not None:
            progress(row)
    stock_rate = rows[1].get("tok_per_s")
    for row in rows:
        if stock_rate and "tok_per_s" in row:
            row["speedup_vs_stock"] = row["tok_per_s"] / stock_rate
    return rows


def _run_config(model, make_drafter, cfg: BenchConfig, prompts, truth, batch, params, profile, eos, stock_runner,
                tolerance: Tolerance, device) -> dict:
    runner = ModelRunner(model, Runtime.build(EngineConfig.from_dict(dict(cfg.engine)), device))
    # built once, outside the timed region (a checkpoint load or a random init is no part of generation), on the
    # configuration's runtime; a drafter serves engine after engine: allocate only grows its cache, start resets a
    # slot
    base_drafter = make_drafter(runner.runtime)
    clock = OracleClock(device) if profile is not None else None
    seeds, oracles = itertools.count(), []
    scheduler = SchedulerConfig(adaptive=True) if cfg.adaptive else FIXED_TREE

    def make(group_truth):
        if profile is None:
            return SpecEngine(runner, base_drafter, TreeSpec.parse(cfg.tree), eos, scheduler=scheduler)
        # a seed per group: with one seed every group would draw the same acceptance pattern
        drafter = SyntheticDrafter(base_drafter, group_truth, profile, model.config.vocab_size, seed=next(seeds),
                                   untimed=clock)
        oracles.append(drafter)
        # hands the drafter its probe
        return ProbingEngine(runner, drafter, TreeSpec.parse(cfg.tree), eos, scheduler=scheduler)

    synthetic_truth = truth if profile is not None else None
    try:
        # warm-up outside the timing: caches at their final size (growing one drops its graphs), then every batch
        # size a group passes through as its requests finish (a verify graph per size), compiles included
        tree, longest = TreeSpec.parse(cfg.tree), max(map(len, prompts)) + params.max_new_tokens + 1
        runner.allocate(batch, longest + tree.max_tree_nodes)
        base_drafter.allocate(batch, longest + tree.max_grown_nodes)  # a drafter holds the tree as it grows
        for b in range(min(batch, len(prompts)), 0, -1):
            run_generation(make, prompts[:b], b, SamplingParams(max_new_tokens=16, ignore_eos=True), device,
                           synthetic_truth, clock)
        if clock is not None:
            clock.seconds = 0.0
            oracles.clear()
        out, stats, seconds = run_generation(make, prompts, batch, params, device, synthetic_truth, clock)
    finally:  # graphs reference the runner (a cycle): free its cache and graphs now, not at the next gc
        runner.graphs.clear()
        runner.verify_graphs.clear()
        runner.cache = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
    row = summarize(out, stats, seconds)
    if clock is not None:
        # the oracle ran inside the engine's draft step: its seconds leave the split as they left the total
        row["seconds_split"]["draft"] -= clock.seconds
        count = sum(d.probes for d in oracles)
        row["oracle"] = {"probes": count, "probes_per_step": count / max(_engine_steps(stats, batch), 1),
                         "seconds_excluded": clock.seconds}
    row["forcing"] = forcing(stock_runner, prompts, out, tolerance) if params.greedy else same_as_ar(out, truth)
    return row


def same_as_ar(outputs, truth) -> dict:
    """The check of a sampled row: speculative sampling emits the tokens plain sampling draws with the same seed
    (the raced rule, spec_decode/rejection.py), so every output equals AR's, token for token (AR's generator and
    the engine both give each request its own stream, at any batch size)."""
    differ = sum(o != t for o, t in zip(outputs, truth))
    return {"check": "equal to AR sampling with the same seed", "tokens": sum(map(len, outputs)),
            "failures": differ, "passed": differ == 0}
