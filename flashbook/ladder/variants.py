"""The decode and backward kernels with their off switches: the book's ladder of chapters 11-12.

The library ships ``flashattn/kernels/decode.py`` and ``fmha_bwd.py`` with these switches folded
away (``tests/test_shipped_kernel.py`` checks it); the files beside this one keep them, so the
experiments can re-measure them:

    DECODE_FUSED_COMBINE   the split kernel's last program per row block merges (no combine
                           launch); contiguous caches only (tileiras fails on atomics when paged)
    DECODE_PDL             the combine launched as a programmatic dependent of the split kernel
    DECODE_PDL_TRIGGER     ... and the split kernel signals it once its partial is stored
    BWD_PDL                0 off; 1 dK/dV waits for the preprocess and dQ for dK/dV; 2 early
                           signals, dQ runs beside the end of dK/dV

``decode`` and ``attention_backward`` here are the library's with these switches (read when
called, so ``mock.patch.object(variants, "DECODE_PDL", True)`` works); with every switch off they
launch the same work as ``flashattn.decode`` and ``flashattn.launch_bwd.attention_backward``.
"""
from __future__ import annotations

import dataclasses
import math

from flashattn import kernels as K
from flashattn.kernels import Array, KernelSpec

DECODE_FUSED_COMBINE = False
DECODE_PDL = False
DECODE_PDL_TRIGGER = False
BWD_PDL = 0
PDL_ARCHS = ("sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121")  # griddepcontrol: sm_90+

_DEC = "flashbook.ladder.decode"
_BWD = "flashbook.ladder.fmha_bwd"
DECODE_SPLIT = KernelSpec(
    "decode_split", _DEC, "decode_split_kernel",
    arrays=(*K.DECODE_SPLIT.arrays, Array("Counter", 2, "int32")), scalars=K.DECODE_SPLIT.scalars,
    constants=(*K.DECODE_SPLIT.constants, "FUSED", "PDL"))
DECODE_COMBINE = dataclasses.replace(K.DECODE_COMBINE, module=_DEC,
                                     constants=(*K.DECODE_COMBINE.constants, "PDL"))
DECODE_COMBINE_ROW = dataclasses.replace(K.DECODE_COMBINE_ROW, module=_DEC,
                                         constants=(*K.DECODE_COMBINE_ROW.constants, "PDL"))
DECODE = {"decode_split": DECODE_SPLIT, "decode_combine": DECODE_COMBINE,
          "decode_combine_row": DECODE_COMBINE_ROW}
BWD = {name: dataclasses.replace(spec, module=_BWD, constants=(*spec.constants, "PDL"))
       for name, spec in K.BWD.items()}


def decode_plan(dims, *, num_splits=None, max_seqlen=None, sm_count: int, arch=None,
                fused=None) -> dict:
    """The library's ``decode_plan`` with the switches: ``combine`` may be "fused" (``fused``,
    default ``DECODE_FUSED_COMBINE``, contiguous caches only), ``pdl`` says whether the combine
    is a dependent launch, and every constant dict carries FUSED and PDL."""
    from flashattn.kernels.decode_spec import decode_plan as library_plan
    plan = library_plan(dims, num_splits=num_splits, max_seqlen=max_seqlen, sm_count=sm_count,
                        arch=arch)
    kind = plan["combine"]
    if kind is not None and (DECODE_FUSED_COMBINE if fused is None else fused) and not dims.paged:
        kind = "fused"
    pdl = bool(DECODE_PDL and kind in ("row", "block") and arch in PDL_ARCHS)
    split_c = dict(plan["split_constants"], FUSED=kind == "fused",
                   PDL=pdl and DECODE_PDL_TRIGGER and not dims.paged)  # tileiras: paged SIGSEGV
    rows, tile_m = plan["rows"], split_c["TILE_M"]
    return dict(plan, split_constants=split_c, combine=kind, pdl=pdl,
                combine_constants=dict(plan["combine_constants"], PDL=pdl),
                combine_grid=None if kind == "fused" else plan["combine_grid"],
                counter_shape=((dims.B * dims.Hkv, K.decode_row_blocks(rows, tile_m))
                               if kind == "fused" else None))


# The fused merge's counters: one int32 per (sequence, kv head, row block), 0 at launch (the
# last program of a row block sets its counter back to 0). One buffer per (device, stream): calls
# on one stream never share a counter in flight; a capture gets a fresh buffer (a memset node).
_COUNTERS: dict = {}


def _counters(device, shape):
    """A zeroed (B * Hkv, row blocks) int32 counter tensor for the fused merge."""
    import torch
    if getattr(device, "type", None) == "cpu" or torch.cuda.is_current_stream_capturing():
        return torch.zeros(tuple(shape), dtype=torch.int32, device=device)
    stream = torch.cuda.current_stream(device)
    n = int(shape[0]) * int(shape[1])
    index = device.index if device.index is not None else torch.cuda.current_device()
    bufs = _COUNTERS.setdefault((index, stream.cuda_stream), [])
    if not bufs or bufs[-1].numel() < n:
        size = max(n, 2 * bufs[-1].numel() if bufs else 4096)
        bufs.append(torch.zeros(size, dtype=torch.int32, device=device))
    return bufs[-1][:n].view(int(shape[0]), int(shape[1]))


