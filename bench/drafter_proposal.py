"""Each drafter's proposal time per step at the 27B shape against its own weight-read roofline, at batch 1 / 8 / 32.

The drafters users bring for a Qwen3.5 / Qwen3.8-27B target, with random weights in their published shapes
(specpilot.bench.shapes: DFlash v1 as `specpilot bench` builds it, DFlash2, DSpark, the target's MTP layer) on a
random target of the shape cut to --target-layers layers (the drafters read only its embedding, LM head and config;
the verify pass is not timed here). Per (drafter, batch): the requests start with --context random context features,
then every step commits --accepted random feature rows per request (an accepted path: the root and accepted - 1
drafts) and proposes the drafter's chain (--depth, capped at its block; the MTP chain at each of --mtp-depths; with
--mtp-draft-vocab N, the MTP rows again over a draft vocabulary of the first N ids, labelled `mtp:N` as --drafter
spells it: its LM head reads N rows per level; with --mtp-head fp8, rows `mtp+fp8` whose head is an FP8 copy).
Correctness first: two drafters of the same
weights, one stepped and one started on the whole committed context, propose the same tokens (the cache
bookkeeping): the fraction of equal draft tokens is recorded (1.0 on the CPU in fp32; in bf16 on a GPU the stepped
drafter's in-graph context extension and the whole one's eager pass take different kernels, and near-ties of random
weights may flip). Then --warmup and --reps timed steps: propose_ms
is the CUDA-event time of the whole propose() call (host preparation, the forward or its graph, the copy back: what
an engine step pays), the median.

Roofline: the bytes a proposal must read (every weight the drafter touches, once per level it runs: the LM head
once for a block drafter, once per level for the MTP chain, its N rows for `mtp:N`; DSpark's Markov W2 once per
slot; gathered rows of embeddings and codebooks; the context K/V it attends to) over the copy bandwidth measured in
the same run.
step_share: propose_ms / (propose_ms + the target's verify of batch x (depth + 1) tokens), the verify time read
from --verify-curve (the curve measured for this shape on this GPU, shipped with the package; absent: null).

    python3 -m bench drafter_proposal --mtp-draft-vocab 32768 --out bench/results/drafter_proposal_27b_h200.json
    python3 -m bench drafter_proposal --device cpu --target tiny-hybrid --batches 1 3 --context 24 --reps 2 \
        --warmup 1 --out /tmp/drafter_proposal.json   # CPU smoke run (tiny shapes, wall time)

The JSON is written again after every (drafter, batch); an error in one is recorded there and the rest goes on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.common import Report, attempt, copy_bandwidth, run_record, sync, time_ms
from specpilot.bench.shapes import (DRAFTER_SHAPES, SHAPES, hf_config, random_dflash, random_dflash2, random_dspark,
                                    random_model, random_mtp)
from specpilot.config import EngineConfig
from specpilot.engine.cost_curve import VerifyCostCurve
from specpilot.runtime.settings import Runtime
from specpilot.spec_decode.drafters.draft_vocab import DraftVocab
from specpilot.spec_decode.drafters.mtp import MTPDrafter
from specpilot.spec_decode.tree import TreeSpec

DRAFTERS = ("dflash", "dflash2", "dspark", "mtp")
CURVE = Path(__file__).resolve().parent.parent / "specpilot" / "data" / "cost_curves" / "nvidia-h200-8282aa02de44.json"


def build(kind: str, target, shape: str, runtime, draft_vocab: int | None = None, head: str = "bf16"):
    """draft_vocab (MTP): the first N ids as its draft vocabulary (None: the whole vocabulary); head (MTP): its LM
    head rows in bf16 or as an FP8 copy."""
    if kind == "dflash":
        return random_dflash(target, shape, runtime=runtime)
    if kind == "dflash2":
        return random_dflash2(target, shape, runtime=runtime)
    if kind == "dspark":
        return random_dspark(target, shape, runtime=runtime)
    drafter = random_mtp(target, runtime=runtime)
    if draft_vocab is None and head == "bf16":
        return drafter
    vocab = DraftVocab.first(draft_vocab) if draft_vocab is not None else None
    return MTPDrafter(drafter.model, target, runtime, vocab=vocab, head_format=head)


def label(kind: str, draft_vocab: int | None, head: str = "bf16") -> str:
    name = kind if draft_vocab is None else f"{kind}:{draft_vocab}"
    return name if head == "bf16" else f"{name}+{head}"


def feature_width(drafter) -> int:
    return drafter.config.hidden_size if drafter.name == "mtp" else drafter.model.fc.weight.shape[1]


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def roofline_bytes(drafter, target, n: int, depth: int, context: int) -> dict:
    """Bytes one proposal of n chains of `depth` must read, by part."""
    head, H = target.lm_head.weight, target.config.hidden_size
    row = H * head.element_size()
    if drafter.name == "mtp":
        layer = sum(_bytes(p) for p in drafter.model.parameters())
        cfg = drafter.config
        kv = 2 * cfg.num_key_value_heads * cfg.head_dim * drafter.cache.k.element_size()
        return {"weights": depth * layer, "lm_head": depth * _bytes(drafter.head_weight),
                "embedding_rows": n * depth * row,
                "context_kv": n * depth * (context + depth) * kv}
    model, parts = drafter.model, {}
    skip = set()
    if drafter.name == "dflash2":
        sel = model.candidate_selector
        skip = {id(sel.predecessor_codebook), id(sel.successor_codebook)}
        parts["codebook_rows"] = n * depth * (2 * sel.top_k) * sel.predecessor_codebook.shape[1] * \
            sel.predecessor_codebook.element_size()
    if drafter.name == "dspark":
        w1, w2 = model.markov_head.markov_w1.weight, model.markov_head.markov_w2.weight
        skip = {id(w1), id(w2)}
        parts["markov_w2"] = depth * _bytes(w2)  # one full [V, r] read per slot (the bias of every token)
        parts["markov_w1_rows"] = n * depth * w1.shape[1] * w1.element_size()
    parts["weights"] = sum(_bytes(p) for p in model.parameters() if id(p) not in skip)
    parts["lm_head"] = _bytes(head)
    parts["embedding_rows"] = n * drafter.block_size * row
    cfg = model.config
    kv = 2 * cfg.num_key_value_heads * cfg.head_dim * drafter.cache.k.element_size() * cfg.num_hidden_layers
    parts["context_kv"] = n * (context + drafter.block_size) * kv
    return parts


class Workload:
    """n requests of `context` random context rows, then `accepted` random rows committed per request per step."""

    def __init__(self, drafter, n: int, context: int, accepted: int, vocab: int, device, seed: int = 0):
        gen = torch.Generator(device=device).manual_seed(seed)
        width, dtype = feature_width(drafter), next(drafter.model.parameters()).dtype
        self.n, self.accepted, self.vocab = n, accepted, vocab
        self.context = [torch.randn(context, width, generator=gen, device=device).to(dtype) for _ in range(n)]
        self.rows = [torch.randn(accepted, width, generator=gen, device=device).to(dtype) for _ in range(4)]
        self.tokens = torch.randint(0, vocab, (64, n), generator=torch.Generator().manual_seed(seed)).tolist()

    def start(self, drafter) -> None:
        for slot, features in enumerate(self.context):
            drafter.start(slot, [1] * features.shape[0], features)

    def step(self, drafter, i: int, spec: TreeSpec):
        """Commits step i's accepted path (the first step commits nothing) and proposes."""
        if i:
            for slot in range(self.n):
                drafter.commit(slot, [2] * (self.accepted - 1), self.rows[i % len(self.rows)])
        return drafter.propose(list(range(self.n)), self.tokens[i % len(self.tokens)], spec)


