"""`specpilot train tokenizer | target | drafter`: flags and commands."""

from __future__ import annotations

import argparse
import json


from specpilot.cli_util import err


def add_parsers(sub) -> None:
    from specpilot.train.zoo import ZOO_MAX_FILES

    t = sub.add_parser("train", help="train a tokenizer, a target model or a draft model")
    tsub = t.add_subparsers(dest="what", required=True)
    tt = tsub.add_parser("tokenizer", help="byte-level BPE on a corpus")
    tt.add_argument("--vocab-size", type=int, default=4096)
    _add_corpus_flags(tt)
    tt.set_defaults(func=cmd_train_tokenizer)
    tg = tsub.add_parser("target", help="a dense (Qwen3) or hybrid (Qwen3.5) model from scratch")
    tg.add_argument("--arch", choices=["dense", "hybrid"], default="dense")
    _add_lm_flags(tg)
    tg.set_defaults(func=cmd_train_lm)
    td = tsub.add_parser("drafter", help="a drafter for a trained target")
    td.add_argument("--kind", choices=["draft-lm", "dflash", "dflash2", "dspark", "eagle3", "mtp"], default="draft-lm",
                    help="mtp: an MTP layer written into a copy of a Qwen3.5-style target (--target OUT --drafter mtp)")
    td.add_argument("--target", required=True, help="the target's directory (its tokenizer is reused)")
    td.add_argument("--block-size", type=int, default=8, 
                    help="dflash, dflash2, dspark: tokens per draft block (anchor included)")
    td.add_argument("--draft-layers", type=int, default=2, 
                    help="dflash, dflash2, dspark: decoder layers of the drafter")
    td.add_argument("--draft-intermediate-size", type=int, default=None,
                    help="dflash: MLP width of the drafter's layers (default: the target's)")
    td.add_argument("--greedy-path-labels", action="store_true",
                    help="dflash: count a deeper draft position's label only while the corpus text follows the "
                         "target's greedy tokens (the only labels inference asks for)")
    td.add_argument("--rollouts", type=int, default=0,
                    help="dflash/eagle3: train on N greedy rollouts of the target (self-distillation) instead of "
                         "the corpus text")
    td.add_argument("--rollout-prompt-len", type=int, default=None,
                    help="dflash: corpus tokens before each rollout's continuation (default: seq_len / 4, at most 32); "
                         "anchors are drawn in the continuation")
    td.add_argument("--rollout-temperature", type=float, nargs="+", default=[0.0], metavar="T",
                    help="dflash: sample the rollouts at T instead of greedily (0: greedy); several values: N "
                         "rollouts at each, joined")
    td.add_argument("--loss", choices=["ce", "kl"], default="ce",
                    help="dflash: ce, cross-entropy on the target's greedy token; kl, KL divergence from the "
                         "target's next-token distribution (soft labels: the draft follows the target at every "
                         "temperature)")
    td.add_argument("--init-from", default=None, metavar="DIR",
                    help="dflash: start from this DFlash drafter's weights (same shape) instead of a random init")
    td.add_argument("--anchors", type=int, default=16, 
                    help="dflash, dflash2, dspark: draft blocks drawn per training sequence")
    td.add_argument("--target-layers", default=None,
                    help="dflash: comma-separated target layers whose outputs feed the drafter (default: spread)")
    td.add_argument("--selector-rank", type=int, default=32, help="dflash2: the candidate selector's rank")
    td.add_argument("--selector-top-k", type=int, default=8, help="dflash2: candidates per slot")
    td.add_argument("--markov-rank", type=int, default=32, help="dspark: the Markov head's rank (0: none)")
    td.add_argument("--draft-vocab-size", type=int, default=None,
                    help="eagle3: the head's vocabulary (the corpus's most frequent tokens); default: all")
    _add_lm_flags(td, tokenizer=False)
    td.set_defaults(func=cmd_train_drafter)
    tz = tsub.add_parser("zoo", help="the bundled zoo: tokenizer, two targets, their drafters, then W12N")
    tz.add_argument("--out", required=True, help="new output directory")
    tz.add_argument("--work", default=None, help="intermediate checkpoints and logs (default: OUT.work); "
                    "an interrupted build resumes from the models finished there")
    tz.add_argument("--corpus", default=None, help="as for `train tokenizer` (default: this Python's .py files)")
    tz.add_argument("--max-files", type=int, default=ZOO_MAX_FILES, help="corpus files used (a hash-spread subset)")
    tz.add_argument("--steps-scale", type=float, default=1.0, help="multiply every job's steps (smoke runs)")
    tz.add_argument("--jobs", type=int, default=8, help="training processes run side by side")
    tz.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    tz.set_defaults(func=cmd_train_zoo)


def _add_corpus_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--corpus", default=None,
                   help="directory of text/code files or a .jsonl of {\"text\"}; default: this Python's .py files")
    p.add_argument("--max-files", type=int, default=None, help="use the first N files of the corpus")


