"""Launching the backward kernels: dQ, dK, dV from the forward's inputs and output.

    dq, dk, dv = attention_backward(q, k, v, out, dout, lse, causal=True)

``lse``: the forward's natural-log log-sum-exp per query row, fp32 (B, Hq, Nq). Three
deterministic launches (``bwd_preprocess``, ``bwd_dkdv``, ``bwd_dq``; dK and dV summed over a
GQA group inside one program) at ``kernels.bwd_configs``; ``flashattn.autograd`` registers this
as its operator's backward. A row that sees no key gets dQ = 0 and adds nothing to dK, dV.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .contract import check_causal, check_tensors
from .dispatch import attention_steps, device_arch, expect, interpreting, launch_kernel, on_device
from .launch import check_like, check_lse_out
from .kernels import BWD, BWD_ATOMIC, KernelSpec, bwd_configs, bwd_constants, bwd_grid, hinted
from .config import Config


@dataclass(frozen=True)
class Launch:
    """One kernel launch: its spec, grid, positional arguments and kernel hints."""
    spec: KernelSpec
    grid: tuple[int, int, int]
    args: tuple
    hints: dict
    constants: dict


def check_backward(q, k, v, out, dout, lse, *, causal, scale, input_pos) -> None:
    """The forward's contract (``contract.check_tensors``) for q, k, v, then
    ``check_backward_tensors``. Raises TypeError/ValueError naming the problem."""
    check_tensors(q, k, v, causal=causal, scale=scale, input_pos=input_pos,
                  interpret=interpreting(getattr(q, "device", None)))
    check_backward_tensors(q, out, dout, lse)


def check_like_q(q, layout: str = "", **tensors) -> None:
    """Each of ``tensors`` (by name: out, dout, ...) a torch tensor of q's shape, dtype and
    device (any strides). ``layout`` names q's axes in the shape message, e.g. "(total_q, Hq,
    D)". Raises TypeError/ValueError naming the tensor and the problem."""
    for name, t in tensors.items():
        check_like(name, t, shape=q.shape, dtype=q.dtype, device=q.device,
                   shape_is=f"the shape of q {tuple(q.shape)}{' ' + layout if layout else ''}",
                   dtype_is=f"have q's dtype {q.dtype}")


def check_backward_tensors(q, out, dout, lse) -> None:
    """out and dout of q's shape, dtype and device; lse a float32 (B, Hq, Nq) tensor there."""
    check_like_q(q, out=out, dout=dout)
    check_lse_out(q, lse, contiguous=False)      # the forward's LSE; copied if not contiguous


