"""A NumPy ``cuda.tile``: the tile semantics the interpreter runs kernels with.

Every name a kernel of this package uses from ``cuda.tile`` is here, with cuTile's type rules:

* Tiles have a dtype of cuTile's (``float16``, ``bfloat16``, ``float32``, ``int32``, ``bool_``,
  ``float8_e4m3fn``, ...). fp16, fp32, fp64, integers and booleans are held in NumPy's own types;
  bf16, tf32 and the fp8 formats in fp32 storage, rounded to nearest-even after every operation.
* Python scalars are loosely typed (an ``int`` takes the other operand's integer dtype, a
  ``float`` its float dtype; across categories the stronger wins, ``float`` giving float32);
  tiles, kernel scalars, ``Array.shape`` and ``bid`` are strongly typed and promote by cuTile's
  table (``promote``), which ``tests/test_interpret.py`` checks against cuda.tile's own.
* ``max``/``min`` of tiles are element-wise (the interpreter rebinds those builtins in kernels).
"""
from __future__ import annotations

import builtins as _b
import enum
import math
import typing
import warnings

import numpy as np

from .errors import InterpreterError

# ------------------------------------------------------------------------------------------
# dtypes


class DType:
    """A cuTile dtype. ``np``: the NumPy storage type; ``kind``: b, i, u, f (float), r
    (restricted float: bf16? no, fp8/tf32: no implicit promotion)."""

    def __init__(self, name, np_dtype, kind, bits, torch_name=None, rounded=False):
        self.name, self.np, self.kind, self.bits = name, np.dtype(np_dtype), kind, bits
        self.torch_name = torch_name or name
        self.rounded = rounded               # held in fp32 storage, rounded after each op

    def __repr__(self):
        return f"<DType '{self.name}'>"

    __str__ = __repr__

    def __eq__(self, other):
        # equal to cuda.tile's own DType of the same name, too
        return getattr(other, "name", None) == self.name and (
            isinstance(other, DType) or "DType" in type(other).__name__)

    def __hash__(self):
        return hash(self.name)

    @property
    def is_float(self):
        return self.kind in "fr"

    @property
    def bitwidth(self):
        return self.bits


bool_ = DType("bool_", np.bool_, "b", 8, "bool")
uint8 = DType("uint8", np.uint8, "u", 8)
uint16 = DType("uint16", np.uint16, "u", 16)
uint32 = DType("uint32", np.uint32, "u", 32)
uint64 = DType("uint64", np.uint64, "u", 64)
int8 = DType("int8", np.int8, "i", 8)
int16 = DType("int16", np.int16, "i", 16)
int32 = DType("int32", np.int32, "i", 32)
int64 = DType("int64", np.int64, "i", 64)
float16 = DType("float16", np.float16, "f", 16)
float32 = DType("float32", np.float32, "f", 32)
float64 = DType("float64", np.float64, "f", 64)
bfloat16 = DType("bfloat16", np.float32, "f", 16, rounded=True)
tfloat32 = DType("tfloat32", np.float32, "r", 32, rounded=True)
float8_e4m3fn = DType("float8_e4m3fn", np.float32, "r", 8, rounded=True)
float8_e5m2 = DType("float8_e5m2", np.float32, "r", 8, rounded=True)

DTYPES = [bool_, uint8, uint16, uint32, uint64, int8, int16, int32, int64, float16, float32,
          float64, bfloat16, tfloat32, float8_e4m3fn, float8_e5m2]
_BY_NAME = {d.name: d for d in DTYPES}
_BY_NAME["bool"] = bool_
_TORCH_NAMES = {"float16": float16, "half": float16, "float32": float32, "float": float32,
                "float64": float64, "double": float64, "bfloat16": bfloat16, "bool": bool_,
                "int8": int8, "int16": int16, "int32": int32, "int64": int64, "uint8": uint8,
                "uint16": uint16, "uint32": uint32, "uint64": uint64,
                "float8_e4m3fn": float8_e4m3fn, "float8_e5m2": float8_e5m2}


def as_dtype(d) -> DType:
    """A shim DType from one, from cuda.tile's own, from a torch or NumPy dtype, by name."""
    if isinstance(d, DType):
        return d
    name = getattr(d, "name", None)
    if isinstance(name, str) and name in _BY_NAME:
        return _BY_NAME[name]
    s = str(d).replace("torch.", "").strip("<>' ").replace("DType ", "").strip("'")
    if s in _TORCH_NAMES:
        return _TORCH_NAMES[s]
    if s in _BY_NAME:
        return _BY_NAME[s]
    raise InterpreterError(f"dtype {d!r} is not supported by the interpreter")


def _torch():
    import torch
    return torch


