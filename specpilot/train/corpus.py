"""Corpus: the text a tokenizer and models are trained on, split deterministically into train and held-out.

Default: the .py files of the running Python installation and its site-packages, in sorted order. Any directory
of text/code files or a .jsonl file (one {"text": ...} per line) may be given instead. A file goes to the
held-out split when the hash of its relative path says so, so the split never depends on the file order; the
hash of the whole file list is recorded, so a model can say exactly what it was trained on.
"""

from __future__ import annotations

import hashlib
import json
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".c", ".h", ".json", ".toml", ".cfg", ".js", ".rs", ".go"}


@dataclass(frozen=True)
class Corpus:
    source: str
    train: tuple[str, ...]  # documents
    held_out: tuple[str, ...]
    files_hash: str

    @property
    def train_chars(self) -> int:
        return sum(map(len, self.train))


def default_roots() -> list[Path]:
    roots = {Path(sysconfig.get_paths()["stdlib"])}
    roots.update(Path(p) for p in site.getsitepackages() if Path(p).exists())
    return sorted(roots)


def load_corpus(source: str | None = None, held_out_percent: int = 2, max_files: int | None = None,
                max_bytes_per_file: int = 200_000) -> Corpus:
    """source None: the Python installation's .py files; else a directory or a .jsonl file."""
    if source is None:
        files = sorted({f for root in default_roots() for f in root.rglob("*.py")})
        label = f"python {sys.version.split()[0]} .py files"
        docs = [(str(f), f) for f in files]
    else:
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"corpus {source}: no such file or directory")
        if path.is_file() and path.suffix == ".jsonl":
            return _from_jsonl(path, held_out_percent, max_files)
        if not path.is_dir():
            raise ValueError(f"corpus {source}: give a directory of text files or a .jsonl file")
        files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES)
        label = str(path)
        docs = [(str(f.relative_to(path)), f) for f in files]
    if max_files is not None:  # a subset spread over the whole tree, not its alphabetical head
        docs = sorted(sorted(docs, key=lambda d: _name_hash(d[0]))[:max_files])
    if not docs:
        raise ValueError(f"corpus {label}: no text files found")
    train, held = [], []
    for name, f in docs:
        try:
            text = f.read_text(encoding="utf-8")[:max_bytes_per_file]
        except (UnicodeDecodeError, OSError):
            continue
        (held if _held_out(name, held_out_percent) else train).append(text)
    return Corpus(label, tuple(train), tuple(held), _hash([n for n, _ in docs]))


def _from_jsonl(path: Path, held_out_percent: int, max_files: int | None) -> Corpus:
    train, held, names = [], [], []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            text = json.loads(line)["text"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{path}:{i + 1}: expected a JSON object with a 'text' field") from None
        names.append(f"{i}")
        (held if _held_out(f"{i}", held_out_percent) else train).append(text)
        if max_files is not None and len(names) >= max_files:
            break
    return Corpus(str(path), tuple(train), tuple(held), _hash(names))


def _name_hash(name: str) -> int:
    return int(hashlib.sha1(name.encode()).hexdigest()[:8], 16)


def _held_out(name: str, percent: int) -> bool:
    # the hash's low digits decide the split, its high ones the max_files subset: the two stay independent
    return int(hashlib.sha1(name.encode()).hexdigest()[-8:], 16) % 100 < percent


def _hash(names: list[str]) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
