"""The import graph of the library (``flashattn``) and the book's package (``flashbook``), read
from the source with ``ast`` (nothing is imported).

Every ``import`` and ``from ... import`` of a module of either package counts, at module level or
inside a function: a function-level import is a dependency that is only deferred. The layers
(see the docstrings of ``flashattn/__init__.py`` and ``flashbook/__init__.py``):

    flashattn.contract, .steps      leaves: import nothing from either package
    flashattn.kernels/              the kernels and their specs
    flashattn.launch, autotune, aot, api   launching, tuning, compiling, the public entry points
    flashattn.reference/
    flashbook.impls, .source        the registry of implementations; a step's folded source
    flashbook.data/, .measure/, .chapter/, .nbrun

The library never imports the book (not even inside a function).

A failing test prints the whole graph.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = "flashattn"
BOOK = "flashbook"
PKGS = (PKG, BOOK)
REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / PKG


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for pkg in PKGS for p in sorted((REPO / pkg).rglob("*.py"))}


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
            out |= {a.name for a in node.names if a.name.split(".")[0] in PKGS}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] not in PKGS:
                continue
            for a in node.names:   # `from . import autotune` imports the submodule
                sub = f"{target}.{a.name}"
                out.add(sub if sub in MODULES else target)
    for m in out:
        assert m in MODULES, f"{module} imports {m}, which is not a module of either package"
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
            "flashbook.measure.bench", "flashbook.data.schema", "flashbook.chapter.page",
            "flashattn.reference.tiles", "flashbook"} <= set(MODULES)
    assert "flashattn.launch" in GRAPH["flashattn.api"]                     # from .launch import
    assert "flashattn.kernels.spec" in GRAPH["flashattn.kernels"]           # from .spec import
    assert "flashattn.contract" in GRAPH["flashbook.data.schema"]           # from flashattn.contract
    assert "flashbook.data.results" in GRAPH["flashbook.chapter.page"]      # inside a function
    assert "flashbook.data.results" not in build_graph(nested=False)["flashbook.chapter.page"]
    assert "flashbook.steps" in GRAPH["flashbook"]                          # from .steps import
    assert "flashattn.registry" in GRAPH["flashbook.steps"]                 # across packages


# --- the library never imports the book ---------------------------------------------------------
def test_the_library_does_not_import_the_book():
    bad = {m: sorted(reachable(GRAPH, m) & under(BOOK)) for m in under(PKG)}
    bad = {m: hit for m, hit in bad.items() if hit}
    assert not bad, f"the library reaches the book's package: {bad}\n{show()}"


def test_the_library_names_no_book_module_anywhere():
    # Not even as a string for importlib: grep the library's source for the book's name in code.
    import io
    import tokenize
    bad = []
    for m in under(PKG):
        toks = tokenize.generate_tokens(io.StringIO(MODULES[m].read_text()).readline)
        for t in toks:
            if t.type == tokenize.STRING and t.string.strip("\"'frbFRB").startswith(BOOK + "."):
                bad.append((m, t.start[0], t.string))
            if t.type == tokenize.NAME and t.string == BOOK:
                bad.append((m, t.start[0], t.string))
    assert not bad, f"library code names the book's package: {bad}"


def test_the_book_uses_the_library():
    assert any(reachable(GRAPH, m) & under(PKG) for m in under(BOOK))


# --- no cycles ------------------------------------------------------------------------------------
def test_no_import_cycles():
    found = cycles(GRAPH)
    assert not found, f"import cycles: {found}\n{show()}"



def test_no_import_cycles_at_module_level():
    graph = build_graph(nested=False)
    found = cycles(graph)
    assert not found, f"import cycles between module-level imports: {found}\n{show(graph)}"


# --- layers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("leaf", ["flashattn.contract", "flashattn.config", "flashattn.stats"])
def test_leaves_import_nothing_from_the_package(leaf):
    assert GRAPH[leaf] == set(), f"{leaf} imports {sorted(GRAPH[leaf])}\n{show()}"


LOW = ["flashattn.kernels", "flashattn.contract", "flashattn.config", "flashattn.registry",
       "flashbook.impls"]
HIGH = ["flashbook.measure", "flashbook.data", "flashbook.chapter", "flashattn.api",
        "flashattn.launch", "flashattn.autotune"]


@pytest.mark.parametrize("low", LOW)
def test_low_layers_do_not_reach_high_ones(low):
    forbidden = set().union(*(under(h) for h in HIGH)) | {PKG, BOOK}
    bad = {}
    for m in under(low):
        hit = reachable(GRAPH, m) & forbidden
        if hit:
            bad[m] = sorted(hit)
    assert not bad, f"{low} reaches a higher layer (directly or through others): {bad}\n{show()}"


def test_data_does_not_import_measure():
    bad = {m: sorted(reachable(GRAPH, m) & under("flashbook.measure"))
           for m in under("flashbook.data")}
    bad = {m: hit for m, hit in bad.items() if hit}
    assert not bad, f"the dataset's reader reaches the measuring code: {bad}\n{show()}"


def test_the_leaves_and_the_kernels_import_cheaply():
    # "Importing it does not import cuda.tile" (kernels); `import flashattn` stays cheap.
    code = ("import sys, flashattn, flashattn.kernels, flashattn.contract, flashattn.config, "
            "flashattn.registry, flashbook.impls\n"
            "heavy = sorted(m for m in ('torch', 'cuda.tile', 'pandas', 'matplotlib') "
            "if m in sys.modules)\n"
            "print(','.join(heavy))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT.parent, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "", f"imported eagerly: {res.stdout.strip()}"


def test_import_flashattn_loads_neither_pandas_nor_matplotlib_nor_the_book():
    # The library's public surface: the API modules and the interpreter, not the book (tqdm is
    # not checked: torch itself imports it).
    code = ("import sys, flashattn, flashattn.api, flashattn.decoding, flashattn.varlen, "
            "flashattn.autograd, flashattn.launch, flashattn.autotune, flashattn.aot, "
            "flashattn.interpret, flashattn.reference, flashattn.env\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pandas', 'matplotlib', 'flashbook', 'IPython'))))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "", f"importing the library loaded: {res.stdout.strip()}"


def test_every_subpackage_is_an_attribute_after_import_flashattn():
    # Issue 35 item 6: `import flashattn; flashattn.integrations.transformers.register` works,
    # and so does every other module of the package by attribute, in a fresh process.
    mods = sorted({p.relative_to(REPO).with_suffix("").as_posix().replace("/", ".")
                   for p in (REPO / "flashattn").glob("*.py") if p.stem[0] != "_"}
                  | {p.parent.relative_to(REPO).as_posix().replace("/", ".")
                     for p in (REPO / "flashattn").glob("*/__init__.py")})
    code = ("import flashattn, functools\n"
            f"for m in {mods!r}:\n"
            "    functools.reduce(getattr, m.split('.')[1:], flashattn)\n"
            "assert callable(flashattn.integrations.transformers.register)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stderr


def test_flashattn_exports_no_book_concepts():
    import flashattn
    book = {"STEPS", "STEP_NAMES", "SEED_STEPS", "EXPERIMENTS", "FLAGS", "Step", "get_step",
            "ARCHS", "chapter", "measure", "data", "impls", "nbrun"}
    assert not book & set(flashattn.__all__)
    for name in book:
        assert not hasattr(flashattn, name), name


def test_the_peak_tflops_is_defined_once():
    # Item 5 of issue 21: the H200's 989 TFLOPS is typed in one place (flashbook/hardware.py).
    import re
    hits = []
    for p in sorted((REPO / "flashattn").rglob("*.py")) + sorted((REPO / "flashbook").rglob("*.py")) \
            + sorted((REPO / "experiments").glob("*.py")):
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if re.search(r"\b989\b", line):
                hits.append(f"{p.relative_to(REPO)}:{n}")
    assert hits == ["flashbook/hardware.py:3"], hits


def test_each_packaging_lists_every_subpackage():
    # The wheel of each package holds all of its subpackages (and the library's none of the book).
    import tomllib
    book = tomllib.loads((REPO / BOOK / "pyproject.toml").read_text())
    have = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / BOOK).rglob("__init__.py")}
    assert set(book["tool"]["setuptools"]["packages"]) == have
    lib = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert lib["tool"]["setuptools"]["packages"]["find"]["include"] == [PKG, f"{PKG}.*"]
    deps = {d.split("[")[0].split(">")[0].split("<")[0].split("=")[0] for d in
            lib["project"]["dependencies"]}
    assert deps == {"numpy", "torch", "cuda-tile"}, deps


def test_the_library_holds_no_book_ladder():
    # Issue 21 items 2 and 4: the book's views of the steps (the Hopper ladder, predecessors, the
    # steps command) and the kernels' off switches (the fused decode merge, dependent launches)
    # live in flashbook; the library's kernels carry what ships.
    from flashattn import kernels, registry
    for name in ("HOPPER_LADDER", "previous_step", "describe", "main"):
        assert not hasattr(registry, name), name
    for name in ("DECODE_FUSED_COMBINE", "DECODE_PDL", "DECODE_PDL_TRIGGER", "BWD_PDL",
                 "PDL_ARCHS", "register_decode_ladder"):
        assert not hasattr(kernels, name), name
    for p in sorted((REPO / "flashattn").rglob("*.py")):
        text = p.read_text()
        assert "HOPPER_LADDER" not in text, p
        if p.parent.name == "kernels" and p.stem in ("decode", "fmha_bwd"):
            assert "FUSED" not in text and "PDL" not in text, p
    import flashattn.decoding as decode_module
    assert not hasattr(decode_module, "prefer_decode")   # the routing: flashattn.api


# The steps of the book as data: the ladder's names, its flags with their defaults, the seed's
# space, the experiments. The library keeps Config (a leaf), the registry and what "best" ships.
LADDER_DATA = {"STEPS", "STEP_NAMES", "SEED_STEPS", "EXPERIMENTS", "FLAG_DEFAULTS", "FLAGS",
               "seed_space", "_STEP_LIST", "_EXPERIMENT_LIST", "HOPPER_LADDER"}
LADDER_FLAGS = ("FAST_MATH", "SPLIT_LOOP", "REMAP", "PAIR", "LAZY_RESCALE", "EXP_POLY",
                "UNCHECKED_KV", "K_LAT", "V_LAT", "PERSISTENT", "PIPELINE")


def _defined(path) -> set[str]:
    """Names a module binds at its top level (assignments, functions, classes)."""
    import ast
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out


def test_the_ladder_data_is_the_books():
    assert not (REPO / PKG / "steps.py").exists()
    bad = {m: sorted(_defined(MODULES[m]) & LADDER_DATA) for m in under(PKG)}
    bad = {m: hit for m, hit in bad.items() if hit}
    assert not bad, f"the library defines the book's ladder data: {bad}"
    import flashbook.steps as book
    assert LADDER_DATA - {"_STEP_LIST", "_EXPERIMENT_LIST"} <= set(vars(book))
    assert book.FLAGS == LADDER_FLAGS and len(book.STEPS) == 9 and len(book.EXPERIMENTS) == 6
    # The ladder's own rules (PAIR's and PERSISTENT's grids, unchecked loads) are registered by
    # the book with its kernel, and its CPU emulation reads every flag there: not the library.
    import re
    reads = re.compile(r"flags(\.get\(|\[)\"(PAIR|PERSISTENT|UNCHECKED_KV|SPLIT_LOOP|REMAP|"
                       r"LAZY_RESCALE|FAST_MATH)\"")
    bad = [m for m in under(PKG) if reads.search(MODULES[m].read_text())]
    assert not bad, f"the library applies the ladder's flags: {bad}"


def test_the_library_alone_registers_what_best_ships():
    # Without the book: the two steps "best" resolves to; a book step names `import flashbook`.
    code = ("import sys, flashattn, torch\n"
            "from flashattn import registry\n"
            "print(','.join(registry.registered()))\n"
            "q = torch.zeros(1, 1, 16, 16, dtype=torch.float16)\n"
            "try:\n    with flashattn.interpret.enabled():\n"
            "        flashattn.api.run_step(q, q, q, 'baseline')\n"
            "except ValueError as e:\n    print(e)\n"
            "print('flashbook' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stderr
    names, err, book = res.stdout.strip().splitlines()
    assert names == "arch_tuned,warp_groups"
    assert "unknown step 'baseline'" in err and "import flashbook first" in err
    assert "flashbook.attention" in err and book == "False"


def test_the_book_registers_its_steps_in_book_order():
    import flashbook
    from flashattn import registry
    assert list(registry.registered()) == [*flashbook.STEPS, *flashbook.EXPERIMENTS]
    assert registry.get_step("arch_tuned") is flashbook.STEPS["arch_tuned"]   # one object


def test_no_hidden_imports_of_the_package():
    # importlib.import_module("flashattn.x") is an import the graph above cannot see: it once
    # hid a circle (fp8 -> decode -> fp8). Package modules are imported with `import` only.
    hits = []
    for p in sorted((REPO / PKG).rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                    node.func, "id", None)) == "import_module" and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).startswith((PKG, BOOK, "."))):
                hits.append(f"{p.relative_to(REPO)}:{node.lineno}")
    assert not hits, hits