def round_to(a: np.ndarray, d: DType) -> np.ndarray:
    """``a`` (any float array) rounded to ``d`` and held in ``d``'s storage type."""
    if not d.rounded:
        return np.asarray(a).astype(d.np, copy=False)
    a = np.asarray(a, dtype=np.float32)
    if d is tfloat32:
        bits = a.view(np.uint32).astype(np.uint64)
        keep = ((bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000).astype(np.uint32)
        out = keep.view(np.float32)
        return np.where(np.isfinite(a), out, a).astype(np.float32)
    torch = _torch()
    t = torch.from_numpy(np.ascontiguousarray(a))
    if d is float8_e4m3fn:
        # e4m3fn has no inf: saturate finite values as a cast on the GPU with satfinite does not;
        # torch's cast gives NaN past 448, which is what cuTile's plain astype gives too.
        return t.to(torch.float8_e4m3fn).to(torch.float32).numpy().reshape(a.shape)
    if d is float8_e5m2:
        return t.to(torch.float8_e5m2).to(torch.float32).numpy().reshape(a.shape)
    return t.to(torch.bfloat16).to(torch.float32).numpy().reshape(a.shape)


# cuTile's promotion table (cuda.tile._datatype): None where implicit promotion is an error.
def promote(a: DType, b: DType) -> DType:
    if a == b:
        return a
    if a.kind == "r" or b.kind == "r":
        raise InterpreterError(f"Implicit promotion of {a} and {b} is not supported as it "
                               "involves restricted float dtypes; cast explicitly")
    for x, y in ((a, b), (b, a)):
        if x is bool_:
            return y
    if a.is_float or b.is_float:
        if a.is_float and b.is_float:
            if {a.name, b.name} == {"float16", "bfloat16"}:
                raise InterpreterError(f"Implicit promotion of {a} and {b} is not supported; "
                                       "cast explicitly")
            order = ["float16", "bfloat16", "float32", "float64"]
            return a if order.index(a.name) > order.index(b.name) else b
        return a if a.is_float else b
    # both integers
    if a.kind != b.kind:
        raise InterpreterError(f"Implicit promotion of {a} and {b} is not supported "
                               "(signed and unsigned); cast explicitly")
    return a if a.bits >= b.bits else b


def _loose_dtype(v) -> DType:
    if isinstance(v, (bool, np.bool_)):
        return bool_
    if isinstance(v, (int, np.integer)):
        return int32 if -2**31 <= int(v) < 2**31 else int64
    if isinstance(v, (float, np.floating)):
        return float32
    raise InterpreterError(f"a {type(v).__name__} ({v!r}) cannot be an operand of a tile "
                           "operation")


_CAT = {"b": 0, "i": 1, "u": 1, "f": 2, "r": 2}


def promote_loose(d: DType, v, force_float=False) -> DType:
    """The dtype of ``tile(d) op v`` for a Python scalar ``v`` (cuTile's loosely typed rule)."""
    ld = _loose_dtype(v)
    c, lc = _CAT[d.kind], _CAT[ld.kind]
    if c == lc:
        ret = d
        if c == 1 and not force_float:
            info = np.iinfo(d.np)
            if not info.min <= int(v) <= info.max:
                raise InterpreterError(f"Integer constant {v} is out of range of {d}")
    else:
        ret = ld if lc > c else d
    if force_float and not ret.is_float:
        return float32
    return ret


def _is_pow2(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def check_shape(shape, what="tile") -> tuple:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    for s in shape:
        if not _is_pow2(s):
            raise InterpreterError(f"{what} shape {shape}: every dimension of a tile must be a "
                                   "power of two")
    return shape


# ------------------------------------------------------------------------------------------
# tiles


def _np_scalar_ok(v):
    return isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating))


