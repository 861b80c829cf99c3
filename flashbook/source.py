"""The kernel source as each step compiles it, and the diff between steps.

The fused kernel is one file whose steps differ by ``ct.Constant`` flags. The compiler folds
``if FLAG:`` away; so does ``step_source``: it keeps the branch the step takes, drops the
other, and writes the flag's value where it is used as an argument, so the book can print
exactly the code a step runs and ``step_diff`` exactly the lines a step changes.

Folding can leave a parameter that nothing reads any more (``Lse`` and ``WRITE_LSE``, the
backward's output, in every step of the book): ``prune_unused`` drops such parameters from the
signatures and from the calls of the functions that take them, so a listing shows only what the
step uses. ``step_source`` drops the backward's by default; ``prune=True`` drops every parameter
the step leaves unused (issue 13: a chapter's kernel without the later chapters' flags).
"""
from __future__ import annotations

import ast
import difflib
import importlib.util
import re
import textwrap

from flashbook.steps import FLAGS, Config, Step, get_step

from .steps import previous_step

# Compile-time booleans of the kernel that do not depend on the step.
_SHAPE_FLAGS = ("CAUSAL", "EVEN_K")
# Parameters of fmha_kernel that no step of the book uses: the forward's LSE output for the
# backward (issue 11). Folded away with WRITE_LSE=False, they leave the listings.
OUTPUT_FLAGS = {"WRITE_LSE": False}
OUTPUT_PARAMS = ("Lse", "WRITE_LSE")
# Flags added after the book's listings were written (E26's PIPELINE): folded away and dropped
# from every listing, so a step's source reads as before they existed.
LATE_FLAGS = ("PIPELINE",)
# Switches of the other kernel files that are off in what ships (measured and refuted, kept to
# be re-measured): the listings the chapters show fold them away.
OFF_SWITCHES = {"PDL": 0}


_KERNEL_MODULES = {"fmha": "flashbook.ladder.fmha", "naive": "flashattn.kernels.naive",
                   "shipped": "flashattn.kernels.fmha"}


def kernel_source(kind: str = "fmha") -> str:
    """The source file of a kernel module: ``fmha`` (the ladder, every step's flag), ``naive``
    or ``shipped`` (the library's forward, the ladder with the shipped flags folded in)."""
    if kind not in _KERNEL_MODULES:
        raise ValueError(f"unknown kernel module {kind!r}; one of {', '.join(_KERNEL_MODULES)}")
    spec = importlib.util.find_spec(_KERNEL_MODULES[kind])
    with open(spec.origin, encoding="utf-8") as f:   # read, not imported: no cuda.tile needed
        return f.read()


def _eval_flag_expr(node: ast.AST, env: dict):
    """Value of a test built from flag names, not/and/or and constants; None if not foldable."""
    if isinstance(node, ast.Name):
        return env.get(node.id)
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int)):
        return node.value
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        a, b = _eval_flag_expr(node.left, env), _eval_flag_expr(node.comparators[0], env)
        if a is None or b is None:
            return None
        op = node.ops[0]
        if isinstance(op, ast.Eq):
            return a == b
        if isinstance(op, ast.NotEq):
            return a != b
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        v = _eval_flag_expr(node.operand, env)
        return None if v is None else (not v)
    if isinstance(node, ast.BoolOp):
        vals = [_eval_flag_expr(v, env) for v in node.values]
        if isinstance(node.op, ast.And):
            if any(v is False for v in vals):
                return False
            return True if all(v is True for v in vals) else None
        if any(v is True for v in vals):
            return True
        return False if all(v is False for v in vals) else None
    return None


