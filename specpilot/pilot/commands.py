"""The pilot's commands: `specpilot profile` (the CLI entry of profile.py) and `specpilot tune` (of tune.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from specpilot.cli_util import check_writable, err, pick_device


def add_parsers(sub) -> None:
    p = sub.add_parser("profile", help="a short workload's step components ranked by distance from their ceilings "
                                       "(cost model), and the predicted effect of each known change")
    p.add_argument("--target", required=True,
                   help="model directory or Hub repo id, or random:SHAPE[:layers=N] (random weights in a real shape; "
                        "needs --acceptance synthetic:PROFILE, the default there)")
    p.add_argument("--target-kind", choices=["margin", "flat"], default="margin", help="random:SHAPE weights")
    p.add_argument("--drafter", default=None,
                   help="drafter directory or Hub id, ngram, or random-dflash / random-dflash2 / random-dspark / "
                        "random-mtp on random targets (default: random-dflash there, else ngram)")
    p.add_argument("--tree", default="chain:7", help="chain:D | static:C1,C2,... | dynamic:TOPK,DEPTH,NODES")
    p.add_argument("--batch", type=int, default=1, help="requests decoding together")
    p.add_argument("--steps", type=int, default=32, help="timed steps")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps first (graph captures)")
    p.add_argument("--workload", default="gsm8k", help="prompt set the requests take their prompts from")
    _add_sampling_flags(p, "the requests decode with")
    p.add_argument("--seed", type=int, default=0, help="each prompt's sampling seed derives from it and the prompt")
    p.add_argument("--acceptance", default=None,
                   help="real, or synthetic:PROFILE (default: synthetic:dflash2-gsm8k on random targets, else real)")
    p.add_argument("--adaptive", action="store_true", help="the engine's node budget (default: every request its "
                                                           "full tree)")
    p.add_argument("--weight-format", choices=["bf16", "w12n", "w12n_only"], default="bf16")
    p.add_argument("--recalibrate", action="store_true", help="measure the calibration again even if cached")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto")
    p.add_argument("--out", default="profile.json", help="JSON report path")
    p.add_argument("--plot", default=None, help="PNG plot path (default: next to the JSON)")
    p.set_defaults(func=cmd_profile)
    _add_tune_parser(sub)


def _add_sampling_flags(parser, what: str) -> None:
    parser.add_argument("--temperature", type=float, default=0.0,
                        help=f"the sampling temperature {what} (0: greedy, the default); above 0 each prompt samples "
                             f"with its own seed, from --seed and its tokens")
    parser.add_argument("--top-k", type=int, default=0, help="sampling's top-k (0: off; needs --temperature > 0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="sampling's top-p (1: off; needs --temperature > 0)")


def sampling_of(args):
    """The workload's sampling from --temperature, --top-k, --top-p and --seed (a bad value: one ValueError line)."""
    from specpilot.pilot.sampling import Sampling

    return Sampling(args.temperature, args.top_k, args.top_p, args.seed)


def check_flags(args):
    """The flags that need no file read; returns (random target or None, acceptance profile or None, drafter
    name)."""
    from specpilot.bench.shapes import RandomTarget
    from specpilot.bench.synthetic import AcceptanceProfile
    from specpilot.spec_decode.tree import TreeSpec

    for flag, value, least in (("--batch", args.batch, 1), ("--steps", args.steps, 1), ("--warmup", args.warmup, 0)):
        if value < least:
            raise ValueError(f"{flag} {value}: must be >= {least}")
    sampling_of(args)
    TreeSpec.parse(args.tree, "--tree")
    target = RandomTarget.parse(args.target, args.target_kind)
    acceptance = args.acceptance or ("synthetic:dflash2-gsm8k" if target is not None else "real")
    kind, _, name = acceptance.partition(":")
    if kind not in ("real", "synthetic") or (kind == "synthetic" and not name):
        raise ValueError(f"--acceptance {acceptance!r}: use real or synthetic:PROFILE")
    if target is not None and kind == "real":
        raise ValueError("acceptance on random weights means nothing: use --acceptance synthetic:PROFILE")
    drafter = args.drafter or ("random-dflash" if target is not None else "ngram")
    if drafter.startswith("random-") and target is None:
        raise ValueError(f"--drafter {drafter} goes with a random:SHAPE target")
    if drafter == "none":
        raise ValueError("--drafter none: profile measures a speculative step; name a drafter (e.g. ngram)")
    for flag, path in (("--out", args.out), ("--plot", args.plot)):
        if path:
            check_writable(flag, path)
    return target, (AcceptanceProfile.load(name) if kind == "synthetic" else None), drafter


