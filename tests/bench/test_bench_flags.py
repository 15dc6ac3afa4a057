"""The session's benchmark scripts (verify_curve, dflash_scaling, zoo_batching) refuse bad flags with one line and
status 2, before any model is built or any file written."""

import pytest

from bench.__main__ import main

CASES = [
    (["verify_curve", "--out", "{out}", "--batches", "0"], "--batches"),
    (["verify_curve", "--out", "{out}", "--target", "nope"], "--target"),
    (["dflash_scaling", "--out", "{out}", "--device", "cpu", "--tree", "bogus:3"], "--tree"),
    (["dflash_scaling", "--out", "{out}", "--device", "cpu", "--batches", "0"], "--batches"),
    (["dflash_scaling", "--out", "{out}", "--device", "cpu", "--target", "nope"], "--target"),
    (["zoo_batching", "--out", "{out}", "--pairs", "dense"], "--pairs"),
    (["zoo_batching", "--out", "{out}", "--pairs", "big:dflash"], "--pairs"),
    (["zoo_batching", "--out", "{out}", "--batch", "0"], "--batch"),
    (["zoo_batching", "--out", "{out}", "--tree", "chain:0"], "--tree"),
]


@pytest.mark.parametrize("argv,names", CASES)
def test_a_bad_flag_is_one_line_and_status_2(argv, names, tmp_path, capsys):
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as done:
        main([a.format(out=out) for a in argv])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert names in err[-1] and err[-1].startswith(f"python3 -m bench {argv[0]}: error: ")
    assert not out.exists()