class Tile:
    """A tile: a NumPy array ``a`` in the storage type of ``dtype``."""

    __slots__ = ("a", "dtype")
    __array_priority__ = 1000

    def __init__(self, a, dtype: DType):
        self.a = np.asarray(a, dtype=dtype.np)
        self.dtype = dtype

    # --- shape -------------------------------------------------------------------------------
    @property
    def shape(self):
        return tuple(self.a.shape)

    @property
    def ndim(self):
        return self.a.ndim

    def item(self):
        return reshape(self, ())

    def reshape(self, shape):
        return reshape(self, shape)

    def astype(self, dtype, *, rounding_mode=None):
        return astype(self, dtype, rounding_mode=rounding_mode)

    def transpose(self, axis0=None, axis1=None):
        return transpose(self, axis0, axis1)

    def permute(self, axes):
        return permute(self, axes)

    def extract(self, index, shape):
        return extract(self, index, shape)

    def insert(self, index, value):
        return insert(self, index, value)

    @property
    def T(self):
        return transpose(self)

    def __getitem__(self, index):
        # cuTile: indexing is expand_dims: None adds an axis, ':' keeps one.
        if not isinstance(index, tuple):
            index = (index,)
        for i in index:
            if not (i is None or i is Ellipsis or (isinstance(i, slice) and i == slice(None))):
                raise InterpreterError("a tile can be indexed only with None and ':' "
                                       f"(expand_dims), got {index!r}")
        return Tile(self.a[index], self.dtype)

    # --- Python protocol ---------------------------------------------------------------------
    def _scalar(self, what):
        if self.a.ndim != 0:
            raise InterpreterError(f"{what} of a tile of shape {self.shape}: only a 0-d tile "
                                   "(a scalar) can be used so")
        return self.a[()]

    def __index__(self):
        v = self._scalar("an index")
        if self.dtype.kind not in "iub":
            raise InterpreterError(f"a {self.dtype} scalar cannot be an index")
        return int(v)

    def __int__(self):
        return int(self._scalar("int()"))

    def __float__(self):
        return float(self._scalar("float()"))

    def __bool__(self):
        return bool(self._scalar("a condition"))

    def __len__(self):
        raise InterpreterError("len() of a tile: use tile.shape")

    def __iter__(self):
        raise InterpreterError("a tile cannot be iterated over")

    def __str__(self):
        return _format(self.a, self.dtype)

    __repr__ = __str__                        # as cuTile prints a tile, inside tuples too

    def __format__(self, spec):
        if not spec:
            return str(self)
        if self.a.ndim == 0:
            return format(self.a[()].item(), spec)
        rec = lambda x: format(x.item(), spec) if x.ndim == 0 else \
            "[" + ", ".join(rec(y) for y in x) + "]"                    # noqa: E731
        return rec(self.a)

    def __hash__(self):
        raise TypeError("unhashable type: 'Tile'")

    # --- arithmetic --------------------------------------------------------------------------
    def __add__(self, o): return binop("add", self, o)
    def __radd__(self, o): return binop("add", o, self)
    def __sub__(self, o): return binop("sub", self, o)
    def __rsub__(self, o): return binop("sub", o, self)
    def __mul__(self, o): return binop("mul", self, o)
    def __rmul__(self, o): return binop("mul", o, self)
    def __truediv__(self, o): return binop("truediv", self, o)
    def __rtruediv__(self, o): return binop("truediv", o, self)
    def __floordiv__(self, o): return binop("floordiv", self, o)
    def __rfloordiv__(self, o): return binop("floordiv", o, self)
    def __mod__(self, o): return binop("mod", self, o)
    def __rmod__(self, o): return binop("mod", o, self)
    def __pow__(self, o): return binop("pow", self, o)
    def __rpow__(self, o): return binop("pow", o, self)
    def __and__(self, o): return binop("and", self, o)
    def __rand__(self, o): return binop("and", o, self)
    def __or__(self, o): return binop("or", self, o)
    def __ror__(self, o): return binop("or", o, self)
    def __xor__(self, o): return binop("xor", self, o)
    def __rxor__(self, o): return binop("xor", o, self)
    def __lshift__(self, o): return binop("lshift", self, o)
    def __rlshift__(self, o): return binop("lshift", o, self)
    def __rshift__(self, o): return binop("rshift", self, o)
    def __rrshift__(self, o): return binop("rshift", o, self)
    def __lt__(self, o): return binop("lt", self, o)
    def __le__(self, o): return binop("le", self, o)
    def __gt__(self, o): return binop("gt", self, o)
    def __ge__(self, o): return binop("ge", self, o)
    def __eq__(self, o): return binop("eq", self, o)
    def __ne__(self, o): return binop("ne", self, o)
    def __matmul__(self, o): return matmul(self, o)
    def __divmod__(self, o): return binop("floordiv", self, o), binop("mod", self, o)
    def __rdivmod__(self, o): return binop("floordiv", o, self), binop("mod", o, self)
    def __rmatmul__(self, o): return matmul(o, self)

    def __neg__(self):
        if self.dtype is bool_:
            raise InterpreterError("unary minus of a bool tile")
        return Tile(round_to(-self.a, self.dtype), self.dtype)

    def __pos__(self):
        return self

    def __invert__(self):
        if self.dtype.is_float:
            raise InterpreterError(f"~ of a {self.dtype} tile")
        return Tile(~self.a, self.dtype)

    def __abs__(self):
        return Tile(np.abs(self.a), self.dtype)


def _format(a: np.ndarray, d: DType) -> str:
    def one(x):
        if d is bool_:
            return "1" if x else "0"
        if d.is_float:
            x = float(x)
            if math.isnan(x):
                return "nan"
            if math.isinf(x):
                return "inf" if x > 0 else "-inf"
            return repr(x) if x != int(x) or math.fabs(x) >= 1e16 else f"{x:.1f}"
        return str(int(x))

    def rec(x):
        if x.ndim == 0:
            return one(x[()])
        return "[" + ", ".join(rec(y) for y in x) + "]"
    return rec(np.asarray(a))


def _operand(x):
    """(array, dtype or None for loose, loose value)."""
    if isinstance(x, Tile):
        return x.a, x.dtype, None
    if _np_scalar_ok(x):
        return None, None, x
    raise InterpreterError(f"a {type(x).__name__} cannot be an operand of a tile operation")


_ARITH = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "pow": np.power}
_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal}
_BIT = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
        "lshift": np.left_shift, "rshift": np.right_shift}


def result_dtype(x, y, force_float=False) -> DType:
    xa, xd, xv = _operand(x)
    ya, yd, yv = _operand(y)
    if xd is not None and yd is not None:
        d = promote(xd, yd)
        if force_float and not d.is_float:
            d = float32
        return d
    if xd is not None:
        return promote_loose(xd, yv, force_float)
    if yd is not None:
        return promote_loose(yd, xv, force_float)
    d = promote(_loose_dtype(xv), _loose_dtype(yv))
    return float32 if force_float and not d.is_float else d


def _as(x, d: DType) -> np.ndarray:
    if isinstance(x, Tile):
        if x.dtype == d:
            return x.a
        return _convert(x.a, x.dtype, d)
    return round_to(np.asarray(x), d) if d.is_float else np.asarray(x).astype(d.np)


def _convert(a, src: DType, dst: DType) -> np.ndarray:
    if dst.is_float:
        return round_to(a.astype(np.float64) if src.kind in "iu" and src.bits == 64 else a, dst)
    if src.is_float:
        # float -> int: round toward zero, as a GPU's cvt.rzi; NaN is an error to rely on.
        with np.errstate(invalid="ignore"):
            return np.trunc(a).astype(dst.np)
    return a.astype(dst.np)


