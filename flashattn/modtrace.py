"""FlexAttention mods written in torch, traced and turned into cuTile tile functions.

People write a FlexAttention ``score_mod``/``mask_mod`` with torch operations::

    bias = torch.randn(H, 2 * N - 1)
    def rel_bias(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, score + bias[h, q_idx - kv_idx + N - 1], -inf)

``trace(fn, "score")`` calls it once with proxy arguments (``Proxy``: they record what is done
to them, as ``torch.fx`` proxies do) and returns the expression graph. Supported: arithmetic,
comparisons, ``& | ^ ~``, ``torch.where``, ``exp``/``exp2``/``log``/``log2``/``sqrt``/
``tanh``/``sigmoid``/``silu``/``relu``/``sin``/``cos``/``tan``/``abs``/``floor``/``ceil``,
``minimum``/``maximum``/``clamp``, casts (``.float()``, ``.to(dtype)``), Python scalars,
captured scalar tensors, ``new_ones``/``new_zeros`` (``and_masks``/``or_masks``), and captured
tensors indexed by ``b``, ``h``, ``q_idx``, ``kv_idx`` and integer expressions of them (each
becomes a tensor argument of the kernel, read with ``ct.gather``). Anything else raises
``ModError`` naming the operation; so does Python control flow on a traced value.

``compile_mod(fn, cls)`` generates the tile function's source (and, for a score, the source
of d score_mod / d score by the chain rule over the graph), writes it to
``$FLASHATTN_CACHE/mods/`` (cuTile reads kernel source with ``inspect``: a function needs a
file), imports it and returns a ``flashattn.mods.ScoreMod``/``MaskMod`` whose tensors are the
captured ones. Identical graphs share one file, one function, hence one compiled kernel; a mod
is traced again on every call (cheap), so a captured tensor or flag that changes is seen.

Why one module of this size: the tracer's proxies, the graph, the derivative rules and the code
generator share one node type and one table of operations (name, arity, torch function, tile
form, derivative); split, every new operation would be an edit in four files.
"""
from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import threading
import types

__all__ = ["ModError", "Proxy", "Graph", "Node", "trace", "generate_source", "compile_mod",
           "to_mod", "SCORE_ARGS", "MASK_ARGS"]

SCORE_ARGS = ("score", "b", "h", "q_idx", "kv_idx")
MASK_ARGS = ("b", "h", "q_idx", "kv_idx")


class ModError(ValueError):
    """A score function or mask the kernel cannot run or compile; the message names it (what
    the tracer cannot express, or what the compiler refused). ``flashattn.flex.ModError``."""


def _error(msg):
    return ModError(msg)


# === the graph ===================================================================================
class Node:
    """One value of the traced function: ``op`` on ``args`` (Nodes), of kind ``dtype`` ('f' float32,
    'i' int32, 'b' bool); ``deps``: the inputs it depends on; ``value``: a constant's value."""
    __slots__ = ("op", "args", "dtype", "deps", "value", "key", "nonneg")

    def __repr__(self):
        return f"Node({self.op}, {self.dtype})"


class Graph:
    """Nodes (hash-consed: one node per distinct expression) and the captured tensors."""

    def __init__(self):
        self.nodes: dict = {}
        self.tensors: list = []          # (name, tensor, bool?) in kernel-argument order
        self._tensor_ids: dict = {}
        self._keep: list = []

    def node(self, op, args=(), dtype="f", value=None, nonneg=False):
        key = (op, tuple(a.key for a in args), dtype,
               None if value is None else (type(value).__name__, repr(value)))
        n = self.nodes.get(key)
        if n is None:
            n = Node()
            n.op, n.args, n.dtype, n.value, n.key = op, tuple(args), dtype, value, key
            n.deps = frozenset().union(*(a.deps for a in args))
            n.nonneg = nonneg
            self.nodes[key] = n
        return n

    def input(self, name, dtype):
        n = self.node("input", (), dtype, value=name, nonneg=name != "score")
        n.deps = frozenset([name])
        return n

    def const(self, v):
        if isinstance(v, bool):
            return self.node("const", (), "b", value=v)
        if isinstance(v, int):
            if not -2**31 <= v < 2**31:
                raise _error(f"the integer constant {v} does not fit in int32 (the kernel's "
                             "index type)")
            return self.node("const", (), "i", value=v, nonneg=v >= 0)
        return self.node("const", (), "f", value=float(v))

    def tensor(self, t):
        """The kernel-argument index of captured tensor ``t`` (converted: float32 or int32)."""
        import torch
        tid = id(t)
        if tid in self._tensor_ids:
            return self._tensor_ids[tid]
        if t.is_complex():
            raise _error(f"a captured complex tensor {tuple(t.shape)} cannot be read by a mod")
        is_bool = t.dtype == torch.bool
        v = _converted(t, torch.float32 if t.dtype.is_floating_point else torch.int32)
        i = len(self.tensors)
        self.tensors.append((f"t{i}", v, is_bool))
        self._tensor_ids[tid] = i
        self._keep.append(t)             # ids stay unique while tracing
        return i


_CONVERTED: dict = {}
_CONVERTED_MAX = 64


def _converted(t, dtype):
    """``t`` as the kernel reads it: ``dtype``, contiguous, at least 1-d. A copy is made once per
    (tensor, version) and reused: a mod is traced on every call, its tensors are not copied on
    every call; an in-place update of the tensor (a new version) makes a new copy."""
    import torch
    import weakref
    if t.dtype == dtype and t.dim() > 0 and t.is_contiguous():
        return t.detach()                  # read in place: updates are seen as they are
    base = t._base if t._base is not None else t
    key = (id(base), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, dtype,
           t._version, t.device)
    hit = _CONVERTED.get(key)
    if hit is not None and hit[0]() is base:
        return hit[1]
    if dtype == torch.int32 and t.dtype != torch.bool and t.numel() and (
            int(t.min()) < -2**31 or int(t.max()) >= 2**31):
        raise _error(f"a captured {t.dtype} tensor holds values outside int32 (the kernel's "
                     "index type)")
    v = t.detach().to(dtype).reshape(-1 if t.dim() == 0 else t.shape).contiguous()
    if len(_CONVERTED) >= _CONVERTED_MAX:
        _CONVERTED.pop(next(iter(_CONVERTED)))
    _CONVERTED[key] = (weakref.ref(base), v)
    return v