def decode(q, k_cache, v_cache, cache_seqlens, *, block_table=None, scale=None,
           num_splits=None, max_seqlen=None, check_values=None, out=None):
    """``flashattn.decode`` (fp16/bf16 caches) with the ladder's decode kernels and switches."""
    import torch
    from flashattn.contract import check_decode_tensors, check_optional_int, check_out
    from flashattn.kernels.decode_spec import decode_steps
    from flashattn.dispatch import (device_arch, device_sm_count, expect, interpreting,
                                    launch_kernel)
    dims = check_decode_tensors(q, k_cache, v_cache, cache_seqlens, block_table, scale=scale,
                                check_values=check_values,
                                interpret=interpreting(getattr(q, "device", None)))
    check_optional_int("max_seqlen", max_seqlen, minimum=0)
    check_out(out)
    B, Hq, Nq, D = q.shape
    Hkv = dims.Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if out is None:
        out = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    arch, sm_count = device_arch(q.device), device_sm_count(q.device)
    plan = decode_plan(dims, num_splits=num_splits, max_seqlen=max_seqlen, sm_count=sm_count,
                       arch=arch)
    rows = plan["rows"]
    q_rows = q.contiguous().view(B, Hkv, rows, D)
    out_rows = out.view(B, Hkv, rows, D)
    table = (torch.empty((1, 1), dtype=torch.int32, device=q.device) if block_table is None
             else block_table.contiguous())
    seqlens = cache_seqlens.contiguous()
    final = plan["combine"] is None
    opart = torch.empty((1, 1, 1, 1) if final else plan["opart_shape"], dtype=torch.float32,
                        device=q.device)
    lse = torch.empty((1, 1, 1) if final else plan["lse_shape"], dtype=torch.float32,
                      device=q.device)
    counter = (_counters(q.device, plan["counter_shape"]) if plan["combine"] == "fused"
               else torch.empty((1, 1), dtype=torch.int32, device=q.device))
    split_kernel = K.hinted(DECODE_SPLIT.kernel(), plan["hints"])
    unread = torch.empty((1, 1), dtype=torch.float32, device=q.device)    # 16-bit: no descales
    with expect(q.device, lambda: decode_steps(plan, seqlens, dims), "flashbook decode"):
        launch_kernel(q.device, plan["split_grid"], split_kernel,
                      DECODE_SPLIT.args(dict(Q=q_rows, K=k_cache, V=v_cache, BlockTable=table,
                                             SeqLens=seqlens, KDescale=unread,
                                             VDescale=unread, Opart=opart, Lse=lse,
                                             Out=out_rows, Counter=counter),
                                        dict(qk_scale=scale, num_q=Nq),
                                        plan["split_constants"]))
        if plan["combine"] in ("row", "block"):
            spec = DECODE_COMBINE_ROW if plan["combine"] == "row" else DECODE_COMBINE
            launch_kernel(q.device, plan["combine_grid"], spec.kernel(),
                          spec.args(dict(Opart=opart, Lse=lse, Out=out_rows), {},
                                    plan["combine_constants"]), pdl=plan["pdl"])
    return out


@dataclasses.dataclass(frozen=True)
class PdlLaunch:
    """A library ``launch_bwd.Launch`` run with the ladder's kernel: ``pdl`` says whether it is a
    programmatic dependent of the launch before it."""
    spec: KernelSpec
    grid: tuple
    args: tuple
    hints: dict
    constants: dict
    pdl: bool = False


def backward_launches(q, k, v, out, dout, lse, delta, dq, dk, dv, *, causal, scale, input_pos,
                      arch, configs=None, deterministic=True) -> list[PdlLaunch]:
    """The library's ``backward_launches`` with ``BWD_PDL``: the deterministic pass runs the
    ladder's kernels with their PDL constant (the last one of each), and dK/dV and dQ are
    dependent launches when it is on (sm_90 and later); the atomic variant is the library's."""
    from flashattn.launch_bwd import backward_launches as library_launches
    got = library_launches(q, k, v, out, dout, lse, delta, dq, dk, dv, causal=causal,
                           scale=scale, input_pos=input_pos, arch=arch, configs=configs,
                           deterministic=deterministic)
    if not deterministic:
        return [PdlLaunch(l.spec, l.grid, l.args, l.hints, l.constants) for l in got]
    pdl = int(BWD_PDL) if arch in PDL_ARCHS else 0
    return [PdlLaunch(BWD[l.spec.name], l.grid, (*l.args, pdl), l.hints,
                      dict(l.constants, PDL=pdl), bool(pdl) and l.spec.name != "bwd_preprocess")
            for l in got]