def binop(op, x, y) -> Tile:
    if op in _CMP:
        d = result_dtype(x, y)
        with np.errstate(invalid="ignore"):
            return Tile(_CMP[op](_as(x, d), _as(y, d)), bool_)
    if op == "truediv":
        d = result_dtype(x, y, force_float=True)
        with np.errstate(all="ignore"):
            return Tile(round_to(np.true_divide(_as(x, d), _as(y, d)), d), d)
    d = result_dtype(x, y)
    a, b = _as(x, d), _as(y, d)
    with np.errstate(all="ignore"):
        if op in _ARITH:
            if d is bool_:
                raise InterpreterError(f"arithmetic ({op}) on bool tiles")
            r = _ARITH[op](a, b)
        elif op == "floordiv":
            if d.is_float:
                r = np.floor(np.true_divide(a, b))
            else:
                if np.any(b == 0):
                    raise InterpreterError("integer division by zero in a tile operation")
                r = np.floor_divide(a, b)
        elif op == "mod":
            if not d.is_float and np.any(b == 0):
                raise InterpreterError("integer modulo by zero in a tile operation")
            r = np.mod(a, b)
        elif op in _BIT:
            if d.is_float:
                raise InterpreterError(f"bitwise {op} of {d} tiles")
            r = _BIT[op](a, b)
        else:
            raise InterpreterError(f"operation {op} is not supported")
    return Tile(round_to(r, d) if d.is_float else r.astype(d.np), d)


# ------------------------------------------------------------------------------------------
# constructors and shape functions


def full(shape, fill_value, dtype) -> Tile:
    d = as_dtype(dtype)
    shape = check_shape(shape)
    return Tile(np.full(shape, _as(fill_value, d)), d)


def zeros(shape, dtype) -> Tile:
    return full(shape, 0, dtype)


def ones(shape, dtype) -> Tile:
    return full(shape, 1, dtype)


def arange(size, /, *, dtype, start=0, step=1) -> Tile:
    d = as_dtype(dtype)
    (n,) = check_shape((int(size),))
    return Tile((np.arange(n) * int(step) + int(start)).astype(d.np), d)


def reshape(x, /, shape) -> Tile:
    x = _tile(x)
    shape = () if shape == () else check_shape(shape)
    if math.prod(shape) != x.a.size:
        raise InterpreterError(f"cannot reshape a tile of shape {x.shape} to {shape}")
    return Tile(x.a.reshape(shape), x.dtype)


def astype(x, dtype, /, *, rounding_mode=None) -> Tile:
    x = _tile(x)
    d = as_dtype(dtype)
    _rounding(rounding_mode, "astype", ("RN", "RZI") if not d.is_float else ("RN",))
    return Tile(_convert(x.a, x.dtype, d), d)


def transpose(x, /, axis0=None, axis1=None) -> Tile:
    x = _tile(x)
    if axis0 is None and axis1 is None:
        if x.ndim != 2:
            raise InterpreterError(f"transpose() without axes needs a 2-d tile, got {x.shape}")
        return Tile(x.a.T, x.dtype)
    return Tile(np.swapaxes(x.a, int(axis0), int(axis1)), x.dtype)


def permute(x, /, axes) -> Tile:
    x = _tile(x)
    return Tile(np.transpose(x.a, tuple(int(a) for a in axes)), x.dtype)


def expand_dims(x, /, axis) -> Tile:
    x = _tile(x)
    return Tile(np.expand_dims(x.a, int(axis)), x.dtype)


def broadcast_to(x, /, shape) -> Tile:
    x = _tile(x)
    return Tile(np.broadcast_to(x.a, check_shape(shape)).copy(), x.dtype)


def extract(x, /, index, shape) -> Tile:
    """The sub-tile at ``index`` of ``x`` partitioned into tiles of ``shape``."""
    x = _tile(x)
    shape = check_shape(shape)
    index = tuple(int(i) for i in index)
    if len(index) != x.ndim or len(shape) != x.ndim:
        raise InterpreterError(f"extract: index {index} and shape {shape} must have the "
                               f"tile's rank {x.ndim}")
    sl = []
    for i, s, n in zip(index, shape, x.shape):
        if n % s or not 0 <= i < n // s:
            raise InterpreterError(f"extract: index {index} of shape {shape} is outside the "
                                   f"tile of shape {x.shape}")
        sl.append(slice(i * s, (i + 1) * s))
    return Tile(x.a[tuple(sl)].copy(), x.dtype)


def cat(tiles, /, axis) -> Tile:
    tiles = [_tile(t) for t in tiles]
    d = tiles[0].dtype
    if any(t.dtype != d for t in tiles):
        raise InterpreterError("cat: the tiles must have one dtype, got "
                               f"{[t.dtype.name for t in tiles]}")
    out = np.concatenate([t.a for t in tiles], axis=int(axis))
    check_shape(out.shape)
    return Tile(out, d)


def bitcast(x, /, dtype) -> Tile:
    x = _tile(x)
    d = as_dtype(dtype)
    if d.rounded or x.dtype.rounded:
        raise InterpreterError(f"bitcast between {x.dtype} and {d} is not supported here")
    if d.np.itemsize != x.dtype.np.itemsize:
        raise InterpreterError(f"bitcast from {x.dtype} to {d}: the widths differ")
    return Tile(np.ascontiguousarray(x.a).view(d.np).reshape(x.shape), d)


def _tile(x) -> Tile:
    if isinstance(x, Tile):
        return x
    if _np_scalar_ok(x):
        d = _loose_dtype(x)
        return Tile(np.asarray(x).astype(d.np), d)
    raise InterpreterError(f"expected a tile, got {type(x).__name__}")