def _add_lm_flags(p: argparse.ArgumentParser, tokenizer: bool = True) -> None:
    from specpilot.train.lm import TrainConfig

    _add_corpus_flags(p)
    if tokenizer:
        p.add_argument("--tokenizer", required=True, help="directory written by `specpilot train tokenizer`")
    d = TrainConfig()
    for name in ("steps", "batch_size", "seq_len", "warmup", "seed", "save_every", "eval_batches"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")


def _train_config(args):
    from specpilot.train.lm import TrainConfig

    return TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                       warmup=args.warmup, seed=args.seed, device=args.device, save_every=args.save_every,
                       eval_batches=args.eval_batches)


def cmd_train_tokenizer(args) -> int:
    from specpilot.train.corpus import load_corpus
    from specpilot.train.tokenizer import train_tokenizer

    corpus = load_corpus(args.corpus, max_files=args.max_files)
    out = train_tokenizer(corpus, args.out, args.vocab_size)
    err.print(f"tokenizer ({args.vocab_size} tokens) trained on {corpus.source} -> {out}")
    return 0


def cmd_train_lm(args) -> int:
    from specpilot.train.corpus import load_corpus
    from specpilot.train.lm import train_lm

    corpus = load_corpus(args.corpus, max_files=args.max_files)
    report = train_lm(corpus, args.tokenizer, args.out, args.arch, _train_config(args), args.resume, err)
    print(json.dumps(report))
    return 0


def cmd_train_drafter(args) -> int:
    from specpilot.train.corpus import load_corpus
    from specpilot.train.lm import train_lm

    dflash_only = [f for f, on in (("--loss", args.loss != "ce"),
                                   ("--rollout-temperature", args.rollout_temperature != [0.0]),
                                   ("--init-from", args.init_from is not None)) if on]
    if dflash_only and args.kind != "dflash":
        raise ValueError(f"{', '.join(dflash_only)}: only --kind dflash takes it (got --kind {args.kind})")
    corpus = load_corpus(args.corpus, max_files=args.max_files)
    if args.kind == "eagle3":
        from specpilot.train.eagle3 import train_eagle3

        report = train_eagle3(corpus, args.target, args.out, _train_config(args), args.draft_vocab_size,
                              args.rollouts, args.resume, console=err)
    elif args.kind == "dflash":
        from specpilot.train.dflash import train_dflash

        report = train_dflash(corpus, args.target, args.out, _train_config(args), args.block_size, args.draft_layers,
                              anchors=args.anchors, rollouts=args.rollouts, resume=args.resume, console=err,
                              greedy_path_labels=args.greedy_path_labels,
                              target_layers=_int_list(args.target_layers, "--target-layers"),
                              rollout_prompt_len=args.rollout_prompt_len,
                              intermediate_size=args.draft_intermediate_size, loss=args.loss,
                              rollout_temperatures=tuple(args.rollout_temperature), init_from=args.init_from)
    elif args.kind in ("dflash2", "dspark"):
        report = _train_block_drafter(args, corpus)
    elif args.kind == "mtp":
        from specpilot.train.mtp import train_mtp

        report = train_mtp(corpus, args.target, args.out, _train_config(args), args.resume, console=err)
    else:
        report = train_lm(corpus, args.target, args.out, "draft", _train_config(args), args.resume, err)
    print(json.dumps(report))
    return 0


def _train_block_drafter(args, corpus) -> dict:
    """DFlash2 or DSpark with the DFlash flags (block size, layers, anchors, rollouts, target layers, MLP width)."""
    kw = dict(block=args.block_size, num_layers=args.draft_layers, anchors=args.anchors, rollouts=args.rollouts,
              resume=args.resume, console=err, target_layers=_int_list(args.target_layers, "--target-layers"),
              rollout_prompt_len=args.rollout_prompt_len, intermediate_size=args.draft_intermediate_size)
    if args.kind == "dflash2":
        from specpilot.train.dflash2 import train_dflash2

        return train_dflash2(corpus, args.target, args.out, _train_config(args), rank=args.selector_rank,
                             top_k=args.selector_top_k, **kw)
    from specpilot.train.dspark import train_dspark

    return train_dspark(corpus, args.target, args.out, _train_config(args), markov_rank=args.markov_rank, **kw)


def _int_list(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise SystemExit(f"error: {flag} takes comma-separated integers, got {text!r}") from None


def cmd_train_zoo(args) -> int:
    from specpilot.train.zoo import build_zoo

    summary = build_zoo(args.out, args.work, args.corpus, args.max_files, args.steps_scale, args.device, args.jobs,
                        console=err)
    print(json.dumps({k: v for k, v in summary.items() if k != "models"} |
                     {"models": {n: {"bytes": m["bytes"], "parameters": m["parameters"]}
                                 for n, m in summary["models"].items()}}))
    return 0
