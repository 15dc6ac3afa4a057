"""`specpilot train tokenizer`: a byte-level BPE tokenizer trained on a corpus, saved the Hugging Face way."""

from __future__ import annotations

import json
from pathlib import Path

from specpilot.models.random_checkpoint import write_tokenizer
from specpilot.train.corpus import Corpus
from specpilot.train.output_dir import output_dir

# <|mask|> fills DFlash draft blocks; a trained zoo keeps it in the vocabulary from the start
SPECIAL_TOKENS = ("<|endoftext|>", "<|mask|>")


def train_tokenizer(corpus: Corpus, out: str | Path, vocab_size: int = 4096, max_chars: int = 64_000_000) -> Path:
    """BPE merges are learned from an evenly strided subset of at most max_chars characters (more text barely
    changes a small vocabulary, and the trainer's time grows with it)."""
    out = Path(out)
    stride = max(1, -(-corpus.train_chars // max_chars))
    docs = list(corpus.train[::stride])
    meta = {"vocab_size": vocab_size, "corpus": corpus.source, "corpus_files_hash": corpus.files_hash,
            "train_documents": len(docs), "train_chars": sum(map(len, docs))}
    with output_dir(out) as tmp:  # whole or not at all (train/output_dir.py)
        write_tokenizer(tmp, vocab_size, docs, SPECIAL_TOKENS)
        (tmp / "tokenizer_training.json").write_text(json.dumps(meta, indent=1))
    return out
