"""The checkpoint package sits below weights/ and models/: none of its files imports either (or anything of
specpilot above config.py and cli_util.py), at any depth, inside functions included."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "specpilot" / "checkpoint"
ALLOWED = ("specpilot.checkpoint", "specpilot.config", "specpilot.cli_util")


def _specpilot_imports(file: Path) -> list[tuple[int, str]]:
    """(line, module) of every specpilot import in the file, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(file.read_text(), filename=str(file))):
        if isinstance(node, ast.ImportFrom):
            base = "specpilot.checkpoint".rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            modules = [module] if module != "specpilot" else [f"specpilot.{a.name}" for a in node.names]
            found += [(node.lineno, m) for m in modules]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return [(line, m) for line, m in found if m.split(".")[0] == "specpilot"]


def test_checkpoint_imports_nothing_above_it():
    files = sorted(PACKAGE.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "checksum.py", "directory.py", "errors.py", "file.py",
                                       "staging.py"}
    bad = [f"{f.name}:{line}: {m}" for f in files for line, m in _specpilot_imports(f)
           if not any(m == a or m.startswith(a + ".") for a in ALLOWED)]
    assert bad == []
