"""bench/drafter_proposal.py on the CPU with tiny shapes: every drafter's row and its stepped-vs-whole check land in
the JSON with the run record; bad flags are refused in one line with status 2."""

import json

import pytest

from bench import drafter_proposal


def test_cpu_smoke_run_writes_every_drafter(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert drafter_proposal.main(["--device", "cpu", "--target", "tiny-hybrid", "--batches", "2", "--context", "12",
                                  "--reps", "1", "--warmup", "1", "--accepted", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {"gpu", "commit", "command"} <= set(data)
    rows = {r["drafter"]: r for r in data["rows"]}
    assert set(rows) == set(drafter_proposal.DRAFTERS) and all("error" not in r for r in rows.values())
    assert all(c == {"stepped_vs_whole_agreement": 1.0} for c in data["checks"].values())
    assert rows["dspark"]["depth"] == 5 and rows["dflash2"]["depth"] == 5 and rows["mtp"]["depth"] == 3
    assert rows["dspark"]["bytes"]["markov_w2"] > 0 and rows["mtp"]["bytes"]["lm_head"] > 0
    assert [r["depth"] for r in data["rows"] if r["drafter"] == "mtp"] == [1, 2, 3]  # a row per --mtp-depths
    assert "propose_ms" in capsys.readouterr().out


def test_mtp_draft_vocab_rows(tmp_path):
    """--mtp-draft-vocab N: the MTP rows again, labelled mtp:N, their LM head bytes N rows per level."""
    out = tmp_path / "p.json"
    assert drafter_proposal.main(["--device", "cpu", "--target", "tiny-hybrid", "--drafters", "mtp", "--batches", "2",
                                  "--context", "12", "--reps", "1", "--warmup", "1", "--accepted", "2",
                                  "--mtp-depths", "1", "3", "--mtp-draft-vocab", "100", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {(r["drafter"], r["depth"]): r for r in data["rows"]}
    assert set(rows) == {("mtp", 1), ("mtp", 3), ("mtp:100", 1), ("mtp:100", 3)}
    assert all("error" not in r for r in rows.values())
    assert data["checks"] == {name: {"stepped_vs_whole_agreement": 1.0} for name in ("mtp", "mtp:100")}
    row_bytes = 64 * 4  # tiny-hybrid's hidden size, fp32 on the CPU
    for depth in (1, 3):
        full, reduced = rows[("mtp", depth)], rows[("mtp:100", depth)]
        assert full["draft_vocab"] == 512 and reduced["draft_vocab"] == 100
        assert full["bytes"]["lm_head"] == depth * 512 * row_bytes
        assert reduced["bytes"]["lm_head"] == depth * 100 * row_bytes
        assert {k: v for k, v in reduced["bytes"].items() if k != "lm_head"} == \
            {k: v for k, v in full["bytes"].items() if k != "lm_head"}


@pytest.mark.parametrize("flags,match", [(["--drafters", "eagle9"], "--drafters"),
                                         (["--target", "Qwen3-8B"], "--target"), (["--batches", "0"], "--batches"),
                                         (["--mtp-depths", "0"], "--mtp-depths"),
                                         (["--mtp-draft-vocab", "0"], "--mtp-draft-vocab [0]: each N must be in 1 .."),
                                         (["--mtp-draft-vocab", "248321"], "in 1 .. 248320 (Qwen3.5-27B's vocab_size)"),
                                         (["--drafters", "dflash", "--mtp-draft-vocab", "8"], "put mtp in --drafters"),
                                         (["--mtp-head", "fp16"], "--mtp-head: invalid choice: 'fp16'"),
                                         (["--mtp-head", "fp8", "fp8"], "name each of bf16, fp8 at most once"),
                                         (["--drafters", "dspark", "--mtp-head", "fp8"], "put mtp in --drafters")])
def test_bad_flags(flags, match, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        drafter_proposal.main(["--device", "cpu", "--out", str(tmp_path / "p.json"), *flags])
    assert e.value.code == 2 and match in capsys.readouterr().err
