"""The spec_step benchmark: kernels are charged to the phase that launched them, and the CPU dry run works."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.spec_step import attribute

ROOT = Path(__file__).resolve().parents[2]


def _x(name, cat, ts, dur, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "args": args}


def test_kernels_go_to_the_phase_whose_host_range_launched_them():
    events = [
        _x("verify", "user_annotation", 0, 100), _x("commit", "user_annotation", 200, 50),
        _x("cudaGraphLaunch", "cuda_runtime", 10, 80, correlation=1),
        _x("cudaLaunchKernel", "cuda_runtime", 210, 5, correlation=2),
        # the graph's kernels run long after the launch returned: still verify's
        _x("gemv", "kernel", 300, 400, correlation=1), _x("attn", "kernel", 700, 100, correlation=1),
        _x("fold", "kernel", 820, 30, correlation=2),
        _x("stray", "kernel", 900, 10, correlation=99),  # no launch seen: outside
    ]
    out = attribute({"traceEvents": events}, steps=2)
    assert out["verify"]["host_ms"] == 0.05 and out["commit"]["host_ms"] == 0.025
    assert out["verify"]["gpu_ms"] == 0.25 and out["commit"]["gpu_ms"] == 0.015
    assert out["verify"]["top_kernels"][0] == ("gemv", 0.2)
    assert out["outside"]["gpu_ms"] == 0.005 and out["propose"]["gpu_ms"] == 0.0


def test_cpu_dry_run(tmp_path):
    out = tmp_path / "step.json"
    subprocess.run([sys.executable, "-m", "bench", "spec_step", "--target", "tiny-hybrid", "--device", "cpu", "--steps",
                    "2", "--warmup", "1", "--prompt", "16", "--engine", "", "--out", str(out)], cwd=ROOT, check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=300)
    r = json.loads(out.read_text())
    assert r["synthetic"] and r["steps"] == 2 and r["tokens_per_step"] >= 1
    assert r["phases"]["verify"]["host_ms"] > 0


@pytest.mark.parametrize("flag", [["--batch", "0"], ["--steps", "0"], ["--warmup", "-1"]])
def test_bad_flags_are_refused_before_any_model_is_built(flag, tmp_path, capsys):
    from bench.spec_step import main

    with pytest.raises(SystemExit) as e:
        main(["--target", "tiny-hybrid", "--device", "cpu", "--out", str(tmp_path / "s.json"), *flag])
    assert e.value.code == 2 and "take numbers >= 1" in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()
