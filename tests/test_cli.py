"""The `specpilot` command end to end: generate (stream and --json), demo, and errors on stderr."""

import json

from specpilot.cli import main
from specpilot.engine.generator import Generator
from specpilot.runtime.runner import ModelRunner
from specpilot.runtime.sampling import SamplingParams
from specpilot.models.loader import load_model, load_tokenizer


def test_generate_json_prints_one_object(checkpoint_factory, capsys):
    path, _ = checkpoint_factory("qwen3_5")
    rc = main(["generate", "--target", str(path), "--prompt", "def add(a, b):", "--max-new-tokens", "10",
               "--json", "--ignore-eos"])
    out = capsys.readouterr().out
    assert rc == 0
    obj = json.loads(out)  # exactly one JSON document on stdout
    assert out.strip().count("\n") == 0
    tok = load_tokenizer(str(path))
    expected = Generator(ModelRunner(load_model(str(path), "cpu", "float32"))).generate(
        [tok.encode("def add(a, b):")], SamplingParams(max_new_tokens=10))[0].token_ids
    assert obj["token_ids"] == expected
    assert obj["text"] == tok.decode(expected, skip_special_tokens=True)
    assert obj["stats"]["tokens"] == 10 and obj["stats"]["tok_per_s"] > 0


def test_generate_streams_text_and_stats(checkpoint_factory, capsys):
    path, _ = checkpoint_factory("llama")
    rc = main(["generate", "--target", str(path), "--prompt", "for i in", "--max-new-tokens", "6",
               "--temperature", "0.8", "--seed", "3", "--device", "cpu", "--dtype", "float32"])
    captured = capsys.readouterr()
    assert rc == 0
    assert captured.out.endswith("\n") and len(captured.out) > 1
    assert "tok/s" in captured.err and "TTFT" in captured.err


def test_generate_errors_go_to_stderr(tmp_path, capsys):
    rc = main(["generate", "--target", str(tmp_path / "missing"), "--prompt", "x"])
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    assert "no such directory" in captured.err


def test_an_error_line_prints_its_message_as_written(tmp_path, capsys):
    """Brackets and colon words in a message (a path, `--drafter mtp:x`) are neither rich markup nor emoji codes."""
    odd = tmp_path / "a[bold]b:x:[/]"
    rc = main(["generate", "--target", str(odd), "--prompt", "x"])
    err = capsys.readouterr().err
    assert rc == 2 and str(odd) in err and len(err.strip().splitlines()) == 1, err


def test_demo_runs(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path))
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)  # the demo's one thread, not this process's
    rc = main(["demo", "--max-new-tokens", "8", "--json"])
    assert threads == [1]
    obj = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(obj["token_ids"]) <= 8
    assert obj["stats"]["architecture"] == "Qwen3_5ForCausalLM"
    spec = obj["speculative"]
    assert spec["identical"] and spec["forcing"]["passed"] and spec["forcing"]["tokens"] == 8 and spec["tau"] >= 1


