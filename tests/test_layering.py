"""The package's import directions: every `specpilot` import, static or inside a function, goes from a layer to a
lower one, as the table "Layers" in docs/architecture.md lists them (the test reads the table from there, so the
page and the rule cannot drift apart)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specpilot"
DOC = ROOT / "docs" / "architecture.md"


def doc_layers() -> dict[str, int]:
    """unit (a folder or a top-level module of specpilot, without .py) -> its level in the doc's table."""
    text = DOC.read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    levels = {}
    for row in re.finditer(r"^\|\s*(\d+)\s*\|([^|]*)\|", section, flags=re.M):
        for unit in re.findall(r"`([a-z_]+)(?:/|\.py)`", row.group(2)):
            levels[unit] = int(row.group(1))
    return levels


def unit_of(module: str) -> str | None:
    """specpilot.runtime.runner -> runtime; specpilot.config -> config; the package itself -> None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "specpilot" and len(parts) > 1 else None


def _is_unit(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").exists()


def imports(file: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import of specpilot in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(file.read_text(), filename=str(file))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "specpilot" else [
                f"specpilot.{a.name}" if _is_unit(a.name) else "specpilot" for a in node.names]
            found += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return [(line, m) for line, m in found if m.split(".")[0] == "specpilot"]


def violations(levels: dict[str, int]) -> list[str]:
    bad = []
    for file in sorted(PACKAGE.rglob("*.py")):
        src = file.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if src == "__init__":
            continue
        for line, module in imports(file):
            dst = unit_of(module)
            if dst is None or dst == src:
                continue
            if src not in levels or dst not in levels:
                bad.append(f"{file.relative_to(ROOT)}:{line}: {src} or {dst} is missing from the Layers table")
            elif levels[dst] >= levels[src]:
                bad.append(f"{file.relative_to(ROOT)}:{line}: {src} (level {levels[src]}) imports {module} "
                           f"(level {levels[dst]})")
    return bad


def test_every_unit_of_the_package_is_in_the_table():
    levels = doc_layers()
    units = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
    assert units - set(levels) == set(), "add these to the Layers table in docs/architecture.md"
    assert set(levels) - units == set(), "the Layers table names units the package no longer has"


def test_imports_go_down_the_layers():
    assert violations(doc_layers()) == []


def test_the_check_catches_an_upward_import(tmp_path, monkeypatch):
    """A layer importing one above it (runtime importing spec_decode) is reported."""
    levels = doc_layers()
    fake = tmp_path / "specpilot"
    (fake / "runtime").mkdir(parents=True)
    (fake / "runtime" / "bad.py").write_text("def f():\n    from specpilot.spec_decode.tree import DraftTree\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert len(violations(levels)) == 1


@pytest.mark.parametrize(("lower", "upper"), [("layers", "models"), ("runtime", "spec_decode"),
                                              ("spec_decode", "engine"), ("checkpoint", "weights"),
                                              ("checkpoint", "models"), ("weights", "models"),
                                              ("bench", "pilot"), ("pilot", "cli")])
def test_the_layering_the_issue_asks_for(lower, upper):
    levels = doc_layers()
    assert levels[lower] < levels[upper]
