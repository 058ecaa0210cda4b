"""Data flows one way: no import cycles inside ``tenantkv`` (type-checking and
function-level imports included), and the client needs nothing of the server."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tenantkv"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(path: Path, mods: dict[str, Path]) -> set[str]:
    """Every tenantkv module ``path`` imports, wherever the import statement is."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    # ``from tenantkv import errors`` names the module, not the package's __init__
    return {m for m in out if m in mods and m != "tenantkv"}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_inside_the_package() -> None:
    mods = _modules()
    graph = {name: _imports(path, mods) - {name} for name, path in mods.items()}
    assert len(graph) > 30
    assert _cycles(graph) == []


def test_the_client_imports_nothing_of_the_server() -> None:
    code = (
        "import sys, tenantkv.client;"
        "print(' '.join(m for m in sys.modules if m.startswith('tenantkv')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    assert "tenantkv.client" in loaded
    server_side = [
        m
        for m in loaded
        if m == "tenantkv.config"
        or m.startswith(("tenantkv.server", "tenantkv.admission", "tenantkv.storage"))
    ]
    assert server_side == []