# ------------------------------------------------------------------------------------------
# element-wise math


def where(cond, x, y, /) -> Tile:
    c = _tile(cond)
    if c.dtype is not bool_:
        raise InterpreterError(f"where: the condition must be a bool tile, got {c.dtype}")
    d = result_dtype(x, y)
    return Tile(np.where(c.a, _as(x, d), _as(y, d)), d)


def _rounding(mode, what, allowed=("RN",)) -> str:
    """The name of ``mode`` (None: RN). A mode the interpreter does not compute is refused
    rather than rounded to nearest silently; APPROX and FULL, where cuTile offers them, are
    computed correctly rounded, which lies within their documented error."""
    name = "RN" if mode is None else getattr(mode, "name", None)
    if name is None:
        raise InterpreterError(f"{what}: rounding_mode must be a ct.RoundingMode, got {mode!r}")
    if name not in allowed:
        raise InterpreterError(f"{what}: rounding_mode {name} is not modelled by the "
                               f"interpreter (it computes {', '.join(allowed)})")
    return name


def _float_in(x, what) -> Tile:
    x = _tile(x)
    if not x.dtype.is_float:
        x = astype(x, float32)
    return x


def _ftz(a: np.ndarray) -> np.ndarray:
    tiny = np.finfo(np.float32).tiny
    return np.where(np.abs(a) < tiny, np.zeros_like(a) * np.sign(a), a)


def _unary_math(fn, x, flush_to_zero=False, what=""):
    x = _float_in(x, what)
    a = x.a
    with np.errstate(all="ignore"):
        if flush_to_zero:
            a = _ftz(a.astype(np.float32))
            r = _ftz(fn(a).astype(np.float32))
        else:
            r = fn(a.astype(np.float32) if x.dtype.rounded else a)
    return Tile(round_to(r, x.dtype), x.dtype)


_APPROX = ("RN", "FULL", "APPROX")


def exp(x, /, *, rounding_mode=None):
    _rounding(rounding_mode, "exp", _APPROX)
    return _unary_math(np.exp, x, False, "exp")


def exp2(x, /, *, flush_to_zero=False):
    return _unary_math(np.exp2, x, flush_to_zero, "exp2")


def _plain_unary(name):
    """cuTile's ``name(x, /)``: the NumPy function of that name on the float tile."""
    fn = getattr(np, name)

    def op(x, /):
        return _unary_math(fn, x, False, name)
    op.__name__ = op.__qualname__ = name
    return op


log, log2, sin, cos, tan, sinh, cosh, floor, ceil = map(
    _plain_unary, ("log", "log2", "sin", "cos", "tan", "sinh", "cosh", "floor", "ceil"))


def sqrt(x, /, *, rounding_mode=None, flush_to_zero=False):
    _rounding(rounding_mode, "sqrt", _APPROX)
    return _unary_math(np.sqrt, x, flush_to_zero, "sqrt")


def rsqrt(x, /, *, flush_to_zero=False):
    return _unary_math(lambda a: 1 / np.sqrt(a), x, flush_to_zero, "rsqrt")


def tanh(x, /, *, rounding_mode=None):
    _rounding(rounding_mode, "tanh", _APPROX)
    return _unary_math(np.tanh, x, False, "tanh")


def abs(x, /):                                                       # noqa: A001 (cuTile's name)
    x = _tile(x)
    return Tile(np.abs(x.a), x.dtype)


def negative(x, /):
    return -_tile(x)


def bitwise_not(x, /):
    return ~_tile(x)


def atan2(x1, x2, /):
    d = result_dtype(x1, x2, force_float=True)
    return Tile(round_to(np.arctan2(_as(x1, d), _as(x2, d)), d), d)


def _arith(op, x, y, rounding_mode, flush_to_zero):
    """add/sub/mul with cuTile's keywords: flush_to_zero flushes fp32 denormal inputs and
    result (sign kept), as the GPU's .ftz does."""
    _rounding(rounding_mode, op)
    if not flush_to_zero:
        return binop(op, x, y)
    d = result_dtype(x, y)
    if d is not float32:
        return binop(op, x, y)
    r = binop(op, Tile(_ftz(_as(x, d)), d), Tile(_ftz(_as(y, d)), d))
    return Tile(_ftz(r.a), d)


def add(x, y, /, *, rounding_mode=None, flush_to_zero=False):
    return _arith("add", x, y, rounding_mode, flush_to_zero)


def sub(x, y, /, *, rounding_mode=None, flush_to_zero=False):
    return _arith("sub", x, y, rounding_mode, flush_to_zero)


def mul(x, y, /, *, rounding_mode=None, flush_to_zero=False):
    return _arith("mul", x, y, rounding_mode, flush_to_zero)


def floordiv(x, y, /): return binop("floordiv", x, y)
def mod(x, y, /): return binop("mod", x, y)
def pow(x, y, /): return binop("pow", x, y)                          # noqa: A001
def bitwise_and(x, y, /): return binop("and", x, y)
def bitwise_or(x, y, /): return binop("or", x, y)
def bitwise_xor(x, y, /): return binop("xor", x, y)
def bitwise_lshift(x, y, /): return binop("lshift", x, y)
def bitwise_rshift(x, y, /): return binop("rshift", x, y)
def less(x, y, /): return binop("lt", x, y)
def less_equal(x, y, /): return binop("le", x, y)
def greater(x, y, /): return binop("gt", x, y)
def greater_equal(x, y, /): return binop("ge", x, y)
def equal(x, y, /): return binop("eq", x, y)
def not_equal(x, y, /): return binop("ne", x, y)