# --- building nodes (torch's type rules on the kinds f/i/b) -------------------------------------
def _num(d):
    return "i" if d == "b" else d


def _promote(*ds):
    return "f" if "f" in ds else "i"


_ARITH = ("add", "sub", "mul", "floordiv", "mod", "pow")
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_FLIP = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}
_UNARY_F = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
            "sigmoid")


def _is_const(n, v=None):
    return n.op == "const" and (v is None or n.value == v)


def build(g, op, *args):
    """The node of ``op`` on nodes ``args``, with constant folding of the identities a
    derivative produces (x*1, x+0, True & x, ...)."""
    if op in _ARITH or op == "truediv":
        a, b = args
        if op in ("add", "sub", "mul") and "b" in (a.dtype, b.dtype) and \
                a.dtype == b.dtype == "b":
            raise _error(f"arithmetic ({op}) on two bool values")
        d = "f" if op == "truediv" else _promote(_num(a.dtype), _num(b.dtype))
        if op == "pow" and a.dtype != "f" and b.dtype != "f" and _is_const(b) and b.value < 0:
            raise _error("an integer raised to a negative integer power")
        # identities (kinds permitting: the result keeps d)
        if op == "add":
            if _is_const(b, 0) and a.dtype == d:
                return a
            if _is_const(a, 0) and b.dtype == d:
                return b
        if op == "sub" and _is_const(b, 0) and a.dtype == d:
            return a
        if op == "mul":
            if _is_const(b, 1) and a.dtype == d:
                return a
            if _is_const(a, 1) and b.dtype == d:
                return b
        if op == "truediv" and _is_const(b, 1) and a.dtype == "f":
            return a
        if op == "pow" and _is_const(b, 1) and a.dtype == d:
            return a
        if _is_const(a) and _is_const(b) and (op in ("add", "sub", "mul") or (
                op == "truediv" and b.value != 0)):
            v = {"add": a.value + b.value, "sub": a.value - b.value,
                 "mul": a.value * b.value}[op] if op != "truediv" else a.value / b.value
            return g.const(float(v) if d == "f" else int(v))
        nonneg = op in ("add", "mul", "floordiv") and a.nonneg and b.nonneg
        return g.node(op, (a, b), d, nonneg=nonneg)
    if op in _CMP:
        a, b = args
        if _is_const(a) and _is_const(b):
            return g.const(bool({"lt": a.value < b.value, "le": a.value <= b.value,
                                 "gt": a.value > b.value, "ge": a.value >= b.value,
                                 "eq": a.value == b.value, "ne": a.value != b.value}[op]))
        return g.node(op, (a, b), "b")
    if op in ("and", "or", "xor"):
        a, b = args
        if "f" in (a.dtype, b.dtype):
            raise _error(f"bitwise {op} of a float value")
        if a.dtype == b.dtype == "b":
            for x, y in ((a, b), (b, a)):
                if _is_const(x):
                    if op == "and":
                        return y if x.value else g.const(False)
                    if op == "or":
                        return g.const(True) if x.value else y
                    return build(g, "not", y) if x.value else y
            return g.node(op, (a, b), "b")
        return g.node(op, (a, b), "i")
    if op == "not":
        (a,) = args
        if a.dtype == "f":
            raise _error("~ of a float value")
        if a.dtype == "b":
            if _is_const(a):
                return g.const(not a.value)
            if a.op in _CMP and "f" not in (a.args[0].dtype, a.args[1].dtype):
                return g.node(_FLIP[a.op], a.args, "b")      # integers: no NaN to respect
        return g.node("not", (a,), a.dtype)
    if op == "neg":
        (a,) = args
        if a.dtype == "b":
            raise _error("unary minus of a bool value")
        if _is_const(a):
            return g.const(-a.value)
        return g.node("neg", (a,), a.dtype)
    if op in _UNARY_F:
        (a,) = args
        return g.node(op, (a,), "f")
    if op in ("floor", "ceil"):
        (a,) = args
        return a if a.dtype != "f" else g.node(op, (a,), "f")
    if op == "abs":
        (a,) = args
        return g.node("abs", (a,), _num(a.dtype), nonneg=True)
    if op in ("minimum", "maximum", "clamp_lo", "clamp_hi"):
        a, b = args
        return g.node(op, (a, b), _promote(_num(a.dtype), _num(b.dtype)),
                      nonneg=(a.nonneg or b.nonneg) if op in ("maximum", "clamp_lo") else
                      (a.nonneg and b.nonneg))
    if op == "where":
        c, a, b = args
        if c.dtype != "b":
            raise _error("torch.where's condition must be a bool value (a comparison)")
        if _is_const(c):
            return a if c.value else b
        if a is b:
            return a
        d = "b" if a.dtype == b.dtype == "b" else _promote(_num(a.dtype), _num(b.dtype))
        if d == "b" and (_is_const(a) or _is_const(b)):
            # a select between bools with a constant side is logic: c & x, ~c | x, ...
            if _is_const(b):
                return build(g, "and", c, a) if not b.value else \
                    build(g, "or", build(g, "not", c), a)
            return build(g, "or", c, b) if a.value else build(g, "and", build(g, "not", c), b)
        return g.node("where", (c, a, b), d, nonneg=a.nonneg and b.nonneg)
    if op in ("to_f", "to_i", "to_b"):
        (a,) = args
        d = op[-1]
        if a.dtype == d:
            return a
        if _is_const(a):
            return g.const({"f": float, "i": int, "b": bool}[d](a.value))
        return g.node(op, (a,), d, nonneg=a.nonneg or d == "b")
    raise AssertionError(op)                                           # pragma: no cover


def gather(g, t, idx):
    """The node reading captured tensor ``t`` at index nodes ``idx`` (one per dimension)."""
    i = g.tensor(t)
    name, v, is_bool = g.tensors[i]
    n = g.node("gather", tuple(idx), "i" if is_bool or not v.dtype.is_floating_point else "f",
               value=i)
    return build(g, "ne", n, g.const(0)) if is_bool else n


