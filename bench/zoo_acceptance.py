"""Acceptance report of the zoo: tau and per-depth acceptance of every drafter x target, greedy, on held-out
prompts (HumanEval by default: code the zoo never trained on), chain and tree.

Acceptance depends on the models and the prompts, not on the hardware, so this runs anywhere (CPU by default,
fp32). Requests run in batches through the speculative engine; every output goes through token forcing (one
stock teacher-forced pass) so a reported tau is a tau of lossless output. The JSON feeds the synthetic
acceptance profiles (specpilot/bench/synthetic.py).

    python3 -m bench zoo_acceptance --out bench/results/zoo_acceptance.json

Drafters trained elsewhere are measured against the zoo's targets with `--drafter-dir NAME=PATH` (NAME in --pairs
is read from PATH): their rows go under `candidates`, not `rows` (the zoo's own drafters, the synthetic profiles'
source), each with the drafter's training.json as `training`. A directory that is a target checkpoint with its MTP
layer (what `specpilot train drafter --kind mtp` writes) drafts with `--drafter mtp`, the target loaded from it
once its weights are checked to be the zoo target's. `--merge` adds this run's rows to the --out file, keeping
every row it has for other (target, drafter, tree) triples.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import time
from pathlib import Path

import torch
from safetensors import safe_open

from specpilot.checkpoint.json_file import write_json
from specpilot.engine.engine import SpecEngine
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.models.loader import load_model, load_tokenizer
from specpilot.prompts import load_prompts, resolve_prompt_set
from specpilot.spec_decode.drafters.registry import build_drafter
from specpilot.spec_decode.forcing import ForcingReport, force_check
from specpilot.spec_decode.tree import TreeSpec

PAIRS = (("dense", "dense-dflash"), ("dense", "dense-eagle3"), ("dense", "draft-lm"),
         ("hybrid", "hybrid-dflash"), ("hybrid", "mtp"), ("hybrid", "draft-lm"))  # mtp: the layer in zoo/hybrid


def measure(zoo: Path, target: str, drafter: str, tree: str, prompts: list[list[int]], new_tokens: int,
            batch: int, device: str, drafter_dir: Path | None = None) -> dict:
    """drafter_dir: where `drafter` is read from (default zoo / drafter; `mtp`: the target's own MTP layer)."""
    target_dir, source = drafter_source(zoo, target, drafter, drafter_dir)
    model = load_model(str(target_dir), device, "float32")
    tok = load_tokenizer(str(target_dir))
    runner = ModelRunner(model)
    draft = build_drafter(source, model, tok, runtime=runner.runtime)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    engine = SpecEngine(runner, draft, TreeSpec.parse(tree), scheduler=SchedulerConfig(adaptive=False))
    steps = emitted = 0
    drafted, accepted = [0] * 8, [0] * 8
    report, outputs = ForcingReport(), []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        for result, stats in engine.generate(prompts[i:i + batch], params):
            outputs.append(result.token_ids)
            steps += stats.steps
            emitted += len(result.token_ids)
            for counts, per_depth in ((drafted, stats.drafted_per_depth), (accepted, stats.accepted_per_depth)):
                for d, n in enumerate(per_depth):  # the two lists have their own lengths
                    counts[d] += n
    seconds = time.perf_counter() - t0
    checker = ModelRunner(model)
    for i, (p, out) in enumerate(zip(prompts, outputs)):
        force_check(checker, p, out, report, i)
    depth = [round(a / n, 4) if n else None for n, a in zip(drafted, accepted)]
    return {"target": target, "drafter": drafter, "tree": tree, "prompts": len(prompts), "tokens": emitted,
            "steps": steps, "tau": round(emitted / steps, 4), "acceptance_per_depth": depth,
            "drafted_per_depth": drafted, "accepted_per_depth": accepted, "seconds": round(seconds, 2),
            "forcing": {"tokens": report.tokens, "mismatches": len(report.mismatches),
                        "max_margin": report.max_margin, "passed": not report.failures(1e-3)}}


def drafter_source(zoo: Path, target: str, drafter: str, drafter_dir: Path | None) -> tuple[Path, str]:
    """(the directory the target is loaded from, the drafter's name for build_drafter). A drafter directory that is
    the target's checkpoint with an MTP layer is both, once its target tensors (every stored tensor but `mtp.*`) are
    byte for byte the zoo target's."""
    if drafter in ("mtp", "mtp+fp8"):  # the layer in the target's own checkpoint (+fp8: its head as an FP8 copy)
        return zoo / target, drafter
    path = drafter_dir if drafter_dir is not None else zoo / drafter
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else {}
    if "mtp_num_hidden_layers" not in config.get("text_config", config):
        return zoo / target, str(path)
    theirs, ours = _target_tensors(path), _target_tensors(zoo / target)
    differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
    if differ:
        raise ValueError(f"{path}: its target weights ({len(differ)} tensors differ, e.g. {differ[0]}) are not those "
                         f"of {zoo / target}; an MTP layer is measured on the target it was trained for (train it "
                         f"with --target {zoo / target})")
    return path, "mtp"


def _target_tensors(model_dir: Path) -> dict[str, str]:
    """Stored tensor name -> SHA-256 of its bytes, over the directory's safetensors files, the MTP layer's left out
    (the zoo's hybrid carries one in its own file; a trained MTP directory has its own in another)."""
    digests = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                if not k.startswith("mtp."):
                    raw = h.get_tensor(k).contiguous().reshape(-1).view(torch.uint8)
                    digests[k] = hashlib.sha256(raw.numpy()).hexdigest()
    return digests


def merge_rows(doc: dict, key: str, rows: list[dict]) -> None:
    """doc[key] with `rows` added: a row for the same (target, drafter, tree) is replaced, every other kept."""
    new = {(r["target"], r["drafter"], r["tree"]) for r in rows}
    doc[key] = [r for r in doc.get(key, []) if (r["target"], r["drafter"], r["tree"]) not in new] + rows


def chain_profile(row: dict) -> dict:
    """A synthetic-acceptance profile (specpilot/bench/profiles) from a measured chain row: per depth, the chance
    that the drafted token is right given that its parent was (accepted at d / accepted at d-1)."""
    reached, per_depth = row["steps"], []
    for drafted, accepted in zip(row["drafted_per_depth"], row["accepted_per_depth"]):
        if not reached or not drafted:
            break
        per_depth.append(round(accepted / reached, 4))
        reached = accepted
    name = row["drafter"] if row["drafter"].startswith(row["target"]) else f"{row['target']}-{row['drafter']}"
    return {"name": f"zoo-{name}", "per_depth": per_depth, "sibling_decay": 0.5,
            "source": f"measured: zoo {row['target']} + {row['drafter']}, {row['tree']}, {row['prompts']} HumanEval "
                      f"prompts, greedy, {row['tokens'] // row['prompts']} new tokens, tau {row['tau']} "
                      "(bench/results/zoo_acceptance.json); sibling_decay assumed"}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench zoo_acceptance", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--zoo", default="zoo")
    p.add_argument("--prompts", default="humaneval")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--trees", nargs="+", default=["chain:7", "dynamic:4,7,24"])
    p.add_argument("--pairs", nargs="+", default=[f"{t}:{d}" for t, d in PAIRS], help="TARGET:DRAFTER names")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--profiles", default=None, help="also write each zoo chain row as a synthetic profile here")
    p.add_argument("--drafter-dir", nargs="+", default=[], metavar="NAME=PATH",
                   help="read drafter NAME of --pairs from PATH (a drafter trained elsewhere): its rows go under "
                        "`candidates` with its training.json")
    p.add_argument("--merge", action="store_true",
                   help="add this run's rows to the --out file, keeping its other rows (default: write it anew)")
    args = p.parse_args(argv)
    zoo, out = Path(args.zoo), Path(args.out)
    try:
        dirs = _drafter_dirs(args.drafter_dir)
        for pair in args.pairs:
            target, _, drafter = pair.partition(":")
            drafter_source(zoo, target, drafter, dirs.get(drafter))
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    if args.merge and not out.exists():
        p.error(f"--merge: {out} does not exist; run without --merge to write it")
    tok = load_tokenizer(str(zoo / "dense"))
    texts = [q.text for q in load_prompts(resolve_prompt_set(args.prompts), args.limit)]
    prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = "python3 -m bench zoo_acceptance " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(v) if isinstance(v, list) else v}" for k, v in vars(args).items()
        if k not in ("out", "merge") and v not in (None, [])) + (" --merge" if args.merge else "")
    doc = json.loads(out.read_text()) if args.merge else {
        "command": command, "commit": commit, "device": args.device, "cpu": platform.processor() or platform.machine(),
        "zoo": json.loads((zoo / "zoo.json").read_text()).get("built_at_commit"), "dtype": "float32",
        "prompts": args.prompts, "greedy": True, "rows": []}
    with torch.no_grad():  # not set_grad_enabled(False): a caller's grad mode stays as it was
        for pair in args.pairs:
            target, drafter = pair.split(":")
            for tree in args.trees:
                row = measure(zoo, target, drafter, tree, prompts, args.max_new_tokens, args.batch, args.device,
                              dirs.get(drafter))
                key = "rows"
                if drafter in dirs:
                    key, row["drafter_dir"] = "candidates", str(dirs[drafter])
                    row["training"] = json.loads((dirs[drafter] / "training.json").read_text())
                if args.merge:  # read again: another run may have merged its rows meanwhile
                    row |= {"command": command, "commit": commit}
                    doc = json.loads(out.read_text())
                merge_rows(doc, key, [row])
                write_json(out, doc)
                if args.profiles and key == "rows" and row["tree"].startswith("chain"):
                    prof = chain_profile(row)
                    Path(args.profiles).mkdir(parents=True, exist_ok=True)
                    Path(args.profiles, f"{prof['name']}.json").write_text(json.dumps(prof, indent=1) + "\n")
                print(f"{target:7s} {drafter:14s} {tree:16s} tau {row['tau']:.2f} per depth "
                      f"{row['acceptance_per_depth']} forcing {'pass' if row['forcing']['passed'] else 'FAIL'} "
                      f"({row['seconds']:.0f} s)", flush=True)


def _drafter_dirs(specs: list[str]) -> dict[str, Path]:
    dirs = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--drafter-dir {spec!r}: give NAME=PATH (the drafter's name in --pairs, its directory)")
        if not Path(path, "training.json").exists():
            raise ValueError(f"--drafter-dir {spec!r}: {path}/training.json not found; give a directory that "
                             "`specpilot train drafter` wrote")
        dirs[name] = Path(path)
    return dirs