def divmod(x, y, /):                                                 # noqa: A001
    return binop("floordiv", x, y), binop("mod", x, y)


def truediv(x, y, /, *, rounding_mode=None, flush_to_zero=False):
    """x / y; ``rounding_mode=APPROX`` is x times an approximate reciprocal (two roundings,
    as div.approx is within 2 ulp), ``flush_to_zero`` flushes denormal inputs and result."""
    d = result_dtype(x, y, force_float=True)
    a, b = _as(x, d), _as(y, d)
    approx = _rounding(rounding_mode, "truediv", _APPROX) == "APPROX"
    with np.errstate(all="ignore"):
        if flush_to_zero:
            a, b = _ftz(a.astype(np.float32)), _ftz(b.astype(np.float32))
        if approx:
            r = a * (np.float32(1) / b) if d.np == np.float32 else np.true_divide(a, b)
        else:
            r = np.true_divide(a, b)
        if flush_to_zero:
            r = _ftz(np.asarray(r, dtype=np.float32))
    return Tile(round_to(r, d), d)


def _minmax(fn, nan_fn, x, y, flush_to_zero, propagate_nan):
    # cuTile: NaN inputs are ignored unless propagate_nan (fmax/fmin against maximum/minimum).
    d = result_dtype(x, y)
    a, b = _as(x, d), _as(y, d)
    if flush_to_zero and d is float32:
        a, b = _ftz(a), _ftz(b)
    with np.errstate(invalid="ignore"):
        return Tile((fn if propagate_nan or not d.is_float else nan_fn)(a, b), d)


def maximum(x, y, /, *, flush_to_zero=False, propagate_nan=False):
    return _minmax(np.maximum, np.fmax, x, y, flush_to_zero, propagate_nan)


def minimum(x, y, /, *, flush_to_zero=False, propagate_nan=False):
    return _minmax(np.minimum, np.fmin, x, y, flush_to_zero, propagate_nan)


def cdiv(x, y, /):
    """ceil(x / y) for integers (Python ints give a Python int, as in cuTile's constants)."""
    if not isinstance(x, Tile) and not isinstance(y, Tile):
        return -(-int(x) // int(y))
    return binop("floordiv", binop("add", x, binop("sub", y, 1)), y)


# ------------------------------------------------------------------------------------------
# reductions


def _axes(x, axis):
    if axis is None:
        return tuple(range(x.ndim))
    if isinstance(axis, (tuple, list)):
        return tuple(int(a) % x.ndim for a in axis)
    return (int(axis) % _b.max(x.ndim, 1),)


def _reduce(fn, x, axis, keepdims, name, flush_to_zero=False):
    x = _tile(x)
    axes = _axes(x, axis)
    a = _ftz(x.a) if flush_to_zero and x.dtype is float32 else x.a
    if name == "sum" and x.dtype.is_float:
        r = np.sum(a.astype(np.float32 if x.dtype.np != np.float64 else np.float64),
                   axis=axes, keepdims=keepdims)
        r = _ftz(r) if flush_to_zero and x.dtype is float32 else r
        return Tile(round_to(r, x.dtype), x.dtype)
    if name == "sum":
        return Tile(np.sum(a, axis=axes, keepdims=keepdims).astype(x.dtype.np), x.dtype)
    with np.errstate(invalid="ignore"):
        r = fn(a, axis=axes, keepdims=keepdims)
    return Tile(round_to(r, x.dtype) if x.dtype.is_float else r.astype(x.dtype.np), x.dtype)


def sum(x, /, axis=None, *, keepdims=False, rounding_mode=None,     # noqa: A001
        flush_to_zero=False):
    _rounding(rounding_mode, "sum")
    return _reduce(None, x, axis, keepdims, "sum", flush_to_zero)


def _extreme(name, np_fn, nan_fn):
    """cuTile's ``max``/``min`` reduction: NaN inputs are skipped unless propagate_nan (cuTile's
    rule); a row all NaN gives NaN."""
    def op(x, /, axis=None, *, keepdims=False, flush_to_zero=False, propagate_nan=False):
        x = _tile(x)
        fn = np_fn if propagate_nan or not x.dtype.is_float else nan_fn
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)          # all-NaN slices
            return _reduce(fn, x, axis, keepdims, name, flush_to_zero)
    op.__name__ = op.__qualname__ = name
    return op


max = _extreme("max", np.max, np.nanmax)                            # noqa: A001 (cuTile's names)
min = _extreme("min", np.min, np.nanmin)                            # noqa: A001


def prod(x, /, axis=None, *, keepdims=False, rounding_mode=None, flush_to_zero=False):
    _rounding(rounding_mode, "prod")
    return _reduce(np.prod, x, axis, keepdims, "prod", flush_to_zero)


