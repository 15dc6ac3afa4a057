"""The `specpilot` command: `demo` (bundled tiny model, CPU, no network) and `generate` (any checkpoint).

Text streams to stdout and a stats line follows; with --json exactly one JSON object goes to stdout.
Errors go to stderr with exit status 2 (bad input) or 1 (anything else).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import io
import json
import sys
import time
from pathlib import Path

from rich.markup import escape

from specpilot import __version__
from specpilot.bench import commands as bench_commands
from specpilot.checkpoint.errors import CheckpointError
from specpilot.cli_util import err, pick_device
from specpilot.config import Ablations, ConfigError, EngineConfig
from specpilot.pilot import commands as pilot_commands
from specpilot.train import commands as train_commands
from specpilot.weights import commands as weights_commands

# ends mid-function without a newline, so the model writes its own next line and indentation (a prompt ending in a
# newline sent the zoo's hybrid into a loop); both zoo targets continue it with a loop over the directory, and
# tests/test_cli.py checks that the hybrid's greedy completion repeats no line more than 3 times
DEMO_PROMPT = 'import os\n\n\ndef list_files(directory):\n    """Return the names of the files in directory."""\n    names = []'


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (CheckpointError, ConfigError, ValueError, NotImplementedError, FileNotFoundError, FileExistsError) as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", markup=True)  # the message as written, brackets kept
        return 2
    except KeyboardInterrupt:
        return 130


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help line ends with its default (where there is one to name and the text does not already)."""

    def _format_action(self, action):
        unset = action.default is False or action.default in (None, [], argparse.SUPPRESS)  # nothing to name
        if action.option_strings and not unset and "default" not in (action.help or ""):
            action = copy.copy(action)
            action.help = f"{action.help or ''} (default: %(default)s)".lstrip()
        return super()._format_action(action)