# === the proxies ================================================================================
class _View:
    """A captured tensor indexed by fewer values than it has dimensions (``bias[b]`` before
    ``[q_idx]``): complete once every dimension has an index."""
    __slots__ = ("g", "t", "idx")

    def __init__(self, g, t, idx):
        self.g, self.t, self.idx = g, t, idx

    def __getitem__(self, index):
        return _index(self.g, self.t, self.idx + _index_tuple(index))

    def __getattr__(self, name):
        raise _error(f"a captured tensor of shape {tuple(self.t.shape)} indexed by "
                     f"{len(self.idx)} value(s) is not a value per score: index every dimension "
                     f"before using it (.{name})")


def _index_tuple(index):
    return index if isinstance(index, tuple) else (index,)


def _index(g, t, idx):
    """``t[idx]``: Python ints select on the host (a view, copied once), traced values gather."""
    import torch
    idx = list(idx)
    for i in idx:
        if i is None or i is Ellipsis or isinstance(i, slice):
            raise _error(f"indexing a captured tensor {tuple(t.shape)} with "
                         f"{'a slice' if isinstance(i, slice) else repr(i)}: a mod reads one "
                         "element per score (index by b, h, q_idx, kv_idx or integers)")
        if isinstance(i, torch.Tensor) and i.dim() != 0:
            raise _error(f"indexing a captured tensor with a tensor of shape {tuple(i.shape)} "
                         "(advanced indexing): index by b, h, q_idx, kv_idx or scalars")
        if isinstance(i, (float, bool)) or (isinstance(i, torch.Tensor) and
                                            (i.dtype.is_floating_point or i.dtype == torch.bool)):
            raise _error(f"indexing a captured tensor with a {type(i).__name__} "
                         f"{getattr(i, 'dtype', '')}")
    if len(idx) > t.dim():
        raise _error(f"too many indices ({len(idx)}) for a captured tensor of shape "
                     f"{tuple(t.shape)}")
    # Python integers: select on the host, from the last position so earlier dims stay put.
    nodes = []
    for pos in reversed(range(len(idx))):
        i = idx[pos]
        if isinstance(i, int):
            n = t.shape[pos]
            if not -n <= i < n:
                raise _error(f"index {i} is out of range for dimension {pos} of a captured "
                             f"tensor of shape {tuple(t.shape)}")
            t = t.select(pos, i)
            del idx[pos]
    if len(idx) < t.dim():
        return _View(g, t, tuple(idx))
    if not idx:                      # every index an integer: a scalar read
        return Proxy(g, _scalar_tensor(g, t))
    for i in idx:
        nodes.append(_operand(g, i))
    for n in nodes:
        if n.dtype == "f":
            raise _error("indexing a captured tensor with a float expression (use // or "
                         ".long(), as torch would require)")
    nodes = [build(g, "to_i", n) for n in nodes]
    return Proxy(g, gather(g, t, _wrap(g, nodes, t)))


def _wrap(g, nodes, t):
    """Negative indices count from the end, as torch's indexing does: wrapped in the kernel
    (against the array's own size) unless provably non-negative."""
    out = []
    for d, n in enumerate(nodes):
        out.append(n if n.nonneg else g.node("wrap", (n,), "i", value=d, nonneg=True))
    return out


def _scalar_tensor(g, t):
    if t.dim() != 0:
        raise _error(f"a captured tensor of shape {tuple(t.shape)} used whole: a mod reads one "
                     "element per score (index it by b, h, q_idx, kv_idx)")
    # One element, read at a zero index that is a tile (b * 0), as gathers take tile indices.
    z = g.node("zero", (), "i", nonneg=True)
    z.deps = frozenset(["b"])
    return gather(g, t, [z])


def _operand(g, x):
    import torch
    if isinstance(x, Proxy):
        if x.g is not g:
            raise _error("a value traced in another mod")
        return x.node
    if isinstance(x, _View):
        x.__getattr__("value")
    if isinstance(x, torch.Tensor):
        return _scalar_tensor(g, x)
    if isinstance(x, (bool, int, float)):
        return g.const(x)
    import numbers
    if isinstance(x, numbers.Number) and not isinstance(x, complex):
        return g.const(float(x) if isinstance(x, numbers.Real) and not
                       isinstance(x, numbers.Integral) else int(x))
    raise _error(f"a {type(x).__name__} cannot take part in a traced mod")


def _kind_of(dtype):
    import torch
    if dtype == torch.bool:
        return "b"
    if dtype.is_floating_point:
        return "f"
    if dtype.is_complex:
        raise _error(f"a cast to {dtype}")
    return "i"


def _torch_dtype(kind):
    import torch
    return {"f": torch.float32, "i": torch.int32, "b": torch.bool}[kind]


