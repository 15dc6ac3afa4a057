"""Writes a draft vocabulary file for `--drafter mtp:FILE` (specpilot/spec_decode/drafters/draft_vocab.py): the
--size most frequent tokens of prompt files (or shipped prompt set names) under the target's tokenizer, the
target's EOS ids first, as safetensors with one int64 tensor `token_ids`.

    python3 dev/draft_vocab.py --target ./Qwen3.5-27B --prompts mt-bench humaneval gsm8k --size 32768 \
        --out qwen3.5-27b-hot32k.safetensors
    specpilot generate --target ./Qwen3.5-27B --drafter mtp:qwen3.5-27b-hot32k.safetensors --tree chain:3
"""

from __future__ import annotations

import argparse
import json
import sys

from specpilot.checkpoint.directory import resolve_model_dir
from specpilot.checkpoint.errors import CheckpointError
from specpilot.config import ConfigError, ModelConfig
from specpilot.models.loader import load_tokenizer
from specpilot.spec_decode.drafters.draft_vocab import count_draft_vocab, prompt_texts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 dev/draft_vocab.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="the target's checkpoint directory or Hub id (its tokenizer)")
    p.add_argument("--prompts", nargs="+", required=True, help="prompt files or shipped set names to count over")
    p.add_argument("--size", type=int, required=True, help="N: tokens in the draft vocabulary")
    p.add_argument("--out", required=True, help="the safetensors file to write")
    args = p.parse_args(argv)
    try:
        model_dir = resolve_model_dir(args.target)
        cfg = ModelConfig.from_file(model_dir / "config.json")
        tokenizer = load_tokenizer(str(model_dir))
        always = cfg.eos_token_ids + ((tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
        vocab = count_draft_vocab(prompt_texts(args.prompts), tokenizer, args.size, cfg.vocab_size, always)
        vocab.save(args.out)
    except (ValueError, ConfigError, CheckpointError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": args.out, "size": len(vocab), "target": str(model_dir), "prompts": args.prompts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