def cmd_profile(args) -> int:
    import torch
    from rich.console import Console

    from specpilot.bench.harness import OracleClock, load_workloads
    from specpilot.bench.report import environment
    from specpilot.config import EngineConfig
    from specpilot.pilot import calibration
    from specpilot.pilot.cost_model import AcceptanceStats, DrafterShape, ModelShape
    from specpilot.pilot.profile import analyse, plot, tables
    from specpilot.pilot.workload import build_engine, reserve, run_steps, truth_for
    from specpilot.runtime.runner import ModelRunner
    from specpilot.runtime.settings import Runtime
    from specpilot.spec_decode.tree import TreeSpec

    target, profile, drafter_name = check_flags(args)
    sampling = sampling_of(args)
    prompts_text = load_workloads([args.workload])[args.workload]
    device = pick_device(args.device)
    dtype = _dtype(args.dtype, device)
    if args.weight_format != "bf16" and dtype != torch.bfloat16:
        raise ValueError(f"--weight-format {args.weight_format} needs --dtype bfloat16 (--dtype {args.dtype} on "
                         f"{device} is {str(dtype).removeprefix('torch.')})")
    model, tokenizer, make_drafter = _models(args, target, drafter_name, device)
    runtime = Runtime.build(EngineConfig(weight_format=args.weight_format), torch.device(device))
    runner = ModelRunner(model, runtime)
    drafter = make_drafter(runtime)
    if drafter is None:
        raise ValueError(f"--drafter {drafter_name}: profile measures a speculative step; name a drafter")
    spec = TreeSpec.parse(args.tree)
    depth = getattr(drafter, "max_depth", None)
    spec = spec.capped(depth) if depth else spec
    plan = calibration.CalibrationPlan(batches=(args.batch,)) if device == "cuda" else replace(
        calibration.CalibrationPlan.tiny(), batches=(args.batch,))
    prompts = [tokenizer.encode(p.text) for p in prompts_text]
    prompts = [prompts[i % len(prompts)] for i in range(args.batch)]
    tokens = (args.warmup + args.steps + 4) * (spec.depth + 1) + 8
    reserve(runner, drafter, args.batch, max(map(len, prompts)) + tokens + 1, [str(spec)])
    cal = calibration.cached(runner, drafter, plan, refresh=args.recalibrate, log=lambda m: err.print(f"[dim]{m}[/]"))
    clock = OracleClock(torch.device(device)) if profile is not None else None
    truth = truth_for(model, runner, prompts, tokens, sampling) if profile is not None else None
    engine = build_engine(runner, drafter, str(spec), args.batch, max(map(len, prompts)) + tokens + 1, profile,
                          truth, clock, adaptive=args.adaptive)
    err.print(f"[dim]profile: {args.steps} timed steps at batch {args.batch}, {spec}, {sampling.describe()}[/]")
    run = run_steps(engine, prompts, args.warmup, args.steps, tokens, clock, sampling)
    shape = ModelShape.from_model(model)
    cost = cal.cost_model(shape, DrafterShape.from_drafter(drafter, shape, spec.depth))
    children = spec.branching if spec.kind == "static" else None
    acceptance = AcceptanceStats.from_counts(run.drafted, run.accepted, run.steps * run.batch,
                                             profile.sibling_decay if profile else 0.5,
                                             profile.variation if profile else None, children)
    result = analyse(run, cost, str(spec), spec.max_tree_nodes, args.weight_format, runtime.verify_graphs,
                     acceptance, depth)
    synthetic = profile.label if profile is not None else None
    doc = {**environment(), "target": args.target, "drafter": drafter_name, "batch": args.batch,
           "acceptance": synthetic or "real", "adaptive": args.adaptive, "sampling": sampling.to_dict(),
           "calibration": {"gpu": cal.gpu, "fingerprint": cal.fingerprint, "seconds": cal.seconds,
                           "path": str(calibration.cache_path(cal.gpu, cal.fingerprint))},
           **result.to_dict()}
    out = Path(args.out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(out)
    plot_path = Path(args.plot).expanduser() if args.plot else out.with_suffix(".png")
    try:
        plot(result, plot_path, synthetic)
    except Exception as e:  # noqa: BLE001 - the JSON is the result; the plot is a view of it
        err.print(f"[yellow]plot failed: {type(e).__name__}: {e}[/]")
    console = Console(highlight=False)
    for t in tables(result, synthetic):
        console.print(t)
    err.print(f"wrote {out} and {plot_path}")
    return 0


def _models(args, target, drafter_name: str, device: str):
    """(target, tokenizer, drafter factory(runtime)): a random-weight model in a real shape, or a checkpoint."""
    from specpilot.spec_decode.drafters.registry import build_drafter

    if target is not None:
        from specpilot.bench.shapes import ByteTokenizer, random_drafter

        model = target.build(device, _dtype(args.dtype, device))
        make = random_drafter(drafter_name)
        if make is not None:
            return model, ByteTokenizer(), lambda runtime: make(model, target.shape, runtime)
        return model, ByteTokenizer(), lambda runtime: build_drafter(drafter_name, model, runtime=runtime)
    from specpilot.models.loader import load_model, load_tokenizer

    tokenizer = load_tokenizer(args.target)
    model = load_model(args.target, device, args.dtype)
    return model, tokenizer, lambda runtime: build_drafter(drafter_name, model, tokenizer, runtime=runtime)


def _dtype(name: str, device: str):
    """--dtype on this device (auto: bf16 on a GPU, fp32 on the CPU, as the loader resolves it)."""
    import torch

    from specpilot.models.loader import resolve_dtype

    return resolve_dtype(name, torch.device(device))


def _add_tune_parser(sub) -> None:
    from specpilot.pilot.tune import SAMPLED_TREES, TREES

    t = sub.add_parser("tune", help="search tree shapes, node budget and weight format per batch size; keep a change "
                                    "only if faster on held-out prompts and exact; write a recipe")
    t.add_argument("--target", required=True,
                   help="model directory or Hub repo id, or random:SHAPE[:layers=N] (random weights in a real shape, "
                        "under --acceptance synthetic:PROFILE)")
    t.add_argument("--target-kind", choices=["margin", "flat"], default="margin", help="random:SHAPE weights")
    t.add_argument("--drafter", required=True,
                   help="drafter directory or Hub id, ngram, or random-dflash / random-dflash2 / random-dspark / "
                        "random-mtp on random targets")
    t.add_argument("--acceptance", default=None,
                   help="real, or synthetic:PROFILE (default: synthetic:dflash2-gsm8k on random targets, else real)")
    t.add_argument("--tie-tolerance", type=float, default=1e-3,
                   help="forcing's tie tolerance (logits) on margin targets and fp32 checkpoints; flat random targets "
                        "and half-precision checkpoints use at least 2 x their measured path noise")
    t.add_argument("--workloads", nargs="+", default=["humaneval"],
                   help="bench workloads, shipped prompt sets or prompt files; their prompts are pooled and split")
    t.add_argument("--data-dir", default=None, help="folder holding the named prompt sets")
    t.add_argument("--limit", type=int, default=16, help="first N prompts of each workload")
    t.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="(default: 1, or the replayed recipe's)")
    t.add_argument("--replay", default=None,
                   help="a recipe to re-validate here: each of its kept changes judged again on this target, drafter "
                        "and device, in the order kept; only those that still win are kept")
    t.add_argument("--max-new-tokens", type=int, default=128, help="tokens per request (EOS ignored)")
    _add_sampling_flags(t, "the workload is tuned at (recorded in the recipe)")
    t.add_argument("--trees", nargs="+", default=None,
                   help=f"the tree specs searched (default: {' '.join(TREES)}; at --temperature > 0 also "
                        f"{SAMPLED_TREES[-1]}, the best-first tree)")
    t.add_argument("--no-adaptive", action="store_true", help="leave the adaptive node budget out of the search")
    t.add_argument("--weight-formats", nargs="+", default=["bf16"], help="bf16, w12n, w12n_only (w12n: --dtype "
                                                                           "bfloat16)")
    t.add_argument("--measure", type=int, default=3, help="best-ranked candidates measured per batch size")
    t.add_argument("--repeats", type=int, default=3, help="interleaved stock/candidate pairs on the held-out prompts")
    t.add_argument("--held-out", type=float, default=0.5, help="share of the prompts held out")
    t.add_argument("--seed", type=int, default=0,
                   help="the tuning / held-out split, and each prompt's sampling seed (with --temperature > 0)")
    t.add_argument("--rank", choices=["calibrated", "ceilings"], default="calibrated",
                   help="the cost model's inputs: the calibration cached per GPU and model (measured when missing), "
                        "or the device's ceilings alone (seconds; a coarser ranking)")
    t.add_argument("--recalibrate", action="store_true", help="measure the calibration again even if cached")
    t.add_argument("--no-chat", action="store_true", help="do not apply the tokenizer's chat template")
    t.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    t.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto")
    t.add_argument("--out", default="recipe.json", help="the recipe (JSON)")
    t.set_defaults(func=cmd_tune)


