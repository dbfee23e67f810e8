"""pyobmem's import graph, read from the ``import``/``from`` statements of its modules with ast:
no circle, and no import of a pyobmem module inside a function unless a comment on that line says
why it must wait (``# deferred: ...``, e.g. a heavy dependency kept off a start-up path)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "pyobmem"


def modules(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under ``package`` (a package: its __init__)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, known: set[str]) -> list[str]:
    """The package's modules that ``node`` in module ``name`` imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    if mod not in known:
        return []
    subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
    names = [a.name for a in node.names if f"{mod}.{a.name}" not in known]
    return subs + ([mod] if names else [])


def import_graph(package: Path) -> tuple[dict[str, set[str]], list[str]]:
    """(edges: module -> the package's modules its import-time imports run; its imports inside
    functions without a ``# deferred:`` comment, as ``file:line``). Importing ``a.b.c`` also runs
    the packages ``a`` and ``a.b``: an edge to each, but not to the packages holding the importer
    (they are set up before it runs); a name taken from the importer's own package (``from .
    import f``) is an edge to that package, the knot that makes a package and its submodules import
    each other."""
    mods = modules(package)
    known = set(mods)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    bare: list[str] = []
    for name, path in mods.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        is_package = path.name == "__init__.py"
        holders = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1 + is_package)}
        deferred = _in_functions(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = _targets(node, name, is_package, known)
            if not targets:
                continue
            if id(node) in deferred:
                if "# deferred:" not in lines[node.lineno - 1]:
                    bare.append(f"{path.relative_to(package.parent)}:{node.lineno}")
                continue
            for t in targets:
                parts = t.split(".")
                edges[name].add(t)
                parents = {".".join(parts[:k]) for k in range(1, len(parts))}
                edges[name] |= parents - holders
    for m in edges:
        edges[m].discard(m)
    return edges, bare


def _in_functions(tree: ast.Module) -> set[int]:
    """ids of the nodes inside a function (what does not run at import time)."""
    return {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for n in ast.walk(f) if n is not f}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_pyobmem_has_no_import_circle():
    edges, _ = import_graph(PACKAGE)
    assert len(edges) > 40 and "pyobmem.model.queries" in edges["pyobmem.report.swap"]
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_export_and_report_are_side_by_side():
    """Both read the model; neither imports the other (nor do the model and its queries import
    either, or the planner)."""
    edges, _ = import_graph(PACKAGE)

    def reach(m: str) -> set[str]:
        seen, todo = set(), [m]
        while todo:
            for t in edges[todo.pop()] - seen:
                seen.add(t)
                todo.append(t)
        return seen

    for m in edges:
        if m.startswith("pyobmem.export"):
            assert not {t for t in reach(m) if t.startswith("pyobmem.report")}, m
        if m.startswith("pyobmem.report"):
            assert not {t for t in reach(m) if t.startswith("pyobmem.export")}, m
        if m.startswith("pyobmem.model"):
            assert not {t for t in reach(m) if t.startswith(("pyobmem.report", "pyobmem.export", "pyobmem.planner"))}, m


def test_no_bare_function_level_import():
    _, bare = import_graph(PACKAGE)
    assert bare == []


def test_the_checks_find_a_circle_and_a_bare_import(tmp_path):
    """On a package made to have both: pkg/__init__ imports pkg.a, pkg.a takes a name from pkg (the
    knot export/ had), pkg.b imports pkg.c inside a function without a comment, pkg.c with one."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\nHELPER = 1\n")
    (pkg / "a.py").write_text("from . import HELPER\n\ndef f():\n    return HELPER\n")
    (pkg / "b.py").write_text("def g():\n    from . import c\n    return c\n")
    (pkg / "c.py").write_text("def h():\n    from .sub import d  # deferred: d is heavy\n    return d\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "d.py").write_text("from ..b import g\n")
    edges, bare = import_graph(pkg)
    assert edges["pkg"] == {"pkg.a"} and edges["pkg.a"] == {"pkg"}
    assert edges["pkg.sub.d"] == {"pkg.b"}  # pkg holds d: no edge to it
    assert find_cycle(edges) == ["pkg", "pkg.a", "pkg"]
    assert bare == ["pkg/b.py:2"]
    (pkg / "a.py").write_text("def f():\n    return 1\n")
    assert find_cycle(import_graph(pkg)[0]) is None

