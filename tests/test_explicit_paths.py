"""No module state chooses a kernel path: the layers, ops, models and runtime neither rebind a module global from a
function (`global`) nor open a region (`contextlib.contextmanager`); the paths travel as KernelPaths on the step's
metadata (specpilot/layers/paths.py), built once by specpilot/runtime/settings.py."""

import ast
from pathlib import Path

import specpilot

ROOT = Path(specpilot.__file__).parent
FOLDERS = ("layers", "ops", "models", "runtime")


def _offences(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Global):
            out.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: global {', '.join(node.names)}")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                if "contextmanager" in ast.unparse(d):
                    out.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: @{ast.unparse(d)} {node.name}")
    return out


def test_no_module_global_picks_a_kernel_path():
    files = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 40
    offences = [o for p in files for o in _offences(p)]
    assert not offences, "\n".join(offences)
