"""Host time to stream 4,096 tokens through `specpilot generate`'s text path (CPU, no model): the engine's
stop-string check plus the CLI streamer, per token, before and after the incremental Detokenizer.

The token stream is the zoo dense tokenizer's encoding of the HumanEval prompts and canonical solutions (shipped
prompt data), cut to --tokens. Stop strings that never occur keep every token streaming. Variants:
- before: the former path, copied here verbatim as the reference: the engine decoded the whole output after
  every token to look for the stop strings, and the streamer decoded it again;
- after: append_token with stop_detokenizer (the engines' stop check) and cli._Streamer (its Detokenizer);
- `--stop` absent (no stop strings): the streamer alone (the engine's check is skipped in both).
Each variant is timed --repeats times; the medians (and min / max) are printed and written to --out.
--after-only skips the quadratic former path (for long streams: the per-token cost stays flat).

    PYTHONPATH=. python3 dev/detokenize_host_time.py --out /tmp/detok.json
    PYTHONPATH=. python3 dev/detokenize_host_time.py --tokens 16384 --after-only
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import statistics
import time
from pathlib import Path

from specpilot.cli import _Streamer
from specpilot.engine.detokenizer import decode_text
from specpilot.engine.generator import GenerationResult, append_token, stop_detokenizer
from specpilot.runtime.sampling import SamplingParams
from specpilot.models.loader import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
STOP = ("<|im_end|>", "\n\n\n\n")


def token_stream(tokenizer, n: int) -> list[int]:
    rows = [json.loads(line) for line in gzip.open(ROOT / "specpilot/data/prompts/HumanEval.jsonl.gz", "rt")]
    ids = tokenizer.encode("".join(r["prompt"] + r["canonical_solution"] for r in rows), add_special_tokens=False)
    if len(ids) < n:
        raise ValueError(f"--tokens {n}: the text has only {len(ids)} tokens")
    return ids[:n]


def before(tokenizer, ids: list[int], stop: tuple[str, ...]) -> str:
    """The former per-token path: the engine's stop check (append_token) and the streamer's push."""
    out, printed, hold, seen = [], 0, max((len(s) for s in stop), default=1) - 1, []
    for tok in ids:
        seen.append(tok)
        if stop:  # append_token: a full decode, then a search for every stop string
            text = tokenizer.decode(seen, skip_special_tokens=True)
            if [text.find(s) for s in stop if s in text]:
                raise AssertionError("the stop strings must not occur in the timed text")
        text = tokenizer.decode(seen, skip_special_tokens=True)  # _Streamer.push
        if not text.endswith("\ufffd"):
            out.append(text[printed:len(text) - hold])
            printed += len(out[-1])
    return "".join(out)


def after(tokenizer, ids: list[int], stop: tuple[str, ...]) -> str:
    params = SamplingParams(max_new_tokens=len(ids), stop=stop)
    result, detok = GenerationResult(prompt_len=1), stop_detokenizer(tokenizer, params)
    stream, sink = _Streamer(tokenizer, stop), io.StringIO()
    with contextlib.redirect_stdout(sink):
        for tok in ids:
            stream.push(0, tok)
            if append_token(result, tok, params, set(), detok, 0.0) and len(result.token_ids) < len(ids):
                raise AssertionError("the stop strings must not occur in the timed text")
    return sink.getvalue()


def timed(fn, repeats: int) -> tuple[dict, str]:
    seconds, text = [], ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        text = fn()
        seconds.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds),
            "repeats": repeats}, text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--repeats-before", type=int, default=5)
    p.add_argument("--repeats-after", type=int, default=30)
    p.add_argument("--after-only", action="store_true", help="time only the Detokenizer path")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args()
    tokenizer = load_tokenizer(str(ROOT / "zoo" / "dense"))
    ids = token_stream(tokenizer, args.tokens)
    reference = decode_text(tokenizer, ids)
    rows = {}
    for label, stop in (("stop strings", STOP), ("no stop strings", ())):
        new, new_text = timed(lambda: after(tokenizer, ids, stop), args.repeats_after)
        assert reference.startswith(new_text)
        line = (f"after {new['median_s'] * 1e3:7.2f} ms (min {new['min_s'] * 1e3:.2f}, max {new['max_s'] * 1e3:.2f},"
                f" {new['median_s'] / args.tokens * 1e6:.1f} us/token)")
        rows[label] = {"after": new}
        if not args.after_only:
            old, old_text = timed(lambda: before(tokenizer, ids, stop), args.repeats_before)
            # the old streamer held the last max(len(stop)) - 1 characters back until the end; the new one none
            assert reference.startswith(old_text) and len(new_text) >= len(old_text)
            rows[label].update(before=old, speedup=old["median_s"] / new["median_s"])
            line = (f"before {old['median_s'] * 1e3:9.1f} ms (min {old['min_s'] * 1e3:.1f}, max "
                    f"{old['max_s'] * 1e3:.1f}) · {line} · {rows[label]['speedup']:.0f}x")
        print(f"{label:>16}: {line}  [{args.tokens} tokens]")
    if args.out:
        Path(args.out).write_text(json.dumps({"tokens": args.tokens, "stop": STOP, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
