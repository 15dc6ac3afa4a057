"""`specpilot train zoo`: the bundled zoo rebuilt by one command.

The recipe is data (ZOO_RECIPE): a tokenizer, a dense and a hybrid target, a DFlash drafter for each, an EAGLE-3
head for the dense one, an MTP layer for the hybrid one (written into the hybrid target's directory, as Qwen3.5
checkpoints carry it: `--drafter mtp`), and one draft LM (both targets share the tokenizer, so one draft LM serves
both). Jobs of a stage
are independent and run as parallel `specpilot train` processes (tiny models leave a GPU mostly idle); each
writes a log. The corpus is tokenized once, before the first model stage, into the token cache every job reads.
Finally every model is written W12N (lossless) into the output directory with a zoo.json summary. A job whose
model already sits in the work directory is skipped, so a zoo can be rebuilt from an earlier one's targets.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Job:
    name: str  # the model's directory in the work directory (and in the zoo, unless `into` is set)
    args: tuple[str, ...]  # `specpilot train ...` arguments, {work} standing for the work directory
    steps: int
    into: str | None = None  # the zoo model this job's output stands in for (an MTP layer: its target plus the layer)


_DRAFTER = ("--batch-size", "16", "--seq-len", "512", "--lr", "2e-3", "--warmup", "100")
# stages run in order; the jobs of a stage run side by side
ZOO_RECIPE: tuple[tuple[Job, ...], ...] = (
    (Job("dense", ("target", "--arch", "dense", "--tokenizer", "{work}/tokenizer", "--batch-size", "32",
                   "--seq-len", "512", "--lr", "2e-3", "--warmup", "200"), 3000),
     Job("hybrid", ("target", "--arch", "hybrid", "--tokenizer", "{work}/tokenizer", "--batch-size", "32",
                    "--seq-len", "512", "--lr", "2e-3", "--warmup", "200"), 2500),
     Job("draft-lm", ("drafter", "--kind", "draft-lm", "--target", "{work}/tokenizer", "--batch-size", "32",
                      "--seq-len", "512", "--lr", "3e-3", "--warmup", "200"), 2000)),
    # The EAGLE-3 head and the MTP layer learn the target's greedy tokens on corpus text; DFlash drafters (three
    # layers) learn from request-like rollouts: 384 corpus tokens, then 128 of the target's own, anchors in the
    # generated part, 64 per sequence, target layers 1, 4, 7; the hybrid's narrower MLP keeps the zoo in 32 MB. Why,
    # with the figures: docs/decisions/2026-12-01-zoo-drafter-recipe.md. The MTP layer's recipe is the CPU run that
    # replaced the hybrid EAGLE-3 head (docs/decisions/2026-12-02-zoo-hybrid-mtp.md).
    tuple(Job(f"{t}-dflash", ("drafter", "--kind", "dflash", "--target", f"{{work}}/{t}", *_DRAFTER, "--block-size",
                              "8", "--draft-layers", "3", *mlp, "--anchors", "64", "--rollouts", "12288",
                              "--rollout-prompt-len", "384", "--target-layers", "1,4,7"), steps)
          for t, mlp, steps in (("dense", (), 2600), ("hybrid", ("--draft-intermediate-size", "384"), 5200))) +
    (Job("dense-eagle3", ("drafter", "--kind", "eagle3", "--target", "{work}/dense", *_DRAFTER, "--draft-vocab-size",
                          "2048"), 2000),
     Job("hybrid-mtp", ("drafter", "--kind", "mtp", "--target", "{work}/hybrid", "--batch-size", "8", "--seq-len",
                        "512", "--lr", "2e-3", "--warmup", "50"), 400, into="hybrid")),
)
VOCAB_SIZE = 4096
ZOO_MAX_FILES = 12000  # ~150 MB of code: about one epoch for the targets' 49M training tokens


def build_zoo(out: str | Path, work: str | Path | None = None, corpus: str | None = None,
              max_files: int | None = ZOO_MAX_FILES, steps_scale: float = 1.0, device: str = "auto", jobs: int = 8,
              console=None) -> dict:
    """Trains every model of the recipe and writes the W12N zoo to `out` (which must not exist yet)."""
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists; choose a new output directory")
    work = Path(work) if work is not None else out.with_name(out.name + ".work")
    (work / "logs").mkdir(parents=True, exist_ok=True)
    common = _corpus_args(corpus, max_files) + ("--device", device)
    t0 = time.perf_counter()
    if not (work / "tokenizer" / "tokenizer.json").exists():
        _run_all([("tokenizer", ("tokenizer", "--out", str(work / "tokenizer"), "--vocab-size", str(VOCAB_SIZE),
                                 *_corpus_args(corpus, max_files)))], work, jobs, console)
    _tokenize_once(work / "tokenizer", corpus, max_files)
    for stage in ZOO_RECIPE:
        todo = [(j.name, (*_fill(j.args, work), "--out", str(work / j.name), "--steps",
                          str(max(1, round(j.steps * steps_scale))), *common))
                for j in stage if not (work / j.name / "training.json").exists()]
        _run_all(todo, work, jobs, console)
    summary = _write_zoo(work, out, time.perf_counter() - t0)
    if console is not None:
        console.print(f"zoo written to {out} ({summary['total_bytes'] / 1e6:.1f} MB)")
    return summary


def _corpus_args(corpus: str | None, max_files: int | None) -> tuple[str, ...]:
    args = ("--corpus", corpus) if corpus else ()
    return args + (("--max-files", str(max_files)) if max_files else ())


def _fill(args: tuple[str, ...], work: Path) -> tuple[str, ...]:
    return tuple(a.replace("{work}", str(work)) for a in args)


def _tokenize_once(tokenizer_dir: Path, corpus: str | None, max_files: int | None) -> None:
    from transformers import AutoTokenizer

    from specpilot.train.corpus import load_corpus
    from specpilot.train.tokens import corpus_tokens

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    corpus_tokens(load_corpus(corpus, max_files=max_files), tok)


def _run_all(todo: list[tuple[str, tuple[str, ...]]], work: Path, jobs: int, console) -> None:
    """Runs `specpilot train` jobs, at most `jobs` at once; any failure stops the zoo with the job's log tail."""
    pending, running = list(todo), {}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    while pending or running:
        while pending and len(running) < jobs:
            name, args = pending.pop(0)
            log = open(work / "logs" / f"{name}.log", "w")
            cmd = [sys.executable, "-m", "specpilot", "train", *args]
            running[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log,
                             time.perf_counter())
            if console is not None:
                console.print(f"[dim]start[/] {name}: specpilot train {' '.join(args)}")
        time.sleep(0.5)
        for name, (proc, log, start) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[name]
            if proc.returncode != 0:
                for p, _, _ in running.values():
                    p.kill()
                tail = (work / "logs" / f"{name}.log").read_text()[-3000:]
                raise RuntimeError(f"zoo job {name} failed (exit {proc.returncode}); log tail:\n{tail}")
            if console is not None:
                console.print(f"[green]done[/] {name} in {time.perf_counter() - start:.0f} s")


def _write_zoo(work: Path, out: Path, seconds: float) -> dict:
    from specpilot.weights.compress import compress, inspect, totals

    jobs = [j for stage in ZOO_RECIPE for j in stage]
    source = {j.name: j.name for j in jobs if j.into is None} | {j.into: j.name for j in jobs if j.into is not None}
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    models = {}
    for name in (j.name for j in jobs if j.into is None):
        src = work / source[name]
        if (src / "w12n.json").exists():  # a model carried over from an earlier zoo: already W12N
            shutil.copytree(src, tmp / name)
            reports = inspect(str(tmp / name))
        else:
            reports = compress(str(src), tmp / name)
        training = json.loads((src / "training.json").read_text())
        size = sum(f.stat().st_size for f in (tmp / name).iterdir())
        total = totals(reports)
        models[name] = {"bytes": size, "parameters": total["parameters"],
                        "w12n_bits_per_weight": total["w12n_bits_per_weight"], "training": training}
    summary = {"models": models, "total_bytes": sum(m["bytes"] for m in models.values()),
               "build_seconds": seconds, "vocab_size": VOCAB_SIZE}
    (tmp / "zoo.json").write_text(json.dumps(summary, indent=1))
    tmp.rename(out)
    return summary
