"""Benchmark prompt sets: load a prompt file of any shipped format into Prompt records, and resolve set names.

Owns the mapping from on-disk prompt files (FastChat question JSONL as used by MT-Bench, Spec-Bench and EAGLE;
HumanEval JSONL.gz; GSM8K JSONL; MATH-500 JSONL; MBPP JSON list; plain text, one prompt a line) to a single
record type, and the short names of the sets shipped in specpilot/data/prompts/ (each under its own license:
see the README there; SPECPILOT_DATA_DIR or an explicit data directory replaces that folder). It does not
tokenize or apply chat templates: a Prompt holds the user turns as text.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

DATA_DIR_ENV = "SPECPILOT_DATA_DIR"
SHIPPED_DIR = Path(__file__).parent / "data" / "prompts"

# short name -> file inside the data directory (eagle-alpaca is CC BY-NC 4.0, non-commercial)
PROMPT_SETS: dict[str, str] = {
    "humaneval": "HumanEval.jsonl.gz",
    "gsm8k": "gsm8k_test.jsonl",
    "math500": "math500.jsonl",
    "mbpp": "mbpp_sanitized.json",
    "mt-bench": "mt_bench_question.jsonl",
    "spec-bench": "spec_bench_question.jsonl",
    "eagle-alpaca": "eagle/alpaca_question.jsonl",
    "eagle-gsm8k": "eagle/gsm8k_question.jsonl",
    "eagle-humaneval": "eagle/humaneval_question.jsonl",
    "eagle-qa": "eagle/qa_question.jsonl",
    "eagle-sum": "eagle/sum_question.jsonl",
}

_GZIP_MAGIC = b"\x1f\x8b"
_JSON_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
_TEXT_SUFFIXES = (".txt", ".txt.gz")
_EXPECTED_RECORD = ("a FastChat question (turns), HumanEval or MBPP (task_id, prompt), GSM8K (question) "
                    "or MATH-500 (problem)")


@dataclass(frozen=True, slots=True)
class Prompt:
    id: str
    turns: tuple[str, ...]
    category: str | None = None

    def __post_init__(self):
        if not self.turns:
            raise ValueError(f"prompt {self.id!r} has no turns")

    @property
    def text(self) -> str:
        return self.turns[0]


def load_prompts(path: str | Path, limit: int | None = None, category: str | None = None) -> list[Prompt]:
    """Reads a prompt file; `category` keeps one category (FastChat-style sets), then `limit` keeps the first N.

    The format comes from the content (gzip magic bytes, a leading JSON list, JSON Lines, else text); the name
    only forces the choice where the content alone is ambiguous (.txt is always text, .json/.jsonl always JSON).
    """
    path = Path(path)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    prompts = _parse(path)
    if not prompts:
        raise ValueError(f"{path}: no prompts found (expected at least one record or non-empty line)")
    if category is not None:
        prompts = _filter_category(path, prompts, category)
    return prompts if limit is None else prompts[:limit]


def resolve_prompt_set(name_or_path: str, data_dir: str | Path | None = None) -> Path:
    """A shipped set name (see PROMPT_SETS) -> its file in data_dir, else $SPECPILOT_DATA_DIR, else the shipped
    folder; anything else must be an existing file.

    Names win over same-named files in the working directory; write ./gsm8k to mean the file.
    """
    name = set_name(name_or_path)
    if name in PROMPT_SETS:
        return _shipped_path(name, data_dir)
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    raise ValueError(f"{name_or_path!r} is neither an existing prompt file nor a shipped prompt set "
                     f"({', '.join(PROMPT_SETS)})")


def set_name(text: str) -> str:
    """The canonical spelling of a set name: MT_Bench and mt-bench are one set."""
    return text.strip().lower().replace("_", "-")


def _shipped_path(name: str, data_dir: str | Path | None) -> Path:
    root = _data_root(data_dir)
    path = root / PROMPT_SETS[name]
    if not path.is_file():
        raise ValueError(f"prompt set {name!r}: {path} does not exist (data directory {root})")
    return path


def _data_root(data_dir: str | Path | None) -> Path:
    """The folder holding the named sets: data_dir, else $SPECPILOT_DATA_DIR, else the shipped one."""
    env = os.environ.get(DATA_DIR_ENV) or None
    if data_dir:
        root, source = Path(data_dir).expanduser(), f"data directory {data_dir}"
    elif env:
        root, source = Path(env).expanduser(), f"{DATA_DIR_ENV}={env}"
    else:
        root, source = SHIPPED_DIR, f"the shipped prompt folder {SHIPPED_DIR} (a broken install?)"
    if not root.is_dir():
        raise ValueError(f"{source}: {'not a directory' if root.exists() else 'no such directory'}")
    return root


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: prompt file does not exist") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read prompt file ({e.strerror})") from None
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise ValueError(f"{path}: corrupt gzip data ({e})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from None


def _parse(path: Path) -> list[Prompt]:
    text = _read_text(path)
    if not text.strip():
        raise ValueError(f"{path}: prompt file is empty (expected JSON records or one prompt per line)")
    kind = _sniff(path, text)
    if kind == "text":
        lines = [line for _, line in _lines(text) if line.strip()]
        return [Prompt(id=str(i), turns=(line,)) for i, line in enumerate(lines)]
    records = _json_list(path, text) if kind == "list" else _json_lines(path, text)
    return [_to_prompt(path, where, index, record) for index, (where, record) in enumerate(records)]


def _sniff(path: Path, text: str) -> str:
    name = path.name.lower()
    if name.endswith(_TEXT_SUFFIXES):
        return "text"
    json_named = name.endswith(_JSON_SUFFIXES)
    # unknown name: only call it JSON when it parses, so a text prompt that starts with "[" or "{" stays text
    if text.lstrip().startswith("[") and (json_named or _parses(text, list)):
        return "list"
    first = next(line for _, line in _lines(text) if line.strip())
    if _parses(first, dict):
        return "jsonl"
    if not json_named:
        return "text"
    # a JSON-named file that parses as neither: let the strict parser name what is wrong
    return "list" if name.endswith((".json", ".json.gz")) else "jsonl"


def _parses(text: str, kind: type) -> bool:
    try:
        return isinstance(json.loads(text), kind)
    except json.JSONDecodeError:
        return False


def _lines(text: str) -> list[tuple[int, str]]:
    # split on "\n" only: str.splitlines() also breaks on U+2028 and friends, which are legal inside JSON strings
    return [(n, line.rstrip("\r")) for n, line in enumerate(text.split("\n"), 1)]


def _json_list(path: Path, text: str) -> list[tuple[str, object]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}: invalid JSON ({e.msg}); expected a JSON list of records") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    return [(f"list item {i}", record) for i, record in enumerate(data)]


def _json_lines(path: Path, text: str) -> list[tuple[str, object]]:
    records = []
    for n, line in _lines(text):
        if not line.strip():
            continue
        try:
            records.append((f"line {n}", json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: line {n}: invalid JSON ({e.msg}); expected one JSON object per line "
                             f"(JSON Lines) or a JSON list") from None
    return records


def _to_prompt(path: Path, where: str, index: int, record: object) -> Prompt:
    if not isinstance(record, dict):
        raise ValueError(f"{path}: {where}: expected a JSON object, got {type(record).__name__}")
    if "turns" in record:
        turns = record["turns"]
        if not isinstance(turns, list) or not turns or not all(_is_text(t) for t in turns):
            raise ValueError(f"{path}: {where}: 'turns' must be a non-empty list of non-empty strings")
        category = record.get("category")
        return Prompt(id=str(record.get("question_id", index)), turns=tuple(turns),
                      category=str(category) if category else None)  # EAGLE alpaca stores "" for no category
    match = _single_turn_field(record, index)
    if match is None:
        raise ValueError(f"{path}: {where}: record with keys {sorted(record)} matches no known format; "
                         f"expected {_EXPECTED_RECORD}")
    key, prompt_id = match
    if not _is_text(record[key]):
        raise ValueError(f"{path}: {where}: {key!r} must be a non-empty string")
    return Prompt(id=prompt_id, turns=(record[key],))


def _single_turn_field(record: dict, index: int) -> tuple[str, str] | None:
    """(field holding the text, prompt id) for the single-turn formats; records without an id get their index."""
    if "task_id" in record and "prompt" in record:  # HumanEval, MBPP
        return "prompt", str(record["task_id"])
    if "question" in record:  # GSM8K
        return "question", str(index)
    if "problem" in record:  # MATH-500
        return "problem", str(record.get("id", index))
    return None


def _is_text(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _filter_category(path: Path, prompts: list[Prompt], category: str) -> list[Prompt]:
    available = list(dict.fromkeys(p.category for p in prompts if p.category is not None))
    if not available:
        raise ValueError(f"{path}: no record has a category, so category={category!r} cannot be applied "
                         f"(only FastChat-style question files carry one)")
    if category not in available:
        raise ValueError(f"{path}: unknown category {category!r}; available: {', '.join(available)}")
    return [p for p in prompts if p.category == category]