def _fold_once(src: str, env: dict) -> str | None:
    """Fold the first foldable ``if`` in ``src``; None when nothing is left to fold."""
    tree = ast.parse(src)
    lines = src.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        val = _eval_flag_expr(node.test, env)
        if val is None:
            continue
        indent = node.col_offset
        start, end = node.lineno - 1, node.end_lineno  # [start, end) lines of the whole if
        # Comment lines directly above the if belong to it when the branch is dropped.
        keep = node.body if val else node.orelse
        if keep and not (len(keep) == 1 and isinstance(keep[0], ast.If) and not val
                         and lines[keep[0].lineno - 1].lstrip().startswith("elif")):
            first = keep[0].lineno - 1
            # Comments between the `if`/`else` line and the first statement belong to the body.
            while first - 1 > start and lines[first - 1].strip().startswith("#"):
                first -= 1
            body = lines[first:keep[-1].end_lineno]
            body = textwrap.indent(textwrap.dedent("\n".join(body)), " " * indent).splitlines()
        elif keep:  # an elif chain: turn `elif` into `if` at this level
            inner = lines[keep[0].lineno - 1:keep[-1].end_lineno]
            inner[0] = inner[0].replace("elif", "if", 1)
            body = textwrap.indent(textwrap.dedent("\n".join(inner)), " " * indent).splitlines()
        else:
            body = []
            # A dropped branch takes its leading comment lines with it.
            while start > 0 and lines[start - 1].strip().startswith("#") and \
                    len(lines[start - 1]) - len(lines[start - 1].lstrip()) == indent:
                start -= 1
        new = lines[:start] + body + lines[end:]
        return "\n".join(new) + "\n"
    return None


def _substitute_flags(src: str, env: dict) -> str:
    """Write flag values where flags are passed as keyword values (``flush_to_zero=FLAG``)."""
    out = src
    for name, val in env.items():
        out = out.replace(f"={name})", f"={val})").replace(f"={name},", f"={val},")
        out = out.replace(f"=not {name},", f"={not val},").replace(f"=not {name})", f"={not val})")
    return out


def _substitute_helper_args(src: str, env: dict) -> str:
    """Write flag values where flags are passed to the helpers of ``flashattn/kernels/common.py``
    (``mask_scores(..., CAUSAL, EVEN_K)``): the helper folds them where it is inlined."""
    tree = ast.parse(src)
    helpers = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
               and (n.module or "").endswith("kernels.common") for a in n.names}
    lines = src.split("\n")
    spots = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) \
                and call.func.id in helpers:
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                if isinstance(arg, ast.Name) and arg.id in env:
                    spots.append((arg.lineno - 1, arg.col_offset, arg.end_col_offset,
                                  repr(env[arg.id])))
    for ln, c0, c1, val in sorted(spots, reverse=True):
        line = lines[ln]
        a, b = _byte_to_char(line, c0), _byte_to_char(line, c1)
        lines[ln] = line[:a] + val + line[b:]
    return "\n".join(lines)


def specialize(src: str, flags: dict) -> str:
    """Fold ``if`` statements whose tests depend only on ``flags`` (name -> bool)."""
    while True:
        nxt = _fold_once(src, flags)
        if nxt is None:
            return _substitute_helper_args(_substitute_flags(src, flags), flags)
        src = nxt


def _byte_to_char(line: str, col: int) -> int:
    """ast's column offsets count UTF-8 bytes; this is the character offset in ``line``."""
    return len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))


def _offset(lines: list[str], line_no: int, col: int) -> int:
    """Character offset in the joined source of (1-based line, byte column)."""
    return sum(len(x) + 1 for x in lines[:line_no - 1]) + _byte_to_char(lines[line_no - 1], col)


def _removal_span(src: str, lines: list[str], items: list, k: int) -> tuple[int, int]:
    """The characters to delete to remove ``items[k]`` from a comma-separated list.

    Keeps the layout of what remains: an item first on its line takes the separator after it
    (``Lse, qk_scale`` -> ``qk_scale``; a line holding only ``Lse,`` disappears); any other item
    takes the separator before it (``Out, Lse,`` -> ``Out,``; ``V_LAT,\n    WRITE_LSE)`` ->
    ``V_LAT)``).
    """
    def start(n):
        return _offset(lines, n.lineno, n.col_offset)

    def end(n):
        return _offset(lines, n.end_lineno, n.end_col_offset)

    item = items[k]
    line_start = src.rfind("\n", 0, start(item)) + 1
    first_on_line = src[line_start:start(item)].strip() == ""
    if first_on_line and k + 1 < len(items):
        return start(item), start(items[k + 1])
    if k > 0:
        return end(items[k - 1]), end(item)
    if k + 1 < len(items):
        return start(item), start(items[k + 1])
    return start(item), end(item)