def cmd_tune(args) -> int:
    import statistics

    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specpilot.bench.harness import encode_turn, load_workloads
    from specpilot.bench.shapes import RandomTarget
    from specpilot.bench.synthetic import AcceptanceProfile
    from specpilot.pilot import calibration, ceilings
    from specpilot.pilot.controller import Controller, ControllerConfig
    from specpilot.pilot.cost_model import CostModel, DrafterShape, ModelShape
    from specpilot.pilot.recipe import Recipe, drafter_fingerprint, target_fingerprint, versions
    from specpilot.pilot.trial import Trial
    from specpilot.pilot.tune import (TunePlan, acceptance_of, default_trees, replayed, report, space, stock,
                                      tune_batch)
    from specpilot.spec_decode.tree import TreeSpec

    sampling = sampling_of(args)
    replay = Recipe.load(args.replay) if args.replay else None
    batch_sizes = args.batch_sizes or (sorted(replay.choices) if replay is not None else [1])
    searched = args.trees or default_trees(sampling)
    plan = TunePlan(tuple(batch_sizes), tuple(searched), (False,) if args.no_adaptive else (False, True),
                    tuple(args.weight_formats), args.measure, args.repeats, args.held_out, args.seed)
    for flag, value in (("--limit", args.limit), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise ValueError(f"{flag} {value}: must be >= 1")
    if args.drafter == "none":
        raise ValueError("--drafter none: tune searches speculative configurations; name a drafter (e.g. ngram)")
    target = RandomTarget.parse(args.target, args.target_kind)
    acceptance = args.acceptance or ("synthetic:dflash2-gsm8k" if target is not None else "real")
    kind, _, name = acceptance.partition(":")
    if kind not in ("real", "synthetic") or (kind == "synthetic" and not name):
        raise ValueError(f"--acceptance {acceptance!r}: use real or synthetic:PROFILE")
    if target is not None and kind == "real":
        raise ValueError("acceptance on random weights means nothing: use --acceptance synthetic:PROFILE")
    if args.drafter.startswith("random-") and target is None:
        raise ValueError(f"--drafter {args.drafter} goes with a random:SHAPE target")
    profile = AcceptanceProfile.load(name) if kind == "synthetic" else None
    check_writable("--out", args.out)
    workloads = load_workloads(args.workloads, args.data_dir, args.limit)
    device = pick_device(args.device)
    dtype = _dtype(args.dtype, device)
    formats = set(plan.weight_formats) | {c.weight_format for b in plan.batch_sizes if replay is not None
                                          for c in replayed(replay, b, None)}
    if any(f != "bf16" for f in formats) and dtype != torch.bfloat16:
        raise ValueError(f"--weight-formats w12n needs --dtype bfloat16 (--dtype {args.dtype} on {device} is "
                         f"{str(dtype).removeprefix('torch.')})")
    model, tokenizer, make_drafter = _models(args, target, args.drafter, device)
    target_fp = target_fingerprint(model, args.target)  # as loaded: a w12n_only runner drops the bf16 weights
    prompts = [encode_turn(tokenizer, [c.turns[0]], [], not args.no_chat) for ws in workloads.values() for c in ws]
    probe = make_drafter(None)
    target_kind = target.kind if target is not None else "checkpoint"
    calibrate_tolerance = target_kind == "flat" or (target_kind == "checkpoint" and dtype != torch.float32)
    depth = getattr(probe, "max_depth", None)
    base, candidates = stock(depth), space(plan, depth)
    per_batch = {b: replayed(replay, b, depth) if replay is not None else candidates for b in plan.batch_sizes}
    trees = [base.tree] + [c.tree for cs in per_batch.values() for c in cs]
    console = Console(highlight=False)
    if replay is not None:
        err.print(f"[dim]replay of {args.replay} (tuned on {replay.target.name} with {replay.drafter.name}, "
                  f"{replay.device}): {sum(map(len, per_batch.values()))} kept changes to judge again[/]")
    if profile is not None:
        err.print(f"[yellow]SYNTHETIC acceptance: {profile.label}[/]")
    err.print(f"[dim]tune: {len(prompts)} prompts ({', '.join(workloads)}) at {sampling.describe()}, batch sizes "
              f"{', '.join(map(str, plan.batch_sizes))}, {len(candidates)} candidates each, the best "
              f"{plan.measure} measured ({plan.repeats} held-out pairs), stock {base.label}[/]")
    results = []
    bar = Progress(TextColumn("tune"), BarColumn(), MofNCompleteColumn(), TextColumn("candidates"),
                   TimeElapsedColumn(), TextColumn("{task.description}"), console=err)
    measured = {b: len(cs) if replay is not None else min(plan.measure, len(cs)) for b, cs in per_batch.items()}
    task = bar.add_task("", total=sum(measured.values()))

    def on_verdict(v) -> None:
        bar.advance(task)
        err.print(f"[{'green' if v.kept else 'dim'}]b{v.batch} {v.candidate.label}: "
                  f"{'KEPT' if v.kept else 'rejected'}, {v.reason}[/]")

    def model_for(trial, batch):
        """The cost model, stock's acceptance and the mean context for the ranking at this batch size."""
        def read(run):
            if replay is not None:  # a replay judges the kept changes in their order: no ranking
                return None, None, 0.0
            runner, drafter = trial.pair(base)
            shape = ModelShape.from_model(model)
            dshape = DrafterShape.from_drafter(drafter, shape, TreeSpec.parse(base.tree).depth)
            if args.rank == "ceilings":
                cost = CostModel(shape, ceilings.measure(runner.device, runner.dtype), dshape)
            else:
                cal_plan = calibration.CalibrationPlan(batches=(batch,)) if device == "cuda" else replace(
                    calibration.CalibrationPlan.tiny(), batches=(batch,))
                cost = calibration.cached(runner, drafter, cal_plan, refresh=args.recalibrate,
                                          log=lambda m: err.print(f"[dim]{m}[/]")).cost_model(shape, dshape)
            return cost, acceptance_of(run), statistics.fmean(map(len, prompts)) + args.max_new_tokens / 2
        return read

    with bar:
        for batch in plan.batch_sizes:
            trial = Trial(model, make_drafter, batch, args.max_new_tokens, max(map(len, prompts)), trees,
                          args.tie_tolerance, calibrate_tolerance, profile, sampling)
            controller = Controller(trial.measure, trial.force, ControllerConfig(plan.repeats),
                                    on_event=lambda m: bar.update(task, description=m), on_verdict=on_verdict)
            bar.update(task, description=f"b{batch}: stock on the tuning prompts, then the ranking")
            try:
                results.append(tune_batch(controller, replace(plan, measure=max(measured[batch], 1)), batch, prompts,
                                          per_batch[batch], base, model_for(trial, batch)))
            finally:
                trial.close()
    recipe = Recipe(target_fp, drafter_fingerprint(probe, args.drafter),
                    calibration.device_name(next(model.parameters()).device), versions(),
                    {r.batch: r.choice for r in results}, {r.batch: r.evidence() for r in results},
                    [entry for r in results for entry in r.log()],
                    {"workloads": args.workloads, "limit": args.limit, "prompts": len(prompts),
                     "max_new_tokens": args.max_new_tokens, "seed": plan.seed, "held_out_share": plan.held_out_share,
                     "repeats": plan.repeats, "measure": plan.measure, "rank": args.rank,
                     "dtype": str(dtype).removeprefix("torch."), "stock": base.to_dict(),
                     "acceptance": f"synthetic:{profile.name}" if profile is not None else "real",
                     "acceptance_label": profile.label if profile is not None else "real", "target_kind": target_kind,
                     "replay_of": None if replay is None else {
                         "path": str(args.replay), "target": replay.target.to_dict(),
                         "drafter": replay.drafter.to_dict(), "device": replay.device,
                         "sampling": replay.sampling.to_dict()}}, sampling)
    recipe.save(Path(args.out).expanduser())
    console.print(report(results))
    kept = sum(len(r.evidence()) for r in results)
    tried = sum(len(r.verdicts) for r in results)
    if replay is not None:
        err.print(f"replay: {kept} of {sum(map(len, per_batch.values()))} kept changes still win here")
    err.print(f"tune: {tried} candidates measured, {kept} kept; wrote {args.out}")
    return 0


def apply_recipe(args, batch: int):
    """--recipe on generate (and any command with --tree, --weight-format and --drafter): the recipe's entry for
    the batch size replaces --tree and --weight-format; its node budget setting and other engine / scheduler fields
    ride on args (recipe_scheduler, recipe_engine) for the engine to read; the recipe itself (recipe_doc) for the
    fingerprint checks once the models are built. Returns the recipe."""
    from specpilot.pilot.recipe import Recipe

    recipe = Recipe.load(args.recipe)
    if args.drafter == "none":
        raise ValueError(f"--recipe {args.recipe}: tuned with the drafter {recipe.drafter.name}; pass --drafter "
                         f"{recipe.drafter.name}")
    size, choice = recipe.choice_for(batch)
    args.tree, args.weight_format = choice.tree, choice.weight_format
    args.recipe_scheduler = choice.scheduler_config(max(batch, size))
    args.recipe_engine = dict(choice.engine)
    args.recipe_doc = recipe
    err.print(f"[dim]recipe {args.recipe}: the batch-{size} entry, {choice.label} (tuned at "
              f"{recipe.sampling.describe()})[/]")
    if getattr(args, "temperature", None) is not None:  # generate's; a server's requests bring their own
        warn_sampling(args.recipe, recipe, [args.temperature], args.top_k, args.top_p)
    return recipe


def warn_sampling(path: str, recipe, temperatures, top_k: int, top_p: float) -> None:
    """One warning line when a run decodes at sampling settings other than the recipe was tuned at: the output stays
    exact at any settings (every configuration is), but the configuration was chosen for the recipe's."""
    from specpilot.pilot.sampling import Sampling

    runs = [Sampling() if t == 0 else Sampling(t, top_k, top_p) for t in temperatures]
    other = [r for r in dict.fromkeys(runs) if not r.same_distribution(recipe.sampling)]
    if other:
        flags = " ".join(f"--temperature {t.temperature:g}" + (f" --top-k {t.top_k}" if t.top_k else "")
                         + (f" --top-p {t.top_p:g}" if t.top_p < 1 else "") for t in other[:1])
        err.print(f"[yellow]warning: --recipe {path} was tuned at {recipe.sampling.describe()}; this run decodes at "
                  f"{'; '.join(r.describe() for r in other)}: the output stays exact, but the configuration was "
                  f"chosen for the other setting (specpilot tune {flags} tunes one for this)[/]")


def check_recipe_models(args, model=None, drafter=None) -> None:
    """The fingerprint checks of --recipe: a target or drafter other than the recipe's is refused. The target is
    checked as loaded, before a runner is built (weight format w12n_only drops its bf16 weights)."""
    from specpilot.pilot.recipe import drafter_fingerprint, target_fingerprint

    recipe = getattr(args, "recipe_doc", None)
    if recipe is None:
        return
    if model is not None:
        recipe.check_target(target_fingerprint(model, args.target))
    if drafter is not None:
        recipe.check_drafter(drafter_fingerprint(drafter, args.drafter))


def add_bench_recipe(bench) -> None:
    """`specpilot bench --recipe FILE` on the bench's parser: each batch size's recipe entry becomes one more
    configuration (recipe-bN, run at the batch sizes that take that entry), and the bench refuses a target or drafter
    whose fingerprint differs from the recipe's."""
    bench.add_argument("--recipe", default=None,
                       help="a recipe from `specpilot tune`: a recipe-bN row per entry, at the batch sizes that take "
                            "it (a target or drafter other than the recipe's is refused)")
    run = bench.get_default("func")
    bench.set_defaults(func=lambda args: run(_with_recipe(args) if args.recipe else args))


def _with_recipe(args):
    from specpilot.pilot.recipe import Recipe, drafter_fingerprint, target_fingerprint

    recipe = Recipe.load(args.recipe)
    groups: dict[int, list[int]] = {}
    for b in args.batch_sizes:
        groups.setdefault(recipe.choice_for(b)[0], []).append(b)
    configs = []
    for size, batches in sorted(groups.items()):
        choice = recipe.choices[size]
        if choice.scheduler:
            raise ValueError(f"--recipe {args.recipe}: the batch-{size} entry sets scheduler fields "
                             f"({', '.join(choice.scheduler)}) that bench rows do not take")
        items = [f"tree:{choice.tree}", f"weight_format:{choice.weight_format}",
                 f"adaptive:{'true' if choice.adaptive else 'false'}", f"batches:{','.join(map(str, batches))}"]
        items += [f"{k}:{str(v).lower() if isinstance(v, bool) else v}" for k, v in choice.engine.items()]
        configs.append(f"recipe-b{size}=" + ";".join(items))
    args.configs = list(args.configs) + configs

    def check(model, drafter):
        recipe.check_target(target_fingerprint(model, args.target))
        recipe.check_drafter(drafter_fingerprint(drafter, args.drafter))

    args.check_models = check
    err.print(f"[dim]recipe {args.recipe}: {', '.join(configs)} (tuned at {recipe.sampling.describe()})[/]")
    warn_sampling(args.recipe, recipe, args.temperature, args.top_k, args.top_p)
    return args
