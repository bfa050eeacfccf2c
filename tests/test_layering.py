"""The package layering, counted over every import (module level, inside functions, under TYPE_CHECKING):

- dependencies point one way, qa -> evals -> quant (quant imports neither, evals never imports qa);
- the study drivers, benchmarks/ and scripts/ (packages run as `python -m benchmarks.<name>` and
  `python -m scripts.<name>`, never on a sys.path edit), import qa, evals, quant and their own package's
  modules, not each other; nothing imports them but the tests;
- no import cycle between modules of these packages, nor between their subpackages (qa.files -> qa.stats and
  qa.stats -> qa.files would be one: a shared piece belongs in the lower one);
- an import inside a function is there only for a heavy optional dependency: it names one (HEAVY) or a
  module of ours that loads one when it is imported, and says so in a comment on its line;
- `qa.api` is the front door: nothing in the library imports it but the CLI (a
  thin shell over it), so every step the API and the pipeline share lives below both; drivers may use it;
- no library module over the size limit, and no private name imported across modules;
- no module of ours, driver or test edits sys.path.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("quant", "evals", "qa")  # the library (installed)
DRIVERS = ("benchmarks", "scripts")  # study drivers (not installed), run from the repository root with -m
# What each top-level package may import of ours.
ALLOWED = {"quant": ("quant",), "evals": ("evals", "quant"), "qa": ("qa", "evals", "quant"),
           "benchmarks": ("benchmarks", "qa", "evals", "quant"), "scripts": ("scripts", "qa", "evals", "quant")}
MAX_LINES = 450
# Heavy optional dependencies: each costs a noticeable part of a second (or far more) to import, or is an
# extra that a light command must not need. Only these justify an import inside a function.
HEAVY = frozenset({"torch", "transformers", "vllm", "xllamacpp", "lm_eval", "datasets", "safetensors",
                   "matplotlib", "huggingface_hub", "accelerate", "gguf", "statsmodels", "inspect_ai",
                   "torchao", "compressed_tensors"})  # the last two: test oracles (dev extra) a benchmark times
FRONT_DOOR = "qa.api"


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES + DRIVERS:
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


MODULES = _modules()


@dataclass(frozen=True)
class Imp:
    """One import statement: the module it sits in, what it names, where, and how it runs."""

    module: str
    node: ast.Import | ast.ImportFrom
    in_function: bool
    type_only: bool  # under `if TYPE_CHECKING:`

    @property
    def names(self) -> list[str]:
        """The dotted names it imports (for `from a import b`: a.b when that is a module, else a)."""
        if isinstance(self.node, ast.Import):
            return [a.name for a in self.node.names]
        base = self.node.module or ""
        if self.node.level:  # relative: resolve against this module's package
            pkg = self.module if MODULES[self.module].name == "__init__.py" else self.module.rpartition(".")[0]
            for _ in range(self.node.level - 1):
                pkg = pkg.rpartition(".")[0]
            base = f"{pkg}.{base}" if base else pkg
        subs = [f"{base}.{a.name}" for a in self.node.names]
        return [s if s in MODULES else base for s in subs]

    def targets(self) -> set[str]:
        """The modules of ours it imports (the nearest enclosing module of each name)."""
        out = set()
        for name in self.names:
            parts = name.split(".")
            for i in range(len(parts), 0, -1):
                cand = ".".join(parts[:i])
                if cand in MODULES:
                    if cand != self.module:
                        out.add(cand)
                    break
        return out

    def externals(self) -> set[str]:
        """The top-level packages outside ours it imports."""
        return {n.split(".")[0] for n in self.names if n.split(".")[0] not in PACKAGES + DRIVERS}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(module: str, body: list[ast.stmt], in_function: bool, type_only: bool) -> list[Imp]:
    out: list[Imp] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(Imp(module, node, in_function, type_only))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out += _walk(module, node.body, True, type_only)
        elif isinstance(node, ast.If):
            out += _walk(module, node.body, in_function, type_only or _is_type_checking(node.test))
            out += _walk(module, node.orelse, in_function, type_only)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    stmts = [s for s in inner if isinstance(s, ast.stmt)]
                    stmts += [s for h in inner if isinstance(h, ast.ExceptHandler) for s in h.body]
                    out += _walk(module, stmts, in_function, type_only)
    return out


@cache
def _imports(module: str) -> tuple[Imp, ...]:
    return tuple(_walk(module, ast.parse(MODULES[module].read_text(encoding="utf-8")).body, False, False))


def _module_level(module: str) -> tuple[set[str], set[str]]:
    """What importing `module` runs directly: (our modules, external packages) of its package inits' and
    its own module-level imports."""
    parents = [module.rsplit(".", i)[0] for i in range(module.count("."), 0, -1)]
    ours: set[str] = {p for p in parents if p in MODULES}
    ext: set[str] = set()
    for m in [p for p in parents if p in MODULES] + [module]:
        for imp in _imports(m):
            if not imp.in_function and not imp.type_only:
                ours |= imp.targets()
                ext |= imp.externals()
    ours.discard(module)
    return ours, ext


@cache
def _loads_heavy(module: str) -> str | None:
    """The heavy dependency importing `module` loads (package inits and module-level imports, transitively),
    or None."""
    seen, todo = {module}, [module]
    while todo:
        ours, ext = _module_level(todo.pop())
        if ext & HEAVY:
            return min(ext & HEAVY)
        todo += sorted(ours - seen)
        seen |= ours
    return None


def _line_has_comment(path: Path, node: ast.stmt) -> bool:
    lines = path.read_text(encoding="utf-8").splitlines()
    return any("#" in lines[i - 1] for i in range(node.lineno, (node.end_lineno or node.lineno) + 1))


def test_dependencies_point_one_way() -> None:
    bad = [f"{m} imports {t}" for m in MODULES for imp in _imports(m) for t in imp.targets()
           if t.split(".")[0] not in ALLOWED[m.split(".")[0]]]
    assert not bad


def test_the_drivers_are_packages_that_only_tests_import() -> None:
    for pkg in DRIVERS:
        assert (ROOT / pkg / "__init__.py").is_file(), f"{pkg}/ is not a package: `python -m {pkg}.<name>` fails"
    users = {m for m in MODULES if m.split(".")[0] not in DRIVERS for imp in _imports(m)
             if {t.split(".")[0] for t in imp.targets()} & set(DRIVERS)}
    assert not users


def test_no_import_cycle_counting_every_import() -> None:
    graph = {m: sorted({t for imp in _imports(m) for t in imp.targets()}) for m in MODULES}
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(u: str, stack: list[str]) -> None:
        state[u] = 1
        stack.append(u)
        for v in graph[u]:
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


def _unit(module: str) -> str:
    """The subpackage a module belongs to (`qa.files.policy` -> `qa.files`); a package's own top-level modules
    (`qa.api`) are units of their own."""
    parts = module.split(".")
    is_package = MODULES[module].name == "__init__.py"
    return ".".join(parts[:2]) if len(parts) > 2 or (is_package and len(parts) == 2) else module


def test_no_import_cycle_between_subpackages() -> None:
    edges = {(_unit(m), _unit(t)) for m in MODULES for imp in _imports(m) for t in imp.targets()
             if _unit(m) != _unit(t) and m.split(".")[0] == t.split(".")[0]}
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)

    def reaches(src: str, dst: str) -> bool:
        seen, todo = {src}, [src]
        while todo:
            for v in graph.get(todo.pop(), ()):
                if v == dst:
                    return True
                if v not in seen:
                    seen.add(v)
                    todo.append(v)
        return False

    cycles = sorted(f"{a} -> {b} -> ... -> {a}" for a, b in edges if reaches(b, a))
    assert not cycles


def test_imports_inside_functions_are_only_for_heavy_dependencies() -> None:
    bad = []
    for m, path in MODULES.items():
        for imp in _imports(m):
            if not imp.in_function:
                continue
            where = f"{path.relative_to(ROOT)}:{imp.node.lineno}"
            heavy = imp.externals() & HEAVY or {h for t in imp.targets() if (h := _loads_heavy(t)) is not None}
            light = (imp.externals() - HEAVY) | {t for t in imp.targets() if _loads_heavy(t) is None}
            if light:
                bad.append(f"{where}: {', '.join(sorted(light))} is light: import it at the top of the module")
            elif not heavy:
                bad.append(f"{where}: imports nothing heavy")
            elif not _line_has_comment(path, imp.node):
                bad.append(f"{where}: say in a comment which heavy dependency ({', '.join(sorted(heavy))}) "
                           "this import defers")
    assert not bad


def test_the_front_door_is_imported_by_nothing_but_the_package() -> None:
    users = {m for m in MODULES if m.split(".")[0] in PACKAGES for imp in _imports(m) if FRONT_DOOR in imp.targets()}
    assert users == {m for m in users if m.startswith("qa.cli.")}  # the package init too imports nothing
    assert "qa.cli.gate_cmd" in users  # the check sees the CLI's own use


def test_no_library_module_over_the_size_limit() -> None:
    big = {m: n for m, p in MODULES.items()
           if m.split(".")[0] in PACKAGES and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not big


def test_no_private_name_imported_across_modules() -> None:
    bad = [f"{m}: from {imp.node.module} import {a.name}" for m in MODULES for imp in _imports(m)
           if isinstance(imp.node, ast.ImportFrom) and imp.node.module
           and imp.node.module.split(".")[0] in PACKAGES + DRIVERS for a in imp.node.names
           if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad


def _edits_sys_path(tree: ast.Module) -> list[int]:
    """Lines that change sys.path: a call of one of its methods, or an assignment to it."""
    def is_sys_path(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
            and node.value.id == "sys"
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value):
            lines.append(node.lineno)
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            lines += [node.lineno for t in targets
                      if is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value))]
    return sorted(lines)


def test_nothing_edits_sys_path() -> None:
    files = [*MODULES.values(), *(ROOT / "tests").rglob("*.py")]
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in files
           for line in _edits_sys_path(ast.parse(p.read_text(encoding="utf-8")))]
    assert not bad, f"import by package name instead (python -m benchmarks.<name>): {bad}"


def test_the_checks_see_what_they_claim() -> None:
    """The walker finds imports inside functions, under TYPE_CHECKING, and the heavy loads of our modules; the
    drivers are walked like the library; a sys.path edit is seen."""
    inner = [i for m in MODULES for i in _imports(m) if i.in_function]
    assert inner, "no import inside a function was found at all: the walker is broken"
    assert _loads_heavy("quant.formats.nvfp4") == "torch"  # the reference quantizer is torch code
    assert _loads_heavy("quant.validation") is None
    assert "scripts.study_published" in {t for imp in _imports("scripts.study_runs") for t in imp.targets()}
    assert "benchmarks.kv_fidelity" in {t for imp in _imports("benchmarks.kv_kernel_probe") for t in imp.targets()}
    assert _edits_sys_path(ast.parse("import sys\nsys.path.insert(0, 'x')\nsys.path = []\nsys.path[:0] = ['y']\n"
                                     "print(sys.path)\n")) == [2, 3, 4]