def backward_launches(q, k, v, out, dout, lse, delta, dq, dk, dv, *, causal: bool,
                      scale: float, input_pos: int, arch: str | None,
                      configs: dict | None = None, deterministic: bool = True) -> list[Launch]:
    """The launches, in order, on validated contiguous tensors (any objects with ``.shape``
    work: the arguments are passed through, so this runs on a CPU). Deterministic: three
    (``BWD``); otherwise two (``BWD_ATOMIC``), and ``dq`` must be a zeroed fp32 buffer."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    configs = {**bwd_configs(arch, D), **(configs or {})}
    configs.setdefault("bwd_dkdv_dq_atomic", configs["bwd_dkdv"])
    dkdv_arrays = dict(Q=q, K=k, V=v, dO=dout, LSE=lse, Delta=delta, dK=dk, dV=dv)
    dkdv_scalars = dict(qk_scale=scale, input_pos=input_pos, num_kv_heads=Hkv,
                        group_size=Hq // Hkv)
    arrays = {
        "bwd_preprocess": dict(Out=out, dO=dout, Delta=delta),
        "bwd_dkdv": dkdv_arrays,
        "bwd_dq": dict(Q=q, K=k, V=v, dO=dout, LSE=lse, Delta=delta, dQ=dq),
        "bwd_dkdv_dq_atomic": dict(dkdv_arrays, dQacc=dq),
    }
    scalars = {
        "bwd_preprocess": dict(num_heads=Hq),
        "bwd_dkdv": dkdv_scalars,
        "bwd_dq": dict(qk_scale=scale, input_pos=input_pos, num_heads=Hq, group_size=Hq // Hkv),
        "bwd_dkdv_dq_atomic": dkdv_scalars,
    }
    launches = []
    for name, spec in (BWD if deterministic else BWD_ATOMIC).items():
        cfg: Config = configs[name]
        constants = bwd_constants(name, cfg, head_dim=D, causal=causal,
                                  even_k=Nk % cfg.TILE_N == 0)
        launches.append(Launch(spec, bwd_grid(name, cfg, B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk),
                               spec.args(arrays[name], scalars[name], constants),
                               cfg.hints(), constants))
    return launches


def attention_backward(q, k, v, out, dout, lse, *, causal: bool = False,
                       scale: float | None = None, input_pos: int = 0,
                       configs: dict | None = None, grads: tuple | None = None,
                       deterministic: bool = True):
    """dQ, dK, dV of ``flashattn.attention(q, k, v, causal=, scale=, input_pos=)``.

    Args:
        q, k, v: the forward's inputs, (B, Hq, Nq, D) and (B, Hkv, Nk, D), float16 or bfloat16
            CUDA tensors (any strides: copied if not contiguous).
        out: the forward's output; dout: the gradient of the loss with respect to it. Both
            (B, Hq, Nq, D) in q's dtype.
        lse: (B, Hq, Nq) float32, the natural-log log-sum-exp of each query row's scaled scores
            (``flashattn.autograd.attention_forward`` returns it; -inf or +inf: a row that sees
            no key, whose gradients are 0).
        causal, scale, input_pos: the forward's.
        configs: {"bwd_dkdv": Config, "bwd_dq": Config, ...} to override ``bwd_configs``.
        grads: (dq, dk, dv) to write into: contiguous, with the shapes, dtype and device of
            q, k, v (the GPU tests pass NaN-filled ones). Default: new tensors.
        deterministic: True (default): dQ in its own pass, bit-identical from run to run.
            False: the opt-in atomics variant (``bwd_dkdv_dq_atomic_kernel``): dQ accumulated
            in an fp32 buffer by atomic adds during the dK/dV pass, then cast; its last bits
            vary from run to run.

    Returns:
        (dq, dk, dv) shaped as q, k, v, in their dtype; dk and dv summed over each GQA group.

    Raises:
        TypeError, ValueError: bad shapes, dtypes, devices or arguments, before any launch.
    """
    import torch
    causal = check_causal(causal)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be True or False, got {deterministic!r}")
    check_backward(q, k, v, out, dout, lse, causal=causal, scale=scale, input_pos=input_pos)
    if grads is not None:
        for name, g, t in (("dq", grads[0], q), ("dk", grads[1], k), ("dv", grads[2], v)):
            if not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(t.shape) or \
                    g.dtype != t.dtype or g.device != t.device or not g.is_contiguous():
                raise ValueError(f"grads: {name} must be a contiguous tensor of shape "
                                 f"{tuple(t.shape)}, dtype {t.dtype} on {t.device}")
    return launch_backward(q, k, v, out, dout, lse, causal=causal, scale=scale,
                           input_pos=input_pos, configs=configs, grads=grads,
                           deterministic=deterministic)


def launch_backward(q, k, v, out, dout, lse, *, causal: bool, scale: float | None,
                    input_pos: int, configs: dict | None = None, grads: tuple | None = None,
                    deterministic: bool = True):
    """``attention_backward`` on inputs its contract has passed: the launches, no check of the
    tensors again (the varlen backward calls this once per sequence)."""
    import torch
    B, Hq, Nq, D = q.shape
    if grads is None:
        dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    else:
        dq, dk, dv = grads
    if B * Hq * Nq == 0 or k.numel() == 0:
        # No query row: nothing reaches K or V.
        dk.zero_()
        dv.zero_()
        return dq, dk, dv
    q, k, v, out, dout, lse = (t if t.is_contiguous() else t.contiguous()
                               for t in (q, k, v, out, dout, lse))
    delta = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    with on_device(q.device):
        dq_buf = dq if deterministic else torch.zeros(dq.shape, dtype=torch.float32,
                                                      device=dq.device)
        launches = backward_launches(q, k, v, out, dout, lse, delta, dq_buf, dk, dv,
                                     causal=causal, scale=float(scale), input_pos=input_pos,
                                     arch=device_arch(q.device), configs=configs,
                                     deterministic=deterministic)
        with expect(q.device, lambda: backward_steps(launches, q, k, causal=causal,
                                                     input_pos=input_pos),
                    "flashattn's attention backward"):
            for launch in launches:
                launch_kernel(q.device, launch.grid,
                              hinted(launch.spec.kernel(), launch.hints), launch.args,
                              stream="current")
        if not deterministic:
            dq.copy_(dq_buf)
    return dq, dk, dv


def backward_steps(launches, q, k, *, causal: bool, input_pos: int) -> int:
    """(query tile, key tile) steps of the backward's launches (``dispatch.expect``'s
    estimate): each kernel but the preprocess visits the forward's pairs at its own tiles."""
    B, Hq, Nq, _ = q.shape
    return sum(B * Hq * attention_steps(Nq, k.shape[2], int(l.constants["TILE_M"]),
                                        int(l.constants["TILE_N"]), causal=causal,
                                        offset=input_pos)
               for l in launches if l.spec.name != "bwd_preprocess")