class _Parser(argparse.ArgumentParser):
    """The parser of `specpilot` and, through add_subparsers (which builds its parsers of the same class), of every
    subcommand: each --help shows the defaults."""

    def __init__(self, *args, formatter_class=_HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="specpilot", description="Lossless speculative decoding for HF LLMs")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt with a local or Hub checkpoint")
    g.add_argument("--target", required=True, help="model directory or Hub repo id (org/name)")
    g.add_argument("--prompt", required=True, help="prompt text")
    _add_generation_flags(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    g.add_argument("--cache-dir", default=None, help="Hugging Face cache directory (default: HF_HOME)")
    _add_spec_flags(g)
    g.add_argument("--recipe", default=None,
                   help="a recipe from `specpilot tune`: its batch-1 tree, weight format and node budget replace "
                        "--tree and --weight-format (a target or drafter other than the recipe's is refused)")
    g.set_defaults(func=cmd_generate)
    v = sub.add_parser("verify", help="speculative generation checked token by token against the stock model")
    v.add_argument("--target", required=True, help="model directory or Hub repo id (org/name)")
    v.add_argument("--prompts", required=True,
                   help="a text file (one prompt per line), a prompt-set file, or a shipped set name (humaneval, "
                        "gsm8k, mt-bench, spec-bench, ...; SPECPILOT_DATA_DIR replaces the shipped folder)")
    v.add_argument("--limit", type=int, default=None, help="use the first N prompts (N >= 1)")
    v.add_argument("--max-new-tokens", type=int, default=128)
    v.add_argument("--tie-tolerance", type=float, default=1e-3,
                   help="a mismatch whose stock logit margin is at most this counts as a tie (default 1e-3)")
    v.add_argument("--chat", action="store_true", help="wrap each prompt in the tokenizer's chat template")
    v.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    v.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto")
    v.add_argument("--cache-dir", default=None)
    v.add_argument("--json", action="store_true", help="print one JSON object")
    _add_spec_flags(v, drafter_default="ngram")
    v.set_defaults(func=cmd_verify)
    weights_commands.add_parsers(sub)
    bench_commands.add_parsers(sub)
    train_commands.add_parsers(sub)
    pilot_commands.add_parsers(sub)
    pilot_commands.add_bench_recipe(sub.choices["bench"])  # bench --recipe (bench/ cannot import the pilot)
    d = sub.add_parser("demo", help="code completion on the bundled trained zoo (CPU), plain and speculative")
    # the zoo's ~6M-parameter models decode fastest on one thread (docs/decisions/2026-12-02-cpu-threads.md)
    _add_generation_flags(d, max_new_tokens=96, threads=1)
    d.add_argument("--prompt", default=DEMO_PROMPT,
                   help="prompt text, echoed dimmed before the completion (default: a Python function to complete)")
    d.add_argument("--model", choices=["dense", "hybrid"], default="hybrid", help="the zoo target")
    d.add_argument("--drafter", dest="demo_drafter", choices=["dflash", "eagle3", "mtp", "draft-lm", "ngram"],
                   default="dflash", help="the zoo drafter for the speculative run (eagle3: dense; mtp: hybrid, "
                                          "the target's own MTP layer)")
    d.add_argument("--tree", default="chain:7", help="chain:D | static:C1,C2,... | dynamic:TOPK,DEPTH,NODES")
    d.set_defaults(func=cmd_demo)
    _add_serve_parser(sub)
    return p


def _add_spec_flags(p: argparse.ArgumentParser, drafter_default: str = "none") -> None:
    p.add_argument("--drafter", default=drafter_default,
                   help="drafter directory or Hub id (draft model, DFlash, DFlash2, DSpark, EAGLE-3), `mtp` (the "
                        "target's own MTP layer; `mtp:FILE` or `mtp:N` over a reduced draft vocabulary: a token-id "
                        "file from dev/draft_vocab.py, or the first N ids; a `+fp8` suffix scores an FP8 copy of the "
                        "LM head), `ngram` (prompt lookup) or `none` (plain decoding)")
    p.add_argument("--tree", default="chain:4", help="chain:D | static:C1,C2,... | dynamic:TOPK,DEPTH,NODES")


def _add_generation_flags(p: argparse.ArgumentParser, max_new_tokens: int = 128, threads: int | None = None) -> None:
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto")
    p.add_argument("--eager", action="store_true",
                   help="no CUDA graphs, torch.compile, Triton GEMV or fused RoPE/K-V store (debugging)")
    p.add_argument("--weight-format", choices=["bf16", "w12n", "w12n_only"], default="bf16",
                   help="w12n: decode-sized products read lossless 12-bit planes (encoded at load; needs --dtype "
                        "bfloat16); w12n_only: the bf16 copies dropped too, every product through the planes")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    p.add_argument("--threads", type=int, default=threads,
                   help="CPU runs: torch's intra-op threads (default: " + (f"{threads}" if threads else "torch's") + ")")


def cmd_generate(args) -> int:
    from specpilot.models.loader import load_model, load_tokenizer

    device = pick_device(args.device)
    if args.recipe:
        pilot_commands.apply_recipe(args, batch=1)
    _check_generation_flags(args, device)
    _check_spec_flags(args.tree)
    _set_threads(args.threads, device)
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(args.target, args.cache_dir)
    model = load_model(args.target, device, args.dtype, args.cache_dir)
    load_s = time.perf_counter() - t0
    pilot_commands.check_recipe_models(args, model=model)  # --recipe: its target only (before W12N drops weights)
    return run_generation(args, model, tokenizer, load_s)


def _check_generation_flags(args, device: str) -> None:
    """generate's and demo's flags that need no file read, checked before any weights load."""
    import torch

    from specpilot.runtime.sampling import SamplingParams
    from specpilot.models.loader import resolve_dtype

    SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p)
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads {args.threads}: must be >= 1")
    dtype = resolve_dtype(args.dtype, torch.device(device))
    if args.weight_format != "bf16" and dtype != torch.bfloat16:
        raise ValueError(f"--weight-format {args.weight_format} needs --dtype bfloat16 (--dtype {args.dtype} on "
                         f"{device} is {str(dtype).removeprefix('torch.')})")


def _set_threads(threads: int | None, device: str) -> None:
    if device == "cpu" and threads is not None:
        import torch

        torch.set_num_threads(threads)


def _check_spec_flags(tree: str) -> None:
    """The tree spec, checked before any weights load."""
    from specpilot.spec_decode.tree import TreeSpec

    TreeSpec.parse(tree)


