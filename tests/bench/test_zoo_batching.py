"""bench/zoo_batching.py's flag checks: a pair the zoo cannot have is one line and status 2 before anything loads."""

import pytest

from bench import zoo_batching


@pytest.mark.parametrize("pair", ["hybrid:foo", "big:dflash", "hybrid"])
def test_a_bad_pair_is_one_line_and_status_2(pair, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        zoo_batching.main(["--out", str(tmp_path / "x.json"), "--pairs", pair])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and f"--pairs {pair!r}: use TARGET:DRAFTER" in err[-1]
    assert "mtp" in err[-1] and not (tmp_path / "x.json").exists()
