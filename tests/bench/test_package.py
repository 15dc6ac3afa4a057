"""The bench package: one entry point (`python3 -m bench NAME`), every benchmark importable without a GPU, and no
benchmark importing another (only the shared modules named in bench.SHARED)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import bench
from bench.__main__ import benchmarks, main

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def _bench_imports(path: Path) -> set[str]:
    """The bench modules a file imports (bench.X, from bench import X, from bench.X import ...)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("bench.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "bench":
                out |= {a.name for a in node.names}
            elif node.module.startswith("bench."):
                out.add(node.module.split(".")[1])
    return out


def test_every_module_is_a_benchmark_or_shared():
    modules = {p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_")}
    assert set(bench.SHARED) <= modules
    assert set(benchmarks()) == modules - set(bench.SHARED)


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCH.glob("*.py")))
def test_no_module_imports_a_benchmark(name):
    """A benchmark imports only the shared modules; a shared module imports only shared ones."""
    allowed = set(bench.SHARED)
    imported = _bench_imports(BENCH / f"{name}.py") - {name}
    assert imported <= allowed, f"bench/{name}.py imports {sorted(imported - allowed)}"


def test_the_scan_sees_each_import_form(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import bench.ar_decode as ar\nfrom bench import gemv\nfrom bench.verify_cost import random_tree\n"
                 "from bench.common import sync\nfrom specpilot.bench import shapes\n")
    assert _bench_imports(f) == {"ar_decode", "gemv", "verify_cost", "common"}


@pytest.mark.parametrize("name", sorted(set(benchmarks()) | set(bench.SHARED)))
def test_every_module_imports_without_a_gpu(name):
    importlib.import_module(f"bench.{name}")


def test_help_lists_every_benchmark_with_one_line(capsys):
    assert main(["--help"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.split("Benchmarks:\n")[1].split("\n\n")[0]
              .splitlines()]
    assert listed == benchmarks()


@pytest.mark.parametrize("name", benchmarks())
def test_each_benchmark_takes_its_arguments_from_the_entry_point(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python3 -m bench {name} ")


@pytest.mark.parametrize("argv", [["nope"], []])
def test_an_unknown_or_missing_name_is_one_line_and_status_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "ar_decode" in err


def test_python_m_bench_help_exits_0():
    proc = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "verify_cost" in proc.stdout


@pytest.mark.parametrize("error", [ValueError("--x 3: must be even"), FileNotFoundError("no file /tmp/nope")])
def test_bad_input_past_the_flags_is_one_line_and_status_2(error, monkeypatch, capsys):
    import types

    import bench.__main__ as entry

    def fail(argv):
        raise error

    monkeypatch.setattr(entry.importlib, "import_module", lambda name: types.SimpleNamespace(main=fail))
    assert main([benchmarks()[0]]) == 2
    assert capsys.readouterr().err == f"error: {error}\n"
