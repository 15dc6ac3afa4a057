"""Detokenizer against a full decode after every token (the engines' and the streamer's former logic): the same
text, the same stop token, incomplete UTF-8 and possible stop-string beginnings held back, no stop string shown."""

import random
from pathlib import Path

import pytest
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from specpilot.bench.shapes import ByteTokenizer
from specpilot.engine.detokenizer import Detokenizer, _Stream, decode_text
from specpilot.engine.engine import SpecEngine
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.models.loader import load_model, load_tokenizer
from specpilot.spec_decode.drafters.ngram import NgramDrafter
from specpilot.spec_decode.tree import TreeSpec

ZOO_DENSE = Path(__file__).resolve().parents[2] / "zoo" / "dense"
TEXTS = ["def naïve_café(x):\n    return x * 2  # ok\n", "日本語のテキストと中文字符。", "emoji 🙂🚀 and ∑ ≤ ∞ ✓\n",
         "the quick brown fox jumps over the lazy dog. ", "Grüße, señor! Ça va? Ωμέγα."] * 10


def _full_decode_reference(tok, ids: list[int], stop: tuple[str, ...]):
    """A full decode after every token. Returns (tokens consumed, final text, whether a stop string ended it, the
    text that may be shown after each token, or None where a token rewrote earlier text). What may be shown: the
    last text not ending in U+FFFD, less its longest tail that is a proper prefix of a stop string."""
    visible, clean = [], ""
    for n in range(1, len(ids) + 1):
        text = decode_text(tok, ids[:n])
        if visible is not None and not text.startswith(clean):
            visible = None  # a byte-fallback run turned invalid: no stream can match, only the stops and the end
        hits = [text.find(s) for s in stop if s in text]
        if hits:
            return n, text[:min(hits)], True, visible
        if not text.endswith("\ufffd"):
            clean = text
        held = max((k for s in stop for k in range(1, len(s)) if clean.endswith(s[:k])), default=0)
        if visible is not None:
            visible.append(clean[:len(clean) - held])
    return len(ids), decode_text(tok, ids), False, visible


def _check_against_reference(tok, ids: list[int], stop: tuple[str, ...]) -> None:
    n, text, stopped, visible = _full_decode_reference(tok, ids, stop)
    detok, shown = Detokenizer(tok, stop), ""
    for i, t in enumerate(ids):
        shown += detok.push(t)
        if detok.stopped:
            break
        assert visible is None or shown == visible[i], (ids, stop, i)
    assert (i + 1, detok.stopped) == (n, stopped), (ids, stop)
    assert (detok.text if detok.stopped else decode_text(tok, ids)) == text, (ids, stop)
    if visible is not None:
        assert text.startswith(shown) and not any(s in shown for s in stop), (ids, stop)


def _random_case(tok, rng: random.Random, vocab: int) -> tuple[list[int], tuple[str, ...]]:
    """Random ids (special tokens and lone UTF-8 bytes included) mixed with the ids of real multilingual text; stop
    strings cut from the decoded text (so most span tokens), one that never occurs, and sometimes none."""
    ids = []
    for _ in range(rng.randrange(1, 6)):
        if rng.random() < 0.5:
            ids += [rng.randrange(vocab) for _ in range(rng.randrange(1, 8))]
        else:
            words = rng.choice(TEXTS)
            a = rng.randrange(len(words))
            ids += tok.encode(words[a:a + rng.randrange(1, 30)], add_special_tokens=False)
    text = decode_text(tok, ids)
    stop = []
    for _ in range(rng.randrange(0, 3)):
        if text:
            a = rng.randrange(len(text))
            stop.append(text[a:a + rng.randrange(1, 6)])
    if rng.random() < 0.5:
        stop.append("never-in-the-output")
    return ids, tuple(stop)


def _byte_level_bpe():
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|end|>", "<|pad|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS, trainer)
    tok.add_tokens([AddedToken("<tool>", special=False, normalized=False)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>")


def _metaspace_byte_fallback():
    """A SentencePiece-style BPE (Llama-2 / Mistral): U+2581 for spaces, <0xNN> byte tokens for anything not in
    the vocabulary, and a decoder that drops the leading space of the text."""
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz.,!?", "▁t", "he", "▁the", "▁a", "in", "▁in", "er", "▁s"]
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "a"), ("i", "n"), ("▁", "in"), ("e", "r"), ("▁", "s")]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    vocab.update({p: len(vocab) + i for i, p in enumerate(pieces)})
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


