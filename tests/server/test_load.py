"""The open-loop HTTP load generator against a server: every request answered in full or refused (429), the
client-side TTFT / TPOT / throughput summary, the report written whole; bad arguments are one error line."""

from __future__ import annotations

import json

import pytest

from specpilot.server.load import main
from tests.server.conftest import MODEL


def test_load_report_counts_every_request(small, zoo_path, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nimport os\nclass Stack:\n")
    out = tmp_path / "load.json"
    rc = main(["--url", small.url, "--model", MODEL, "--tokenizer", zoo_path, "--workloads", str(prompts),
               "--requests", "6", "--rate", "20", "--max-tokens", "4", "--no-chat", "--out", str(out)])
    assert rc == 0 and not (tmp_path / "load.json.tmp").exists()
    result = json.loads(out.read_text())["result"]
    assert result["requests"] + result["refused"] == 6 and result["requests"] >= 4
    assert result["tokens"] == 4 * result["requests"]
    assert result["ttft_p50_ms"] > 0 and result["tpot_p50_ms"] > 0 and result["throughput_tok_s"] > 0
    assert result["tau"] >= 1


@pytest.mark.parametrize(("flags", "says"), [(["--rate", "0"], "arrival rate 0.0: must be > 0"),
                                             (["--rate", "1", "--requests", "0"], "--requests 0 --max-tokens 256"),
                                             (["--rate", "1", "--workloads", "nope"], "workload 'nope': unknown")])
def test_bad_arguments_are_one_error_line(capsys, flags, says):
    assert main(["--url", "http://127.0.0.1:9", "--model", MODEL, "--tokenizer", "unused", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err
