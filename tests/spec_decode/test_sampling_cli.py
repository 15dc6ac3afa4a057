"""specpilot bench's sampling flags: bad values and combinations are one line and status 2, before any model
loads or file is written."""

import pytest

from specpilot.cli import main

CASES = [
    (["--temperature", "0.7", "--batch-sizes", "1", "4"],
     "--temperature 0.7 with --batch-sizes 1 4: sampled rows are checked against AR sampling with the same seed one "
     "request at a time; use --batch-sizes 1"),
    (["--temperature", "1", "--acceptance", "synthetic:dflash2-gsm8k"],
     "--temperature 1 with --acceptance synthetic:dflash2-gsm8k: synthetic acceptance follows greedy continuations; "
     "use --acceptance real"),
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