class Proxy:
    """A traced value: stands for a tile of the kernel (the score, an index, a result)."""
    __slots__ = ("g", "node")

    def __init__(self, g, node):
        self.g, self.node = g, node

    # --- torch's protocol: torch.where(proxy, ...), captured_tensor[proxy], tensor + proxy ---
    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        g = next(a.g for a in _flat(args, kwargs) if isinstance(a, (Proxy, _View)))
        return _call(g, func, args, kwargs or {})

    def _b(self, op, o, swap=False):
        a, b = _operand(self.g, self), _operand(self.g, o)
        if swap:
            a, b = b, a
        return Proxy(self.g, build(self.g, op, a, b))

    __hash__ = object.__hash__

    def __neg__(self): return Proxy(self.g, build(self.g, "neg", self.node))
    def __pos__(self): return self
    def __invert__(self): return Proxy(self.g, build(self.g, "not", self.node))
    def __abs__(self): return Proxy(self.g, build(self.g, "abs", self.node))

    def __bool__(self):
        raise _error("Python control flow on a traced value (if/while/and/or/not, or bool()): "
                     "the kernel computes every score at once; use torch.where or & | ~")

    def __index__(self):
        raise _error("a traced value used as a Python integer (range, list index, int()): "
                     "index captured tensors with it instead")

    def __int__(self):
        self.__index__()

    def __float__(self):
        raise _error("a traced value used as a Python float (math.* or float()): use torch's "
                     "functions (torch.exp, torch.tanh, ...)")

    def __getitem__(self, index):
        raise _error("indexing the score or an index (score[...]): a mod sees one score at a "
                     "time")

    def __iter__(self):
        raise _error("iterating over a traced value")

    def __len__(self):
        raise _error("len() of a traced value")

    # --- what a 0-d tensor answers (each mod argument is one element under torch's vmap) ---
    @property
    def shape(self):
        import torch
        return torch.Size([])

    @property
    def ndim(self):
        return 0

    def dim(self):
        return 0

    def size(self, d=None):
        if d is not None:
            raise _error("size(dim) of a mod argument (a 0-d value)")
        return self.shape

    def numel(self):
        return 1

    @property
    def dtype(self):
        return _torch_dtype(self.node.dtype)

    @property
    def device(self):
        import torch
        return torch.device("cpu")

    @property
    def is_floating_point(self):
        return lambda: self.node.dtype == "f"

    def new_ones(self, *size, dtype=None, **kw):
        return self._new(size or (kw.get("size", ()),), 1, dtype)

    def new_zeros(self, *size, dtype=None, **kw):
        return self._new(size or (kw.get("size", ()),), 0, dtype)

    def new_full(self, size, fill_value, dtype=None, **_):
        return self._new((size,), fill_value, dtype)

    def new_tensor(self, data, dtype=None, **_):
        return self._new((), data, dtype)

    def _new(self, size, v, dtype):
        if len(size) == 1 and isinstance(size[0], (tuple, list)):
            size = tuple(size[0])
        if tuple(size) not in ((), (1,)):
            raise _error(f"new_ones/new_zeros/new_full of shape {size}: a mod makes scalars")
        kind = _kind_of(dtype) if dtype is not None else self.node.dtype
        if isinstance(v, Proxy):
            return Proxy(self.g, build(self.g, "to_" + kind, v.node))
        conv = {"f": float, "i": int, "b": bool}[kind]
        return Proxy(self.g, self.g.const(conv(v)))

    def to(self, *args, **kwargs):
        import torch
        dtype = kwargs.get("dtype")
        for a in args:
            if isinstance(a, torch.dtype):
                dtype = a
            elif isinstance(a, torch.Tensor) or isinstance(a, Proxy):
                dtype = a.dtype
        if dtype is None:
            return self                    # a device move
        return Proxy(self.g, build(self.g, "to_" + _kind_of(dtype), self.node))

    def type(self, dtype=None):
        if dtype is None:
            raise _error(".type() without a dtype")
        return self.to(dtype)

    def type_as(self, other):
        return self.to(other.dtype)

    def float(self): return Proxy(self.g, build(self.g, "to_f", self.node))
    def double(self): return self.float()
    def half(self): return self.float()
    def bfloat16(self): return self.float()
    def int(self): return Proxy(self.g, build(self.g, "to_i", self.node))
    def long(self): return self.int()
    def bool(self): return Proxy(self.g, build(self.g, "to_b", self.node))

    def __getattr__(self, name):
        # Tensor methods (score.exp(), q.abs(), s.clamp(min=0)): torch's function of that name.
        if name.startswith("_"):
            raise AttributeError(name)
        f = _HANDLERS.get(name)
        if f is None:
            raise _error(f"Tensor.{name} is not supported in a traced mod (supported: "
                         f"{', '.join(sorted(_HANDLERS))})")
        return lambda *a, **k: f(self.g, (self,) + a, k)

    def __repr__(self):
        return f"Proxy({self.node.op}, {self.node.dtype})"


# Arithmetic, bitwise and comparison operators: each records one node, operands in order
# (the reflected form swaps them).
for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor"):
    setattr(Proxy, f"__{_op}__", lambda self, o, _op=_op: self._b(_op, o))
    setattr(Proxy, f"__r{_op}__", lambda self, o, _op=_op: self._b(_op, o, True))
for _op in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(Proxy, f"__{_op}__", lambda self, o, _op=_op: self._b(_op, o))
del _op


def _flat(args, kwargs):
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, (tuple, list)):
            yield from _flat(a, None)
        else:
            yield a


def _call(g, func, args, kwargs):
    import torch
    name = getattr(func, "__name__", str(func))
    if name == "__getitem__" and isinstance(args[0], torch.Tensor):
        return _index(g, args[0], _index_tuple(args[1]))
    if name.startswith("__r") and name.endswith("__") and name[3:-2] in _DUNDER:
        # tensor.__radd__(proxy) etc: the reflected operation
        return _HANDLERS[_DUNDER[name[3:-2]]](g, (args[1], args[0]), kwargs)
    if name.startswith("__") and name.endswith("__") and name[2:-2] in _DUNDER:
        name = _DUNDER[name[2:-2]]
    if name.startswith("special_"):
        name = name[len("special_"):]
    f = _HANDLERS.get(name)
    if f is None:
        raise _error(f"torch.{name} is not supported in a traced mod (supported: "
                     f"{', '.join(sorted(_HANDLERS))})")
    return f(g, args, kwargs)


_DUNDER = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv":
           "floor_divide", "mod": "remainder", "pow": "pow", "and": "bitwise_and",
           "or": "bitwise_or", "xor": "bitwise_xor", "lt": "lt", "le": "le", "gt": "gt",
           "ge": "ge", "eq": "eq", "ne": "ne", "neg": "neg", "invert": "bitwise_not",
           "abs": "abs"}


def _bin(op):
    def h(g, args, kwargs):
        a, b = args[0], args[1] if len(args) > 1 else kwargs.get("other")
        alpha = kwargs.get("alpha", 1)
        if alpha != 1 and op in ("add", "sub"):
            b = Proxy(g, build(g, "mul", _operand(g, b), g.const(alpha)))
        return Proxy(g, build(g, op, _operand(g, a), _operand(g, b)))
    return h


def _un(op):
    def h(g, args, kwargs):
        return Proxy(g, build(g, op, _operand(g, args[0])))
    return h


def _div(g, args, kwargs):
    a, b = _operand(g, args[0]), _operand(g, args[1] if len(args) > 1 else kwargs["other"])
    mode = kwargs.get("rounding_mode")
    if mode is None:
        return Proxy(g, build(g, "truediv", a, b))
    if mode == "floor":
        return Proxy(g, build(g, "floordiv", a, b))
    raise _error(f"torch.div(rounding_mode={mode!r}) (only None and 'floor')")


def _where(g, args, kwargs):
    if len(args) == 1 and not kwargs:
        raise _error("torch.where(condition) with one argument (nonzero indices)")
    c, x, y = (list(args) + [kwargs.get(k) for k in ("input", "other")])[:3] \
        if len(args) < 3 else args
    return Proxy(g, build(g, "where", _operand(g, c), _operand(g, x), _operand(g, y)))


