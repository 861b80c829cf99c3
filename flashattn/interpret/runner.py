"""Arrays, memory operations and the grid: one program after another.

Arrays are the CPU tensors' own memory where NumPy has the dtype (fp16, fp32, fp64, integers,
bool: stores land in the tensor), and copies written back after the launch where it has not
(bf16, fp8). Every memory operation checks what cuTile leaves undefined (see the package
docstring) and can be recorded by a ``Trace``.
"""
from __future__ import annotations

import collections
import inspect
import math
import os
import sys
import typing

import numpy as np

import flashattn.interpret.tile as T
from .errors import InterpreterError

# ------------------------------------------------------------------------------------------
# the program being run


class _Ctx:
    kernel = None          # name
    bid = (0, 0, 0)
    grid = (1, 1, 1)
    pid = -1               # linear program id in launch order
    active = False


CTX = _Ctx()
_TRACES: list = []


def _where() -> str:
    return f"kernel {CTX.kernel}, program {CTX.bid}"


def _fail(msg: str):
    raise InterpreterError(f"{_where()}: {msg}")


# ------------------------------------------------------------------------------------------
# arrays


class Array:
    """A kernel's view of a tensor: ``data`` (NumPy, storage dtype), cuTile ``dtype``."""

    def __init__(self, root, slices, name):
        self.root = root                      # _Root
        self.slices = slices                  # tuple of slices into root.data
        self.name = name
        self.data = root.data[slices]
        self.dtype = root.dtype

    @property
    def shape(self):
        return tuple(T.Tile(n, T.int32) for n in self.data.shape)

    @property
    def ndim(self):
        return self.data.ndim

    @property
    def strides(self):
        return tuple(T.Tile(s // self.data.itemsize, T.int32) for s in self.data.strides)

    def owner(self):
        return self.root.owner()[self.slices]

    def slice(self, axis, start, stop):
        axis = int(axis)
        start, stop = int(start), int(stop)
        n = self.data.shape[axis]
        if not 0 <= start <= stop <= n:
            _fail(f"{self.name}.slice(axis={axis}, start={start}, stop={stop}) leaves the "
                  f"array's extent {n} on that axis")
        sl = list(self.slices)
        base = sl[axis].start or 0
        sl[axis] = slice(base + start, base + stop)
        return Array(self.root, tuple(sl), f"{self.name}[{start}:{stop}]")

    def tiled_view(self, tile_shape, *, padding_mode=T.PaddingMode.UNDETERMINED,
                   traversal_steps=None):
        _fail("Array.tiled_view is not supported by the interpreter")

    def __repr__(self):
        return f"Array({self.name}, {self.dtype.name}, {self.data.shape})"


class _Root:
    def __init__(self, tensor, name):
        import torch
        if not isinstance(tensor, torch.Tensor):
            raise InterpreterError(f"argument {name} is a {type(tensor).__name__}, not a tensor")
        if tensor.device.type != "cpu":
            raise InterpreterError(f"argument {name} is on {tensor.device}: the interpreter "
                                   "runs on CPU tensors")
        self.tensor = tensor
        self.dtype = T.as_dtype(tensor.dtype)
        t = tensor.detach()
        if self.dtype.rounded:
            self.data = t.to(torch.float32).numpy().copy()
            self.copy_back = True
        else:
            self.data = t.numpy()                # the tensor's memory
            self.copy_back = False
        self._owner = None
        self.written = False

    def owner(self):
        if self._owner is None:
            self._owner = np.full(self.data.shape, -1, dtype=np.int64)
        return self._owner

    def finish(self):
        if self.copy_back and self.written:
            import torch
            self.tensor.detach().copy_(torch.from_numpy(self.data).to(self.tensor.dtype))


def _array(a) -> Array:
    if isinstance(a, Array):
        return a
    _fail(f"expected an array (a kernel's tensor argument), got {type(a).__name__}")


def _ints(index, what) -> tuple:
    if isinstance(index, (int, np.integer, T.Tile)):
        index = (index,)
    out = []
    for i in index:
        if isinstance(i, T.Tile):
            if i.ndim != 0 or i.dtype.kind not in "iub":
                _fail(f"{what}: index {i!r} must be an integer scalar")
            out.append(int(i.a))
        else:
            out.append(int(i))
    return tuple(out)


def _order(order, rank):
    if order in (None, "C"):
        return tuple(range(rank))
    if order == "F":
        return tuple(reversed(range(rank)))
    order = tuple(int(o) for o in order)
    if sorted(order) != list(range(rank)):
        _fail(f"order {order} is not a permutation of the array's {rank} axes")
    return order


_PAD = {"ZERO": 0.0, "NEG_ZERO": -0.0, "NAN": math.nan, "POS_INF": math.inf,
        "NEG_INF": -math.inf}


def _region(arr, index, shape, order, what):
    """(view of arr.data permuted by order, slices into it, slices into the tile, inside?)"""
    rank = arr.ndim
    if len(index) != rank or len(shape) != rank:
        _fail(f"{what} {arr.name}: index {index} and tile shape {shape} must have the array's "
              f"rank {rank}")
    perm = _order(order, rank)
    dims = tuple(arr.data.shape[p] for p in perm)
    src, dst, inside = [], [], True
    for i, s, n in zip(index, shape, dims):
        lo, hi = i * s, i * s + s
        if hi <= 0 or lo >= n:
            _fail(f"{what} {arr.name}: tile {index} of shape {shape} (order {perm}) lies "
                  f"wholly outside the array of shape {dims} (undefined behaviour on a GPU)")
        a, b = max(lo, 0), min(hi, n)
        inside &= a == lo and b == hi
        src.append(slice(a, b))
        dst.append(slice(a - lo, b - lo))
    return perm, tuple(src), tuple(dst), inside


def _record(op, arr, index, shape):
    if _TRACES:
        ev = (CTX.kernel, CTX.bid, op, arr.name.split("[")[0], index, shape)
        for tr in _TRACES:
            tr.events.append(ev)


ENV_STRICT_PADDING = "FLASHATTN_INTERPRET_STRICT_PADDING"


def strict_padding() -> bool:
    """``FLASHATTN_INTERPRET_STRICT_PADDING=1`` (read at each load): a float load that reads
    undetermined padding raises at the load instead of reading NaN."""
    return os.environ.get(ENV_STRICT_PADDING, "").strip().lower() in ("1", "true", "yes", "on")


def _caller() -> str:
    """file:line of the kernel source that called into the interpreter."""
    here = os.path.dirname(os.path.abspath(__file__))
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == here:
        f = f.f_back
    if f is None:
        return "?"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} in {f.f_code.co_name}"


def _outside(index, shape, perm, arr) -> str:
    """Which elements of the tile lie past the array, per axis (in the load's order)."""
    parts = []
    for ax, (i, s, p) in enumerate(zip(index, shape, perm)):
        n = arr.data.shape[p]
        lo, hi = i * s, i * s + s
        if hi > n:
            parts.append(f"axis {ax}: elements {max(lo, n)}..{hi - 1} past the extent {n}")
    return "; ".join(parts)


def load(array, /, index, shape, *, order="C", padding_mode=T.PaddingMode.UNDETERMINED,
         check_bounds=True, latency=None, allow_tma=None, memory_order=T.MemoryOrder.WEAK,
         memory_scope=T.MemoryScope.NONE):
    arr = _array(array)
    scalar = shape == () or shape == []
    shape = (1,) * arr.ndim if scalar else T.check_shape(shape, "load")
    index = _ints(index, "load")
    if latency is not None and not 1 <= int(latency) <= 10:
        _fail(f"load {arr.name}: latency {latency} must be between 1 and 10")
    perm, src, dst, inside = _region(arr, index, shape, order, "load")
    mode = getattr(padding_mode, "name", "UNDETERMINED") if padding_mode is not None \
        else "UNDETERMINED"
    if not inside and not check_bounds:
        _fail(f"load {arr.name}: tile {index} of shape {shape} leaves the array of shape "
              f"{arr.data.shape} with check_bounds=False (undefined behaviour on a GPU)")
    view = np.transpose(arr.data, perm)
    if inside:
        out = np.array(view[src], copy=True)
    else:
        d = arr.dtype
        if mode == "UNDETERMINED":
            if not d.is_float or strict_padding():
                _fail(f"load {arr.name} at {_caller()}: tile {index} of shape {shape} "
                      f"(order {perm}) reads past the array of shape "
                      f"{tuple(arr.data.shape[p] for p in perm)} with padding_mode "
                      f"UNDETERMINED ({_outside(index, shape, perm, arr)}): those values "
                      "are undetermined on a GPU; give the load a padding_mode"
                      + ("" if d.is_float else
                         f" (a {d.name} array has no NaN to stand for them)"))
            pad = math.nan                        # stricter than a GPU: garbage reads as NaN
        else:
            pad = _PAD[mode]
            if not d.is_float and mode != "ZERO":
                _fail(f"load {arr.name}: padding {mode} needs a float array, not {d.name}")
        out = np.full(shape, pad, dtype=d.np)
        out[dst] = view[src]
    _record("load", arr, index, shape)
    t = T.Tile(out, arr.dtype)
    return T.reshape(t, ()) if scalar else t


def store(array, /, index, tile, *, order="C", check_bounds=True, latency=None,
          allow_tma=None, memory_order=T.MemoryOrder.WEAK, memory_scope=T.MemoryScope.NONE):
    arr = _array(array)
    index = _ints(index, "store")
    if isinstance(tile, T.Tile):
        if tile.dtype != arr.dtype:
            _fail(f"store {arr.name}: a {tile.dtype.name} tile into a {arr.dtype.name} array "
                  "(cast it with astype first)")
        t = tile
    else:
        t = T.Tile(T._as(tile, arr.dtype), arr.dtype)
    if t.ndim == 0:
        t = T.reshape(t, (1,) * arr.ndim)
    if t.ndim != arr.ndim:
        _fail(f"store {arr.name}: a tile of rank {t.ndim} into an array of rank {arr.ndim}")
    shape = T.check_shape(t.shape, "store")
    perm, src, dst, inside = _region(arr, index, shape, order, "store")
    if not inside and not check_bounds:
        _fail(f"store {arr.name}: tile {index} of shape {shape} leaves the array of shape "
              f"{arr.data.shape} with check_bounds=False (undefined behaviour on a GPU)")
    own = np.transpose(arr.owner(), perm)[src]
    clash = (own != -1) & (own != CTX.pid)
    if clash.any():
        _fail(f"store {arr.name}: tile {index} of shape {shape} writes elements another program "
              f"of this launch wrote (a race on a GPU)")
    own[...] = CTX.pid
    np.transpose(arr.data, perm)[src] = t.a[dst]
    arr.root.written = True
    _record("store", arr, index, shape)


def _gather_index(arr, indices, what):
    if not isinstance(indices, tuple):
        indices = (indices,)
    if len(indices) != arr.ndim:
        _fail(f"{what} {arr.name}: {len(indices)} indices for an array of rank {arr.ndim}")
    idx = []
    for i in indices:
        if isinstance(i, T.Tile):
            if i.dtype.kind not in "iu":
                _fail(f"{what} {arr.name}: an index tile must be integer, got {i.dtype.name}")
            idx.append(i.a.astype(np.int64))
        else:
            idx.append(np.asarray(int(i), dtype=np.int64))
    idx = np.broadcast_arrays(*idx)
    valid = np.ones(idx[0].shape, dtype=bool)
    for i, n in zip(idx, arr.data.shape):
        valid &= (i >= 0) & (i < n)
    return idx, valid


def gather(array, indices, /, *, mask=None, padding_value=0, check_bounds=True, latency=None):
    arr = _array(array)
    idx, valid = _gather_index(arr, indices, "gather")
    if mask is not None:
        valid = valid & np.broadcast_to(T._tile(mask).a, valid.shape)
    if not check_bounds and not valid.all():
        _fail(f"gather {arr.name}: an index out of bounds with check_bounds=False")
    out = np.full(valid.shape, T._as(padding_value, arr.dtype), dtype=arr.dtype.np)
    sel = tuple(i[valid] for i in idx)
    out[valid] = arr.data[sel]
    _record("gather", arr, None, valid.shape)
    return T.Tile(out, arr.dtype)


def scatter(array, indices, value, /, *, mask=None, check_bounds=True, latency=None):
    arr = _array(array)
    idx, valid = _gather_index(arr, indices, "scatter")
    if mask is not None:
        valid = valid & np.broadcast_to(T._tile(mask).a, valid.shape)
    v = value if isinstance(value, T.Tile) else T.Tile(T._as(value, arr.dtype), arr.dtype)
    if v.dtype != arr.dtype:
        _fail(f"scatter {arr.name}: a {v.dtype.name} tile into a {arr.dtype.name} array")
    vals = np.broadcast_to(v.a, valid.shape)
    sel = tuple(i[valid] for i in idx)
    own = arr.owner()
    o = own[sel]
    if ((o != -1) & (o != CTX.pid)).any():
        _fail(f"scatter {arr.name}: writes elements another program of this launch wrote")
    own[sel] = CTX.pid
    arr.data[sel] = vals[valid]
    arr.root.written = True
    _record("scatter", arr, None, valid.shape)


def _atomic(op, array, indices, update, expected=None, check_bounds=True):
    arr = _array(array)
    idx, valid = _gather_index(arr, indices, f"atomic_{op}")
    if isinstance(update, T.Tile):
        if update.dtype != arr.dtype and (update.dtype.is_float != arr.dtype.is_float or
                                          T.promote(update.dtype, arr.dtype) != arr.dtype):
            _fail(f"atomic_{op} {arr.name}: a {update.dtype.name} update into a "
                  f"{arr.dtype.name} array")
        u = T._as(update, arr.dtype)
    else:
        u = T._as(update, arr.dtype)
    shape = np.broadcast_shapes(valid.shape, np.shape(u))
    valid = np.broadcast_to(valid, shape)
    idx = [np.broadcast_to(i, shape) for i in idx]
    u = np.broadcast_to(u, shape)
    old = np.zeros(shape, dtype=arr.dtype.np)
    # One element after another, in index order: atomics of one program, then the next program.
    for pos in zip(*np.nonzero(valid)) if valid.ndim else ([()] if valid else []):
        at = tuple(int(i[pos]) for i in idx)
        cur = arr.data[at]
        old[pos] = cur
        if op == "add":
            arr.data[at] = T.round_to(np.asarray(cur + u[pos]), arr.dtype) \
                if arr.dtype.is_float else cur + u[pos]
        elif op == "xchg":
            arr.data[at] = u[pos]
        elif op == "max":
            arr.data[at] = max(cur, u[pos])
        elif op == "min":
            arr.data[at] = min(cur, u[pos])
        elif op == "cas":
            if cur == np.broadcast_to(T._as(expected, arr.dtype), shape)[pos]:
                arr.data[at] = u[pos]
        elif op in ("and", "or", "xor"):
            arr.data[at] = {"and": cur & u[pos], "or": cur | u[pos], "xor": cur ^ u[pos]}[op]
    arr.root.written = True
    _record(f"atomic_{op}", arr, None, shape)
    return T.Tile(old, arr.dtype)


def _atomic_op(op):
    """cuTile's ``atomic_<op>(array, indices, update)``: the old values, as a tile."""
    def fn(array, indices, update, /, *, check_bounds=True,
           memory_order=T.MemoryOrder.ACQ_REL, memory_scope=T.MemoryScope.DEVICE):
        return _atomic(op, array, indices, update)
    fn.__name__ = fn.__qualname__ = f"atomic_{op}"
    return fn


atomic_add, atomic_xchg, atomic_max, atomic_min, atomic_and, atomic_or, atomic_xor = map(
    _atomic_op, ("add", "xchg", "max", "min", "and", "or", "xor"))


def atomic_cas(array, indices, expected, desired, /, *, check_bounds=True,
               memory_order=T.MemoryOrder.ACQ_REL, memory_scope=T.MemoryScope.DEVICE):
    return _atomic("cas", array, indices, desired, expected=expected)


def bid(axis):
    a = int(axis)
    if a not in (0, 1, 2):
        _fail(f"bid({axis}): the axis is 0, 1 or 2")
    return T.Tile(CTX.bid[a], T.int32)


def num_blocks(axis):
    a = int(axis)
    if a not in (0, 1, 2):
        _fail(f"num_blocks({axis}): the axis is 0, 1 or 2")
    return T.Tile(CTX.grid[a], T.int32)


def grid_dependency_control_wait():
    """A programmatic dependent's wait: every launch runs to its end before the next starts
    here, so what the previous kernel wrote is already there."""


def grid_dependency_control_launch_dependents():
    """Let a dependent launch be scheduled: a hint, nothing to do in order."""


def num_tiles(array, /, axis, shape, order="C"):
    arr = _array(array)
    perm = _order(order, arr.ndim)
    shape = T.check_shape(shape)
    return T.Tile(-(-arr.data.shape[perm[int(axis)]] // shape[int(axis)]), T.int32)


# ------------------------------------------------------------------------------------------
# the launch


def _is_constant(ann) -> bool:
    return any(type(m).__name__ == "ConstantAnnotation"
               for m in getattr(ann, "__metadata__", ()))


def _scalar_dtype(ann, v):
    for m in getattr(ann, "__metadata__", ()):
        d = getattr(m, "dtype", None)
        if d is not None:
            return T.as_dtype(d)
    if isinstance(v, bool):
        return T.bool_
    if isinstance(v, int):
        if not -2**31 <= v < 2**31:
            raise InterpreterError(f"integer argument {v} does not fit int32 (annotate the "
                                   "parameter ct.ScalarInt64)")
        return T.int32
    return T.float32


def _kernel_name(kernel) -> str:
    f = getattr(kernel, "_pyfunc", kernel)
    return getattr(f, "__name__", repr(kernel))


def _array_arg(v, name, roots):
    """The Array of tensor ``v``, sharing a root with any argument of the same memory."""
    key = (v.data_ptr(), tuple(v.shape), tuple(v.stride()), v.dtype) if v.numel() else id(v)
    if key not in roots:
        roots[key] = _Root(v, name)
    return Array(roots[key], (slice(None),) * v.dim(), name)


def run(grid, kernel, args, *, bind, shuffle=False, seed=None):
    """Run every program of ``grid``; ``bind(f)`` rebinds the kernel function (``rebind``)."""
    import torch
    pyfunc = getattr(kernel, "_pyfunc", kernel)
    if not inspect.isfunction(pyfunc):
        raise InterpreterError(f"{kernel!r} is not a cuTile kernel")
    name = pyfunc.__name__
    if isinstance(grid, int):
        grid = (grid,)
    grid = tuple(int(g) for g in grid)
    if not 1 <= len(grid) <= 3 or any(g < 1 for g in grid):
        raise InterpreterError(f"kernel {name}: the grid must be 1 to 3 positive ints, got "
                               f"{grid}")
    grid = grid + (1,) * (3 - len(grid))
    params = list(inspect.signature(pyfunc).parameters.values())
    args = tuple(args)
    if len(args) != len(params):
        raise InterpreterError(f"kernel {name} takes {len(params)} arguments "
                               f"({', '.join(p.name for p in params)}), got {len(args)}")
    roots: dict = {}
    prepared = []
    for p, v in zip(params, args):
        if _is_constant(p.annotation):
            if not isinstance(v, (bool, int, float)):
                raise InterpreterError(f"kernel {name}: constant {p.name} must be a bool, int "
                                       f"or float, got {type(v).__name__}")
            prepared.append(v)
        elif isinstance(v, torch.Tensor):
            prepared.append(_array_arg(v, p.name, roots))
        elif isinstance(v, tuple) and all(isinstance(x, torch.Tensor) for x in v):
            # A tuple of arrays (cuTile takes tuples since 1.5): a mod's tensors.
            prepared.append(tuple(_array_arg(x, f"{p.name}[{i}]", roots)
                                  for i, x in enumerate(v)))
        elif isinstance(v, (bool, int, float)):
            prepared.append(T.Tile(v, _scalar_dtype(p.annotation, v)))
        else:
            raise InterpreterError(f"kernel {name}: argument {p.name} is a {type(v).__name__}; "
                                   "the interpreter takes CPU tensors (or tuples of them), bools, ints "
                                   "and floats")
    f = bind(pyfunc)
    order = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
    if shuffle:
        rng = np.random.default_rng(seed)
        order = [order[i] for i in rng.permutation(len(order))]
    saved = (CTX.kernel, CTX.bid, CTX.grid, CTX.pid, CTX.active)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                 # tile-sized products: threads only cost here
    try:
        CTX.kernel, CTX.grid, CTX.active = name, grid, True
        for pid, b in enumerate(order):
            CTX.bid, CTX.pid = b, pid
            try:
                f(*prepared)
            except InterpreterError:
                raise
            except Exception as e:                                   # name the program
                if hasattr(e, "add_note"):
                    e.add_note(f"(in the interpreter: kernel {name}, program {b})")
                raise
    finally:
        CTX.kernel, CTX.bid, CTX.grid, CTX.pid, CTX.active = saved
        torch.set_num_threads(threads)
    for r in roots.values():
        r.finish()


class Trace:
    """Every load, store, gather and atomic of the launches run inside ``with``: ``events`` is
    a list of (kernel, program, op, array name, tile index, tile shape)."""

    def __init__(self):
        self.events = []

    def __enter__(self):
        _TRACES.append(self)
        return self

    def __exit__(self, *exc):
        _TRACES.remove(self)
        return False

    def count(self, op="load", array=None, kernel=None) -> collections.Counter:
        """{program: number of ``op`` events on ``array``} (all arrays if None)."""
        c = collections.Counter()
        for k, b, o, a, _, _ in self.events:
            if o == op and (array is None or a == array) and (kernel is None or k == kernel):
                c[b] += 1
        return c

    def loads(self, array=None, kernel=None) -> collections.Counter:
        return self.count("load", array, kernel)

    def tiles(self, op="load", array=None, program=None) -> list:
        """The tile indices of ``op`` on ``array`` (by one program, if given), in order."""
        return [i for k, b, o, a, i, _ in self.events
                if o == op and (array is None or a == array) and (program is None or b == program)]
