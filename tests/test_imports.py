"""The package's import graph, read from the source with ``ast`` (nothing is imported).

Every ``import`` and ``from ... import`` of a package module counts, at module level or inside a
function: a function-level import is a dependency that is only deferred. The layers (see the
docstring of ``flashattn/__init__.py``):

    contract, steps             leaves: import nothing from the package
    kernels/, impls             the kernels and the registry of implementations
    launch, autotune, aot, api  launching, tuning, compiling, the public entry points
    reference/, measure/, data/, chapter/

A failing test prints the whole graph.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = "flashattn"
ROOT = Path(__file__).resolve().parents[1] / PKG


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(module: str, *, nested: bool = True) -> set[str]:
    """The package modules ``module`` imports; ``nested=False``: module-level imports only
    (not those inside a function or a class)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    if nested:
        nodes = list(ast.walk(tree))
    else:
        nodes, todo = [], list(tree.body)
        while todo:
            n = todo.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            nodes.append(n)
            todo.extend(ast.iter_child_nodes(n))
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == PKG}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PKG:
                continue
            for a in node.names:   # `from . import autotune` imports the submodule
                sub = f"{target}.{a.name}"
                out.add(sub if sub in MODULES else target)
    for m in out:
        assert m in MODULES, f"{module} imports {m}, which is not a module of the package"
    return out - {module}


def build_graph(nested: bool = True) -> dict[str, set[str]]:
    return {m: _imports(m, nested=nested) for m in MODULES}


GRAPH = build_graph()


def show(graph=GRAPH) -> str:
    return "import graph:\n" + "\n".join(
        f"  {m} -> {', '.join(sorted(graph[m])) or '-'}" for m in sorted(graph))


def reachable(graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for n in graph[todo.pop()]:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def cycles(graph) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def under(prefix: str) -> set[str]:
    """The module ``prefix`` and, for a package, every module below it."""
    return {m for m in MODULES if m == prefix or m.startswith(prefix + ".")}


# --- the graph is what the source says ----------------------------------------------------------
def test_the_graph_sees_every_kind_of_import():
    assert {"flashattn", "flashattn.contract", "flashattn.kernels", "flashattn.kernels.spec",
            "flashattn.measure.bench", "flashattn.data.schema", "flashattn.chapter.page",
            "flashattn.reference.emulate"} <= set(MODULES)
    assert "flashattn.launch" in GRAPH["flashattn.api"]                     # from .launch import
    assert "flashattn.kernels.spec" in GRAPH["flashattn.kernels"]           # from .spec import
    assert "flashattn.contract" in GRAPH["flashattn.data.schema"]           # from ..contract
    assert "flashattn.data.results" in GRAPH["flashattn.chapter.page"]      # inside a function
    assert "flashattn.data.results" not in build_graph(nested=False)["flashattn.chapter.page"]


# --- no cycles ------------------------------------------------------------------------------------
def test_no_import_cycles():
    found = cycles(GRAPH)
    assert not found, f"import cycles: {found}\n{show()}"



def test_no_import_cycles_at_module_level():
    graph = build_graph(nested=False)
    found = cycles(graph)
    assert not found, f"import cycles between module-level imports: {found}\n{show(graph)}"


# --- layers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("leaf", ["flashattn.contract", "flashattn.steps"])
def test_leaves_import_nothing_from_the_package(leaf):
    assert GRAPH[leaf] == set(), f"{leaf} imports {sorted(GRAPH[leaf])}\n{show()}"


LOW = ["flashattn.kernels", "flashattn.contract", "flashattn.steps", "flashattn.impls"]
HIGH = ["flashattn.measure", "flashattn.data", "flashattn.chapter", "flashattn.api",
        "flashattn.launch", "flashattn.autotune"]


@pytest.mark.parametrize("low", LOW)
def test_low_layers_do_not_reach_high_ones(low):
    forbidden = set().union(*(under(h) for h in HIGH)) | {PKG}
    bad = {}
    for m in under(low):
        hit = reachable(GRAPH, m) & forbidden
        if hit:
            bad[m] = sorted(hit)
    assert not bad, f"{low} reaches a higher layer (directly or through others): {bad}\n{show()}"


def test_data_does_not_import_measure():
    bad = {m: sorted(reachable(GRAPH, m) & under("flashattn.measure"))
           for m in under("flashattn.data")}
    bad = {m: hit for m, hit in bad.items() if hit}
    assert not bad, f"the dataset's reader reaches the measuring code: {bad}\n{show()}"


def test_the_leaves_and_the_kernels_import_cheaply():
    # "Importing it does not import cuda.tile" (kernels); `import flashattn` stays cheap.
    code = ("import sys, flashattn, flashattn.kernels, flashattn.contract, flashattn.steps, "
            "flashattn.impls\n"
            "heavy = sorted(m for m in ('torch', 'cuda.tile', 'pandas', 'matplotlib') "
            "if m in sys.modules)\n"
            "print(','.join(heavy))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT.parent, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "", f"imported eagerly: {res.stdout.strip()}"