def _tensor_where(g, args, kwargs):          # self.where(cond, other)
    return _where(g, (args[1], args[0], args[2] if len(args) > 2 else kwargs["other"]), {})


def _masked_fill(g, args, kwargs):           # self.masked_fill(mask, value)
    return _where(g, (args[1], args[2] if len(args) > 2 else kwargs["value"], args[0]), {})


def _clamp(g, args, kwargs):
    x = _operand(g, args[0])
    lo = args[1] if len(args) > 1 else kwargs.get("min")
    hi = args[2] if len(args) > 2 else kwargs.get("max")
    if lo is None and hi is None:
        raise _error("torch.clamp without min or max")
    # max/min with torch's clamp derivative (1 on the closed interval, not split on ties)
    if lo is not None:
        x = build(g, "clamp_lo", x, _operand(g, lo))
    if hi is not None:
        x = build(g, "clamp_hi", x, _operand(g, hi))
    return Proxy(g, x)


def _clamp_side(side):
    def h(g, args, kwargs):
        v = args[1] if len(args) > 1 else kwargs[side]
        return _clamp(g, (args[0],), {side: v})
    return h


def _minmax(op):
    def h(g, args, kwargs):
        if len(args) < 2 and "other" not in kwargs:
            raise _error(f"torch.{'max' if op == 'maximum' else 'min'} as a reduction (a mod sees "
                         "one score: use torch.maximum/minimum of two values)")
        b = args[1] if len(args) > 1 else kwargs["other"]
        import torch
        if isinstance(b, int) and not isinstance(b, bool) and not isinstance(args[0], Proxy):
            raise _error(f"torch.{op} with a dim argument (a reduction)")
        return Proxy(g, build(g, op, _operand(g, args[0]), _operand(g, b)))
    return h


def _silu(g, args, kwargs):
    x = _operand(g, args[0])
    return Proxy(g, build(g, "mul", x, build(g, "sigmoid", x)))


def _relu(g, args, kwargs):
    # where(x > 0, x, 0): torch's relu, derivative 0 at 0 as torch's
    x = _operand(g, args[0])
    zero = g.const(0.0 if x.dtype == "f" else 0)
    return Proxy(g, build(g, "where", build(g, "gt", x, zero), x, zero))


def _square(g, args, kwargs):
    x = _operand(g, args[0])
    return Proxy(g, build(g, "mul", x, x))


def _reciprocal(g, args, kwargs):
    return Proxy(g, build(g, "truediv", g.const(1.0), _operand(g, args[0])))


def _log1p(g, args, kwargs):
    return Proxy(g, build(g, "log", build(g, "add", g.const(1.0), _operand(g, args[0]))))


def _expm1(g, args, kwargs):
    return Proxy(g, build(g, "sub", build(g, "exp", _operand(g, args[0])), g.const(1.0)))


def _like(v):
    def h(g, args, kwargs):
        import torch
        x = _operand(g, args[0])
        dtype = kwargs.get("dtype")
        kind = _kind_of(dtype) if isinstance(dtype, torch.dtype) else x.dtype
        val = v if v is not None else (args[1] if len(args) > 1 else kwargs["fill_value"])
        if isinstance(val, Proxy):
            return Proxy(g, build(g, "to_" + kind, val.node))
        return Proxy(g, g.const({"f": float, "i": int, "b": bool}[kind](val)))
    return h


def _to(g, args, kwargs):
    return args[0].to(*args[1:], **kwargs) if isinstance(args[0], Proxy) else \
        Proxy(g, _operand(g, args[0]))


def _logical(op):
    def h(g, args, kwargs):
        a = build(g, "to_b", _operand(g, args[0]))
        b = build(g, "to_b", _operand(g, args[1] if len(args) > 1 else kwargs["other"]))
        return Proxy(g, build(g, op, a, b))
    return h


def _logical_not(g, args, kwargs):
    return Proxy(g, build(g, "not", build(g, "to_b", _operand(g, args[0]))))


_HANDLERS = {
    "add": _bin("add"), "sub": _bin("sub"), "subtract": _bin("sub"), "mul": _bin("mul"),
    "multiply": _bin("mul"), "div": _div, "divide": _div, "true_divide": _bin("truediv"),
    "floor_divide": _bin("floordiv"), "remainder": _bin("mod"), "pow": _bin("pow"),
    "lt": _bin("lt"), "le": _bin("le"), "gt": _bin("gt"), "ge": _bin("ge"), "eq": _bin("eq"),
    "ne": _bin("ne"), "less": _bin("lt"), "less_equal": _bin("le"), "greater": _bin("gt"),
    "greater_equal": _bin("ge"), "not_equal": _bin("ne"),
    "bitwise_and": _bin("and"), "bitwise_or": _bin("or"), "bitwise_xor": _bin("xor"),
    "bitwise_not": _un("not"), "logical_and": _logical("and"), "logical_or": _logical("or"),
    "logical_xor": _logical("xor"), "logical_not": _logical_not,
    "neg": _un("neg"), "negative": _un("neg"), "abs": _un("abs"), "absolute": _un("abs"),
    "exp": _un("exp"), "exp2": _un("exp2"), "log": _un("log"), "log2": _un("log2"),
    "sqrt": _un("sqrt"), "rsqrt": _un("rsqrt"), "sin": _un("sin"), "cos": _un("cos"),
    "tan": _un("tan"), "tanh": _un("tanh"), "sigmoid": _un("sigmoid"), "expit": _un("sigmoid"),
    "floor": _un("floor"), "ceil": _un("ceil"), "silu": _silu, "relu": _relu,
    "square": _square, "reciprocal": _reciprocal, "log1p": _log1p, "expm1": _expm1,
    "minimum": _bin("minimum"), "maximum": _bin("maximum"), "min": _minmax("minimum"),
    "max": _minmax("maximum"), "clamp": _clamp, "clip": _clamp,
    "clamp_min": _clamp_side("min"), "clamp_max": _clamp_side("max"),
    "where": _where, "masked_fill": _masked_fill,
    "full_like": _like(None), "ones_like": _like(1), "zeros_like": _like(0), "to": _to,
}
# Tensor methods on a proxy use the method's argument order (self first).
Proxy.where = lambda self, cond, other: _tensor_where(self.g, (self, cond, other), {})
Proxy.masked_fill = lambda self, mask, value: _masked_fill(self.g, (self, mask, value), {})


