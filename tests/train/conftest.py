"""Fixtures of the block-drafter and MTP training tests: a tiny corpus and a random target whose tokenizer has the
<|mask|> token."""

import pytest

from specpilot.models.random_checkpoint import EOS, write_tokenizer


@pytest.fixture(scope="session")
def drafter_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafter_corpus")
    for i in range(150):  # the CLI holds out 2% of the files, by hash
        (root / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" * 8)
    return root


@pytest.fixture(scope="session")
def mask_target(tmp_path_factory):
    """A random Qwen3 target whose tokenizer has the <|mask|> token the block drafters train with."""
    from tests.checkpoints import TEXTS, write_checkpoint

    path = tmp_path_factory.mktemp("qwen3_mask")
    write_checkpoint("qwen3", path)
    write_tokenizer(path, 320, TEXTS, special_tokens=(EOS, "<|mask|>"))
    return path
