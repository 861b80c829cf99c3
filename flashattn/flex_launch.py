"""The flex kernels' launches: the forward (``forward``) and the backward (``backward``: Delta
by the dense backward's preprocess, then dQ and dK/dV), from the pure plans of
``kernels/flex_spec.py`` and the kernels of ``flex_build``. Inputs arrive checked by
``flashattn.flex``."""
from __future__ import annotations

import math

from .contract import tile_d_for
from .dispatch import attention_steps, device_arch, expect, interpreting, launch_kernel, \
    on_device
from .flex_blockmask import visited_steps
from .flex_build import ModError, flex_bwd_kernels, flex_kernel
from .kernels.flex_spec import FLEX, FLEX_DKDV, FLEX_DQ, flex_bwd_plan, flex_plan

__all__ = ["forward", "backward", "check_differentiable", "mod_tensors", "block_lists",
           "sink_grad"]

_LAUNCHED: set = set()


def mod_tensors(mod) -> tuple:
    """A mod's tensors as the kernels' tuple argument (``ST``/``MT``), contiguous."""
    return tuple(t.contiguous() for t in mod.tensor_values()) if mod is not None else ()


def forward(query, key, value, sinks, *, score, mask, tensors, block_size, scale, blasst, ko,
             block_mask, want_lse):
    """Launch the flex forward kernel: (out, lse or None)."""
    import torch
    B, Hq, Nq, D = query.shape
    Hkv, Nk = key.shape[1], key.shape[2]
    device = query.device
    interp = interpreting(device)
    blasst_threshold = blasst
    out = torch.empty((B, Hq, Nq, D), dtype=query.dtype, device=device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=device) if want_lse else None
    if out.numel() and Nk == 0:
        out.zero_()
        if lse is not None:
            lse.fill_(-math.inf if sinks is None else 0.0)
            if sinks is not None:
                lse.copy_(sinks.view(1, Hq, 1).expand(B, Hq, Nq))
    elif out.numel():
        arch = device_arch(device)
        plan = flex_plan(B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, block_size=block_size,
                         has_full=len(tensors) == 4, score=score, mask=mask,
                         sinks=sinks is not None, write_lse=want_lse, blasst=blasst_threshold,
                         arch=arch, kernel_options=ko)
        c = plan["constants"]
        q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (query, key, value))
        i32 = dict(dtype=torch.int32, device=device)
        tm = {n: t for n, t in tensors}
        kv_num = tm.get("kv_num_blocks", torch.zeros(1, 1, 1, **i32))
        kv_idx = tm.get("kv_indices", torch.zeros(1, 1, 1, 1, **i32))
        f_num = tm.get("full_kv_num_blocks", torch.zeros(1, 1, 1, **i32))
        f_idx = tm.get("full_kv_indices", torch.zeros(1, 1, 1, 1, **i32))
        kv_num, kv_idx, f_num, f_idx = (t.contiguous() for t in (kv_num, kv_idx, f_num, f_idx))
        st, mt = mod_tensors(score), mod_tensors(mask)
        lse_arg = lse if lse is not None else torch.empty(1, 1, 1, dtype=torch.float32,
                                                          device=device)
        sink_arg = sinks if sinks is not None else torch.zeros(1, dtype=torch.float32,
                                                               device=device)
        args = FLEX.args(
            dict(Q=q, K=k, V=v, Out=out, Lse=lse_arg, KvNum=kv_num, KvIdx=kv_idx,
                 FullNum=f_num, FullIdx=f_idx, Sink=sink_arg, ST=st, MT=mt),
            dict(sm_scale=scale, num_heads=Hq, group_size=Hq // Hkv,
                 mask_bmul=int(kv_num.shape[0] > 1), mask_hmul=int(kv_num.shape[1] > 1)), c)
        kernel = flex_kernel(score, mask)
        if plan["hints"] and not interp:
            from .kernels import hinted
            kernel = hinted(kernel, plan["hints"])
        steps = lambda: visited_steps(block_mask, B, Hq, Nq, Nk, c) \
            if block_mask is not None else \
            B * Hq * attention_steps(Nq, Nk, c["TILE_M"], c["TILE_N"], causal=False)
        launch_key = (id(kernel), tuple(sorted(c.items())), str(query.dtype))
        with on_device(device), expect(device, steps, f"flex_attention({B}x{Hq}x{Nq}x{D})"):
            try:
                launch_kernel(device, plan["grid"], kernel, args)
            except Exception as e:
                if interp or launch_key in _LAUNCHED:
                    raise
                names = " and ".join(f"{m.kind}_mod {m.name!r}" for m in (score, mask) if m) \
                    or "no mod"
                raise ModError(f"the flex kernel with {names} failed to compile or launch: "
                               f"{type(e).__name__}: {e}") from e
        _LAUNCHED.add(launch_key)
    return out, lse


