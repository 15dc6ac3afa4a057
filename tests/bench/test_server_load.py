"""bench/server_load.py on the CPU: the simulated engine through the real app and a client process (every answer
equal to the direct run's tokens, a comparison per repeat), a random target end to end, and its refusals."""

import json

import pytest

from bench import server_load


def test_simulated_engine_direct_and_http_rows_match(tmp_path):
    out = tmp_path / "load.json"
    assert server_load.main(["--simulate", "0.2,1", "--engines", "ar", "--requests", "6", "--max-tokens", "5",
                             "--batch", "3", "--repeats", "2", "--device", "cpu", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert [(x["engine"], x["path"], x["repeat"]) for x in r["rows"]] == [
        ("ar", "direct", 0), ("ar", "http", 0), ("ar", "direct", 1), ("ar", "http", 1)]
    assert all(x["requests"] == 6 and x["tokens"] == 30 and x["mismatched_requests"] == 0 for x in r["rows"])
    c = r["comparison"]["ar"]
    assert c["exact"] and len(c["overhead_per_token"]) == 2 and c["overhead_per_token_median"] > -1


def test_thread_and_process_engines_side_by_side(tmp_path):
    """--http-engines thread process: after each direct row one HTTP row per engine placement, their order
    alternating per repeat, every answer exact, the comparison per path."""
    out = tmp_path / "load.json"
    assert server_load.main(["--simulate", "0.2,1", "--engines", "ar", "--requests", "4", "--max-tokens", "4",
                             "--batch", "2", "--repeats", "2", "--device", "cpu", "--http-engines", "thread", "process",
                             "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert [(x["path"], x["repeat"]) for x in r["rows"]] == [
        ("direct", 0), ("http", 0), ("http_process", 0), ("direct", 1), ("http_process", 1), ("http", 1)]
    assert all(x["tokens"] == 16 and x["mismatched_requests"] == 0 for x in r["rows"])
    c = r["comparison"]["ar"]
    assert c["exact"] and set(c["by_path"]) == {"http", "http_process"}
    assert c["overhead_per_token"] == c["by_path"]["http"]["overhead_per_token"]
    assert all(len(v["overhead_per_token"]) == 2 for v in c["by_path"].values())


def test_loop_lag_is_recorded_on_the_http_rows(tmp_path):
    """Two client processes on one clock: every request answered once, exact, and each side's loop lag recorded."""
    out = tmp_path / "load.json"
    assert server_load.main(["--simulate", "0.5,1", "--engines", "ar", "--requests", "5", "--max-tokens", "4",
                             "--batch", "2", "--device", "cpu", "--loop-lag", "--clients", "2",
                             "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    http = [r for r in rows if r["path"] == "http"][0]
    lag = http["loop_lag_ms"]
    assert lag["samples"] > 0 and 0 <= lag["p50"] <= lag["p99"] <= lag["max"] and lag["client_p99"] >= 0
    assert all(r["requests"] == 5 and r["tokens"] == 20 and r["mismatched_requests"] == 0 for r in rows)
    assert "loop_lag_ms" not in [r for r in rows if r["path"] == "direct"][0]


def test_random_target_speculative_rows_are_exact(tmp_path):
    out = tmp_path / "load.json"
    assert server_load.main(["--target", "random:tiny-dense", "--requests", "4", "--max-tokens", "6", "--batch", "2",
                             "--device", "cpu", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert {(x["engine"], x["path"]) for x in r["rows"]} == {("ar", "direct"), ("ar", "http"), ("spec", "direct"),
                                                             ("spec", "http")}
    assert r["comparison"]["ar"]["exact"] and r["comparison"]["spec"]["exact"]
    assert [x for x in r["rows"] if x["path"] == "http" and x["engine"] == "spec"][0]["tau"] >= 1


def test_an_unknown_http_engine_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        server_load.main(["--http-engines", "gpu", "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2 and "--http-engines: invalid choice: 'gpu'" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_bad_flags_are_one_line_and_status_2(tmp_path, capsys):
    out = str(tmp_path / "x.json")
    assert server_load.main(["--simulate", "1", "--engines", "ar", "--out", out]) == 2
    assert server_load.main(["--simulate", "1,6", "--out", out]) == 2  # spec has no simulation
    assert server_load.main(["--target", "./some-dir", "--out", out]) == 2
    assert server_load.main(["--batch", "0", "--out", out]) == 2
    assert server_load.main(["--clients", "0", "--out", out]) == 2
    assert server_load.main(["--http-engines", "thread", "thread", "--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and all(line.startswith("error: ") for line in err)
    assert not (tmp_path / "x.json").exists()