def cmd_demo(args) -> int:
    from rich.console import Console
    from rich.text import Text

    from specpilot.demo import demo_checkpoint, zoo_dir, zoo_pair
    from specpilot.models.loader import load_model, load_tokenizer

    device = pick_device(args.device)
    _check_generation_flags(args, device)
    _check_spec_flags(args.tree)  # the speculative run is greedy whatever --temperature streams with
    _set_threads(args.threads, device)
    if zoo_dir() is not None:
        path, drafter = zoo_pair(args.model, args.demo_drafter)
        note = (f"specpilot demo: the zoo's trained {args.model} target ({path}), greedy code completion; then the "
                f"same prompt with the {args.demo_drafter} drafter ({args.tree})")
    else:
        path, drafter = demo_checkpoint(err), "ngram"
        note = ("specpilot demo: no trained zoo in this install, so a tiny Qwen3.5-style hybrid with RANDOM weights "
                "runs instead; its text is noise. It shows the runtime end to end.")
    if not args.json:
        err.print(f"[yellow]{note}[/]")
    t0 = time.perf_counter()
    tokenizer, model = load_tokenizer(str(path)), load_model(str(path), device, args.dtype)
    load_s = time.perf_counter() - t0
    args.chat, args.drafter = False, "none"  # the streamed part is plain decoding
    if not args.json:  # the completion streams on right after its prompt
        Console(highlight=False, soft_wrap=True).print(Text(args.prompt, style="dim"), end="")
    with contextlib.redirect_stdout(io.StringIO()) if args.json else contextlib.nullcontext() as captured:
        run_generation(args, model, tokenizer, load_s)
    spec = demo_speculative(args, model, tokenizer, drafter)
    ok = spec["identical"] and spec["forcing"]["passed"]
    if args.json:
        print(json.dumps(json.loads(captured.getvalue()) | {"speculative": spec}))
        return 0 if ok else 1
    verdict = "[green]pass[/]" if spec["forcing"]["passed"] else "[bold red]FAIL[/]"
    err.print(f"speculative ({spec['drafter']}, {spec['tree']}): tau {spec['tau']:.2f} · {spec['speedup_vs_ar']:.2f}x "
              f"AR · same tokens as AR: {'yes' if spec['identical'] else 'NO'} · token forcing {verdict} "
              f"({spec['forcing']['tokens']} tokens, {spec['forcing']['mismatches']} mismatches)")
    if device == "cpu" and spec["speedup_vs_ar"] < 1:
        err.print("[dim]below 1x here: on a CPU the zoo's tiny models spend a step in host work, not in reading "
                  "weights, so drafting and verifying several tokens costs more than decoding one; speculation pays "
                  "where a step is bound by its weight reads, as on a GPU (README: Performance)[/]")
    return 0 if ok else 1


def demo_speculative(args, model, tokenizer, drafter_name: str) -> dict:
    """The same prompt through the speculative engine: tau, speedup over AR on this machine (both timed here,
    after the streamed run warmed up), equality with AR and the token-forcing verdict. Greedy: the check is exact."""
    from specpilot.engine.engine import SpecEngine
    from specpilot.engine.generator import Generator
    from specpilot.runtime.runner import ModelRunner
    from specpilot.runtime.sampling import SamplingParams
    from specpilot.spec_decode.drafters.registry import build_drafter
    from specpilot.spec_decode.forcing import ForcingReport, force_check
    from specpilot.spec_decode.tree import TreeSpec

    ids = encode_prompt(tokenizer, args.prompt, False)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    runtime = engine_runtime(args, model)
    runner = ModelRunner(model, runtime)
    drafter = build_drafter(drafter_name, model, tokenizer, runtime=runtime)
    t0 = time.perf_counter()
    ar = Generator(runner, ()).generate([ids], params)[0]
    t1 = time.perf_counter()
    tree = _drafted_tree(TreeSpec.parse(args.tree), drafter)
    out, stats = SpecEngine(ModelRunner(model, runtime), drafter, tree).generate([ids], params)[0]
    t2 = time.perf_counter()
    report = ForcingReport()
    force_check(runner, ids, out.token_ids, report)
    return {"drafter": Path(drafter_name).name, "tree": args.tree, "tau": round(stats.tau, 3),
            "speedup_vs_ar": round((t1 - t0) / (t2 - t1), 3), "identical": out.token_ids == ar.token_ids,
            "forcing": {"tokens": report.tokens, "mismatches": len(report.mismatches),
                        "passed": not report.failures(1e-3)}}


