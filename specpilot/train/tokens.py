"""The tokenized corpus: each split as one token stream (documents joined by EOS), cached on disk.

Tokenizing a few hundred MB of code takes longer than training a zoo model on it, and every model of a zoo
reads the same streams, so they are encoded once, in parallel batches, and kept as safetensors under the cache
directory ($SPECPILOT_CACHE, default ~/.cache/specpilot), keyed by the tokenizer's contents and the corpus's
file-list hash. A stale or foreign file can never be picked up: the key changes with either input.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specpilot.train.corpus import Corpus

_BATCH_DOCS = 512


def cache_dir() -> Path:
    return Path(os.environ.get("SPECPILOT_CACHE", Path.home() / ".cache" / "specpilot")) / "tokens"


def token_stream(docs, tokenizer) -> torch.Tensor:
    """int64 [n]: the documents' tokens, each document followed by EOS."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token: documents could not be separated in the stream")
    docs = list(docs)
    parts = []
    for i in range(0, len(docs), _BATCH_DOCS):
        # the fast tokenizer encodes a list in parallel threads
        for ids in tokenizer(docs[i:i + _BATCH_DOCS], add_special_tokens=False)["input_ids"]:
            parts.append(torch.tensor(ids + [eos], dtype=torch.int32))
    return torch.cat(parts).long() if parts else torch.zeros(0, dtype=torch.long)


def corpus_tokens(corpus: Corpus, tokenizer, cache: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) token streams of the corpus, read from the cache when the same pair was encoded before."""
    path = cache_dir() / f"{_key(corpus, tokenizer)}.safetensors"
    if cache and path.exists():
        streams = load_file(str(path))
        return streams["train"].long(), streams["held_out"].long()
    train, held = token_stream(corpus.train, tokenizer), token_stream(corpus.held_out, tokenizer)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        save_file({"train": train.int(), "held_out": held.int()}, tmp)
        os.replace(tmp, path)  # concurrent trainers may race here: the last identical file wins
    return train, held


def _key(corpus: Corpus, tokenizer) -> str:
    h = hashlib.sha256()
    h.update(tokenizer.backend_tokenizer.to_str().encode())
    h.update(f"{corpus.source}\n{corpus.files_hash}\n{len(corpus.train)}\n{len(corpus.held_out)}".encode())
    return h.hexdigest()[:24]