def check(kind: str, target, shape: str, runtime, n: int, work: Workload, spec: TreeSpec, max_len: int,
          draft_vocab: int | None = None, head: str = "bf16") -> dict:
    """Stepped vs started-whole: the fourth step's proposal of a drafter that started and committed three accepted
    paths equals that of a drafter of the same weights started on the same committed tokens and features at once."""
    stepped, whole = (build(kind, target, shape, runtime, draft_vocab, head) for _ in range(2))
    whole.model.load_state_dict(stepped.model.state_dict())
    for d in (stepped, whole):
        d.allocate(n, max_len)
    work.start(stepped)
    for i in range(4):
        a = work.step(stepped, i, spec)
    for slot in range(n):
        ids = [1] * work.context[slot].shape[0]
        for i in range(3):  # step i + 1 committed step i's root and accepted - 1 drafts
            ids += [work.tokens[i][slot]] + [2] * (work.accepted - 1)
        ctx = torch.cat([work.context[slot]] + [work.rows[i % len(work.rows)] for i in (1, 2, 3)])
        whole.start(slot, ids, ctx)
    b = whole.propose(list(range(n)), work.tokens[3], spec)
    same = [x == y for ta, tb in zip(a, b) for x, y in zip(ta.tokens[1:], tb.tokens[1:])]
    return {"stepped_vs_whole_agreement": sum(same) / len(same)}


