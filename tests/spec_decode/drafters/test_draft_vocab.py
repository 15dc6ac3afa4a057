"""A draft vocabulary: its file (safetensors, one int64 `token_ids`) round-trips and is checked on load, N takes the
first N ids, and counting prompt files with the target's tokenizer gives the most frequent ids first (the EOS ids
ahead), as the dev/draft_vocab.py command writes them."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specpilot.spec_decode.drafters.draft_vocab import DraftVocab, count_draft_vocab, prompt_texts

ROOT = Path(__file__).resolve().parents[3]


class Tokens:
    """A tokenizer of one id per character: ord(c) - 97."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) - 97 for c in text]


def test_file_round_trip_and_first_n(tmp_path):
    ids = torch.tensor([7, 2, 30, 5])
    DraftVocab(ids).save(tmp_path / "v.safetensors")
    assert set(load_file(tmp_path / "v.safetensors")) == {"token_ids"}
    loaded = DraftVocab.load(tmp_path / "v.safetensors")
    assert loaded.token_ids.tolist() == [7, 2, 30, 5] and len(loaded) == 4 and not list(tmp_path.glob("*.tmp"))
    assert DraftVocab.parse(str(tmp_path / "v.safetensors")).token_ids.tolist() == [7, 2, 30, 5]
    assert DraftVocab.parse("3").token_ids.tolist() == [0, 1, 2]
    loaded.check(31)
    with pytest.raises(ValueError, match="token id 30 is outside the target's vocabulary"):
        loaded.check(30)


def test_counts_most_frequent_first_eos_ahead():
    texts = ["aab", "cbbb", "d"]  # b 4, a 2, c 1, d 1
    assert count_draft_vocab(texts, Tokens(), 3, 8).token_ids.tolist() == [1, 0, 2]
    assert count_draft_vocab(texts, Tokens(), 3, 8, always=(7,)).token_ids.tolist() == [7, 1, 0]
    # never-seen ids fill the rest in id order; an always id is not repeated
    assert count_draft_vocab(texts, Tokens(), 8, 8, always=(3,)).token_ids.tolist() == [3, 1, 0, 2, 4, 5, 6, 7]
    with pytest.raises(ValueError, match="--size 0"):
        count_draft_vocab(texts, Tokens(), 0, 8)
    with pytest.raises(ValueError, match="past the target's vocab_size 3"):
        count_draft_vocab(texts, Tokens(), 2, 3)


def test_prompt_texts_reads_every_turn(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text(json.dumps({"question_id": 1, "turns": ["one", "two"]}) + "\n")
    assert prompt_texts([f]) == ["one", "two"]


def _dev_main():
    spec = importlib.util.spec_from_file_location("draft_vocab_cmd", ROOT / "dev" / "draft_vocab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_dev_command_writes_a_file_the_drafter_reads(checkpoint_factory, tmp_path, capsys):
    path, _ = checkpoint_factory("qwen3_5")
    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\n    return a + b\nfor i in range(10):\n    print(i)\n")
    out = tmp_path / "hot.safetensors"
    main = _dev_main()
    assert main(["--target", str(path), "--prompts", str(prompts), "--size", "40", "--out", str(out)]) == 0
    vocab = DraftVocab.load(out)
    assert len(vocab) == 40 and json.loads(capsys.readouterr().out)["size"] == 40
    assert main(["--target", str(path), "--prompts", str(prompts), "--size", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --size 0") and err.count("\n") == 1
    assert main(["--target", str(path), "--prompts", str(tmp_path / "nope.txt"), "--size", "4", "--out",
                 str(tmp_path / "x.safetensors")]) == 2
    assert "neither an existing prompt file" in capsys.readouterr().err and not (tmp_path / "x.safetensors").exists()
    assert main(["--target", str(path), "--prompts", str(prompts), "--size", "4", "--out",
                 str(tmp_path / "no" / "x.safetensors")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'no'}: no such directory to write the draft vocabulary " \
        "x.safetensors in\n"
