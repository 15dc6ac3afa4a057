"""A reduced draft vocabulary (FR-Spec; SGLang's speculative token map): the target token ids a drafter's LM head
scores, so that each drafted level reads N rows of the target's LM head instead of all of them. The drafter maps
its argmax / top-k back to target ids; verification keeps the output exact whatever the set holds.

File format: safetensors with one tensor, `token_ids`, int64 [N]: distinct ids of the target's vocabulary (most
frequent first when counted). `--drafter mtp:FILE` reads one; `--drafter mtp:N` takes the first N ids (random-weight
targets, where no token is more frequent than another). `count_draft_vocab` builds one from prompt files with the
target's tokenizer (dev/draft_vocab.py is its command line).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from specpilot.prompts import load_prompts, resolve_prompt_set

KEY = "token_ids"
FORMAT = f"a safetensors file with one int64 tensor `{KEY}` [N] of distinct target ids (dev/draft_vocab.py writes one)"


@dataclasses.dataclass(frozen=True)
class DraftVocab:
    token_ids: torch.Tensor  # int64 [N]: distinct target ids, in the order the drafter's head rows take them
    source: str = KEY  # where they came from, for error lines

    def __post_init__(self):
        ids, src = self.token_ids, self.source
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64:
            got = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(f"{src}: the draft vocabulary's token ids are {got}, not int64; use {FORMAT}")
        if ids.dim() != 1 or ids.numel() < 1:
            raise ValueError(f"{src}: the draft vocabulary has shape {list(ids.shape)}; it needs N >= 1 ids in one "
                             f"dimension: use {FORMAT}")
        if int(ids.min()) < 0:
            raise ValueError(f"{src}: token id {int(ids.min())} is negative; the draft vocabulary holds target ids")
        uniq, counts = ids.unique(return_counts=True)
        if uniq.numel() != ids.numel():
            dup = uniq[counts > 1]
            raise ValueError(f"{src}: token ids repeat ({dup.numel()} of them, e.g. {int(dup[0])}); the draft "
                             "vocabulary holds each id once")

    def __len__(self) -> int:
        return self.token_ids.numel()

    def check(self, vocab_size: int) -> None:
        """Every id inside the target's vocabulary [0, vocab_size)."""
        top = int(self.token_ids.max())
        if top >= vocab_size:
            raise ValueError(f"{self.source}: token id {top} is outside the target's vocabulary (vocab_size "
                             f"{vocab_size}); use ids below {vocab_size} (a file built with this target's tokenizer, "
                             f"or N <= {vocab_size})")

    @classmethod
    def first(cls, n: int, source: str | None = None) -> DraftVocab:
        """The ids 0 .. n - 1 (for random-weight targets)."""
        if n < 1:
            raise ValueError(f"{source or 'draft vocabulary'}: N = {n}; a draft vocabulary needs N >= 1 tokens")
        return cls(torch.arange(n), source or f"the first {n} token ids")

    @classmethod
    def load(cls, path: str | Path) -> DraftVocab:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such draft vocabulary file; use {FORMAT}")
        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{path}: not a safetensors file ({e}); use {FORMAT}") from None
        if set(tensors) != {KEY}:
            raise ValueError(f"{path}: holds tensors {sorted(tensors)}; use {FORMAT}")
        return cls(tensors[KEY], str(path))

    @classmethod
    def parse(cls, spec: str, flag: str = "") -> DraftVocab:
        """`N` (the first N ids) or a file path; flag (e.g. `--drafter mtp:`) names N in error lines."""
        if not spec:
            raise ValueError(f"{flag.rstrip(':') or 'draft vocabulary'}: none given; use {flag}N (the first N ids) or "
                             f"{flag}FILE, {FORMAT}")
        try:
            n = int(spec)
        except ValueError:
            return cls.load(spec)
        return cls.first(n, f"{flag}{spec}")

    def save(self, path: str | Path) -> None:
        """Written next to the destination, then renamed into place (never a half-written file)."""
        from safetensors.torch import save_file

        path = Path(path)
        if not path.parent.is_dir():
            raise FileNotFoundError(f"{path.parent}: no such directory to write the draft vocabulary {path.name} in")
        tmp = path.with_name(path.name + ".tmp")
        try:
            save_file({KEY: self.token_ids.contiguous()}, str(tmp), metadata={"format": "pt"})
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)


def count_draft_vocab(texts: list[str], tokenizer, size: int, vocab_size: int, always: tuple[int, ...] = ()
                      ) -> DraftVocab:
    """The `size` most frequent target tokens of `texts` under the target's tokenizer, most frequent first (ties:
    the lower id first; ids that never occur fill the rest in id order). `always` (e.g. the EOS ids) come first
    whatever their counts: a token outside the set is never drafted."""
    if size < 1 or size > vocab_size:
        raise ValueError(f"--size {size}: a draft vocabulary needs 1 <= N <= the target's vocab_size {vocab_size}")
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for text in texts:
        ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.int64)
        if ids.numel() and int(ids.max()) >= vocab_size:
            raise ValueError(f"the tokenizer gives id {int(ids.max())} past the target's vocab_size {vocab_size}; "
                             "use the target's own tokenizer")
        counts += torch.bincount(ids, minlength=vocab_size)
    first = list(dict.fromkeys(int(t) for t in always if 0 <= t < vocab_size))
    counts[first] = -1  # out of the counted order: they lead
    order = torch.sort(counts, descending=True, stable=True).indices
    ids = torch.cat([torch.tensor(first, dtype=torch.int64), order[:max(size - len(first), 0)]])[:size]
    return DraftVocab(ids, f"{size} most frequent tokens")


def prompt_texts(sets: list[str | Path]) -> list[str]:
    """Every turn of every prompt of the given prompt files or shipped set names (specpilot.prompts formats)."""
    return [turn for s in sets for p in load_prompts(resolve_prompt_set(str(s))) for turn in p.turns]