# === tracing ====================================================================================
class Traced:
    """What ``trace`` returns: the graph, its output node, the kind and the mod's name."""

    def __init__(self, g, out, kind, name):
        self.graph, self.out, self.kind, self.name = g, out, kind, name

    @property
    def tensors(self):
        return [(n, t) for n, t, _ in self.graph.tensors]


def _name(fn):
    return getattr(fn, "__name__", type(fn).__name__)


def trace(fn, kind: str) -> Traced:
    """Call ``fn`` (a FlexAttention ``score_mod`` or ``mask_mod``) on proxies; ``ModError`` for
    what cannot be traced, naming the operation."""
    if kind not in ("score", "mask"):
        raise ValueError(f"kind must be 'score' or 'mask', got {kind!r}")
    g = Graph()
    names = SCORE_ARGS if kind == "score" else MASK_ARGS
    args = [Proxy(g, g.input(n, "f" if n == "score" else "i")) for n in names]
    what = f"{kind}_mod {_name(fn)!r}"
    try:
        res = fn(*args)
    except ModError as e:
        raise ModError(f"{what}: {e}") from None
    except Exception as e:
        raise ModError(f"{what} cannot be traced: {type(e).__name__}: {e}") from e
    import torch
    if not isinstance(res, (Proxy, _View, torch.Tensor)):
        raise TypeError(f"{what} returned a {type(res).__name__}, not a tile or a tensor: a "
                        f"{kind}_mod returns " + ("the score" if kind == "score" else
                                                  "a bool per score (True: attend)"))
    if kind == "score" and isinstance(res, Proxy) and res.node.dtype == "b":
        raise TypeError(f"{what} returned a bool value; a score_mod returns the float score "
                        "(a mask is a mask_mod, or torch.where(cond, score, -inf))")
    try:
        out = _operand(g, res)
    except ModError as e:
        raise ModError(f"{what} returned {type(res).__name__}: {e}") from None
    if kind == "mask" and out.dtype != "b":
        raise ModError(f"{what} returned {'a float' if out.dtype == 'f' else 'an integer'} value; "
                       "a mask_mod returns a bool (True: attend), e.g. q_idx >= kv_idx")
    if kind == "score" and out.dtype != "f":
        out = build(g, "to_f", out)
    return Traced(g, out, kind, _name(fn))


# === differentiation =============================================================================
_LN2 = math.log(2.0)


def derivative(g, out):
    """d out / d score as a node (None: zero), by the chain rule over the graph."""
    memo: dict = {}

    def one(x):
        return g.const(1.0)

    def mul(a, b):
        if a is None or b is None:
            return None
        return build(g, "mul", a, b)

    def add(a, b):
        if a is None:
            return b
        if b is None:
            return a
        return build(g, "add", a, b)

    def neg(a):
        return None if a is None else build(g, "neg", a)

    def d(n):
        if n.key in memo:
            return memo[n.key]
        memo[n.key] = r = _d(n)
        return r

    def _d(n):
        if n.dtype != "f" or "score" not in n.deps:
            return None
        op, a = n.op, n.args
        if op == "input":
            return one(n)
        if op == "to_f":
            return d(a[0])
        if op == "add":
            return add(d(a[0]), d(a[1]))
        if op == "sub":
            return add(d(a[0]), neg(d(a[1])))
        if op == "mul":
            return add(mul(d(a[0]), a[1]), mul(a[0], d(a[1])))
        if op == "truediv":
            da, db = d(a[0]), d(a[1])
            r = None if da is None else build(g, "truediv", da, a[1])
            if db is not None:
                r = add(r, neg(build(g, "truediv", mul(n, db), a[1])))
            return r
        if op == "pow":
            x, p = a
            r = None
            if d(x) is not None:
                r = mul(mul(p, build(g, "pow", x, build(g, "sub", p, g.const(1)))), d(x))
            if d(p) is not None:
                r = add(r, mul(mul(n, build(g, "log", x)), d(p)))
            return r
        if op == "neg":
            return neg(d(a[0]))
        if op == "exp":
            return mul(n, d(a[0]))
        if op == "exp2":
            return mul(mul(n, g.const(_LN2)), d(a[0]))
        if op == "log":
            return mul(build(g, "truediv", g.const(1.0), a[0]), d(a[0]))
        if op == "log2":
            return mul(build(g, "truediv", g.const(1.0 / _LN2), a[0]), d(a[0]))
        if op == "sqrt":
            return mul(build(g, "truediv", g.const(0.5), n), d(a[0]))
        if op == "rsqrt":
            return mul(build(g, "mul", g.const(-0.5), build(g, "mul", n, build(
                g, "mul", n, n))), d(a[0]))
        if op == "sin":
            return mul(build(g, "cos", a[0]), d(a[0]))
        if op == "cos":
            return mul(build(g, "neg", build(g, "sin", a[0])), d(a[0]))
        if op == "tan":
            return mul(build(g, "add", g.const(1.0), build(g, "mul", n, n)), d(a[0]))
        if op == "tanh":
            return mul(build(g, "sub", g.const(1.0), build(g, "mul", n, n)), d(a[0]))
        if op == "sigmoid":
            return mul(build(g, "mul", n, build(g, "sub", g.const(1.0), n)), d(a[0]))
        if op in ("floor", "ceil", "floordiv"):
            return None                                              # piecewise constant
        if op == "mod":
            return d(a[0])                                           # x - floor(x/y)*y
        if op == "abs":
            x = a[0]
            sign = build(g, "where", build(g, "gt", x, g.const(0.0)), g.const(1.0),
                         build(g, "where", build(g, "lt", x, g.const(0.0)), g.const(-1.0),
                               g.const(0.0)))
            return mul(sign, d(x))
        if op in ("minimum", "maximum"):
            # torch's rule: the gradient goes to the chosen side, half to each on a tie
            x, y = a
            dx, dy = d(x), d(y)
            zero = g.const(0.0)
            dx_, dy_ = dx or zero, dy or zero
            first = build(g, "lt" if op == "minimum" else "gt", x, y)
            second = build(g, "gt" if op == "minimum" else "lt", x, y)
            tie = build(g, "mul", build(g, "add", dx_, dy_), g.const(0.5))
            return build(g, "where", first, dx_, build(g, "where", second, dy_, tie))
        if op in ("clamp_lo", "clamp_hi"):
            x, bound = a
            dx, db = d(x), d(bound)
            if dx is None and db is None:
                return None
            inside = build(g, "ge" if op == "clamp_lo" else "le", x, bound)
            return build(g, "where", inside, dx or g.const(0.0), db or g.const(0.0))
        if op == "where":
            c, x, y = a
            dx, dy = d(x), d(y)
            if dx is None and dy is None:
                return None
            return build(g, "where", c, dx or g.const(0.0), dy or g.const(0.0))
        if op == "gather":
            return None
        raise _error(f"no derivative rule for {op}")                   # pragma: no cover
    return d(out)