def measure(name: str, drafter, target, n: int, args, spec: TreeSpec, bandwidth: float, curve) -> dict:
    device = args.device
    drafter.allocate(n, args.context + args.accepted * (args.warmup + args.reps + 4) + 64)
    work = Workload(drafter, n, args.context, args.accepted, target.config.vocab_size, device)
    work.start(drafter)
    steps = iter(range(1 << 30))
    ms = time_ms(lambda: work.step(drafter, next(steps), spec), device, args.reps, args.warmup)
    depth = spec.depth
    parts = roofline_bytes(drafter, target, n, depth, args.context)
    roof_ms = sum(parts.values()) / bandwidth * 1e3
    propose = statistics.median(ms)
    row = {"drafter": name, "batch": n, "depth": depth, "propose_ms": round(propose, 4),
           "propose_ms_all": [round(x, 4) for x in ms], "roofline_ms": round(roof_ms, 4),
           "of_roofline": round(roof_ms / propose, 3), "bytes": parts, "graphs": bool(getattr(drafter, "graphs", None))}
    if drafter.name == "mtp":
        row["draft_vocab"] = drafter.head_weight.shape[0]
    if curve is not None:
        verify = curve.seconds(n * (depth + 1), n, args.context) * 1e3
        row["verify_ms_from_curve"] = round(verify, 4)
        row["step_share"] = round(propose / (propose + verify), 4)
    return row


def run(args, report: Report) -> None:
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    t0 = time.perf_counter()
    target = random_model(hf_config(args.target, num_hidden_layers=args.target_layers), device, dtype)
    runtime = Runtime.build(EngineConfig(), device)
    bandwidth = copy_bandwidth(device)
    curve = VerifyCostCurve.load(args.verify_curve) if args.verify_curve else None
    report["setup"] = {"target_built_s": round(time.perf_counter() - t0, 2),
                       "copy_bandwidth_gbs": round(bandwidth / 1e9, 1),
                       "verify_curve": str(args.verify_curve) if args.verify_curve else None}
    rows = report["rows"]
    runs = [(kind, v, h) for kind in args.drafters
            for v in [None] + (args.mtp_draft_vocab if kind == "mtp" else [])
            for h in (args.mtp_head if kind == "mtp" else ["bf16"])]
    for kind, vocab, head in runs:
        name = label(kind, vocab, head)
        drafter = attempt(name, build, kind, target, args.target, runtime, vocab, head)
        if isinstance(drafter, dict):
            rows.append({"drafter": name, **drafter})
            report.save()
            continue
        specs = [TreeSpec.parse(f"chain:{min(d, drafter.max_depth or d)}") for d in args.depth[kind]]
        checked = attempt(f"{name} check", check, kind, target, args.target, runtime, min(args.batches), Workload(
            drafter, min(args.batches), args.context, args.accepted, target.config.vocab_size, device), specs[-1],
            args.context + 64, vocab, head)
        report["checks"][name] = checked
        for spec in specs:
            for n in args.batches:
                row = attempt(f"{name} batch {n}", measure, name, drafter, target, n, args, spec, bandwidth, curve)
                rows.append(row if "drafter" in row else {"drafter": name, "batch": n, "depth": spec.depth, **row})
                _print(rows[-1], time.perf_counter() - t0)
                report.save()
        del drafter
        if device == "cuda":
            torch.cuda.empty_cache()
    sync(device)


