"""Tiny kernels that each break one rule of cuTile, for ``test_interpret.py``."""
import cuda.tile as ct

ConstInt = ct.Constant[int]


@ct.kernel
def copy_kernel(X, Y, TILE: ConstInt):
    """Y = X, one tile per program, zero padding."""
    t = ct.load(X, index=(ct.bid(0),), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, index=(ct.bid(0),), tile=t)


@ct.kernel
def load_no_padding(X, Y, TILE: ConstInt):
    t = ct.load(X, index=(ct.bid(0),), shape=(TILE,))
    ct.store(Y, index=(ct.bid(0),), tile=t)


@ct.kernel
def load_past_the_end(X, Y, TILE: ConstInt):
    t = ct.load(X, index=(ct.bid(0) + 5,), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, index=(ct.bid(0),), tile=t)


@ct.kernel
def load_unchecked(X, Y, TILE: ConstInt):
    t = ct.load(X, index=(ct.bid(0),), shape=(TILE,), check_bounds=False)
    ct.store(Y, index=(ct.bid(0),), tile=t)


@ct.kernel
def store_wrong_dtype(X, Y, TILE: ConstInt):
    t = ct.load(X, index=(ct.bid(0),), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, index=(ct.bid(0),), tile=t.astype(ct.float32))


@ct.kernel
def store_same_tile(X, Y, TILE: ConstInt):
    t = ct.load(X, index=(ct.bid(0),), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, index=(0,), tile=t)


@ct.kernel
def mma_kernel(A, B, C, TILE: ConstInt, ACC_F16: ct.Constant[bool], B_F32: ct.Constant[bool]):
    a = ct.load(A, index=(0, 0), shape=(TILE, TILE))
    b = ct.load(B, index=(0, 0), shape=(TILE, TILE))
    if B_F32:
        b = b.astype(ct.float32)
    if ACC_F16:
        acc = ct.full((TILE, TILE), 0.0, dtype=ct.float16)
    else:
        acc = ct.full((TILE, TILE), 0.0, dtype=ct.float32)
    c = ct.mma(a, b, acc)
    ct.store(C, index=(0, 0), tile=c.astype(C.dtype))


@ct.kernel
def odd_tile(X, Y):
    t = ct.full((3,), 1.0, dtype=ct.float32)
    ct.store(Y, index=(0,), tile=t)


@ct.kernel
def ticket(Counter, Order):
    """Each program takes a ticket: the atomic's old value is its place in program order."""
    n = ct.atomic_add(Counter, (0,), 1)
    ct.store(Order, index=(ct.bid(0),), tile=ct.full((1,), n, dtype=ct.int32))


@ct.kernel
def math_kernel(X, E, E_FTZ, D, D_APPROX, TILE: ConstInt):
    x = ct.load(X, index=(0,), shape=(TILE,))
    ct.store(E, index=(0,), tile=ct.exp2(x))
    ct.store(E_FTZ, index=(0,), tile=ct.exp2(x, flush_to_zero=True))
    ct.store(D, index=(0,), tile=ct.truediv(x, 3.0))
    ct.store(D_APPROX, index=(0,), tile=ct.truediv(x, 3.0, flush_to_zero=True,
                                                   rounding_mode=ct.RoundingMode.APPROX))


@ct.kernel
def promote_kernel(X, Out_i, Out_f):
    """int32 scalar tile + Python float is float32; + Python int stays int32."""
    i = ct.bid(0)
    ct.store(Out_i, index=(0,), tile=ct.full((1,), i + 7, dtype=ct.int32) + 1)
    x = ct.load(X, index=(0,), shape=(1,))
    ct.store(Out_f, index=(0,), tile=(x + 0.5).astype(ct.float32) + i * 0.5)


@ct.kernel
def transpose_kernel(X, Y):
    """Y = X^T through ct.load's order='F' (cuda.tile's documented example, as a store)."""
    t = ct.load(X, index=(0, 0), shape=(4, 4), order="F")
    ct.store(Y, index=(0, 0), tile=t)


@ct.kernel
def order_kernel(X, Y):
    """Y = X permuted by (0, 2, 1) in (4, 4, 4) tiles of a (3, 5, 6) array: ragged on every
    axis, zero padding; Y (3, 8, 8) receives the padded tiles, its rows past 3 dropped."""
    b = ct.load(X, index=(0, ct.bid(0), ct.bid(1)), shape=(4, 4, 4), order=(0, 2, 1),
                padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, index=(0, ct.bid(0), ct.bid(1)), tile=b)