def test_verify_json_passes_token_forcing(checkpoint_factory, tmp_path, capsys):
    path, _ = checkpoint_factory("qwen3")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nfor i in range(10):\n")
    rc = main(["verify", "--target", str(path), "--drafter", str(path), "--prompts", str(prompts),
               "--max-new-tokens", "12", "--tree", "dynamic:2,3,6", "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert rc == 0 and obj["passed"] and obj["prompts"] == 2 and obj["mismatches"] == 0
    assert obj["tokens"] == 24 and obj["tau"] > 1.5  # the target drafting for itself


def test_verify_reports_a_forced_mismatch(checkpoint_factory, tmp_path, monkeypatch, capsys):
    """A drafter bug that changed an output token must be caught, with its margin and exit status 1."""
    from specpilot.engine import engine as engine_mod

    path, _ = checkpoint_factory("llama")
    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\n")
    original = engine_mod.SpecEngine.emit

    def corrupt(self, active, trees, accepted, *rest):
        accepted = [type(a)(a.path, a.tokens[:-1] + ((a.tokens[-1] + 1) % 300,)) for a in accepted]
        return original(self, active, trees, accepted, *rest)

    monkeypatch.setattr(engine_mod.SpecEngine, "emit", corrupt)
    rc = main(["verify", "--target", str(path), "--prompts", str(prompts), "--max-new-tokens", "6", "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert rc == 1 and not obj["passed"] and obj["failures"] > 0
    assert all(m["margin"] > 0 for m in obj["mismatch_list"])


def test_generate_with_drafter_reports_tau(checkpoint_factory, capsys):
    path, _ = checkpoint_factory("qwen3")
    rc = main(["generate", "--target", str(path), "--prompt", "def add(a, b):", "--max-new-tokens", "10",
               "--drafter", "ngram", "--tree", "chain:3", "--json", "--ignore-eos"])
    obj = json.loads(capsys.readouterr().out)
    assert rc == 0 and obj["stats"]["tokens"] == 10 and obj["stats"]["tau"] >= 1.0
    assert set(obj["stats"]["seconds"]) == {"start", "draft", "verify", "accept", "commit", "other"}


def test_version_is_the_package_metadata(capsys):
    from importlib.metadata import version

    import pytest

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"specpilot {version('specpilot')}\n"


def _parsers(parser, argv=()):
    import argparse

    yield list(argv), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*argv, name))


def test_every_help_names_each_default():
    """Every option of every (sub)command with a default to name shows it in --help."""
    import argparse

    from specpilot.cli import _parser

    parsers = list(_parsers(_parser()))
    assert len(parsers) > 9  # specpilot, its seven commands and train's subcommands
    for argv, parser in parsers:
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if not action.option_strings or action.default is False or action.default in (None, [], argparse.SUPPRESS):
                continue
            shown = f"(default: {action.default})" in text or "default" in (action.help or "")
            assert shown, f"specpilot {' '.join(argv)} --help: {action.option_strings[0]} hides its default"


def test_demo_echoes_its_prompt_before_the_completion(capsys):
    rc = main(["demo", "--prompt", "def add(a, b):", "--max-new-tokens", "4", "--drafter", "ngram"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("def add(a, b):") and len(out) > len("def add(a, b):\n")


def test_the_default_demo_prompt_does_not_loop_on_the_zoo_hybrid():
    """The demo's greedy completion on the zoo's hybrid target: no line more than 3 times (the earlier default,
    a docstring ending in a newline, printed `import os` 29 times)."""
    from collections import Counter

    from specpilot.cli import _parser, encode_prompt
    from specpilot.demo import zoo_pair

    args = _parser().parse_args(["demo"])
    path, _ = zoo_pair(args.model, args.demo_drafter)
    tok, model = load_tokenizer(str(path)), load_model(str(path), "cpu", "float32")
    out = Generator(ModelRunner(model)).generate([encode_prompt(tok, args.prompt, False)], SamplingParams(
        max_new_tokens=args.max_new_tokens))[0]
    lines = Counter(line for line in tok.decode(out.token_ids, skip_special_tokens=True).splitlines() if line.strip())
    assert len(out.token_ids) == args.max_new_tokens and max(lines.values()) <= 3, lines.most_common(3)


def test_bad_flags_fail_before_any_weights_load(tmp_path, monkeypatch, capsys):
    """The tree spec, greedy decoding under a drafter, the sampling values and the weight format's dtype are checked
    before a tokenizer or a weight is read (the loaders raise here), in generate, verify and demo."""
    from specpilot.models import loader

    def no_load(*a, **k):
        raise AssertionError("a checkpoint was read before the flags were checked")

    monkeypatch.setattr(loader, "load_model", no_load)
    monkeypatch.setattr(loader, "load_tokenizer", no_load)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\n")
    generate = ["generate", "--target", str(tmp_path / "model"), "--prompt", "x"]
    cases = [
        (generate + ["--tree", "chain:0"],
         "--tree 'chain:0': use chain:D, static:C1,C2,... or dynamic:TOPK,DEPTH,NODES with positive integers"),
        (generate + ["--drafter", "ngram", "--tree", "bogus"],
         "--tree 'bogus': use chain:D, static:C1,C2,... or dynamic:TOPK,DEPTH,NODES with positive integers"),
        (generate + ["--drafter", "ngram", "--tree", "dynamic:16,16,4"],
         "--tree 'dynamic:16,16,4': the tree grows to 257 nodes per step (root included); at most 256: use a "
         "smaller tree"),
        (generate + ["--top-p", "0"], "top_p=0.0: must be in (0, 1]"),
        (generate + ["--weight-format", "w12n", "--device", "cpu"],
         "--weight-format w12n needs --dtype bfloat16 (--dtype auto on cpu is float32)"),
        (["verify", "--target", str(tmp_path / "model"), "--prompts", str(prompts), "--tree", "chain:40"],
         "--tree 'chain:40': 40 levels deep; at most 32: use a shallower tree"),
        (["demo", "--tree", "static:2,0"],
         "--tree 'static:2,0': use chain:D, static:C1,C2,... or dynamic:TOPK,DEPTH,NODES with positive integers"),
        (["demo", "--temperature", "-1"], "temperature=-1.0: must be >= 0"),
        (["demo", "--threads", "0"], "--threads 0: must be >= 1"),
        (generate + ["--threads", "-2"], "--threads -2: must be >= 1"),
    ]
    for argv, line in cases:
        rc = main(argv)
        captured = capsys.readouterr()
        assert (rc, captured.out, captured.err) == (2, "", f"error: {line}\n"), argv


def test_a_tree_deeper_than_the_dflash_block_is_cut_and_said_once(checkpoint_factory, tmp_path, capsys):
    from tests.spec_decode.test_dflash import write_dflash

    path, _ = checkpoint_factory("qwen3")
    drafter = write_dflash(tmp_path / "dflash")  # a block of 6: the root and 5 drafted tokens
    capsys.readouterr()
    rc = main(["generate", "--target", str(path), "--prompt", "def add(a, b):", "--max-new-tokens", "12",
               "--drafter", str(drafter), "--tree", "chain:20", "--json", "--ignore-eos"])
    captured = capsys.readouterr()
    line = "--tree chain:20: the dflash drafter drafts at most 5 tokens ahead, so it drafts chain:5 per step"
    assert rc == 0 and captured.err.count(line) == 1 and captured.err.count("\n") == 1
    tok = load_tokenizer(str(path))
    expected = Generator(ModelRunner(load_model(str(path), "cpu", "float32"))).generate(
        [tok.encode("def add(a, b):")], SamplingParams(max_new_tokens=12))[0].token_ids
    assert json.loads(captured.out)["token_ids"] == expected


def test_demo_eagle3_with_a_small_dynamic_tree(capsys):
    """The zoo's EAGLE-3 head with dynamic:8,3,2 crashed in store_kv: its tree while growing (up to 8 x 2 scratch
    nodes) outgrew the head cache, sized for the 2 nodes it keeps."""
    rc = main(["demo", "--model", "dense", "--drafter", "eagle3", "--tree", "dynamic:8,3,2", "--max-new-tokens", "8",
               "--json"])
    spec = json.loads(capsys.readouterr().out)["speculative"]
    assert rc == 0 and spec["identical"] and spec["forcing"]["passed"] and spec["forcing"]["tokens"] == 8


def test_demo_runs_the_hybrid_targets_own_mtp_layer(capsys):
    """`--drafter mtp`: the MTP layer in zoo/hybrid's checkpoint, chained to depth 7."""
    rc = main(["demo", "--drafter", "mtp", "--max-new-tokens", "8", "--json"])
    spec = json.loads(capsys.readouterr().out)["speculative"]
    assert rc == 0 and spec["drafter"] == "mtp" and spec["identical"] and spec["forcing"]["passed"]
    assert spec["tau"] > 1


def test_a_drafter_the_zoo_lacks_for_the_model_is_one_line_listing_what_it_has(monkeypatch, capsys):
    """The zoo has no EAGLE-3 head for the hybrid target (its MTP layer took that place) and no MTP layer for the
    dense one: one line, status 2, before any weight loads."""
    from specpilot.demo import zoo_dir
    from specpilot.models import loader

    def no_load(*a, **k):
        raise AssertionError("a checkpoint was read before the drafter was checked")

    monkeypatch.setattr(loader, "load_model", no_load)
    monkeypatch.setattr(loader, "load_tokenizer", no_load)
    zoo = zoo_dir()
    for model, drafter, have in (("hybrid", "eagle3", "dflash, draft-lm, mtp, ngram"),
                                 ("dense", "mtp", "dflash, eagle3, draft-lm, ngram")):
        rc = main(["demo", "--model", model, "--drafter", drafter])
        captured = capsys.readouterr()
        line = f"the zoo ({zoo}) has no {drafter} drafter for the {model} target; its drafters for {model}: {have}"
        assert (rc, captured.out, captured.err) == (2, "", f"error: {line}\n")


def test_eager_and_weight_format_reach_a_draft_lms_runner(checkpoint_factory, monkeypatch, capsys):
    """generate --eager --weight-format w12n with a draft LM: the drafter's runner takes the runtime the flags give
    the target (so the draft model carries W12N planes too), and on a GPU that runtime has every CUDA graph and
    fast path --eager names off, for the target and the drafter alike."""
    from specpilot import cli
    from specpilot.config import Ablations, EngineConfig
    from specpilot.runtime.settings import Runtime
    from specpilot.spec_decode.drafters import registry

    path, _ = checkpoint_factory("qwen3", intermediate_size=1024)  # MLP weights large enough to pay for W12N
    draft_path, _ = checkpoint_factory("qwen3", intermediate_size=1024, num_hidden_layers=1)
    built = []

    class Recorded(registry.DraftLMDrafter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(registry, "DraftLMDrafter", Recorded)
    flags = ["generate", "--target", str(path), "--prompt", "def add(a, b):", "--drafter", str(draft_path),
             "--max-new-tokens", "6", "--ignore-eos", "--device", "cpu", "--dtype", "bfloat16", "--eager",
             "--weight-format", "w12n", "--json"]
    assert main(flags) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["drafter"] == str(draft_path)
    eager = EngineConfig(cuda_graphs=False, verify_graphs=False, weight_format="w12n",
                         ablations=Ablations(compile_pointwise=False, decode_gemv=False, fused_qk_rope_store=False))
    (drafter,) = built
    assert drafter.runner.runtime == Runtime.build(eager, "cpu")
    assert any(getattr(m, "w12n", None) is not None for m in drafter.model.modules())
    gpu = Runtime.build(cli.engine_config(cli._parser().parse_args(flags)), "cuda")
    assert gpu == Runtime.build(eager, "cuda") and gpu.weight_format == "w12n"
    assert not gpu.cuda_graphs and not gpu.verify_graphs  # --eager: no CUDA graph of any kind
    assert not any(p.gemv or p.compiled or p.fused_qk_rope_store for p in (gpu.decode, gpu.verify, gpu.draft))