def _uses(fn: ast.FunctionDef, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name
               for stmt in fn.body for n in ast.walk(stmt))


def _prune_once(src: str, names) -> str | None:
    """Remove one unused parameter (and its arguments at the calls); None if there is none."""
    out = _prune_param(src, names)
    return None if out is None else out[0]


def _prune_param(src: str, names):
    """``_prune_once``, also naming what it removed: (source, function, parameter) or None."""
    tree = ast.parse(src)
    lines = src.split("\n")
    funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    for fn in funcs.values():
        params = fn.args.args
        for idx, a in enumerate(params):
            if (names is not None and a.arg not in names) or _uses(fn, a.arg):
                continue
            spans = [_removal_span(src, lines, params, idx)]
            for call in ast.walk(tree):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                        and call.func.id == fn.name):
                    continue
                if any(isinstance(x, ast.Starred) for x in call.args):
                    return None                      # positions unknown: leave the source
                items = [*call.args, *call.keywords]
                for i, x in enumerate(items):
                    if (i == idx and i < len(call.args)) or \
                            (isinstance(x, ast.keyword) and x.arg == a.arg):
                        spans.append(_removal_span(src, lines, items, i))
            for s0, s1 in sorted(spans, reverse=True):
                src = src[:s0] + src[s1:]
            return src, fn.name, a.arg
    return None


def prune_unused(src: str, names=None) -> str:
    """Drop the parameters that no statement of their function reads, from the signature and
    from every call of that function in ``src``, until none is left; ``names`` limits it to those
    parameter names (None: any). Run after ``specialize``: a parameter passed on only to a helper
    that drops it becomes unused in turn (``Lse`` from ``attend_query_tile``, then from
    ``fmha_kernel``)."""
    while True:
        nxt = _prune_once(src, names)
        if nxt is None:
            return src
        src = nxt


def _drop_docstring_mentions(src: str, fn_name: str, param: str) -> str:
    """Drop a ``; param = ...`` or ``; param: ...`` clause from ``fn_name``'s docstring, so a
    pruned parameter is not described (``num_m_blocks = cdiv(Nq, TILE_M)`` in the baseline)."""
    tree = ast.parse(src)
    for fn in tree.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name == fn_name and fn.body
                and isinstance(fn.body[0], ast.Expr)
                and isinstance(fn.body[0].value, ast.Constant)
                and isinstance(fn.body[0].value.value, str)):
            continue
        doc = fn.body[0]
        lines = src.split("\n")
        clause = re.compile(rf";\s*{re.escape(param)}\s*[=:][^;]*?(?=;|\.?$)")
        for i in range(doc.lineno - 1, doc.end_lineno):
            lines[i] = clause.sub("", lines[i])
        return "\n".join(lines)
    return src


def _names_read(nodes) -> set:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def _defined_name(node: ast.stmt) -> str | None:
    """The one name a top-level function, assignment or single import defines; else None."""
    if isinstance(node, ast.FunctionDef):
        if any("kernel" in ast.unparse(d) for d in node.decorator_list):
            return None                                   # entry points stay
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 \
            and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, (ast.Import, ast.ImportFrom)) and len(node.names) == 1:
        alias = node.names[0]
        return alias.asname or alias.name.split(".")[0]
    return None