def attention_backward(q, k, v, out, dout, lse, *, causal=False, scale=None, input_pos=0,
                       configs=None, grads=None, deterministic=True):
    """``flashattn.launch_bwd.attention_backward`` with ``backward_launches`` above."""
    import torch
    from flashattn.contract import check_causal
    from flashattn.dispatch import launch_kernel, on_device
    from flashattn.dispatch import device_arch
    from flashattn.launch_bwd import check_backward
    causal = check_causal(causal)
    check_backward(q, k, v, out, dout, lse, causal=causal, scale=scale, input_pos=input_pos)
    B, Hq, Nq, D = q.shape
    dq, dk, dv = grads if grads is not None else (torch.empty_like(t) for t in (q, k, v))
    q, k, v, out, dout, lse = (t.contiguous() for t in (q, k, v, out, dout, lse))
    delta = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    with on_device(q.device):
        dq_buf = dq if deterministic else torch.zeros(dq.shape, dtype=torch.float32,
                                                      device=dq.device)
        for l in backward_launches(q, k, v, out, dout, lse, delta, dq_buf, dk, dv,
                                   causal=causal, scale=scale, input_pos=input_pos,
                                   arch=device_arch(q.device), configs=configs,
                                   deterministic=deterministic):
            launch_kernel(q.device, l.grid, K.hinted(l.spec.kernel(), l.hints), l.args,
                          stream="current", pdl=l.pdl)
        if not deterministic:
            dq.copy_(dq_buf)
    return dq, dk, dv


# --- the ladder's decode kernels in NumPy (the library's emulation with the switches) -------------
def emulate_split_kernel(grid, Q, K, V, BlockTable, SeqLens, KDescale, VDescale, Opart, Lse, Out,
                         Counter, *rest, order_seed=0):
    """The ladder's ``decode_split_kernel`` on NumPy arrays, in its argument order (``Counter``
    after ``Out``, FUSED and PDL last): the library's emulation, and with FUSED the programs in
    a shuffled order (``order_seed``: on a GPU any split can finish last), each counting itself
    in ``Counter[bh, bid_m]``; the one that counts last merges its row block into ``Out`` and
    sets the counter back to 0. PDL changes nothing here (launches run one after another)."""
    import random

    import numpy as np

    from flashattn.reference.decode import emulate_split_kernel as library, merge_block
    *args, fused, _pdl = rest
    arrays = (Q, K, V, BlockTable, SeqLens, KDescale, VDescale, Opart, Lse, Out)
    if not fused:
        library(grid, *arrays, *args)
        return
    tile_m, tile_d, num_splits = args[2], args[4], grid[1]
    programs = list(np.ndindex(*grid))
    random.Random(order_seed).shuffle(programs)
    for bid_m, split, bh in programs:
        library(grid, *arrays, *args, programs=[(bid_m, split, bh)])
        arrived = int(Counter[bh, bid_m])
        Counter[bh, bid_m] = arrived + 1
        if arrived == num_splits - 1:                                 # the last: merge
            Counter[bh, bid_m] = 0
            with np.errstate(invalid="ignore", over="ignore"):
                merge_block(Opart, Lse, Out, bh, bid_m, tile_m, tile_d)


def emulate_decode_fused(q, k_cache, v_cache, cache_seqlens, block_table=None, *, scale=None,
                         num_splits: int = 2, tile_m: int = 16, tile_n: int = 64,
                         order_seed: int = 0):
    """``flashattn.reference.emulate_decode`` with the fused merge (no combine launch), in
    NumPy; raises AssertionError if a counter is left non-zero."""
    import numpy as np

    from flashattn.contract import check_decode, tile_d_for
    from flashattn.reference.decode import _compute_dtype, _float, _np
    check_decode(q, k_cache, v_cache, cache_seqlens, block_table, scale=scale,
                 check_values=False)
    dt = _compute_dtype(q, k_cache, v_cache)
    qn, kn, vn = _float(q, dt), _float(k_cache, dt), _float(v_cache, dt)
    table = np.zeros((1, 1), np.int32) if block_table is None else _np(block_table)
    B, Hq, Nq, D = qn.shape
    Hkv = kn.shape[1]
    rows, td = Hq // Hkv * Nq, tile_d_for(D)
    m_blocks = -(-rows // tile_m)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    opart = np.zeros((num_splits, B * Hkv, m_blocks * tile_m, td), dt)
    lse = np.zeros((num_splits, B * Hkv, m_blocks * tile_m), dt)
    out = np.zeros((B, Hkv, rows, D), dt)
    counter = np.zeros((B * Hkv, m_blocks), np.int32)
    unread = np.ones((1, 1), dt)
    emulate_split_kernel((m_blocks, num_splits, B * Hkv), qn.reshape(B, Hkv, rows, D), kn, vn,
                         table, _np(cache_seqlens), unread, unread, opart, lse, out, counter,
                         scale, Nq, tile_m, tile_n, td, block_table is not None, False, False,
                         False, td, 0, True, False, order_seed=order_seed)
    if counter.any():
        raise AssertionError("a fused merge left a counter non-zero")
    return out.reshape(B, Hq, Nq, D)