def _arg(fn, nan_fn, x, axis, keepdims, propagate_nan):
    x = _tile(x)
    a = x.a
    if x.dtype.is_float and np.isnan(a).any():
        if propagate_nan:                    # the index of the first NaN
            r = np.argmax(np.isnan(a), axis=axis, keepdims=keepdims)
            has = np.isnan(a).any(axis=axis, keepdims=keepdims)
            return Tile(np.where(has, r, fn(np.where(np.isnan(a), 0, a), axis=axis,
                                            keepdims=keepdims)).astype(np.int32), int32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                return Tile(np.asarray(nan_fn(a, axis=axis, keepdims=keepdims)).astype(np.int32),
                            int32)
            except ValueError:               # an all-NaN slice: cuTile gives index 0 there
                filled = np.where(np.isnan(a), -np.inf if fn is np.argmax else np.inf, a)
                return Tile(fn(filled, axis=axis, keepdims=keepdims).astype(np.int32), int32)
    return Tile(np.asarray(fn(a, axis=axis, keepdims=keepdims)).astype(np.int32), int32)


def argmax(x, /, axis=None, *, keepdims=False, propagate_nan=False):
    return _arg(np.argmax, np.nanargmax, x, axis, keepdims, propagate_nan)


def argmin(x, /, axis=None, *, keepdims=False, propagate_nan=False):
    return _arg(np.argmin, np.nanargmin, x, axis, keepdims, propagate_nan)


def cumsum(x, /, axis=0, *, reverse=False, rounding_mode=None, flush_to_zero=False):
    _rounding(rounding_mode, "cumsum")
    x = _tile(x)
    a = np.flip(x.a, int(axis)) if reverse else x.a
    a = _ftz(a) if flush_to_zero and x.dtype is float32 else a
    r = np.cumsum(a, axis=int(axis), dtype=np.float32 if x.dtype.is_float else None)
    r = np.flip(r, int(axis)) if reverse else r
    return Tile(round_to(r, x.dtype) if x.dtype.is_float else r.astype(x.dtype.np), x.dtype)


def cumprod(x, /, axis=0, *, reverse=False, rounding_mode=None, flush_to_zero=False):
    _rounding(rounding_mode, "cumprod")
    x = _tile(x)
    a = np.flip(x.a, int(axis)) if reverse else x.a
    a = _ftz(a) if flush_to_zero and x.dtype is float32 else a
    r = np.cumprod(a, axis=int(axis))
    r = np.flip(r, int(axis)) if reverse else r
    return Tile(round_to(r, x.dtype) if x.dtype.is_float else r.astype(x.dtype.np), x.dtype)


def isnan(x, /):
    x = _tile(x)
    return Tile(np.isnan(x.a) if x.dtype.is_float else np.zeros(x.shape, bool), bool_)


def insert(x, /, index, value) -> Tile:
    """``x`` with the sub-tile at ``index`` (in units of ``value``'s shape) replaced."""
    x, v = _tile(x), _tile(value)
    index = tuple(int(i) for i in index)
    out = x.a.copy()
    sl = tuple(slice(i * s, (i + 1) * s) for i, s in zip(index, v.shape))
    out[sl] = _as(v, x.dtype)
    return Tile(out, x.dtype)


def static_assert(condition, message=None, /):
    if not bool(condition):
        raise InterpreterError("static_assert failed" + (f": {message}" if message else ""))


def assert_(cond, /, message=None):
    if not np.all(_tile(cond).a):
        raise InterpreterError("assert_ failed" + (f": {message}" if message else ""))


def ensure_constant(value, /):
    if isinstance(value, Tile):
        raise InterpreterError("ensure_constant: the value is not a compile-time constant")
    return value


def static_iter(iterable):
    return iter(iterable)


def static_exception(exc, /):
    return exc


def assume_divisible_by(x, divisor):
    return x


def print(*args, sep=" ", end="\n"):                                  # noqa: A001
    _b.print(*args, sep=sep, end=end)


def printf(format, *args):                                            # noqa: A002
    vals = tuple(a.a[()].item() if isinstance(a, Tile) and a.ndim == 0 else a for a in args)
    _b.print(format.replace("\\n", "\n") % vals, end="")


# ------------------------------------------------------------------------------------------
# matrix products

# cuTile's table (cuda.tile._datatype._mma_supported_dtypes): operand dtype -> accumulators.
MMA_DTYPES = {"float8_e4m3fn": ("float16", "float32"), "float8_e5m2": ("float16", "float32"),
              "float16": ("float16", "float32"), "bfloat16": ("float32",),
              "float32": ("float32",), "tfloat32": ("float32",), "float64": ("float64",),
              "int8": ("int32",), "uint8": ("int32",)}


def mma(x, y, /, acc, *, use_fast_acc: bool = False) -> Tile:
    x, y, acc = _tile(x), _tile(y), _tile(acc)
    if not isinstance(use_fast_acc, (bool, np.bool_)):
        raise InterpreterError(f"mma: use_fast_acc must be a constant bool, got "
                               f"{type(use_fast_acc).__name__}")
    if use_fast_acc and x.dtype.name not in ("float8_e4m3fn", "float8_e5m2"):
        # cuTile's rule (cuda.tile mma): fast accumulation is for fp8 operands only. Its
        # numerics (Hopper's FP8 MMA without periodic promotion) are not modelled: the sum
        # below is fp32 either way.
        raise InterpreterError(f"mma: use_fast_acc is only supported for fp8 input dtypes, "
                               f"got {x.dtype.name}")
    if x.dtype != y.dtype and not ({x.dtype.name, y.dtype.name} <= {"int8", "uint8"}):
        raise InterpreterError(f"mma: x and y must have the same dtype, got {x.dtype.name} and "
                               f"{y.dtype.name}")
    if x.dtype.name not in MMA_DTYPES:
        raise InterpreterError(f"mma: unsupported operand dtype {x.dtype.name}; supported: "
                               f"{', '.join(MMA_DTYPES)}")
    if acc.dtype.name not in MMA_DTYPES[x.dtype.name]:
        raise InterpreterError(f"mma: unsupported accumulator dtype {acc.dtype.name} for "
                               f"{x.dtype.name} operands; supported: "
                               f"{', '.join(MMA_DTYPES[x.dtype.name])}")
    if x.ndim < 2 or y.ndim < 2:
        raise InterpreterError(f"mma: operands of rank 2 or more, got {x.shape} and {y.shape}")
    m, k = x.shape[-2:]
    k2, n = y.shape[-2:]
    try:
        batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    except ValueError:
        batch = None
    if k != k2 or batch is None or acc.shape != tuple(batch) + (m, n):
        raise InterpreterError(f"mma: shapes {x.shape} @ {y.shape} -> {acc.shape} do not match")
    if x.dtype.kind in "iu":
        r = x.a.astype(np.int64) @ y.a.astype(np.int64) + acc.a
        return Tile(r.astype(np.int32), int32)
    if acc.dtype is float64:
        return Tile(x.a.astype(np.float64) @ y.a.astype(np.float64) + acc.a, float64)
    # Products of fp16/bf16/fp8 operands are exact in fp32; the sum is fp32 (the tensor core's
    # accumulation order differs: last-bit differences only).
    xa = x.a.astype(np.float32)
    ya = y.a.astype(np.float32)
    if x.dtype is float32:                                            # tf32 on the tensor core
        xa, ya = round_to(xa, tfloat32), round_to(ya, tfloat32)
    r = np.matmul(xa, ya) + acc.a.astype(np.float32)
    return Tile(round_to(r, acc.dtype), acc.dtype)


def matmul(x, y, /) -> Tile:
    """``x @ y``: NumPy's matmul rules (vectors, broadcast batches), the operands' dtype."""
    x, y = _tile(x), _tile(y)
    if x.dtype != y.dtype:
        raise InterpreterError(f"@: the operands must have one dtype, got {x.dtype.name} and "
                               f"{y.dtype.name}")
    d = x.dtype
    if d.kind in "iu":
        return Tile(np.matmul(x.a.astype(np.int64), y.a.astype(np.int64)).astype(d.np), d)
    wide = np.float64 if d is float64 else np.float32
    return Tile(round_to(np.matmul(x.a.astype(wide), y.a.astype(wide)), d), d)


# ------------------------------------------------------------------------------------------
# enums, annotations, kernel objects (what ``import cuda.tile`` provides besides the ops)


class RoundingMode(enum.Enum):
    RN = "nearest_even"
    RZ = "zero"
    RM = "negative_inf"
    RP = "positive_inf"
    RA = "nearest_away"
    FULL = "full"
    APPROX = "approx"
    RZI = "nearest_int_to_zero"


class PaddingMode(enum.Enum):
    UNDETERMINED = "undetermined"
    ZERO = "zero"
    NEG_ZERO = "neg_zero"
    NAN = "nan"
    POS_INF = "pos_inf"
    NEG_INF = "neg_inf"


class MemoryOrder(enum.Enum):
    WEAK = "weak"
    RELAXED = "relaxed"
    ACQUIRE = "acquire"
    RELEASE = "release"
    ACQ_REL = "acq_rel"


class MemoryScope(enum.Enum):
    NONE = "none"
    BLOCK = "block"
    DEVICE = "device"
    SYS = "sys"


class ConstantAnnotation:
    def __repr__(self):
        return "ConstantAnnotation()"


class _ConstantFactory:
    def __getitem__(self, t):
        return typing.Annotated[t, ConstantAnnotation()]


Constant = _ConstantFactory()


class _Unspecified:
    def __repr__(self):
        return "UNSPECIFIED"


UNSPECIFIED = _Unspecified()


class ByTarget:
    """``ByTarget(sm_90=..., default=...)``: a hint's value per architecture."""

    def __init__(self, *, default=UNSPECIFIED, **value_by_target):
        self.default = default
        self.values = value_by_target

    def __repr__(self):
        return f"ByTarget({self.values!r}, default={self.default!r})"


class Kernel:
    """What ``@ct.kernel`` makes here: the function (``_pyfunc``) and its hints."""

    def __init__(self, pyfunc, **hints):
        self._pyfunc = pyfunc
        self.hints = hints
        self.__name__ = getattr(pyfunc, "__name__", "kernel")
        self.__doc__ = getattr(pyfunc, "__doc__", None)
        self.__wrapped__ = pyfunc

    def replace_hints(self, **hints):
        return Kernel(self._pyfunc, **{**self.hints, **hints})

    def __call__(self, *args, **kwargs):
        raise InterpreterError(f"kernel {self.__name__} is launched with ct.launch(stream, "
                               "grid, kernel, args), not called")

    def __repr__(self):
        return f"<interpreted cuTile kernel {self.__name__}>"


def kernel(function=None, /, **kwargs):
    if function is None:
        return lambda f: Kernel(f, **kwargs)
    return Kernel(function, **kwargs)


def function(func=None, /, *, host=False, tile=True):
    return func if func is not None else (lambda g: g)


class TileError(InterpreterError):
    pass


TileTypeError = TileValueError = TileCompilerError = TileError


# bid, num_blocks, load, store, gather, scatter, atomics, launch: the program state lives in
# ``runner``; ``shim.module()`` puts them beside these names and records itself here.
SHIM_MODULE = None