def _drop_unused_definition(src: str) -> str | None:
    """Remove one top-level helper, constant or import nothing else reads; None if none is.

    The definition takes the comment lines directly above it; the blank lines around it
    shrink to the longer of the two runs, so the file keeps its spacing."""
    tree = ast.parse(src)
    lines = src.split("\n")
    for node in tree.body:
        name = _defined_name(node)
        if name is None:
            continue
        others = [n for n in tree.body if n is not node]
        if name in _names_read(others):
            continue
        first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno]) - 1
        while first > 0 and lines[first - 1].startswith("#"):
            first -= 1
        end = node.end_lineno
        before = 0
        while first - before > 0 and lines[first - before - 1].strip() == "":
            before += 1
        after = 0
        while end + after < len(lines) and lines[end + after].strip() == "":
            after += 1
        keep = max(before, after)
        new = lines[:first - before] + [""] * keep + lines[end + after:]
        return "\n".join(new)
    return None


def _is_dead(stmt: ast.stmt, read: set) -> bool:
    """A ``name = expr`` nothing reads (and that calls no ``store``), or an ``if`` made only of
    such assignments."""
    if isinstance(stmt, ast.If):
        return all(_is_dead(s, read) for s in stmt.body + stmt.orelse)
    return (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id not in read
            and not any(isinstance(c, ast.Call) and "store" in ast.unparse(c.func)
                        for c in ast.walk(stmt.value)))


def _drop_dead_assignment(src: str) -> str | None:
    """Remove one ``name = expr`` statement (of a function, loop or branch body) whose name nothing in the
    function reads (``mask_start``, chapter 7's, in the baseline), with the comment lines
    directly above it; None if there is none. Calls that may write (``store``) are kept."""
    tree = ast.parse(src)
    lines = src.split("\n")
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Load)}
        # Statements of the function's body or of a loop's, never a body's only statement.
        blocks = [fn.body]
        for n in ast.walk(fn):
            if isinstance(n, (ast.For, ast.While, ast.If)):
                blocks += [n.body, n.orelse]
        dead = [st for body in blocks if len(body) > 1 for st in body if _is_dead(st, read)]
        for node in dead[:1]:
            first = node.lineno - 1
            indent = len(lines[first]) - len(lines[first].lstrip())
            while first > 0 and lines[first - 1].strip().startswith("#") and \
                    len(lines[first - 1]) - len(lines[first - 1].lstrip()) == indent:
                first -= 1
            return "\n".join(lines[:first] + lines[node.end_lineno:])
    return None


def prune_definitions(src: str) -> str:
    """Drop the top-level helpers, constants and imports that nothing left in ``src`` reads
    (``exp2_fma`` and its constants in every step without ``EXP_POLY``), until none is left.
    Entry points (``@ct.kernel``) stay. Local assignments nothing reads go first."""
    while (nxt := _drop_dead_assignment(src)) is not None:
        src = nxt
    while True:
        nxt = _drop_unused_definition(src)
        if nxt is None:
            return src
        src = nxt


def shipped_source(src: str) -> str:
    """A kernel file's source with ``OFF_SWITCHES`` folded away and their parameters dropped:
    the code as it ships (the backward and decoding listings of chapters 12 and 13)."""
    return prune_unused(specialize(src, OFF_SWITCHES), tuple(OFF_SWITCHES))


class _FoldKnown(ast.NodeTransformer):
    """``FLAG and X`` -> ``X`` (and ``or``) for flags of known value: the partial folding that
    ``specialize`` (whole tests only) leaves for the library's kernel."""

    def __init__(self, env: dict):
        self.env = env

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        known = [v for v in node.values if isinstance(v, ast.Name) and v.id in self.env]
        if not known:
            return node
        vals = [bool(self.env[v.id]) for v in known]
        is_and = isinstance(node.op, ast.And)
        if is_and and not all(vals):
            return ast.Constant(False)
        if not is_and and any(vals):
            return ast.Constant(True)
        rest = [v for v in node.values if v not in known]
        return rest[0] if len(rest) == 1 else ast.BoolOp(node.op, rest)


