"""`specpilot bench`: its flags and its command (the CLI entry of the harness)."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from specpilot.cli_util import check_writable, err, pick_device


def add_parsers(sub) -> None:
    b = sub.add_parser("bench", help="AR vs stock speculation vs configurations on the benchmark workloads")
    # not required=True: `bench serve` takes its own --target, which this parser never sees (cmd_bench checks it)
    b.add_argument("--target", default=None,
                   help="(required) model directory or Hub repo id, or random:SHAPE[:layers=N] (Qwen3-8B, "
                        "Qwen3.5-27B: random bf16 weights in the real shape, of --target-kind; margin:SHAPE / "
                        "flat:SHAPE name the kind; needs --acceptance synthetic:...)")
    b.add_argument("--target-kind", choices=["margin", "flat"], default="margin",
                   help="random:SHAPE weights: margin (a planted circuit gives every greedy token a lead of 16 "
                        "logits, so forcing holds at --tie-tolerance in bf16) or flat (every weight random: near-ties "
                        "flip between kernels, so forcing uses a tolerance calibrated on the target, labelled)")
    b.add_argument("--drafter", default="ngram",
                   help="draft model / DFlash / EAGLE-3 checkpoint, ngram, or random-dflash (random targets)")
    b.add_argument("--workloads", nargs="+", default=["mt-bench", "humaneval", "gsm8k", "alpaca", "cnndm"],
                   help="mt-bench humaneval gsm8k alpaca cnndm spec-bench (humaneval, gsm8k, alpaca, cnndm: EAGLE's "
                        "80-prompt sets; alpaca is CC BY-NC 4.0 data, non-commercial), any other shipped prompt set "
                        "(math500, mbpp, eagle-qa, ...) or a prompt file")
    b.add_argument("--data-dir", default=None,
                   help="folder holding the named prompt sets (default: SPECPILOT_DATA_DIR, else the shipped sets)")
    b.add_argument("--limit", type=int, default=None, help="first N prompts of each workload (N >= 1)")
    b.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    b.add_argument("--max-new-tokens", type=int, default=2048)
    b.add_argument("--temperature", type=float, nargs="+", default=[0.0],
                   help="one or more (rows per temperature, e.g. 0 0.7 1): 0 = greedy (default); above 0 the rows "
                        "sample (speculative sampling) and are checked against AR sampling with the same seed, token "
                        "for token (each request has its own stream, so at any batch size); with --acceptance "
                        "synthetic the oracle follows AR's sampled output at the profile's greedy rates (labelled)")
    b.add_argument("--top-k", type=int, default=0, help="sampling's top-k (0: off)")
    b.add_argument("--top-p", type=float, default=1.0, help="sampling's top-p (1: off)")
    b.add_argument("--seed", type=int, default=0, help="every request's sampling seed")
    b.add_argument("--stock-tree", default="chain:7", help="the stock configuration's fixed chain")
    b.add_argument("--configs", nargs="*", default=[],
                   help="NAME=tree:SPEC;ENGINE_FIELD:VALUE... e.g. 'tree16=tree:dynamic:4,5,16'; also adaptive:true "
                        "(the node budget) and batches:1,8 (run only at these batch sizes)")
    b.add_argument("--engine", default="",
                   help="EngineConfig fields under AR, stock and every configuration, FIELD:VALUE;... (a "
                        "configuration's own fields win), e.g. 'fused_qk_rope_store:false'")
    b.add_argument("--acceptance", default="real", help="real, or synthetic:PROFILE (shipped name or JSON path)")
    b.add_argument("--no-chat", action="store_true", help="do not apply the tokenizer's chat template")
    b.add_argument("--tie-tolerance", type=float, default=1e-3,
                   help="forcing's tie tolerance (logits) on margin targets and fp32 checkpoints; flat random targets "
                        "and half-precision checkpoints use at least 2 x their measured AR-decode vs teacher-forced "
                        "logit noise, recorded in each row with its source")
    b.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    b.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto")
    b.add_argument("--out", default="bench.json", help="JSON report path")
    b.add_argument("--plot", default=None, help="PNG plot path (default: next to the JSON)")
    b.set_defaults(func=cmd_bench)
    _add_serve_parser(b.add_subparsers(dest="bench_command", title="other benchmarks", metavar="{serve}"))


def cmd_bench(args) -> int:
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specpilot.bench.harness import BenchConfig, bench, load_workloads
    from specpilot.bench.report import plot, table, write_json
    from specpilot.bench.synthetic import AcceptanceProfile
    from specpilot.config import EngineConfig

    if args.target is None:
        raise ValueError("--target is required: a model directory, Hub repo id or random:SHAPE")
    _check_flags(args)
    workloads = load_workloads(args.workloads, args.data_dir, args.limit)
    kind, _, name = args.acceptance.partition(":")
    if kind not in ("real", "synthetic") or (kind == "synthetic" and not name):
        raise ValueError(f"--acceptance {args.acceptance!r}: use real or synthetic:PROFILE")
    profile = AcceptanceProfile.load(name) if kind == "synthetic" else None
    configs = [BenchConfig.parse(c, args.stock_tree) for c in args.configs]
    base = BenchConfig.parse(f"engine={args.engine}", args.stock_tree)
    if any(item.partition(":")[0] == "tree" for item in args.engine.split(";")):
        raise ValueError(f"--engine {args.engine!r}: EngineConfig fields only (the tree goes in --configs)")
    for c in configs:  # a bad field value fails here, before any model is built
        EngineConfig.from_dict({**dict(base.engine), **dict(c.engine)})
    device = pick_device(args.device)
    model, tokenizer, make_drafter = _bench_models(args, device, profile)
    drafter = make_drafter(None)  # fail fast on a bad drafter, before any timing
    if getattr(args, "check_models", None) is not None:  # e.g. --recipe's fingerprints (set by pilot/commands.py)
        args.check_models(model, drafter)
    for path in (args.out, args.plot):  # checked writable up front; created only once a row can be measured
        if path:
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    extra = {"target": args.target, "target_kind": _target_kind(args), "drafter": args.drafter,
             "acceptance": args.acceptance, "temperature": args.temperature, "top_k": args.top_k,
             "top_p": args.top_p, "seed": args.seed,
             "max_new_tokens": args.max_new_tokens, "limit": args.limit, "workloads": args.workloads,
             "batch_sizes": args.batch_sizes, "stock_tree": args.stock_tree, "configs": args.configs,
             "engine": dict(base.engine),
             "profile": profile.__dict__ if profile else None}
    done = []
    per_group = 2 + len(configs)  # AR, stock and each configuration per workload x batch size x temperature
    bar = Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=err)
    task = bar.add_task("", total=len(workloads) * len(args.batch_sizes) * len(args.temperature) * per_group)

    def progress(r):
        # the report is rewritten after every row: a run cut short (timeout, crash) keeps what it measured
        done.append(r)
        label = f"{r['workload']} b{r['batch']} {r['config']}"
        if r.get("temperature"):
            label += f" T{r['temperature']:g}"
        if "error" in r:
            err.print(f"[red]{label}: FAILED {r['error'][:500]}[/]")
        else:
            err.print(f"[dim]{label}: {r['tok_per_s']:.1f} tok/s, {r['speedup_vs_ar']:.2f}x AR[/]")
        # a failed AR row ends its whole group: no truth for the other configurations
        bar.update(task, advance=per_group if r["config"] == "ar" and "error" in r else 1, description=label)
        write_json(done, args.out, {**extra, "partial": True})

    half = next(model.parameters()).dtype != torch.float32  # two correct half-precision kernels round apart
    kind = _target_kind(args)
    rows = []
    with bar:
        for sampling in _sampling(args):
            rows += bench(model, tokenizer, make_drafter, workloads,
                          args.batch_sizes, configs, args.stock_tree, args.max_new_tokens,
                          profile, chat=not args.no_chat, tie_tolerance=args.tie_tolerance, progress=progress,
                          base_engine=base.engine, target_kind=kind,
                          calibrate_tolerance=kind == "flat" or (kind == "checkpoint" and half), sampling=sampling)
    write_json(rows, args.out, extra)
    plot_path = args.plot or str(Path(args.out).with_suffix(".png"))
    try:
        plot(rows, plot_path)
    except Exception as e:  # noqa: BLE001 - the JSON is the result; the plot is a view of it
        err.print(f"[yellow]plot failed: {type(e).__name__}: {e}[/]")
    console = Console(highlight=False)
    console.print(table(rows))
    for label in dict.fromkeys(r["acceptance_label"] for r in rows if r.get("synthetic") and r.get("temperature")):
        console.print(f"T > 0 rows: {label}")  # what a sampled synthetic row's acceptance is, beside its figures
    err.print(f"wrote {args.out} and {plot_path}")
    ok = all("error" not in r and r.get("forcing", {"passed": True})["passed"] for r in rows)
    return 0 if ok else 1


def _sampling(args) -> list:
    """The run's sampling settings, one per --temperature (with --top-k, --top-p, --seed); a bad value is a
    ValueError."""
    from specpilot.runtime.sampling import SamplingParams

    return [SamplingParams(temperature=t, top_k=args.top_k, top_p=args.top_p, seed=args.seed) for t in args.temperature]


def _check_flags(args) -> None:
    """The flags that need no file read: a bad one fails here, before any model loads or row is measured."""
    from specpilot.spec_decode.tree import TreeSpec

    _sampling(args)  # a bad sampling value fails here
    counts = [("--max-new-tokens", args.max_new_tokens)] + [("--batch-sizes", b) for b in args.batch_sizes]
    if args.limit is not None:
        counts.append(("--limit", args.limit))
    for flag, value in counts:
        if value < 1:
            raise ValueError(f"{flag} {value}: must be >= 1")
    if TreeSpec.parse(args.stock_tree, "--stock-tree").kind != "chain":
        raise ValueError(f"--stock-tree {args.stock_tree!r}: stock is a chain; use chain:D, e.g. chain:7")
    names = []
    for text in args.configs:
        name, sep, _ = text.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--configs {text!r}: use NAME=tree:SPEC;FIELD:VALUE, e.g. 'tree16=tree:dynamic:4,5,16'")
        if name in ("ar", "stock") or name in names:
            raise ValueError(f"--configs {text!r}: the name {name!r} is "
                             f"{'a built-in row' if name in ('ar', 'stock') else 'given twice'}; pick another NAME")
        names.append(name)
    check_writable("--out", args.out)
    if args.plot:
        check_writable("--plot", args.plot)


def _target_kind(args) -> str:
    """margin or flat (random-weight targets), or checkpoint."""
    from specpilot.bench.shapes import RandomTarget

    target = RandomTarget.parse(args.target, args.target_kind)
    return target.kind if target is not None else "checkpoint"


def _bench_models(args, device: str, profile, profile_flag: str = "--acceptance synthetic:PROFILE"):
    """(target, tokenizer, drafter factory): a checkpoint, or a random-weight model in a real shape."""
    from specpilot.models.loader import load_model, load_tokenizer
    from specpilot.spec_decode.drafters.registry import build_drafter

    from specpilot.bench.shapes import RandomTarget

    target = RandomTarget.parse(args.target, args.target_kind)
    if target is not None:
        import torch

        from specpilot.bench.shapes import ByteTokenizer, random_drafter

        if profile is None:
            raise ValueError(f"acceptance on random weights means nothing: use {profile_flag}")
        model = target.build(device, torch.bfloat16 if device == "cuda" else torch.float32)
        make = random_drafter(args.drafter)
        if make is not None:
            return model, ByteTokenizer(), lambda runtime: make(model, target.shape, runtime)
        return model, ByteTokenizer(), lambda runtime: build_drafter(args.drafter, model, runtime=runtime)
    if args.drafter.startswith("random-"):
        raise ValueError(f"--drafter {args.drafter} goes with a random:SHAPE target")
    tokenizer = load_tokenizer(args.target)
    model = load_model(args.target, device, args.dtype)
    return model, tokenizer, lambda runtime: build_drafter(args.drafter, model, tokenizer, runtime=runtime)


def _add_serve_parser(bsub) -> None:
    s = bsub.add_parser("serve", help="continuous batching: the speculative engine vs AR on the same scheduler, "
                                      "closed loop (clients) or open loop (Poisson arrivals)")
    s.add_argument("--target", required=True,
                   help="model directory or Hub repo id, or random:SHAPE[:layers=N] (random weights in a real shape; "
                        "needs --profile)")
    s.add_argument("--target-kind", choices=["margin", "flat"], default="margin",
                   help="random:SHAPE weights: margin (speculative output must equal AR's) or flat")
    s.add_argument("--drafter", default="random-dflash",
                   help="random-dflash, random-dflash2, random-dspark, random-mtp or random-mtp:N (over the first N "
                        "ids), either MTP form with +fp8 (an FP8 copy of its LM head) (random targets: the published "
                        "drafter shapes), a draft model / DFlash / EAGLE-3 checkpoint, or ngram (default: "
                        "random-dflash)")
    s.add_argument("--profile", default=None,
                   help="synthetic acceptance profile (shipped name, e.g. dflash2-gsm8k, or JSON path); omitted: "
                        "the drafter's real acceptance")
    s.add_argument("--tree", default="chain:7", help="the speculative engine's tree (its deepest; the engine adapts)")
    s.add_argument("--mode", choices=["closed", "open"], default="closed")
    s.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8, 16, 32],
                   help="closed: concurrent clients per row; open: the engines' max_num_seqs is the largest")
    s.add_argument("--load", type=float, nargs="+", default=None,
                   help="open: arrival rates as fractions of AR's capacity (default 0.3 0.6 0.9)")
    s.add_argument("--capacity", type=float, default=None,
                   help="open: AR's capacity in requests/s (default: measured, AR closed loop at the largest batch)")
    s.add_argument("--requests-per-client", type=int, default=2, help="closed loop: requests each client sends")
    s.add_argument("--requests", type=int, default=64, help="open loop: requests per load")
    s.add_argument("--max-new-tokens", type=int, default=2048)
    s.add_argument("--seed", type=int, default=0, help="arrivals, the open loop's prompt order, the oracle")
    s.add_argument("--workloads", nargs="+", default=["gsm8k"],
                   help="prompt sets (as `specpilot bench --workloads`), interleaved; first turns only")
    s.add_argument("--data-dir", default=None, help="folder holding the named prompt sets")
    s.add_argument("--no-chat", action="store_true", help="do not apply the tokenizer's chat template")
    s.add_argument("--scheduler", default="", help="SchedulerConfig fields, FIELD:VALUE;... (e.g. "
                                                   "'max_prefill_tokens:2048;adaptive:false')")
    s.add_argument("--engine", default="", help="EngineConfig fields under both engines, FIELD:VALUE;...")
    s.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    s.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto")
    s.add_argument("--out", default="serve-bench", help="output directory: MODE.json and MODE.png")
    s.add_argument("--append", action="store_true",
                   help="keep the rows of an earlier run of the same configuration in --out (other batch sizes or "
                        "loads: a long run split over several commands); its commands are kept under `runs`")
    s.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    import json

    from specpilot.bench import serving
    from specpilot.bench.harness import load_workloads
    from specpilot.bench.report import environment, write_json
    from specpilot.bench.serving_plot import plot
    from specpilot.bench.synthetic import AcceptanceProfile

    cfg = _check_serve_flags(args)
    profile = AcceptanceProfile.load(args.profile) if args.profile else None
    workloads = load_workloads(args.workloads, args.data_dir)
    out = Path(args.out).expanduser()
    json_path, png_path = out / f"{cfg.mode}.json", out / f"{cfg.mode}.png"
    extra = {"target": args.target, "target_kind": _target_kind(args), "drafter": args.drafter,
             "profile": profile.__dict__ if profile else None, "config": cfg.to_dict(), "workloads": args.workloads}
    prior, runs = [], []
    if args.append and json_path.exists():  # checked before any model is built
        doc = json.loads(json_path.read_text())
        prior, runs = serving.appended(doc, json.loads(json.dumps(extra)), cfg, args.capacity is None)
    device = pick_device(args.device)
    model, tokenizer, make_drafter = _bench_models(args, device, profile, "--profile PROFILE (e.g. dflash2-gsm8k)")
    prompts = serving.workload_prompts(tokenizer, workloads, args.seed, not args.no_chat, shuffle=cfg.mode == "open")
    eos = tuple(model.config.eos_token_ids) + ((tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
    engines = serving.Engines(model, make_drafter, eos, cfg, profile)
    out.mkdir(parents=True, exist_ok=True)
    if args.append:
        run = environment()
        extra["runs"] = runs + [{k: run[k] for k in ("command", "commit", "date", "gpu")}]
    done = list(prior)

    def on_row(row):  # the report is rewritten after every row: a run cut short keeps what it measured
        done.append(row)
        write_json(done, json_path, {**extra, "partial": True})

    with serving.RichProgress(err, on_row) as progress:
        if cfg.mode == "closed":
            rows = serving.serve_closed(engines, prompts, _target_kind(args), progress)
        else:
            rows = serving.serve_open(engines, prompts, _target_kind(args), progress, args.capacity)
    write_json(prior + rows, json_path, extra)
    try:
        plot(prior + rows, png_path, f"{args.target} {cfg.mode} loop, {cfg.tree}")
    except Exception as e:  # noqa: BLE001 - the JSON is the result; the plot is a view of it
        err.print(f"[yellow]plot failed: {type(e).__name__}: {e}[/]")
    err.print(f"wrote {json_path} and {png_path}")
    exact_needed = _target_kind(args) != "flat"
    ok = all("error" not in r and (r.get("exact", True) or not exact_needed) for r in rows)
    return 0 if ok else 1


def _check_serve_flags(args):
    """The flags that need no file read; returns the run's ServeConfig."""
    from specpilot.bench.serving import ServeConfig, parse_fields, scheduler_config
    from specpilot.config import EngineConfig
    from specpilot.spec_decode.tree import TreeSpec

    counts = [("--max-new-tokens", args.max_new_tokens), ("--requests-per-client", args.requests_per_client),
              ("--requests", args.requests)] + [("--batch", b) for b in args.batch]
    for flag, value in counts:
        if value < 1:
            raise ValueError(f"{flag} {value}: must be >= 1")
    if args.mode == "closed":
        for flag, value in (("--load", args.load), ("--capacity", args.capacity)):
            if value is not None:
                raise ValueError(f"{flag} goes with --mode open (the closed loop sets its load by --batch)")
    for load in args.load or ():
        if not load > 0:
            raise ValueError(f"--load {load}: must be > 0 (a fraction of AR's capacity, e.g. 0.3 0.6 0.9)")
    if args.capacity is not None and not args.capacity > 0:
        raise ValueError(f"--capacity {args.capacity}: must be > 0 requests/s")
    TreeSpec.parse(args.tree, "--tree")
    scheduler = parse_fields(args.scheduler, "--scheduler")
    scheduler_config(scheduler, 1)  # an unknown field or a bad value fails here, before any model is built
    engine = parse_fields(args.engine, "--engine")
    EngineConfig.from_dict(engine)
    out = Path(args.out).expanduser()
    folder = next(p for p in (out, *out.parents) if p.exists())
    if not folder.is_dir():
        raise ValueError(f"--out {args.out}: {folder} is not a directory (--out names a folder for MODE.json and "
                         "MODE.png)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--out {args.out}: cannot write in {folder} (permission denied)")
    return ServeConfig(args.mode, tuple(args.batch), args.max_new_tokens, args.tree, args.requests_per_client,
                       tuple(args.load or (0.3, 0.6, 0.9)) if args.mode == "open" else (), args.requests, args.seed,
                       tuple(scheduler.items()), tuple(engine.items()))