TOKENIZERS = {
    "zoo": lambda: load_tokenizer(str(ZOO_DENSE)),
    "byte-level-bpe": _byte_level_bpe,
    "metaspace-byte-fallback": _metaspace_byte_fallback,
    "bytes": ByteTokenizer,
}


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_random_sequences_match_full_decode(name):
    tok = TOKENIZERS[name]()
    vocab = 256 if name == "bytes" else len(tok)
    rng = random.Random(name)
    for _ in range(150):
        _check_against_reference(tok, *_random_case(tok, rng, vocab))


@pytest.mark.parametrize("name", ["zoo", "byte-level-bpe", "metaspace-byte-fallback"])
def test_fast_tokenizers_never_decode_the_whole_output(name, monkeypatch):
    tok = TOKENIZERS[name]()
    ids = tok.encode(" ".join(TEXTS), add_special_tokens=False)
    detok = Detokenizer(tok, ("never-in-the-output", "Ωμ"))
    assert isinstance(detok.stream, _Stream)

    def full_decode(*args, **kwargs):
        raise AssertionError("the fast path decoded the whole output")

    monkeypatch.setattr(tok, "decode", full_decode)
    for t in ids:
        detok.push(t)
    assert detok.stopped


def test_plain_path_for_tokenizers_without_a_backend():
    assert Detokenizer(ByteTokenizer()).stream is None


def test_multibyte_character_split_across_tokens_is_held_back():
    tok = ByteTokenizer()
    detok = Detokenizer(tok)
    assert [detok.push(b) for b in "a🙂b".encode()] == ["a", "", "", "", "🙂", "b"]


def test_only_a_possible_stop_beginning_is_held_back():
    tok = _byte_level_bpe()
    detok = Detokenizer(tok, ("STOP", "<end>"))
    out = [detok.push(t) for t in tok.encode("x = 1 S", add_special_tokens=False)]
    assert "".join(out) == "x = 1 "  # "S" may begin "STOP"; the held tail is one character, not len("STOP") - 1
    out = [detok.push(t) for t in tok.encode("TO", add_special_tokens=False)]
    assert "".join(out) == "" and not detok.stopped
    out = [detok.push(t) for t in tok.encode("P and more", add_special_tokens=False)]
    assert "".join(out) == "" and detok.stopped and detok.text == "x = 1 "


def test_streamer_prints_the_final_text_and_never_a_stop_string(capsys):
    from specpilot.cli import _Streamer

    tok = _byte_level_bpe()
    ids = tok.encode("Grüße 🙂 señor STOP and more", add_special_tokens=False)
    n, final, stopped, _ = _full_decode_reference(tok, ids, ("STOP",))
    assert stopped and final == "Grüße 🙂 señor "
    stream = _Streamer(tok, ("STOP",))
    for t in ids[:n]:  # the engine stops after the token that completes the stop string
        stream.push(0, t)
    assert capsys.readouterr().out == final  # all of it while streaming, none of the stop string
    stream.finish(final)
    assert capsys.readouterr().out == "\n"


@pytest.mark.parametrize("engine", ["ar", "spec"])
def test_engines_stop_where_a_full_decode_stops(engine, checkpoint_factory):
    path, _ = checkpoint_factory("llama")
    model, tok = load_model(str(path), "cpu", "float32"), load_tokenizer(str(path))
    prompt = tok.encode("def add(a, b):")

    def run(stop):
        params = SamplingParams(max_new_tokens=16, stop=stop)
        if engine == "ar":
            return Generator(ModelRunner(model), (), tok).generate([prompt], params)[0]
        return SpecEngine(ModelRunner(model), NgramDrafter(), TreeSpec.parse("chain:3"), (), tok).generate(
            [prompt], params)[0][0]

    free = run(())
    assert free.text == decode_text(tok, free.token_ids)
    mid = len(free.text) // 2
    stop = (free.text[mid:mid + 3], "never-in-the-output")
    n, text, _, _ = _full_decode_reference(tok, free.token_ids, stop)
    stopped = run(stop)
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[:n] and stopped.text == text