def run_generation(args, model, tokenizer, load_s: float) -> int:
    from specpilot.runtime.runner import ModelRunner
    from specpilot.runtime.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, stop=tuple(args.stop), ignore_eos=args.ignore_eos)
    prompt_ids = encode_prompt(tokenizer, args.prompt, args.chat)
    gen = _generator(args, ModelRunner(model, engine_runtime(args, model)), tokenizer)
    stream = None if args.json else _Streamer(tokenizer, params.stop)
    out = gen.generate([prompt_ids], params, on_token=stream.push if stream else None)[0]
    result, spec = out if isinstance(out, tuple) else (out, None)
    if stream:
        stream.finish(result.text)
    stats = _stats(result, load_s, model.config.architecture)
    if spec is not None:
        stats.update(drafter=args.drafter, tree=args.tree, **spec.to_dict())
    if args.json:
        print(json.dumps({"token_ids": result.token_ids, "text": result.text, "stats": stats}))
    else:
        line = (f"{stats['tokens']} tokens · {stats['tok_per_s']:.1f} tok/s decode · TTFT {stats['ttft_s'] * 1000:.0f} ms"
                f" · {stats['finish_reason']} · load {load_s:.1f} s")
        if spec is not None:
            split = " ".join(f"{k} {v * 1000:.0f} ms" for k, v in spec.seconds.items())
            line += f"\ntau {spec.tau:.2f} tokens/step over {spec.steps} steps · {split}"
        err.print(f"[dim]{line}[/]")
    return 0


def engine_config(args) -> EngineConfig:
    """generate's and demo's flags as an EngineConfig: --eager turns off every CUDA graph (decode, verify, DFlash
    proposals), torch.compile, the Triton GEMVs and the fused q/k norm + RoPE + K/V store; --weight-format."""
    fast = not args.eager
    config = EngineConfig(cuda_graphs=fast, verify_graphs=fast, weight_format=args.weight_format,
                          ablations=Ablations(compile_pointwise=fast, decode_gemv=fast, fused_qk_rope_store=fast))
    return config.replace(**getattr(args, "recipe_engine", {}))  # --recipe's engine fields


def engine_runtime(args, model):
    """The Runtime of generate's and demo's flags on the model's device: the target's runner and its drafter
    share it."""
    from specpilot.runtime.settings import Runtime

    return Runtime.build(engine_config(args), next(model.parameters()).device)


