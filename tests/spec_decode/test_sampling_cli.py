"""specpilot bench's sampling flags: bad values and combinations are one line and status 2, before any model
loads or file is written."""

import itertools

import pytest

from specpilot.cli import main

CASES = [
    (["--temperature", "-0.5"], "temperature=-0.5: must be >= 0"),
    (["--temperature", "0.7", "--top-p", "0"], "top_p=0.0: must be in (0, 1]"),
    (["--temperature", "0.7", "--top-k", "-2"], "top_k=-2: must be >= 0"),
]


@pytest.mark.parametrize("flags,line", CASES)
def test_bench_refuses_bad_sampling_flags(flags, line, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["bench", "--target", str(tmp_path / "model"), "--out", str(out), *flags])
    captured = capsys.readouterr()
    assert (rc, captured.out, captured.err) == (2, "", f"error: {line}\n")
    assert not out.exists()


def test_generate_samples_with_a_drafter_as_without(checkpoint_factory, capsys):
    """specpilot generate at temperature > 0 with a drafter emits what plain sampling with the same seed emits."""
    import json

    path, _ = checkpoint_factory("qwen3")
    out = {}
    for drafter in ("none", "ngram"):
        capsys.readouterr()
        rc = main(["generate", "--target", str(path), "--prompt", "def add(a, b): return a + b\ndef add(a, b):",
                   "--drafter", drafter, "--tree", "static:2,1,1", "--temperature", "0.5", "--top-p", "0.9",
                   "--seed", "3", "--max-new-tokens", "16", "--ignore-eos", "--device", "cpu", "--dtype", "float32",
                   "--json"])
        assert rc == 0
        out[drafter] = json.loads(capsys.readouterr().out)
    assert out["ngram"]["token_ids"] == out["none"]["token_ids"]
    assert out["ngram"]["stats"]["tau"] >= 1


def test_bench_rows_per_temperature_beside_greedy(checkpoint_factory, tmp_path, capsys):
    """specpilot bench --temperature 0 0.8: AR and stock at both; the sampled rows are checked against AR sampling
    with the same seed, the greedy ones by forcing."""
    import json

    data = tmp_path / "data" / "eagle"
    data.mkdir(parents=True)
    rows = [{"question_id": i, "category": "coding", "turns": [f"def add{i}(a, b):\n    return a + b\n" * 2]}
            for i in range(1)]
    (data / "humaneval_question.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    path, _ = checkpoint_factory("qwen3")
    out = tmp_path / "bench.json"
    rc = main(["bench", "--target", str(path), "--drafter", "ngram", "--workloads", "humaneval", "--data-dir",
               str(tmp_path / "data"), "--max-new-tokens", "8", "--stock-tree", "chain:3", "--temperature", "0",
               "0.8", "--seed", "5", "--out", str(out), "--no-chat"])
    assert rc == 0
    results = json.loads(out.read_text())["results"]
    assert sorted((r["temperature"], r["config"]) for r in results) == [(0.0, "ar"), (0.0, "stock"), (0.8, "ar"),
                                                                         (0.8, "stock")]
    checks = {(r["temperature"], r["forcing"].get("check", "forcing")) for r in results if r["config"] != "ar"}
    assert checks == {(0.0, "forcing"), (0.8, "equal to AR sampling with the same seed")}
    assert all(r["forcing"]["passed"] for r in results if r["config"] != "ar")
    captured = capsys.readouterr()
    assert "4/4 rows" in captured.err and "stock T0.8" in captured.out


def test_bench_synthetic_rows_at_temperature(tmp_path, capsys):
    """specpilot bench on a random target under synthetic acceptance at 0 and 0.7, batch 1 and 2: the sampled rows
    equal AR sampling with the same seed, their oracle follows AR's sampled output (tau as the profile gives it), and
    the JSON and the printed table say what such a row's acceptance is."""
    import json

    data = tmp_path / "data" / "eagle"
    data.mkdir(parents=True)
    turns = ["Tom has 3 apples and buys 4 more.", "A train leaves at 9 and arrives at 11."]
    (data / "gsm8k_question.jsonl").write_text("\n".join(
        json.dumps({"question_id": i, "category": "math", "turns": [t]}) for i, t in enumerate(turns)))
    out = tmp_path / "bench.json"
    rc = main(["bench", "--target", "random:tiny-dense", "--drafter", "random-dflash", "--acceptance",
               "synthetic:dflash2-gsm8k", "--workloads", "gsm8k", "--data-dir", str(tmp_path / "data"),
               "--max-new-tokens", "16", "--temperature", "0", "0.7", "--seed", "3", "--device", "cpu",
               "--batch-sizes", "1", "2", "--configs", "tree=tree:static:3,2,1", "--out", str(out)])
    assert rc == 0
    rows = {(r["temperature"], r["batch"], r["config"]): r for r in json.loads(out.read_text())["results"]}
    for batch, config in itertools.product((1, 2), ("stock", "tree")):
        row = rows[0.7, batch, config]
        assert row["forcing"]["check"] == "equal to AR sampling with the same seed" and row["forcing"]["passed"]
        assert row["tau"] > 1.5 and row["synthetic"]
        assert "sampled at T=0.7" in row["acceptance_label"]
        assert "sampled" not in rows[0.0, batch, config]["acceptance_label"]
    captured = capsys.readouterr()
    assert "T > 0 rows: dflash2-gsm8k" in captured.out
