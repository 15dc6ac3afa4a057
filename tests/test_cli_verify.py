"""`specpilot verify`'s bad inputs: one `error:` line on stderr, exit 2, before any model loads."""

import pytest

from specpilot.cli import main


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded before the bad flag was refused")


@pytest.mark.parametrize("flags, message", [
    (["--limit", "0"], "--limit 0: must be >= 1"),
    (["--limit", "-2"], "--limit -2: must be >= 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0: must be >= 1"),
    (["--max-new-tokens", "-1"], "--max-new-tokens -1: must be >= 1"),
    (["--prompts", "no-such-set"], "'no-such-set' is neither an existing prompt file nor a shipped prompt set"),
])
def test_verify_bad_input_fails_up_front_with_one_line(flags, message, capsys, monkeypatch):
    from specpilot.models import loader

    monkeypatch.setattr(loader, "load_model", _no_model)
    monkeypatch.setattr(loader, "load_tokenizer", _no_model)
    rc = main(["verify", "--target", "unused", "--prompts", "gsm8k", *flags])
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: ") and message in captured.err
