"""bench/prefill.py on the CPU: the smoke run end to end (JSON sections, per-chunk times, table), the fresh-process
time-to-first-token child, the FLOP count, and its refusals."""

import json
import os

import pytest

from bench import prefill
from specpilot.bench import shapes


def test_smoke_run_writes_every_section(tmp_path, capsys):
    out = tmp_path / "prefill.json"
    assert prefill.main(["--smoke", "--skip-ttft", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["gpu"] == "cpu" and r["commit"] and r["command"].startswith("python3")
    assert r["matmul_peak"]["tflops"] > 0
    assert [row["tokens"] for row in r["gdn_prefill"]] == [40, 100]
    assert all("ms_median" in row["torch"] and "skipped" in row["fla"] for row in r["gdn_prefill"])
    assert [m["shape"] for m in r["models"]] == ["tiny-hybrid", "tiny-dense"]
    hybrid = r["models"][0]
    assert hybrid["gdn_prefill_form"] == "torch" and hybrid["prefill_chunk"] == 32
    runs = {(row["batch"], row["tokens"]): row for row in hybrid["runs"]}
    assert set(runs) == {(1, 100), (1, 40), (2, 100), (2, 40)}
    row = runs[(2, 100)]
    assert row["logits_finite"] and row["tflops"] > 0 and row["s_median"] > 0
    # 100 tokens in chunks of 32: starts 0, 32, 64, 96; the counted FLOPs grow with the chunk's prefix
    assert [(p, n) for p, n, _ in row["chunks"]] == [(0, 32), (32, 32), (64, 32), (96, 4)]
    assert row["chunk_flops"][0] < row["chunk_flops"][1] < row["chunk_flops"][2]
    assert "ttft" not in r
    table = capsys.readouterr().out
    assert "(b) whole-model prefill" in table and "tiny-dense" in table


def test_skip_gdn_layer_leaves_out_section_a(tmp_path, monkeypatch):
    monkeypatch.setattr(prefill, "gdn_prefill", lambda *a: pytest.fail("(a) must not run"))
    out = tmp_path / "prefill.json"
    assert prefill.main(["--smoke", "--skip-ttft", "--skip-gdn-layer", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["gdn_prefill"] == r["gdn_decode"] == {"skipped": "--skip-gdn-layer"}
    assert [m["shape"] for m in r["models"]] == ["tiny-hybrid", "tiny-dense"]


def test_ttft_child_prints_its_two_generates(capsys):
    assert prefill.main(["--ttft-child", "tiny-dense", "--device", "cpu", "--out", os.devnull]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(prefill.TTFT_PREFIX))
    r = json.loads(line[len(prefill.TTFT_PREFIX):])
    assert r["shape"] == "tiny-dense" and 0 < r["first_ttft_s"] <= r["first_total_s"]
    assert 0 < r["second_ttft_s"] and r["prompt_tokens"] == 10


def test_flops_of_chunks_add_up_to_the_whole_prompt():
    """Counted per chunk (each after its prefix) the attention and matrix FLOPs sum to the whole prompt's; the
    attention term is 4 x heads x head dim per causal (query, key) pair and layer."""
    model = shapes.random_model(shapes.hf_config("tiny-hybrid"), "cpu")
    cfg = model.config
    whole = prefill.prefill_flops(model, cfg, 2, 100)
    parts = [prefill.prefill_flops(model, cfg, 2, n, p) for p, n in ((0, 32), (32, 32), (64, 32), (96, 4))]
    for key in ("matrices", "attention", "gdn_estimate"):
        assert sum(x[key] for x in parts) == whole[key], key
    assert whole["attention"] == 4 * cfg.num_attention_heads * cfg.head_dim * 2 * (100 * 101 // 2) * 2
    matrix = sum(p.numel() for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("model.layers."))
    assert whole["matrices"] == 2 * matrix * 200
    assert whole["lm_head"] == 2 * cfg.vocab_size * cfg.hidden_size * 2


@pytest.mark.parametrize("argv,message", [
    (["--reps", "0"], "--reps and --prefill-chunk must be >= 1 and --budget-s > 0"),
    (["--budget-s", "0"], "--reps and --prefill-chunk must be >= 1 and --budget-s > 0"),
    (["--device", "cuda"], "no CUDA device: run on the GPU, or --smoke for the CPU check"),
])
def test_bad_input_one_line_status_2(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(prefill.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        prefill.main([*argv, "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_budget_extrapolates_chunk_times_in_position():
    """A run's full chunks give seconds = a + b x position; a longer prompt's estimate sums that line over its chunks
    (the last one pro rata), so a prefill whose attention grows with the prefix is not underestimated."""
    chunks = [(0, 2048, 100.0), (2048, 2048, 110.0), (4096, 2048, 120.0), (6144, 2048, 130.0), (8192, 100, 9.0)]
    a, b = prefill._chunk_line(chunks)
    assert a == pytest.approx(0.1) and b == pytest.approx(0.01 / 2048)
    assert prefill._extrapolate((a, b), 8192, 2048) == pytest.approx(0.46)
    assert prefill._extrapolate((a, b), 32768, 2048) == pytest.approx(16 * 0.1 + 0.01 * sum(range(16)))
    assert prefill._chunk_line(chunks[:1]) is None and prefill._extrapolate(None, 32768, 2048) == 0.0