# === code generation =============================================================================
_PY_OPS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%",
           **_CMP}
_CT_UNARY = {"exp": "ct.exp", "exp2": "ct.exp2", "log": "ct.log", "log2": "ct.log2",
             "sqrt": "ct.sqrt", "rsqrt": "ct.rsqrt", "sin": "ct.sin", "cos": "ct.cos",
             "tan": "ct.tan", "tanh": "ct.tanh", "floor": "ct.floor", "ceil": "ct.ceil",
             "abs": "ct.abs"}
_FULL = frozenset(["q_idx", "kv_idx"])


def _literal(v, kind):
    if kind == "f":
        v = float(v)
        if math.isnan(v):
            return "math.nan"
        if math.isinf(v):
            return "math.inf" if v > 0 else "(-math.inf)"
        return repr(v)
    if kind == "i":
        if isinstance(v, float) and not v.is_integer():
            raise _error(f"the float {v} where an integer is needed")
        return repr(int(v))
    return repr(bool(v))


class _Emitter:
    def __init__(self, g):
        self.g = g
        self.lines: list = []
        self.names: dict = {}

    def val(self, n, want=None):
        """``n``'s expression, converted to kind ``want``."""
        if n.op == "const":
            return _literal(n.value, want or n.dtype)
        s = self.name(n)
        if want is None or want == n.dtype:
            return s
        if n.dtype == "b":
            return f"ct.where({s}, 1.0, 0.0)" if want == "f" else f"ct.where({s}, 1, 0)"
        if want == "b":
            return f"({s} != {'0.0' if n.dtype == 'f' else '0'})"
        return f"ct.astype({s}, {'ct.float32' if want == 'f' else 'ct.int32'})"

    def name(self, n):
        if n.op == "input":
            return n.value
        if n.key in self.names:
            return self.names[n.key]
        expr = self.expr(n)
        v = f"v{len(self.names)}"
        self.lines.append(f"    {v} = {expr}")
        self.names[n.key] = v
        return v

    def expr(self, n):
        op, a = n.op, n.args
        if op in _PY_OPS:
            if op in _CMP:
                k = "f" if "f" in (a[0].dtype, a[1].dtype) else (
                    "b" if a[0].dtype == a[1].dtype == "b" else "i")
            else:
                k = n.dtype
            if k == "i" and op == "truediv":
                k = "f"
            return f"({self.val(a[0], k)} {_PY_OPS[op]} {self.val(a[1], k)})"
        if op == "pow":
            if _is_const(a[1], 2):
                x = self.val(a[0], n.dtype)
                return f"({x} * {x})"
            return f"ct.pow({self.val(a[0], n.dtype)}, {self.val(a[1], n.dtype)})"
        if op in ("and", "or", "xor"):
            k = n.dtype
            if k == "b" and op == "xor":
                return f"({self.val(a[0], 'b')} != {self.val(a[1], 'b')})"
            sym = {"and": "&", "or": "|", "xor": "^"}[op]
            return f"({self.val(a[0], k)} {sym} {self.val(a[1], k)})"
        if op == "not":
            return f"(~{self.val(a[0])})"
        if op == "neg":
            return f"(-{self.val(a[0])})"
        if op in _CT_UNARY:
            return f"{_CT_UNARY[op]}({self.val(a[0], 'f' if op != 'abs' else None)})"
        if op == "sigmoid":
            return f"(1.0 / (1.0 + ct.exp(-{self.val(a[0], 'f')})))"
        if op in ("minimum", "maximum", "clamp_lo", "clamp_hi"):
            f = {"clamp_lo": "maximum", "clamp_hi": "minimum"}.get(op, op)
            return f"ct.{f}({self.val(a[0], n.dtype)}, {self.val(a[1], n.dtype)})"
        if op == "where":
            return (f"ct.where({self.val(a[0], 'b')}, {self.val(a[1], n.dtype)}, "
                    f"{self.val(a[2], n.dtype)})")
        if op in ("to_f", "to_i", "to_b"):
            return self.val(a[0], n.dtype)
        if op == "zero":
            return "(b * 0)"
        if op == "gather":
            idx = []
            for d, x in enumerate(a):
                if x.op == "wrap":
                    i = self.val(x.args[0], "i")
                    idx.append(f"ct.where({i} < 0, {i} + t{n.value}.shape[{d}], {i})")
                else:
                    idx.append(self.val(x, "i"))
            return f"ct.gather(t{n.value}, ({', '.join(idx)},))"
        raise AssertionError(op)                                       # pragma: no cover


def _render(g, out, fname, kind, tensor_names):
    em = _Emitter(g)
    if kind == "mask":
        r = em.val(out, "b")
        if out.op == "const":
            r = "(kv_idx >= 0)" if out.value else "(kv_idx < 0)"      # a [1, TILE_N] bool
        elif not out.deps & _FULL:
            r = f"({r} & (kv_idx >= 0))"
    else:
        r = em.val(out, "f")
        if not ("score" in out.deps or _FULL <= out.deps):
            r = f"ct.full(score.shape, {r}, dtype=ct.float32)" if out.op == "const" else \
                f"ct.broadcast_to({r}, score.shape)"
    args = ", ".join((SCORE_ARGS if kind != "mask" else MASK_ARGS) + tuple(tensor_names))
    return [f"def {fname}({args}):"] + em.lines + [f"    return {r}"]


