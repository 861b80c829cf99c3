"""The interpreter's ``cuda.tile`` has cuda.tile's signatures: every public name it implements
takes the same parameters (names, kinds, defaults) as the installed cuda-tile's, so that a
kernel written against cuTile (keywords included, e.g. ``ct.mma(x, y, acc=acc)``) calls it the
same way, and a call cuTile refuses is refused here too."""
import enum
import importlib.util
import inspect

import pytest

from flashattn.interpret import shim

HAVE_CT = importlib.util.find_spec("cuda.tile") is not None
pytestmark = pytest.mark.skipif(not HAVE_CT, reason="compares with the installed cuda-tile")


def _default(d):
    if d is inspect.Parameter.empty:
        return "<none>"
    if isinstance(d, enum.Enum):                  # the shim's enums mirror cuTile's by name
        return f"{type(d).__name__}.{d.name}"
    return repr(d)


def _shape(sig: inspect.Signature):
    """(name, kind, default) of each parameter: what decides how a call binds."""
    return [(p.name, p.kind.name, _default(p.default)) for p in sig.parameters.values()]


def _sig(f):
    try:
        return inspect.signature(f)
    except (TypeError, ValueError):
        return None


# Classes a kernel module calls: their constructors are compared too.
CALLED_CLASSES = ("kernel", "ByTarget")


def _pairs():
    import cuda.tile as ct
    m = shim.module()
    out = []
    for name in sorted(vars(m)):
        if name.startswith("_") or not hasattr(ct, name):
            continue
        real, ours = getattr(ct, name), getattr(m, name)
        if type(real).__module__ == "typing":     # ct.Constant: an annotation, not a call
            continue
        if inspect.isclass(real) and name not in CALLED_CLASSES:
            continue
        if inspect.ismodule(real) or not callable(real):
            continue
        if _sig(real) is None:                    # dtypes: callable objects, no signature
            continue
        out.append((name, real, ours))
    for cls in ("Tile", "Array"):                 # the methods a kernel calls on them
        for name, real in vars(getattr(ct, cls)).items():
            if name.startswith("_") or not inspect.isfunction(real):
                continue
            ours = getattr(getattr(m, cls), name, None)
            if ours is not None:
                out.append((f"{cls}.{name}", real, ours))
    return out


def test_there_is_something_to_compare():
    names = {n for n, _, _ in _pairs()}
    # the names every kernel uses, and the ones TileGym's attention calls by keyword
    assert {"load", "store", "mma", "exp2", "truediv", "where", "gather", "scatter", "launch",
            "kernel", "max", "sum", "astype", "Tile.reshape"} <= names
    assert len(names) > 80


@pytest.mark.parametrize("name,real,ours", _pairs() if HAVE_CT else [],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_signature_is_cuda_tiles(name, real, ours):
    want, got = _shape(inspect.signature(real)), _shape(inspect.signature(ours))
    assert got == want, f"{name}: cuda.tile{inspect.signature(real)} but the interpreter has " \
                        f"{inspect.signature(ours)}"


def test_mma_takes_acc_by_keyword():
    import torch
    from flashattn.interpret import tile as T
    x = T.Tile(torch.randn(16, 16).half().numpy(), T.float16)
    y = T.Tile(torch.randn(16, 16).half().numpy(), T.float16)
    acc = T.full((16, 16), 0.0, T.float32)
    a = T.mma(x, y, acc)
    b = T.mma(x, y, acc=acc)
    assert (a.a == b.a).all()
    with pytest.raises(TypeError):
        T.mma(x=x, y=y, acc=acc)                  # x and y are positional-only in cuTile


def test_a_keyword_cuda_tile_does_not_take_is_refused():
    from flashattn.interpret import tile as T
    t = T.full((4,), 1.0, T.float32)
    with pytest.raises(TypeError):
        T.exp(t, flush_to_zero=True)              # cuTile's exp has no flush_to_zero
    with pytest.raises(TypeError):
        T.log2(t, rounding_mode=T.RoundingMode.APPROX)


def test_an_unmodelled_rounding_mode_is_refused_not_ignored():
    from flashattn.interpret import tile as T, InterpreterError
    t = T.full((4,), 1.0, T.float32)
    with pytest.raises(InterpreterError, match="rounding_mode RZ is not modelled"):
        T.add(t, t, rounding_mode=T.RoundingMode.RZ)
    assert T.exp(t, rounding_mode=T.RoundingMode.APPROX).a[0] == pytest.approx(2.718281828)


def test_max_skips_nan_unless_asked():
    import numpy as np
    from flashattn.interpret import tile as T
    t = T.Tile(np.array([1.0, np.nan, 3.0], np.float32), T.float32)
    assert float(T.max(t).a) == 3.0
    assert np.isnan(T.max(t, propagate_nan=True).a)
    assert int(T.argmax(t).a) == 2 and int(T.argmax(t, propagate_nan=True).a) == 1
    assert T.maximum(t, 2.0).a.tolist() == [2.0, 2.0, 3.0]