def shipped_kernel_source(flags: dict | None = None) -> str:
    """The ladder kernel with the library's shipped flags (``flashattn.kernels.SHIPPED_FLAGS``)
    folded away, their parameters, helpers and constants dropped, docstrings and comments
    removed (``ast.unparse``): what ``flashattn/kernels/fmha.py`` must be, as code."""
    from .ladder import SHIPPED_FLAGS
    env = dict(SHIPPED_FLAGS if flags is None else flags)
    src = specialize(kernel_source("fmha"), env)
    tree = _FoldKnown(env).visit(ast.parse(src))
    src = specialize(ast.unparse(ast.fix_missing_locations(tree)), env)
    src = prune_definitions(prune_unused(src, tuple(env)))
    return normalized(src)


def normalized(src: str) -> str:
    """Source without docstrings and comments, as ``ast.unparse`` writes it: two files that
    give the same text here are the same program."""
    tree = ast.parse(src)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def _function_source(src: str, name: str) -> str:
    tree = ast.parse(src)
    lines = src.splitlines()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            return "\n".join(lines[first:node.end_lineno]) + "\n"
    raise KeyError(name)


def shipped_listing(module: str, name: str) -> str:
    """One function (with its decorators) of a library module as it ships (``shipped_source``),
    read as text, not imported: no compiler needed. KeyError if the module has no such
    function."""
    spec = importlib.util.find_spec(module)
    with open(spec.origin, encoding="utf-8") as f:
        src = shipped_source(f.read())
    try:
        return _function_source(src, name)
    except KeyError:
        raise KeyError(f"no function {name!r} in {module}") from None


def step_source(name: str, *, causal: bool | None = None, even_k: bool | None = None,
                functions: tuple[str, ...] | None = None, write_lse: bool = False,
                prune: bool = False) -> str:
    """The fused kernel's source with step ``name``'s flags folded away.

    ``causal`` / ``even_k`` fold those shape flags too (None leaves them in). ``functions``
    restricts the output to some functions of the kernel file, in file order. ``write_lse``:
    the kernel as the backward's forward compiles it (with the LSE output); without it the LSE
    output and its flag leave the listing. ``prune=True`` also drops every other parameter the
    folded source no longer reads (flags of other chapters, their arguments at the calls and
    their mention in the docstring), then the helpers, constants and imports nothing reads any
    more: the kernel exactly as the step compiles it, as the chapters show it.
    """
    step: Step = get_step(name)
    if step.kernel == "naive":
        return kernel_source("naive")
    env = step.flag_values()
    env["WRITE_LSE"] = bool(write_lse)
    if causal is not None:
        env["CAUSAL"] = bool(causal)
    if even_k is not None:
        env["EVEN_K"] = bool(even_k)
    src = specialize(kernel_source("fmha"), env)
    if prune:
        while (out := _prune_param(src, None)) is not None:
            src = _drop_docstring_mentions(*out)
        src = prune_definitions(src)
    else:
        src = prune_unused(src, OUTPUT_PARAMS + LATE_FLAGS)
    if functions:
        src = "\n\n".join(_function_source(src, f) if _defines(src, f) else
                           common_helper_source(f, src, env, prune=prune) for f in functions)
    return src


_COMMON = "flashattn.kernels.common"


def _defines(src: str, name: str) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in ast.parse(src).body)