def generate_source(traced: Traced):
    """(source text, tile function name, grad function name or None, additive) of a traced mod."""
    g = traced.graph
    names = [n for n, _, _ in g.tensors]
    body = [_render(g, traced.out, "{F}", traced.kind, names)]
    grad_name, additive = None, False
    if traced.kind == "score":
        dnode = derivative(g, traced.out)
        if dnode is not None and _is_const(dnode, 1.0):
            additive = True
        else:
            if dnode is None:
                dnode = g.const(0.0)
            body.append(_render(g, dnode, "{F}_grad", "score", names))
    text = "\n\n\n".join("\n".join(b) for b in body)
    h = hashlib.sha256(text.encode()).hexdigest()[:16]
    fname = f"{traced.kind}_mod_{h}"
    text = text.replace("{F}", fname)
    if "{F}_grad" not in "\n".join(body[-1]) or traced.kind == "mask" or additive:
        grad_name = None
    else:
        grad_name = fname + "_grad"
    header = (f'"""Generated by flashattn.modtrace from the {traced.kind}_mod {traced.name!r} '
              '(torch code, traced); do not edit."""\nimport math\n\nimport cuda.tile as ct\n\n\n')
    return header + text + "\n", fname, grad_name, additive


# === import and the mod object ==================================================================
_LOCK = threading.Lock()
_FUNCS: dict = {}
_GENERATED: dict = {}


def _cache_dir():
    from .env import cache_root
    return cache_root() / "mods"


def _load(src, fname, grad_name):
    key = hashlib.sha256(src.encode()).hexdigest()[:24]
    with _LOCK:
        hit = _FUNCS.get(key)
        if hit is not None:
            return hit
        from .interpret import install_shim
        install_shim()                    # the generated file imports cuda.tile
        d = _cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{fname}.py"
        if not path.exists() or path.read_text() != src:
            tmp = d / f".{fname}.{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.write_text(src)
            os.replace(tmp, path)
        modname = f"flashattn_mods_{fname}"
        spec = importlib.util.spec_from_file_location(modname, path)
        m = importlib.util.module_from_spec(spec)
        sys.modules[modname] = m
        spec.loader.exec_module(m)
        hit = (getattr(m, fname), getattr(m, grad_name) if grad_name else None, str(path))
        _FUNCS[key] = hit
        return hit


def _torch_caller(fn, kind):
    # The mod's tensors are the traced ones (for the kernel); the torch side is the user's own
    # function, which reads its captured tensors itself.
    if kind == "score":
        def traced_score(score, b, h, q_idx, kv_idx, *_tensors):
            return fn(score, b, h, q_idx, kv_idx)
        return traced_score

    def traced_mask(b, h, q_idx, kv_idx, *_tensors):
        return fn(b, h, q_idx, kv_idx)
    return traced_mask


def compile_mod(fn, cls):
    """``fn`` traced and generated, as a ``cls`` (``flashattn.mods.ScoreMod`` or ``MaskMod``)
    for the flex kernels: its tile function and derivative imported from the generated file, its
    tensors the captured ones, its torch function ``fn`` itself."""
    kind = cls.kind
    tr = trace(fn, kind)
    # The graph's key names the generated code (tensors by position and kind): generated once.
    key = (kind, tr.name, tr.out.key, tuple((v.dim(), b) for _, v, b in tr.graph.tensors))
    hit = _GENERATED.get(key)
    if hit is None:
        src, fname, grad_name, additive = generate_source(tr)
        hit = _GENERATED[key] = (fname, additive) + _load(src, fname, grad_name)
    fname, additive, tile, grad, path = hit
    kw = dict(params=dict(traced=fname), grad=grad, additive=additive) if kind == "score" \
        else dict(params=dict(traced=fname))
    try:
        mod = cls(tr.name, tile, _torch_caller(fn, kind), tr.tensors, **kw)
    except (TypeError, ValueError) as e:
        raise _error(str(e)) from e
    mod.source_path = path
    return mod


def _uses_cutile(fn) -> bool:
    """Whether ``fn`` is written in cuda.tile (names the module in its globals or closure):
    such a def is already a tile function, not traced."""
    from .interpret.rebind import _is_ct_module
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    gl = getattr(fn, "__globals__", {})
    names = _all_names(code)
    if names & _cutile_only_names():
        return True                        # .astype(), ct.gather(...): tile code
    for name in names:
        if _is_ct_module(gl.get(name)) or _is_ct_function(gl.get(name)):
            return True
    for c in getattr(fn, "__closure__", None) or ():
        try:
            v = c.cell_contents
        except ValueError:
            continue
        if _is_ct_module(v) or _is_ct_function(v):
            return True
    return False


_CT_ONLY = frozenset(["ct", "astype", "gather", "scatter", "bitcast", "cdiv", "expand_dims",
                      "extract", "mma", "truediv", "floordiv", "RoundingMode", "PaddingMode",
                      "static_assert", "assume_divisible_by", "bool_"])


def _cutile_only_names() -> frozenset:
    """Names of cuda.tile that torch code does not use (``x.astype``, ``ct.gather``): a function
    naming one is tile code."""
    return _CT_ONLY


def _is_ct_function(v) -> bool:
    mod = getattr(v, "__module__", "") or ""
    return callable(v) and (mod.startswith("cuda.tile") or mod == "flashattn.interpret.tile")


def _all_names(code):
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _all_names(c)
    return names


def to_mod(fn, cls):
    """A plain function as a ``cls`` (ScoreMod/MaskMod): traced (torch operations) unless it is
    a def written in cuda.tile, which is then its own tile function."""
    import torch
    if _uses_cutile(fn) or torch.compiler.is_compiling():
        # Under torch.compile the tracer cannot run inside Dynamo: a def is taken as tile code,
        # as before; trace it eagerly (mods.as_mod(fn, kind)) and pass the mod instead.
        return cls(_name(fn), fn)
    try:
        return compile_mod(fn, cls)
    except Exception as e:
        if isinstance(fn, types.FunctionType) and _raised_by_cutile(e.__cause__):
            return cls(_name(fn), fn)      # ct.* called on a proxy: a tile def
        raise


def _raised_by_cutile(exc) -> bool:
    import cuda.tile as ct
    roots = [os.path.dirname(getattr(ct, "__file__", "") or "") or "//none",
             os.path.join(os.path.dirname(__file__), "interpret")]
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        f = tb.tb_frame.f_code.co_filename
        if any(f.startswith(r + os.sep) for r in roots):
            return True
        tb = tb.tb_next
    return False