def _print(row: dict, elapsed: float) -> None:
    if "error" in row:
        print(f"{row['drafter']:10s} batch {row.get('batch', '-'):>3}: ERROR {row['error'][:120]}", flush=True)
        return
    share = f" step share {row['step_share']:.1%}" if "step_share" in row else ""
    print(f"{row['drafter']:10s} batch {row['batch']:>3} chain:{row['depth']}: propose {row['propose_ms']:.3f} ms, "
          f"roofline {row['roofline_ms']:.3f} ms ({row['of_roofline']:.0%}){share}  [{elapsed:.0f} s]", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench drafter_proposal", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="Qwen3.5-27B",
                   help=f"shape: {', '.join(s for s in SHAPES if s in DRAFTER_SHAPES)}")
    p.add_argument("--target-layers", type=int, default=4, help="the random target's depth (its verify is not timed)")
    p.add_argument("--drafters", nargs="+", default=list(DRAFTERS), help=f"of {', '.join(DRAFTERS)}")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--context", type=int, default=512, help="context tokens per request at the first timed step")
    p.add_argument("--accepted", type=int, default=4, help="rows committed per request per step (root + drafts)")
    p.add_argument("--depth", type=int, default=None, help="chain depth (default: each block drafter's block)")
    p.add_argument("--mtp-depths", type=int, nargs="+", default=[1, 2, 3],
                   help="the MTP chain's depths, a row each (each level reads the layer and the LM head once)")
    p.add_argument("--mtp-draft-vocab", type=int, nargs="+", default=[], metavar="N",
                   help="the MTP rows again over a draft vocabulary of the first N ids (rows `mtp:N`), per N")
    p.add_argument("--mtp-head", nargs="+", default=["bf16"], choices=("bf16", "fp8"),
                   help="the MTP rows per LM head format (fp8: rows `mtp+fp8`, its head an FP8 copy, as --drafter "
                        "mtp+fp8)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--verify-curve", type=Path, default=None,
                   help="verify cost curve JSON for step_share (default: the shipped H200 curve for Qwen3.5-27B on "
                        "CUDA, none otherwise)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    bad = [d for d in args.drafters if d not in DRAFTERS]
    if args.target not in DRAFTER_SHAPES or args.target not in SHAPES:
        p.error(f"--target {args.target!r}: use one of {', '.join(s for s in SHAPES if s in DRAFTER_SHAPES)}")
    if bad:
        p.error(f"--drafters {bad}: use some of {', '.join(DRAFTERS)}")
    if min(args.batches) < 1 or args.context < 1 or args.accepted < 1 or args.reps < 1 or args.target_layers < 1:
        p.error("--batches, --context, --accepted, --reps and --target-layers must be >= 1")
    if (args.depth is not None and args.depth < 1) or min(args.mtp_depths) < 1:
        p.error("--depth and --mtp-depths must be >= 1")
    vocab = hf_config(args.target).vocab_size
    if args.mtp_draft_vocab and not (1 <= min(args.mtp_draft_vocab) and max(args.mtp_draft_vocab) <= vocab):
        p.error(f"--mtp-draft-vocab {args.mtp_draft_vocab}: each N must be in 1 .. {vocab} ({args.target}'s "
                "vocab_size)")
    if args.mtp_draft_vocab and "mtp" not in args.drafters:
        p.error("--mtp-draft-vocab adds MTP rows: put mtp in --drafters")
    if args.mtp_head != ["bf16"] and "mtp" not in args.drafters:
        p.error(f"--mtp-head {' '.join(args.mtp_head)} sets the MTP rows' head: put mtp in --drafters")
    if len(set(args.mtp_head)) != len(args.mtp_head):
        p.error(f"--mtp-head {' '.join(args.mtp_head)}: name each of bf16, fp8 at most once")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no GPU here; use --device cpu for the smoke run")
    if args.verify_curve is None and args.device == "cuda" and args.target == "Qwen3.5-27B" and CURVE.exists():
        args.verify_curve = CURVE
    args.depth = {k: [args.depth or 32] if k != "mtp" else args.mtp_depths for k in DRAFTERS}
    report = Report(args.out, {**run_record(args.device), "target": args.target, "target_layers": args.target_layers,
                               "context": args.context, "accepted": args.accepted, "rows": [], "checks": {}})
    run(args, report)
    _table(report["rows"])
    return 0


def _table(rows: list[dict]) -> None:
    print("\ndrafter    batch  depth  propose_ms  roofline_ms  of_roofline  step_share", file=sys.stdout)
    for r in rows:
        if "error" in r:
            continue
        share = f"{r['step_share']:.3f}" if "step_share" in r else "-"
        print(f"{r['drafter']:10s} {r['batch']:5d}  {r['depth']:5d}  {r['propose_ms']:10.3f}  {r['roofline_ms']:11.3f}"
              f"  {r['of_roofline']:11.2f}  {share:>10s}")
