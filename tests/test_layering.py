"""The package layering: qa -> evals -> quant (quant imports neither, evals never imports qa), no
module-level import cycle, no library module over 450 lines, and no private name imported across modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("quant", "evals", "qa")
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


MODULES = _modules()


def _imports(path: Path, *, top_level_only: bool) -> list[ast.ImportFrom | ast.Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    return [n for n in nodes if isinstance(n, ast.ImportFrom | ast.Import)]


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for m, path in MODULES.items():
        for n in _imports(path, top_level_only=True):
            if isinstance(n, ast.Import):
                graph[m].update(a.name for a in n.names if a.name in MODULES)
                continue
            if not n.module:
                continue
            subs = [f"{n.module}.{a.name}" for a in n.names]
            if all(s in MODULES for s in subs):  # `from pkg import submodule`
                graph[m].update(s for s in subs if s != m)
            elif n.module in MODULES and n.module != m:
                graph[m].add(n.module)
    return graph


def test_dependencies_point_one_way() -> None:
    allowed = {"quant": ("quant",), "evals": ("evals", "quant"), "qa": ("qa", "evals", "quant")}
    bad = []
    for m, path in MODULES.items():
        for n in _imports(path, top_level_only=False):  # lazy imports count too
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top in PACKAGES and top not in allowed[m.split(".")[0]]:
                    bad.append(f"{m} imports {name}")
    assert not bad


def test_no_module_level_import_cycle() -> None:
    graph, state, cycles = _graph(), {}, []

    def visit(u: str, stack: list[str]) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                cycles.append(" -> ".join(stack[stack.index(v):] + [v]))
            elif v not in state:
                visit(v, stack)
        stack.pop()
        state[u] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles


def test_no_library_module_over_the_size_limit() -> None:
    big = {m: n for m, p in MODULES.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not big


def test_no_private_name_imported_across_modules() -> None:
    bad = [f"{m}: from {n.module} import {a.name}" for m, p in MODULES.items()
           for n in _imports(p, top_level_only=False) if isinstance(n, ast.ImportFrom) and n.module
           and n.module.split(".")[0] in PACKAGES for a in n.names
           if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad
