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


@pytest.mark.parametrize("flags,match", [(["--drafters", "eagle9"], "--drafters"),
                                         (["--target", "Qwen3-8B"], "--target"), (["--batches", "0"], "--batches"),
                                         (["--mtp-depths", "0"], "--mtp-depths")])
def test_bad_flags(flags, match, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        drafter_proposal.main(["--device", "cpu", "--out", str(tmp_path / "p.json"), *flags])
    assert e.value.code == 2 and match in capsys.readouterr().err
