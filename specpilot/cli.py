"""The `specpilot` command: `demo` (bundled tiny model, CPU, no network) and `generate` (any checkpoint).

Text streams to stdout and a stats line follows; with --json exactly one JSON object goes to stdout.
Errors go to stderr with exit status 2 (bad input) or 1 (anything else).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rich.console import Console

from specpilot.config import ConfigError, EngineConfig
from specpilot.models.loader import CheckpointError

err = Console(stderr=True, highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (CheckpointError, ConfigError, ValueError, NotImplementedError, FileNotFoundError) as e:
        err.print(f"[bold red]error:[/] {e}", markup=True)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specpilot", description="Lossless speculative decoding for HF LLMs")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt with a local or Hub checkpoint")
    g.add_argument("--target", required=True, help="model directory or Hub repo id (org/name)")
    g.add_argument("--prompt", required=True, help="prompt text")
    _add_generation_flags(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    g.add_argument("--cache-dir", default=None, help="Hugging Face cache directory (default: HF_HOME)")
    g.set_defaults(func=cmd_generate)
    d = sub.add_parser("demo", help="run generation on the bundled tiny model (random weights for now)")
    _add_generation_flags(d, max_new_tokens=48)
    d.add_argument("--prompt", default="def fibonacci(n):\n", help="prompt text")
    d.set_defaults(func=cmd_demo)
    return p


def _add_generation_flags(p: argparse.ArgumentParser, max_new_tokens: int = 128) -> None:
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs, torch.compile or Triton GEMV (debugging)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available on this machine; use --device cpu")
    return name


def cmd_generate(args) -> int:
    from specpilot.models.loader import load_model, load_tokenizer

    device = _device(args.device)
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(args.target, args.cache_dir)
    model = load_model(args.target, device, args.dtype, args.cache_dir)
    load_s = time.perf_counter() - t0
    return run_generation(args, model, tokenizer, load_s)


def cmd_demo(args) -> int:
    from specpilot.demo import demo_checkpoint
    from specpilot.models.loader import load_model, load_tokenizer

    device = _device(args.device)
    path = demo_checkpoint(err)
    if not args.json:
        err.print("[yellow]specpilot demo: a tiny Qwen3.5-style hybrid model with RANDOM weights; the text is noise "
                  "until the trained zoo lands. It shows the runtime end to end.[/]")
    t0 = time.perf_counter()
    tokenizer, model = load_tokenizer(str(path)), load_model(str(path), device, args.dtype)
    args.chat = False
    return run_generation(args, model, tokenizer, time.perf_counter() - t0)


def run_generation(args, model, tokenizer, load_s: float) -> int:
    from specpilot.engine.generator import Generator
    from specpilot.engine.runner import ModelRunner
    from specpilot.engine.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, stop=tuple(args.stop), ignore_eos=args.ignore_eos)
    prompt_ids = encode_prompt(tokenizer, args.prompt, args.chat)
    engine = EngineConfig(cuda_graphs=not args.eager, compile_pointwise=not args.eager, decode_gemv=not args.eager)
    eos = tuple(model.config.eos_token_ids) + ((tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
    gen = Generator(ModelRunner(model, engine), eos, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    stream = None if args.json else _Streamer(tokenizer, params.stop)
    result = gen.generate([prompt_ids], params, on_token=stream.push if stream else None)[0]
    if stream:
        stream.finish(result.text)
    stats = _stats(result, load_s, model.config.architecture)
    if args.json:
        print(json.dumps({"token_ids": result.token_ids, "text": result.text, "stats": stats}))
    else:
        err.print(f"[dim]{stats['tokens']} tokens · {stats['tok_per_s']:.1f} tok/s decode · "
                  f"TTFT {stats['ttft_s'] * 1000:.0f} ms · {stats['finish_reason']} · load {load_s:.1f} s[/]")
    return 0


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
    """Prints the new part of the detokenised text as tokens arrive.

    Holds back incomplete UTF-8 and the last characters that could still begin a stop string, so a stop
    string is never shown.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.tokenizer, self.ids, self.printed = tokenizer, [], 0
        self.hold = max((len(s) for s in stop), default=1) - 1

    def push(self, index: int, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            self._write(text[self.printed:len(text) - self.hold])

    def finish(self, final_text: str | None) -> None:
        self._write((final_text or "")[self.printed:] + "\n")

    def _write(self, text: str) -> None:
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
            self.printed += len(text)


if __name__ == "__main__":
    sys.exit(main())