def _eos(model, tokenizer) -> tuple[int, ...]:
    extra = (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
    return tuple(model.config.eos_token_ids) + extra


def _generator(args, runner, tokenizer):
    """The plain Generator for --drafter none, else the speculative engine with the built drafter."""
    from specpilot.engine.generator import Generator

    if args.drafter == "none":
        return Generator(runner, _eos(runner.model, tokenizer), tokenizer)
    engine = spec_engine(args, runner, tokenizer, getattr(args, "recipe_scheduler", None))
    pilot_commands.check_recipe_models(args, drafter=engine.drafter)  # --recipe: its drafter only
    return engine


def spec_engine(args, runner, tokenizer, scheduler=None):
    """The SpecEngine of --drafter and --tree on the runner (--drafter none: plain continuous batching)."""
    from specpilot.engine.engine import SpecEngine
    from specpilot.spec_decode.drafters.registry import build_drafter
    from specpilot.spec_decode.tree import TreeSpec

    drafter = build_drafter(args.drafter, runner.model, tokenizer, cache_dir=getattr(args, "cache_dir", None),
                            runtime=runner.runtime)
    tree = _drafted_tree(TreeSpec.parse(args.tree), drafter) if drafter is not None else None
    return SpecEngine(runner, drafter, tree, _eos(runner.model, tokenizer), tokenizer, scheduler=scheduler)


def _drafted_tree(tree, drafter):
    """The tree the drafter can draft: cut to its depth, said once on stderr when that changes it."""
    capped = tree.capped(drafter.max_depth) if drafter.max_depth is not None else tree
    if capped != tree:
        err.print(f"[yellow]--tree {tree}: the {drafter.name} drafter drafts at most {drafter.max_depth} tokens "
                  f"ahead, so it drafts {capped} per step[/]")
    return capped


def _add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server: completions and chat, streaming, Prometheus "
                                     "metrics (docs/server.md)")
    s.add_argument("--target", required=True, help="model directory or Hub repo id (org/name)")
    _add_spec_flags(s)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=int, default=8000, help="port to listen on (0: a free one, printed)")
    s.add_argument("--served-model-name", default=None, help="the `model` clients ask for (default: --target)")
    s.add_argument("--max-num-seqs", type=int, default=32, help="requests decoding together (engine slots)")
    s.add_argument("--max-model-len", type=int, default=None,
                   help="prompt + completion tokens per request (default: the model's context, at most 4096)")
    s.add_argument("--max-waiting", type=int, default=256,
                   help="requests queued beyond the running ones; past them the server answers 429")
    s.add_argument("--chat-template", default=None, help="a Jinja chat template file (default: the tokenizer's)")
    s.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    s.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto")
    s.add_argument("--eager", action="store_true", help="no CUDA graphs, torch.compile or Triton GEMV (debugging)")
    s.add_argument("--cache-dir", default=None, help="Hugging Face cache directory (default: HF_HOME)")
    s.add_argument("--recipe", default=None,
                   help="a recipe from `specpilot tune`: the entry for --max-num-seqs (tree, weight format, node "
                        "budget, engine fields) replaces --tree; another target or drafter is refused")
    s.add_argument("--engine-process", action="store_true",
                   help="run the engine in a process of its own, so that HTTP work never holds its interpreter lock "
                        "(docs/server.md)")
    s.set_defaults(func=cmd_serve, weight_format="bf16")


def cmd_serve(args) -> int:
    import logging

    from specpilot.server.uvicorn_server import bind, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sock = bind(args.host, args.port)  # before the weights load: a busy port fails at once
    with sock:
        serve(serve_app(args), sock)
    return 0


def serve_app(args):
    """`specpilot serve`'s application: the flags checked, then the target, its tokenizer and the engine of
    --drafter / --tree behind the server."""
    from specpilot.engine.scheduler import SchedulerConfig
    from specpilot.models.loader import load_tokenizer
    from specpilot.server.app import create_app
    from specpilot.server.config import ServerConfig
    from specpilot.server.engine_process import RemoteEngine

    if args.recipe:
        pilot_commands.apply_recipe(args, batch=args.max_num_seqs)
    _check_spec_flags(args.tree)
    scheduler = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len)
    if getattr(args, "recipe_scheduler", None) is not None:  # --recipe: its node budget setting and fields
        scheduler = dataclasses.replace(args.recipe_scheduler, max_num_seqs=args.max_num_seqs,
                                        max_model_len=args.max_model_len)
    template = None
    if args.chat_template:
        if not Path(args.chat_template).is_file():
            raise FileNotFoundError(f"--chat-template {args.chat_template}: no such file; pass a Jinja template file")
        template = Path(args.chat_template).read_text()
    config = ServerConfig(args.served_model_name or args.target, max_waiting=args.max_waiting, chat_template=template)
    device = pick_device(args.device)
    tokenizer = load_tokenizer(args.target, args.cache_dir)
    if args.engine_process:  # the weights load in the engine's process only
        engine = RemoteEngine(functools.partial(serve_engine, args, scheduler, device))
    else:
        engine = serve_engine(args, scheduler, device, tokenizer)
    return create_app(engine, tokenizer, config)


def serve_engine(args, scheduler, device: str, tokenizer=None):
    """`specpilot serve`'s engine: the target on the device behind the engine of --drafter / --tree (with
    --engine-process, called in the engine's process)."""
    from specpilot.models.loader import load_model, load_tokenizer
    from specpilot.runtime.runner import ModelRunner

    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(args.target, args.cache_dir)
    model = load_model(args.target, device, args.dtype, args.cache_dir)
    pilot_commands.check_recipe_models(args, model=model)
    engine = spec_engine(args, ModelRunner(model, engine_runtime(args, model)), tokenizer, scheduler)
    pilot_commands.check_recipe_models(args, drafter=engine.drafter)
    return engine