def common_helper_source(name: str, caller_src: str, env: dict, *, prune: bool = True) -> str:
    """A helper the kernel imports from ``flashattn/kernels/common.py`` (the math written once),
    as ``caller_src`` calls it: the compile-time arguments of its call (``GUARD=False``, a flag
    of ``env``, a default) folded in and, with ``prune``, the parameters that leaves unread
    dropped with their ``NAME:`` lines of the docstring."""
    spec = importlib.util.find_spec(_COMMON)
    with open(spec.origin, encoding="utf-8") as f:
        common = f.read()
    helper = _function_source(common, name)                  # KeyError: not a common helper
    fn = ast.parse(helper).body[0]
    params = [a.arg for a in fn.args.args]
    consts = {}
    for a, d in zip(fn.args.args[len(params) - len(fn.args.defaults):], fn.args.defaults):
        if isinstance(d, ast.Constant):
            consts[a.arg] = d.value

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int)):
            return node.value
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        return None
    calls = [c for c in ast.walk(ast.parse(caller_src)) if isinstance(c, ast.Call)
             and isinstance(c.func, ast.Name) and c.func.id == name]
    for call in calls[:1]:                                    # the kernel's (first) call
        passed = list(zip(params, call.args)) + [(k.arg, k.value) for k in call.keywords]
        for p, node in passed:
            v = value(node)
            if v is None:
                consts.pop(p, None)
            else:
                consts[p] = v
    helper = specialize(helper, consts)
    if prune:
        # A folded parameter's default goes first, so dropping the parameter drops it too.
        head_end = helper.index("):")
        head = helper[:head_end]
        for p in consts:
            head = re.sub(rf"\b({p}(?:\s*:\s*[\w.\[\]]+)?)\s*=\s*[^,)]+", r"\1", head)
        helper = head + helper[head_end:]
        while (out := _prune_param(helper, None)) is not None:
            helper, _, param = out
            lines = helper.split("\n")
            for i, ln in enumerate(lines):
                if ln.strip().startswith(f"{param}:"):
                    ind = len(ln) - len(ln.lstrip())
                    j = i + 1
                    while j < len(lines) and lines[j].strip() and \
                            len(lines[j]) - len(lines[j].lstrip()) > ind:
                        j += 1
                    del lines[i:j]
                    break
            helper = "\n".join(lines)
    return helper


def kernel_params(src: str, function: str = "fmha_kernel") -> list[str]:
    """The parameter names of ``function`` in a kernel source (``step_source``'s output), in
    order: what a chapter counts when it says how many arguments its kernel takes."""
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return [a.arg for a in node.args.args]
    raise KeyError(f"no function {function!r} in the source")


def step_params(name: str, function: str = "fmha_kernel", **kw) -> list[str]:
    """The parameters of ``function`` as step ``name`` compiles it (``step_source(name, **kw)``):
    ``step_params("baseline", causal=True, even_k=True, prune=True)`` is chapter 3's list."""
    return kernel_params(step_source(name, **kw), function)


def step_diff(name: str, base: str | None = None, *, context: int = 3, **kw) -> str:
    """Unified diff of the kernel source from ``base`` (default: the previous step) to ``name``.

    Steps that differ only in tile shape or hints have an empty source diff; their change is
    in ``config_diff``.
    """
    base = base or previous_step(name)
    if base is None:
        return ""
    a = step_source(base, **kw).splitlines(keepends=True)
    b = step_source(name, **kw).splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, f"{base}", f"{name}", n=context))


def config_diff(name: str, base: str | None = None, arch: str = "sm_90") -> dict:
    """What changes outside the source: {field: (before, after)} for tiles, hints, flags."""
    base = base or previous_step(name)
    if base is None:
        return {}
    a, b = get_step(base), get_step(name)
    ca, cb = a.configs(arch)[0], b.configs(arch)[0]
    out = {}
    for f in ("TILE_M", "TILE_N", *Config.HINTS):
        if getattr(ca, f) != getattr(cb, f):
            out[f] = (getattr(ca, f), getattr(cb, f))
    for f in FLAGS:
        if a.flag_values()[f] != b.flag_values()[f]:
            out[f] = (a.flag_values()[f], b.flag_values()[f])
    if a.tuned != b.tuned:
        out["tuned"] = (a.tuned, b.tuned)
    return out


def show(code: str, language: str = "python"):
    """Render code (or a diff, language="diff") with syntax colours in a notebook."""
    from IPython.display import Markdown
    return Markdown(f"```{language}\n{code.rstrip()}\n```")
