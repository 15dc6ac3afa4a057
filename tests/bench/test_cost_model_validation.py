"""The cost_model_validation benchmark's CPU dry run: measured and predicted side by side per row, in one JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run(tmp_path):
    out = tmp_path / "cmv.json"
    env = {**os.environ, "SPECPILOT_CACHE": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "-m", "bench", "cost_model_validation", "--smoke", "--shapes", "tiny-dense",
                    "--out", str(out)], cwd=ROOT, check=True, env=env, capture_output=True, timeout=600)
    doc = json.loads(out.read_text())
    assert doc["smoke"] and doc["gpu"] == "cpu" and doc["command"].startswith("python3 -m bench cost_model_validation")
    rows = doc["rows"]
    assert [r["label"] for r in rows] == ["tiny-dense b1 chain:7 bf16", "tiny-dense b2 static:2,2,2 bf16"]
    for r in rows:
        assert r["measured"]["tok_s"] > 0
        for name in ("prior", "counts", "step"):
            p = r[f"predicted_{name}"]
            assert p["tok_s"] > 0 and p["error"] == p["tok_s"] / r["measured"]["tok_s"] - 1
    cal = doc["shapes"]["tiny-dense"]["calibrations"]["bf16"]
    assert cal["seconds"] > 0 and {p["step"]["batch"] for p in cal["points"]} == {1, 2}
    assert doc["summary"]["rows"] == 2


def test_unknown_shape_is_refused_before_anything_runs(tmp_path):
    out = tmp_path / "cmv.json"
    r = subprocess.run([sys.executable, "-m", "bench", "cost_model_validation", "--smoke", "--shapes", "nope",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "shape 'nope'" in r.stderr and not out.exists()