def check_differentiable(score, block_mask, blasst):
    if score is not None and not score.differentiable:
        raise NotImplementedError(
            f"score_mod {score.name!r} has no derivative: it is forward-only. Give it one "
            "(flashattn.mods.ScoreMod(name, tile, torch_fn, grad=def d_score) or additive=True "
            "for a bias), or call under torch.no_grad()")
    if blasst is not None:
        raise NotImplementedError("blasst_threshold is forward-only (an approximation); drop it "
                                  "for training")
    if block_mask is not None and block_mask.q_num_blocks is None:
        raise ValueError("block_mask has no q_num_blocks/q_indices (the backward's column "
                         "lists): build it with create_block_mask")


def block_lists(block_mask, device):
    """(row lists, column lists, has_full, mask_bmul, mask_hmul) of a BlockMask as the dQ and
    dK/dV kernels take them: (num, idx, full_num, full_idx) each, stand-ins where absent."""
    import torch
    i32 = dict(dtype=torch.int32, device=device)
    z3, z4 = torch.zeros(1, 1, 1, **i32), torch.zeros(1, 1, 1, 1, **i32)
    if block_mask is None:
        return [z3, z4, z3, z4], [z3, z4, z3, z4], False, 0, 0
    bm = block_mask
    has_full = bm.full_kv_num_blocks is not None and bm.full_q_num_blocks is not None
    kvt = [bm.kv_num_blocks, bm.kv_indices,
           bm.full_kv_num_blocks if has_full else z3, bm.full_kv_indices if has_full else z4]
    qt = [bm.q_num_blocks, bm.q_indices,
          bm.full_q_num_blocks if has_full else z3, bm.full_q_indices if has_full else z4]
    kvt, qt = [t.contiguous() for t in kvt], [t.contiguous() for t in qt]
    return kvt, qt, has_full, int(kvt[0].shape[0] > 1), int(kvt[0].shape[1] > 1)


def sink_grad(sinks, lse, delta):
    """dL/dsink: the sink is a key of logit sinks[h] and value 0, so -sum_i P_sink,i Delta_i."""
    import torch
    p_sink = torch.exp(sinks.view(1, -1, 1).float() - lse)
    return -(p_sink * delta).sum((0, 2))


def backward(q, k, v, out, dout, lse, sinks, *, score, mask, tensors, block_size, scale,
              blasst, ko, block_mask):
    """(dq, dk, dv, dsinks or None) of the flex forward."""
    import torch
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    device = q.device
    q, k, v, out, dout = (t.contiguous() for t in (q, k, v, out, dout))
    lse = lse.contiguous()
    st, mt = mod_tensors(score), mod_tensors(mask)
    kvt, qt, has_full, bmul, hmul = block_lists(block_mask, device)
    plan = flex_bwd_plan(B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D,
                         block_size=block_size if block_mask is not None else None,
                         has_full=has_full, score=score, mask=mask,
                         arch=device_arch(device), kernel_options=ko)
    pq, pkv = plan["dq"], plan["dkdv"]
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    from .kernels import hinted
    dq_kernel, dkdv_kernel = flex_bwd_kernels(score, mask)
    with on_device(device):
        # Delta = rowsum(dO o O): the dense backward's preprocess, one read of each.
        from .kernels.fmha_bwd import bwd_preprocess_kernel
        delta = torch.empty((B, Hq, Nq), dtype=torch.float32, device=device)
        launch_kernel(device, (-(-Nq // 64), B * Hq, 1), bwd_preprocess_kernel,
                      (out, dout, delta, Hq, 64, tile_d_for(D)))
        ins = dict(Q=q, K=k, V=v, dO=dout, Lse=lse, Delta=delta, ST=st, MT=mt)
        scalars = dict(sm_scale=scale, group_size=Hq // Hkv, mask_bmul=bmul, mask_hmul=hmul)
        launch_kernel(device, pq["grid"], hinted(dq_kernel, pq["hints"]), FLEX_DQ.args(
            dict(ins, dQ=dq, **dict(zip(("KvNum", "KvIdx", "FullNum", "FullIdx"), kvt))),
            dict(scalars, num_heads=Hq), pq["constants"]))
        launch_kernel(device, pkv["grid"], hinted(dkdv_kernel, pkv["hints"]), FLEX_DKDV.args(
            dict(ins, dK=dk, dV=dv, **dict(zip(("QNum", "QIdx", "FullQNum", "FullQIdx"), qt))),
            dict(scalars, num_kv_heads=Hkv), pkv["constants"]))
    dsinks = sink_grad(sinks, lse, delta) if sinks is not None else None
    return dq, dk, dv, dsinks
