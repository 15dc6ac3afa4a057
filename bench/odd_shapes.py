"""Odd shapes: every configuration the loader accepts runs on the GPU, and its greedy output is transformers'.

Tiny random checkpoints written by transformers' own classes over a grid of odd shapes (attention head dims
48 / 80 / 96 with odd head counts; Gated DeltaNet key and value head dims 48 / 96, value/key head ratios 1 / 2 / 3,
full_attention_interval 2 / 3), saved as safetensors and loaded by our loader in fp32 with the default engine (CUDA
graphs, Triton kernels). Per config:
- our AR greedy output equals transformers' `model.generate(do_sample=False)`, token for token;
- our speculative output equals our AR output, with each drafter (n-gram; a draft LM that is a smaller random
  checkpoint of the same vocabulary, whose drafts the target mostly rejects; the target's own checkpoint as its
  draft LM, whose drafts it accepts, so that multi-token commits run) on chain and dynamic trees.
Recorded per config: pass / fail, the ops whose kernel could not take the shapes and ran their reference
(specpilot.ops.dispatch.fallbacks), any exception, and the smallest top-2 logit margin along transformers' greedy
path (so that a mismatch at a near-tie can be told from a wrong kernel). The LM head is scaled up so that random
weights give peaked next-token distributions. Exit status 1 if any config fails. With --jobs > 1 each config runs
in a process of its own (Triton and inductor compile on the host's cores in parallel, and a kernel fault that kills
a CUDA context stays inside its config).

    python3 -m bench odd_shapes --out $OUT/odd_shapes.json              # GPU: every config at once
    python3 -m bench odd_shapes --device cpu --quick --out /tmp/odd.json  # the plumbing, on CPU
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from bench.common import Report, attempt, run_record
from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.models.loader import load_model, load_tokenizer
from specpilot.models.random_checkpoint import randomize, write_tokenizer
from specpilot.ops import dispatch
from specpilot.spec_decode.drafters.registry import build_drafter
from specpilot.spec_decode.tree import TreeSpec

VOCAB = 384
LM_HEAD_SCALE = 8.0  # random weights give nearly flat logits; a larger head spreads them (argmax unchanged)
TEXTS = ["def add(a, b):\n    return a + b\n", "the quick brown fox jumps over the lazy dog. " * 4] * 20
TREES = ("chain:5", "dynamic:3,4,12")
DRAFTERS = ("ngram", "draft-lm", "self")  # self: the target's checkpoint as a draft LM


@dataclass(frozen=True)
class Shape:
    """One grid point: an attention-only model (llama / qwen3) or a Qwen3.5 hybrid."""

    name: str
    family: str  # "llama" | "qwen3" | "qwen3_5"
    head_dim: int
    heads: int
    kv_heads: int
    key_dim: int = 0  # Gated DeltaNet key / value head dims, value heads per key head, full-attention interval
    value_dim: int = 0
    ratio: int = 0
    key_heads: int = 0
    interval: int = 0

    def hf_config(self, hidden: int, layers: int):
        common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 3 // 2,
                      num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, head_dim=self.head_dim,
                      max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False)
        if self.family == "qwen3_5":
            return transformers.Qwen3_5TextConfig(
                **common, num_hidden_layers=self.interval * layers, linear_num_key_heads=self.key_heads,
                linear_num_value_heads=self.key_heads * self.ratio, linear_key_head_dim=self.key_dim,
                linear_value_head_dim=self.value_dim, full_attention_interval=self.interval,
                architectures=["Qwen3_5ForCausalLM"])
        cls, arch = ((transformers.LlamaConfig, "LlamaForCausalLM") if self.family == "llama"
                     else (transformers.Qwen3Config, "Qwen3ForCausalLM"))
        return cls(**common, num_hidden_layers=layers + 1, architectures=[arch])


# every odd value of the grid at least once: attention head dims 48 / 80 / 96 with GQA groups of 1, 3, 5, 2;
# GDN key / value head dims 48 / 96 in all four pairings, value/key head ratios 1 / 2 / 3, intervals 2 / 3
GRID = (
    Shape("qwen3-d80-h5kv1", "qwen3", 80, 5, 1),
    Shape("llama-d48-h6kv2", "llama", 48, 6, 2),
    Shape("llama-d96-h3kv3", "llama", 96, 3, 3),
    Shape("qwen3_5-d48-k48v96-r3-i2", "qwen3_5", 48, 3, 1, 48, 96, 3, 1, 2),
    Shape("qwen3_5-d80-k96v48-r2-i3", "qwen3_5", 80, 4, 2, 96, 48, 2, 2, 3),
    Shape("qwen3_5-d96-k96v96-r1-i2", "qwen3_5", 96, 5, 1, 96, 96, 1, 2, 2),
    Shape("qwen3_5-d80-k48v48-r3-i3", "qwen3_5", 80, 6, 3, 48, 48, 3, 1, 3),
)
QUICK = ("llama-d48-h6kv2", "qwen3_5-d48-k48v96-r3-i2")
DRAFT = Shape("draft-qwen3-d48-h3kv1", "qwen3", 48, 3, 1)


@dataclass(frozen=True)
class Sizes:
    hidden: int
    layers: int  # attention-only: layers + 1; hybrid: `layers` full-attention layers, each after interval - 1 GDN
    prompt_lens: tuple[int, ...]
    new_tokens: int


FULL = Sizes(hidden=120, layers=2, prompt_lens=(70, 9), new_tokens=24)  # 70: the chunked GDN prefill over 2 chunks
SMALL = Sizes(hidden=60, layers=1, prompt_lens=(20, 5), new_tokens=8)


def write_checkpoint(shape: Shape, sizes: Sizes, path: Path, seed: int):
    """A random transformers model of the shape saved as safetensors (with a tokenizer); returns the model."""
    config = shape.hf_config(sizes.hidden, sizes.layers)
    torch.manual_seed(seed)
    model = getattr(transformers, config.architectures[0])(config).eval()
    randomize(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path, VOCAB, TEXTS)
    return model


def prompts_for(sizes: Sizes, seed: int) -> list[list[int]]:
    """Random token ids with a repeated stretch (so the n-gram drafter finds matches); never a lone token."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes.prompt_lens:
        motif = torch.randint(0, VOCAB, (max(2, n // 3),), generator=gen).tolist()
        out.append((motif * 4)[:n])
    return out


def hf_greedy(model, prompts: list[list[int]], new_tokens: int, device: str) -> tuple[list[list[int]], float]:
    """transformers' greedy continuation of each prompt, and the smallest top-2 logit margin along the way."""
    model.generation_config.eos_token_id = None  # no early stop: every run emits new_tokens
    model.generation_config.pad_token_id = 0
    outs, margin = [], float("inf")
    for p in prompts:
        ids = torch.tensor([p], device=device)
        with torch.no_grad():
            res = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True)
        outs.append(res.sequences[0, len(p):].tolist())
        for scores in res.scores:
            top = scores[0].float().topk(2).values
            margin = min(margin, float(top[0] - top[1]))
    return outs, margin


def first_difference(want: list[list[int]], got: list[list[int]]) -> dict | None:
    for i, (w, g) in enumerate(zip(want, got)):
        if w != g:
            at = next((j for j, (a, b) in enumerate(zip(w, g)) if a != b), min(len(w), len(g)))
            return {"prompt": i, "position": at, "want": w[at:at + 4], "got": g[at:at + 4]}
    return None


def run_shape(shape: Shape, sizes: Sizes, root: Path, draft_dir: Path, device: str) -> dict:
    """Checks one grid point; the result dict has "ok" and the details of each comparison."""
    path = root / shape.name
    hf = write_checkpoint(shape, sizes, path, seed=zlib.crc32(shape.name.encode()) % 1000)
    prompts = prompts_for(sizes, seed=7)
    hf = hf.to(device)
    want, margin = hf_greedy(hf, prompts, sizes.new_tokens, device)
    del hf
    dispatch.clear_fallbacks()
    model = load_model(str(path), device, "float32")
    params = SamplingParams(max_new_tokens=sizes.new_tokens, ignore_eos=True)
    runner = ModelRunner(model)
    ar = [r.token_ids for r in Generator(runner).generate(prompts, params)]
    out = {"hf_min_top2_margin": round(margin, 4), "ar_equals_hf": ar == want, "ar_diff": first_difference(want, ar),
           "spec": {}}
    tokenizer = load_tokenizer(str(path))
    sources = {"ngram": "ngram", "draft-lm": str(draft_dir), "self": str(path)}
    for drafter_name in DRAFTERS:
        for tree in TREES:
            label = f"{drafter_name} {tree}"
            spec_runner = ModelRunner(model)
            drafter = build_drafter(sources[drafter_name], model, tokenizer, runtime=spec_runner.runtime)
            engine = SpecEngine(spec_runner, drafter, TreeSpec.parse(tree))
            run = attempt(f"{shape.name} {label}", engine.generate, prompts, params)
            if isinstance(run, dict):  # the error record of attempt()
                out["spec"][label] = {"ok": False, "error": run["error"]}
                continue
            got = [r.token_ids for r, _ in run]
            tau = sum(s.emitted for _, s in run) / max(1, sum(s.steps for _, s in run))
            out["spec"][label] = {"ok": got == ar, "tau": round(tau, 3), "diff": first_difference(ar, got)}
    out["fallbacks"] = dispatch.fallbacks()
    out["ok"] = out["ar_equals_hf"] and all(s["ok"] for s in out["spec"].values())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench odd_shapes", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON report path")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help=f"two configs ({', '.join(QUICK)}) at tiny sizes")
    p.add_argument("--configs", nargs="+", default=None, help="grid points by name (default: all, or --quick's)")
    p.add_argument("--jobs", type=int, default=None, help="configs run at once, one process each (default: 8 on "
                   "cuda, 1 on cpu)")
    args = p.parse_args(argv)
    jobs = args.jobs if args.jobs is not None else (8 if args.device == "cuda" else 1)
    if jobs < 1:
        print(f"error: --jobs {jobs}: must be at least 1", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible; use --device cpu --quick", file=sys.stderr)
        return 2
    names = args.configs or ([s.name for s in GRID if s.name in QUICK] if args.quick else [s.name for s in GRID])
    unknown = set(names) - {s.name for s in GRID}
    if unknown:
        print(f"error: --configs {sorted(unknown)}: use names from {[s.name for s in GRID]}", file=sys.stderr)
        return 2
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on both sides (transformers' and ours)
    torch.backends.cudnn.allow_tf32 = False
    sizes = SMALL if args.quick else FULL
    report = Report(args.out, {**run_record(args.device), "sizes": sizes.__dict__, "lm_head_scale": LM_HEAD_SCALE,
                               "trees": TREES, "drafters": DRAFTERS, "configs": {}})
    t_all = time.perf_counter()
    if jobs > 1 and len(names) > 1:
        results = _in_processes(names, args, jobs)
    else:
        results = _in_this_process(names, sizes, args.device)
    for name, res in results:
        report["configs"] = {**report["configs"], name: res}
        print(f"{name}: {'pass' if res['ok'] else 'FAIL'} ({res['seconds']} s)", flush=True)
    report["configs"] = {n: report["configs"][n] for n in names}  # grid order
    report["seconds"] = round(time.perf_counter() - t_all, 1)
    report["ok"] = all(r["ok"] for r in report["configs"].values())
    _table(report.data)
    return 0 if report["ok"] else 1


def _in_this_process(names: list[str], sizes: Sizes, device: str):
    """(name, result) per config, as each finishes."""
    with tempfile.TemporaryDirectory(prefix="odd_shapes-") as tmp:
        root = Path(tmp)
        write_checkpoint(DRAFT, SMALL, root / DRAFT.name, seed=1)
        for shape in (s for s in GRID if s.name in names):
            t0 = time.perf_counter()
            res = attempt(shape.name, run_shape, shape, sizes, root, root / DRAFT.name, device)
            res.setdefault("ok", False)
            res["shape"], res["seconds"] = shape.__dict__, round(time.perf_counter() - t0, 1)
            yield shape.name, res


def _in_processes(names: list[str], args, jobs: int):
    """(name, result) per config, as each finishes: this benchmark on one config per process, `jobs` at a time."""
    with tempfile.TemporaryDirectory(prefix="odd_shapes-") as tmp, ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(_child, name, args, Path(tmp)): name for name in names}
        for future in as_completed(futures):
            yield futures[future], future.result()


def _child(name: str, args, tmp: Path) -> dict:
    out, log = tmp / f"{name}.json", tmp / f"{name}.log"
    cmd = [sys.executable, "-m", "bench", "odd_shapes", "--out", str(out), "--device", args.device, "--configs", name,
           "--jobs", "1"] + (["--quick"] if args.quick else [])
    t0 = time.perf_counter()
    with open(log, "w") as f:  # from the repository root, where `-m bench` finds the package
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1]).returncode
    try:
        return json.loads(out.read_text())["configs"][name]
    except (OSError, ValueError, KeyError):  # the child died before it wrote its result
        tail = log.read_text()[-3000:] if log.exists() else ""
        return {"ok": False, "error": f"the config's process exited with status {rc}", "log_tail": tail,
                "seconds": round(time.perf_counter() - t0, 1)}


def _table(data: dict) -> None:
    print(f"\n{data['gpu']}  torch {data['torch']}  triton {data['triton']}  transformers {data['transformers']}  "
          f"commit {data['commit'][:10]}  {data['seconds']} s")
    print(f"{'config':28} {'AR=HF':6} {'spec=AR':8} {'margin':>7} {'fallbacks':24} error")
    for name, r in data["configs"].items():
        spec = r.get("spec", {})
        passed = sum(s["ok"] for s in spec.values())
        fell = ",".join(sorted(r.get("fallbacks", {}))) or "-"
        error = (r.get("error") or "").splitlines()[0][:60] if r.get("error") else ""
        print(f"{name:28} {str(r.get('ar_equals_hf', '-')):6} {f'{passed}/{len(spec)}':8} "
              f"{r.get('hf_min_top2_margin', float('nan')):7.3f} {fell:24} {error}")
    print("PASS" if data["ok"] else "FAIL")

