"""`specpilot profile` end to end on a tiny random target (CPU), and its bad-input errors."""

from __future__ import annotations

import json

import pytest

from specpilot.cli import main


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("def add(a, b):\nclass Stack:\n")
    return path


def test_profile_ranks_components_and_predicts_changes(tmp_path, prompts, monkeypatch, capsys):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "p.json"
    argv = ["profile", "--target", "random:tiny-dense", "--device", "cpu", "--batch", "2", "--steps", "3",
            "--warmup", "1", "--workload", str(prompts), "--tree", "chain:5", "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert (tmp_path / "p.png").stat().st_size > 0
    gaps = [r["gap_ms"] for r in doc["components"]]
    assert gaps == sorted(gaps, reverse=True)
    assert {r["component"] for r in doc["components"]} == {"draft", "verify", "accept", "commit", "other", "host_gap"}
    assert [p["part"] for p in doc["verify_parts"]] == ["verify.weights", "verify.lm_head", "verify.attention",
                                                        "verify.recurrent", "verify.launch"]
    changes = {c["change"]: c for c in doc["changes"]}
    assert changes["none (this run)"]["vs_now"] == 1.0 and "tree chain:7" in changes
    assert changes["verify at its ceiling"]["vs_now"] >= 1.0
    assert doc["measured"]["steps"] == 3 and doc["measured"]["tok_s"] > 0 and doc["predicted"]["tok_s"] > 0
    assert doc["prefill"]["steps"] >= 1 and doc["prefill"]["tokens_p50"] > 0 and doc["prefill"]["ceiling_ms"] > 0
    assert doc["acceptance"]["per_depth"] and "SYNTHETIC" in capsys.readouterr().out
    # the calibration was cached: a second run reads it
    assert main(argv) == 0
    assert "calibration: cached" in capsys.readouterr().err


def test_profile_samples_at_the_temperature_it_is_given(tmp_path, prompts, monkeypatch, capsys):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "p.json"
    argv = ["profile", "--target", "random:tiny-dense", "--device", "cpu", "--batch", "2", "--steps", "2",
            "--warmup", "1", "--workload", str(prompts), "--tree", "chain:3", "--temperature", "0.7", "--top-k", "20",
            "--seed", "5", "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["sampling"] == {"temperature": 0.7, "top_k": 20, "top_p": 1.0, "seed": 5}
    assert doc["measured"]["steps"] == 2 and doc["measured"]["tok_s"] > 0
    assert "temperature 0.7, top-k 20" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--target", "random:tiny-dense", "--batch", "0"], "error: --batch 0: must be >= 1"),
    (["--target", "random:tiny-dense", "--steps", "0"], "error: --steps 0: must be >= 1"),
    (["--target", "random:nope"], "unknown shape 'nope'"),
    (["--target", "random:tiny-dense", "--acceptance", "real"], "acceptance on random weights means nothing"),
    (["--target", "random:tiny-dense", "--acceptance", "synthetic:nope"], "acceptance profile 'nope'"),
    (["--target", "random:tiny-dense", "--tree", "ring:3"], "--tree"),
    (["--target", "{missing}", "--drafter", "ngram"], "no such directory"),
    (["--target", "random:tiny-dense", "--weight-format", "w12n"], "--weight-format w12n needs --dtype bfloat16"),
    (["--target", "random:tiny-dense", "--drafter", "none"], "--drafter none: profile measures a speculative step"),
    (["--target", "random:tiny-dense", "--temperature", "-1"],
     "error: --temperature -1: must be a finite number >= 0 (0: greedy)"),
    (["--target", "random:tiny-dense", "--temperature", "1", "--top-p", "1.5"],
     "error: --top-p 1.5: must be in (0, 1] (1: off)"),
    (["--target", "random:tiny-dense", "--top-p", "0.9"],
     "error: --top-p 0.9: filters sampling; it needs --temperature > 0 (0 is greedy)"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, args, message):
    args = [a.replace("{missing}", str(tmp_path / "no-such-model")) for a in args]
    assert main(["profile", "--device", "cpu", "--out", str(tmp_path / "p.json"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "p.json").exists()
