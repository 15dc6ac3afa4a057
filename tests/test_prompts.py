"""Prompt-set loading: every file format, the filters, name resolution, every error, and the real shipped sets."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from specpilot.prompts import DATA_DIR_ENV, PROMPT_SETS, SHIPPED_DIR, Prompt, load_prompts, resolve_prompt_set

MT_BENCH = [
    {"question_id": 81, "category": "writing", "turns": ["Write a blog post about Hawaii.", "Rewrite it with A."]},
    {"question_id": 82, "category": "writing", "turns": ["Draft an email.", "Critique it."]},
    {"question_id": 91, "category": "roleplay", "turns": ["Pretend to be Elon Musk.", "Do you like dancing?"],
     "reference": ["n/a"]},
]
SPEC_BENCH_TAIL = [
    {"question_id": 161, "category": "translation", "turns": ["Translate German to English: Hallo Welt."],
     "reference": ["Hello world."]},
    {"question_id": 321, "category": "qa", "turns": ["Who played anna in once upon a time?"]},
]
ALPACA = [
    {"question_id": 0, "category": "", "turns": ["Best exercise for arthritis?"], "reference": ["Swimming."]},
    {"question_id": 1, "category": "", "turns": ["Name three colors."], "reference": ["Red, green, blue."]},
]
HUMANEVAL = [
    {"task_id": "HumanEval/0", "prompt": "from typing import List\n\n\ndef has_close_elements(numbers):\n",
     "entry_point": "has_close_elements", "canonical_solution": "    return False\n", "test": "def check(c): pass\n"},
    {"task_id": "HumanEval/1", "prompt": "def separate_paren_groups(s: str):\n", "entry_point": "separate_paren_groups",
     "canonical_solution": "    return []\n", "test": "def check(c): pass\n"},
]
GSM8K = [
    {"question": "Janet's ducks lay 16 eggs per day. How many are left?", "answer": "16 - 3 = 13\n#### 13"},
    {"question": "A robe takes 2 bolts of blue fiber. How many bolts?", "answer": "2 + 1 = 3\n#### 3"},
]
MATH500 = [
    {"id": "math500_0000", "problem": "Convert the point $(0,3)$ to polar coordinates.", "solution": "...",
     "answer": "(3, \\frac{\\pi}{2})", "level": 2, "subject": "Precalculus", "dataset": "math500"},
    {"id": "math500_0001", "problem": "Compute $1+1$.", "solution": "2", "answer": "2", "level": 1,
     "subject": "Algebra", "dataset": "math500"},
]
MBPP = [
    {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 2,
     "prompt": "Write a function to find the shared elements from the given two lists.",
     "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))", "test_imports": [],
     "test_list": ["assert similar_elements((1,), (1,)) == (1,)"]},
    {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 3,
     "prompt": "Write a python function to identify non-prime numbers.", "code": "def is_not_prime(n): ...",
     "test_imports": ["import math"], "test_list": ["assert is_not_prime(2) == False"]},
]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def write_jsonl_gz(path: Path, records: list[dict]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


# ---- formats -------------------------------------------------------------------------------------------------


def test_fastchat_multi_turn(tmp_path):
    prompts = load_prompts(write_jsonl(tmp_path / "question.jsonl", MT_BENCH))
    assert prompts[0] == Prompt(id="81", turns=("Write a blog post about Hawaii.", "Rewrite it with A."),
                                category="writing")
    assert prompts[0].text == "Write a blog post about Hawaii."
    assert [p.category for p in prompts] == ["writing", "writing", "roleplay"]


def test_fastchat_empty_category_is_none(tmp_path):
    prompts = load_prompts(write_jsonl(tmp_path / "alpaca_question.jsonl", ALPACA))
    assert [(p.id, p.text, p.category) for p in prompts] == [
        ("0", "Best exercise for arthritis?", None), ("1", "Name three colors.", None)]


def test_humaneval_gz(tmp_path):
    prompts = load_prompts(write_jsonl_gz(tmp_path / "HumanEval.jsonl.gz", HUMANEVAL))
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1"]
    assert prompts[0].turns == (HUMANEVAL[0]["prompt"],)
    assert prompts[0].category is None


def test_gzip_detected_from_content_not_name(tmp_path):
    prompts = load_prompts(write_jsonl_gz(tmp_path / "humaneval.data", HUMANEVAL))
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1"]


def test_gsm8k_ids_are_positions(tmp_path):
    prompts = load_prompts(write_jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K))
    assert [(p.id, p.text) for p in prompts] == [("0", GSM8K[0]["question"]), ("1", GSM8K[1]["question"])]


def test_math500(tmp_path):
    prompts = load_prompts(write_jsonl(tmp_path / "math500.jsonl", MATH500))
    assert [(p.id, p.text) for p in prompts] == [("math500_0000", MATH500[0]["problem"]),
                                                 ("math500_0001", MATH500[1]["problem"])]


def test_mbpp_json_list(tmp_path):
    path = tmp_path / "mbpp_sanitized.json"
    path.write_text(json.dumps(MBPP), encoding="utf-8")
    prompts = load_prompts(path)
    assert [(p.id, p.text) for p in prompts] == [("2", MBPP[0]["prompt"]), ("3", MBPP[1]["prompt"])]


def test_json_list_detected_without_suffix(tmp_path):
    path = tmp_path / "mbpp"
    path.write_text(json.dumps(MBPP, indent=2), encoding="utf-8")
    assert len(load_prompts(path)) == 2


def test_jsonl_detected_without_suffix_and_blank_lines_skipped(tmp_path):
    path = tmp_path / "questions.data"
    path.write_text("\n" + json.dumps(GSM8K[0]) + "\n\n" + json.dumps(GSM8K[1]) + "\r\n", encoding="utf-8")
    assert [p.text for p in load_prompts(path)] == [GSM8K[0]["question"], GSM8K[1]["question"]]


def test_text_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("Hello there\n\n   \ndef fib(n):\r\n", encoding="utf-8")
    prompts = load_prompts(path)
    assert prompts == [Prompt(id="0", turns=("Hello there",)), Prompt(id="1", turns=("def fib(n):",))]


def test_txt_suffix_wins_over_json_looking_lines(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text('{"question": "x"}\n', encoding="utf-8")
    assert load_prompts(path)[0].text == '{"question": "x"}'


def test_unknown_suffix_non_json_is_text(tmp_path):
    path = tmp_path / "prompts"
    path.write_text("[INST] Tell me a joke [/INST]\n{not json either}\n", encoding="utf-8")
    assert [p.text for p in load_prompts(path)] == ["[INST] Tell me a joke [/INST]", "{not json either}"]


def test_utf8_bom_and_unicode_line_separator_inside_json(tmp_path):
    path = tmp_path / "q.jsonl"
    # U+2028 is legal raw inside a JSON string and must not split the line
    record = json.dumps({"question": "a\u2028b"}, ensure_ascii=False)
    path.write_bytes(b"\xef\xbb\xbf" + record.encode("utf-8") + b"\n")
    assert load_prompts(path)[0].text == "a\u2028b"


def test_prompt_is_frozen_and_needs_a_turn():
    p = Prompt(id="x", turns=("hi",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.id = "y"
    with pytest.raises(ValueError, match="has no turns"):
        Prompt(id="x", turns=())


# ---- filters -------------------------------------------------------------------------------------------------


def test_limit(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K)
    assert [p.id for p in load_prompts(path, limit=1)] == ["0"]
    assert len(load_prompts(path, limit=10)) == 2
    assert load_prompts(path, limit=0) == []


def test_category_then_limit(tmp_path):
    path = write_jsonl(tmp_path / "question.jsonl", SPEC_BENCH_TAIL + MT_BENCH)
    assert [p.id for p in load_prompts(path, category="writing")] == ["81", "82"]
    assert [p.id for p in load_prompts(path, category="writing", limit=1)] == ["81"]
    assert [p.id for p in load_prompts(path, category="qa")] == ["321"]


def test_unknown_category_lists_available(tmp_path):
    path = write_jsonl(tmp_path / "question.jsonl", MT_BENCH)
    with pytest.raises(ValueError, match=r"question\.jsonl.*unknown category 'poetry'.*available: writing, roleplay"):
        load_prompts(path, category="poetry")


def test_category_on_set_without_categories(tmp_path):
    with pytest.raises(ValueError, match=r"gsm8k_test\.jsonl.*no record has a category.*'math'"):
        load_prompts(write_jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K), category="math")
    with pytest.raises(ValueError, match="no record has a category"):
        load_prompts(write_jsonl(tmp_path / "alpaca_question.jsonl", ALPACA), category="")


def test_negative_limit():
    with pytest.raises(ValueError, match="limit must be >= 0"):
        load_prompts("unused.jsonl", limit=-1)


# ---- errors --------------------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"nope\.jsonl: prompt file does not exist"):
        load_prompts(tmp_path / "nope.jsonl")


def test_directory_is_not_a_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read prompt file"):
        load_prompts(tmp_path)


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.jsonl: prompt file is empty"):
        load_prompts(path)


def test_empty_json_list(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.json: no prompts found"):
        load_prompts(path)


def test_invalid_json_line_names_the_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(GSM8K[0]) + "\n\n" + '{"question": "unterminated\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.jsonl: line 3: invalid JSON .*expected one JSON object per line"):
        load_prompts(path)


def test_invalid_json_list_names_the_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[\n  {"task_id": 2, "prompt": "x", "code": "y"},\n  oops\n]', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.json: line 3: invalid JSON .*expected a JSON list of records"):
        load_prompts(path)


@pytest.mark.parametrize("content, got", [('"just a string"', "str"), ('{\n  "question": "x"\n}', "dict")])
def test_json_file_that_is_not_a_list(tmp_path, content, got):
    path = tmp_path / "obj.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"obj\.json: expected a JSON list of records, got {got}"):
        load_prompts(path)


def test_single_line_object_in_json_file_is_read_as_jsonl(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps(GSM8K[0]), encoding="utf-8")
    assert load_prompts(path)[0].text == GSM8K[0]["question"]


def test_pretty_printed_object_in_jsonl(tmp_path):
    path = tmp_path / "pretty.jsonl"
    path.write_text(json.dumps(GSM8K[0], indent=2), encoding="utf-8")
    with pytest.raises(ValueError, match=r"pretty\.jsonl: line 1: invalid JSON"):
        load_prompts(path)


def test_record_matching_no_format(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [GSM8K[0], {"instruction": "x", "output": "y"}])
    with pytest.raises(ValueError, match=r"odd\.jsonl: line 2: record with keys \['instruction', 'output'\] "
                                         r"matches no known format; expected a FastChat question \(turns\)"):
        load_prompts(path)


def test_list_item_matching_no_format(tmp_path):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps([MBPP[0], {"text": "x"}]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"odd\.json: list item 1: record with keys \['text'\] matches no known"):
        load_prompts(path)


def test_non_object_record(tmp_path):
    path = tmp_path / "odd.jsonl"
    path.write_text('"a bare string"\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"odd\.jsonl: line 1: expected a JSON object, got str"):
        load_prompts(path)


@pytest.mark.parametrize("turns", [[], "not a list", [""], ["ok", 3]])
def test_bad_turns(tmp_path, turns):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question_id": 1, "category": "x", "turns": turns}])
    with pytest.raises(ValueError, match=r"q\.jsonl: line 1: 'turns' must be a non-empty list of non-empty strings"):
        load_prompts(path)


def test_empty_single_turn_text(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "   ", "answer": "1"}])
    with pytest.raises(ValueError, match=r"q\.jsonl: line 1: 'question' must be a non-empty string"):
        load_prompts(path)


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "HumanEval.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"task_id": "a", "prompt": "b"}\n')[:-12])
    with pytest.raises(ValueError, match=r"HumanEval\.jsonl\.gz: corrupt gzip data"):
        load_prompts(path)


def test_not_utf8(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt: not UTF-8 text"):
        load_prompts(path)


# ---- resolve_prompt_set --------------------------------------------------------------------------------------


def test_resolve_name_in_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    (tmp_path / "eagle").mkdir()
    write_jsonl(tmp_path / "eagle" / "qa_question.jsonl", SPEC_BENCH_TAIL[1:])
    write_jsonl(tmp_path / "mt_bench_question.jsonl", MT_BENCH)
    assert resolve_prompt_set("eagle-qa", data_dir=tmp_path) == tmp_path / "eagle" / "qa_question.jsonl"
    assert resolve_prompt_set("MT_Bench", data_dir=str(tmp_path)) == tmp_path / "mt_bench_question.jsonl"


def test_resolve_name_from_env(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert resolve_prompt_set("gsm8k") == tmp_path / "gsm8k_test.jsonl"
    other = tmp_path / "other"
    other.mkdir()
    write_jsonl(other / "gsm8k_test.jsonl", GSM8K)
    assert resolve_prompt_set("gsm8k", data_dir=other) == other / "gsm8k_test.jsonl"  # the argument wins


@pytest.mark.parametrize("env", [None, ""])
def test_resolve_name_without_data_dir_finds_the_shipped_sets(monkeypatch, tmp_path, env):
    if env is None:
        monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    else:
        monkeypatch.setenv(DATA_DIR_ENV, env)
    monkeypatch.chdir(tmp_path)  # found next to the package, not through the working directory
    for name, file in PROMPT_SETS.items():
        assert resolve_prompt_set(name) == SHIPPED_DIR / file
    assert SHIPPED_DIR.parent.parent == Path(__import__("specpilot").__file__).parent


def test_env_var_overrides_the_shipped_sets(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "mt_bench_question.jsonl", MT_BENCH)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert resolve_prompt_set("mt-bench") == tmp_path / "mt_bench_question.jsonl"
    assert len(load_prompts(resolve_prompt_set("mt-bench"))) == len(MT_BENCH)  # not the shipped 80
    with pytest.raises(ValueError, match=r"prompt set 'gsm8k': .*gsm8k_test\.jsonl does not exist"):
        resolve_prompt_set("gsm8k")  # the override replaces the shipped folder, it does not fall back to it


@pytest.mark.parametrize("where", ["env", "argument"])
def test_missing_data_directory(tmp_path, monkeypatch, where):
    missing = tmp_path / "nowhere"
    if where == "env":
        monkeypatch.setenv(DATA_DIR_ENV, str(missing))
        with pytest.raises(ValueError, match=rf"^SPECPILOT_DATA_DIR={missing}: no such directory$"):
            resolve_prompt_set("gsm8k")
    else:
        with pytest.raises(ValueError, match=rf"^data directory {missing}: no such directory$"):
            resolve_prompt_set("gsm8k", data_dir=missing)


def test_resolve_name_missing_from_data_dir(tmp_path):
    with pytest.raises(ValueError, match=r"prompt set 'math500': .*math500\.jsonl does not exist"):
        resolve_prompt_set("math500", data_dir=tmp_path)


def test_resolve_path(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    path = write_jsonl(tmp_path / "mine.jsonl", GSM8K)
    assert resolve_prompt_set(str(path)) == path
    # a file named like a shipped set is reached by spelling it as a path
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "gsm8k", GSM8K)
    assert resolve_prompt_set("./gsm8k") == Path("./gsm8k")


def test_resolve_unknown(tmp_path):
    with pytest.raises(ValueError, match=r"'nope\.jsonl' is neither an existing prompt file nor a shipped prompt set "
                                         r"\(humaneval, gsm8k"):
        resolve_prompt_set("nope.jsonl", data_dir=tmp_path)


# ---- the shipped sets ----------------------------------------------------------------------------------------

REAL_ROWS = {"humaneval": 164, "gsm8k": 1319, "math500": 500, "mbpp": 427, "mt-bench": 80, "spec-bench": 480,
             "eagle-alpaca": 80, "eagle-gsm8k": 80, "eagle-humaneval": 80, "eagle-qa": 80, "eagle-sum": 80}


def test_real_prompt_sets(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert set(REAL_ROWS) == set(PROMPT_SETS)
    for name, rows in REAL_ROWS.items():
        prompts = load_prompts(resolve_prompt_set(name))
        assert len(prompts) == rows, name
        assert all(t.strip() for p in prompts for t in p.turns), name
        assert len({p.id for p in prompts}) == rows, f"{name}: duplicate ids"
    mt = load_prompts(resolve_prompt_set("mt-bench"))
    assert all(len(p.turns) == 2 for p in mt)
    spec = resolve_prompt_set("spec-bench")
    for category in ("translation", "summarization", "qa", "math_reasoning", "rag"):
        assert len(load_prompts(spec, category=category)) == 80, category
    assert len(load_prompts(spec, category="writing")) == 10


def test_shipped_files_match_their_readme_hashes_and_licenses():
    """Every shipped set is byte for byte the attributed source (sha256 in the folder's README), and the
    non-commercial Alpaca subset carries its own notice."""
    import hashlib
    import re

    readme = (SHIPPED_DIR / "README.md").read_text(encoding="utf-8")
    listed = dict((file, digest) for digest, file in re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, re.M))
    assert set(listed) == set(PROMPT_SETS.values())
    for file, digest in listed.items():
        assert hashlib.sha256((SHIPPED_DIR / file).read_bytes()).hexdigest() == digest, file
    notice = (SHIPPED_DIR / "eagle" / "NOTICE-alpaca.md").read_text(encoding="utf-8")
    assert "CC BY-NC 4.0" in notice and "non-commercial" in notice and listed["eagle/alpaca_question.jsonl"] in notice
    assert "CC BY-NC 4.0" in readme