def cmd_verify(args) -> int:
    from specpilot.runtime.runner import ModelRunner
    from specpilot.runtime.sampling import SamplingParams
    from specpilot.models.loader import load_model, load_tokenizer
    from specpilot.prompts import load_prompts, resolve_prompt_set
    from specpilot.spec_decode.forcing import ForcingReport, force_check

    for flag, value in (("--limit", args.limit), ("--max-new-tokens", args.max_new_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value}: must be >= 1")
    _check_spec_flags(args.tree)
    prompts = load_prompts(resolve_prompt_set(args.prompts), limit=args.limit)
    device = pick_device(args.device)
    tokenizer = load_tokenizer(args.target, args.cache_dir)
    model = load_model(args.target, device, args.dtype, args.cache_dir)
    runner = ModelRunner(model)
    gen = _generator(args, runner, tokenizer)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    report, steps, emitted = ForcingReport(), 0, 0
    for i, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt.text, args.chat)
        out = gen.generate([ids], params)[0]
        result, spec = out if isinstance(out, tuple) else (out, None)
        if spec is not None:
            steps, emitted = steps + spec.steps, emitted + spec.emitted
        force_check(runner, ids, result.token_ids, report, prompt_index=i)
    failures = report.failures(args.tie_tolerance)
    summary = {"prompts": len(prompts), "tokens": report.tokens, "mismatches": len(report.mismatches),
               "failures": len(failures), "tie_tolerance": args.tie_tolerance,
               "max_mismatch_margin": report.max_margin, "tau": round(emitted / steps, 4) if steps else 1.0,
               "drafter": args.drafter, "tree": args.tree, "passed": not failures,
               "mismatch_list": [_mismatch(m) for m in report.mismatches]}
    if args.json:
        print(json.dumps(summary))
    else:
        for m in report.mismatches:
            err.print(f"prompt {m.prompt} position {m.position}: emitted {m.emitted}, stock argmax {m.expected}, "
                      f"margin {m.margin:.3g}{'' if m.margin <= args.tie_tolerance else '  [bold red]FAIL[/]'}")
        verdict = "[green]PASS[/]" if not failures else "[bold red]FAIL[/]"
        err.print(f"{verdict} {summary['prompts']} prompts · {summary['tokens']} tokens · "
                  f"{summary['mismatches']} mismatches ({summary['failures']} above tolerance "
                  f"{args.tie_tolerance:g}) · tau {summary['tau']:.2f}")
    return 0 if not failures else 1


def _mismatch(m) -> dict:
    return {"prompt": m.prompt, "position": m.position, "emitted": m.emitted, "expected": m.expected,
            "margin": m.margin}


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("--chat: this tokenizer has no chat template")
        messages = [{"role": "user", "content": prompt}]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
    ids = tokenizer.encode(prompt, add_special_tokens=True)
    if not ids:
        raise ValueError("the prompt encodes to zero tokens")
    return ids


def _stats(r, load_s: float, arch: str) -> dict:
    n = len(r.token_ids)
    decode_s = max(r.total_s - r.ttft_s, 1e-9)
    return {"tokens": n, "prompt_tokens": r.prompt_len, "ttft_s": round(r.ttft_s, 4),
            "total_s": round(r.total_s, 4), "tok_per_s": round((n - 1) / decode_s, 2) if n > 1 else 0.0,
            "finish_reason": r.finish_reason, "load_s": round(load_s, 3), "architecture": arch}


class _Streamer:
    """Prints the text as tokens arrive: what the Detokenizer releases (complete characters, never a stop string,
    nothing after one), then the rest of the final text at the end."""

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        from specpilot.engine.detokenizer import Detokenizer

        self.detok, self.printed = Detokenizer(tokenizer, stop), 0

    def push(self, index: int, token: int) -> None:
        self._write(self.detok.push(token))

    def finish(self, final_text: str | None) -> None:
        self._write((final_text or "")[self.printed:] + "\n")

    def _write(self, text: str) -> None:
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
            self.printed += len(text)


if __name__ == "__main__":
    sys.exit(main())
