"""Launching the kernels: a step and a configuration, on validated tensors.

    launch(q, k, v, out, step, config, causal=True, scale=D ** -0.5)
    launch(q, k, v, out, step, config, causal=True, scale=D ** -0.5, lse=lse)   # and the LSE

Which step and configuration to launch for given inputs is ``autotune.resolve``.

``flashattn.attention`` (in ``api``) validates inputs and calls these; the benchmarks, the
profiler target and autotune call them directly on inputs they made. Each launch goes through
``dispatch.launch_kernel``: ``ct.launch`` on the GPU, the interpreter for CPU tensors opted in;
``target``: the ``dispatch.Target`` the entry point resolved for q's device (default: q's).
"""
from __future__ import annotations

from .dispatch import attention_steps, device_sm_count, expect, launch_kernel, on_device
from .kernels import NAIVE, fmha_plan, hinted, naive_constants
from .config import Config
from .registry import Step

NAIVE_SCRATCH_BYTES = 8 << 30   # S (fp32) + P for this many bytes of (batch, head) pairs at once

_NO_LSE: dict = {}              # device -> the one-element stand-in for Lse when it is not written


def _lse_stand_in(device):
    """A (1, 1, 1) fp32 tensor on ``device``, made once: the kernel's Lse when WRITE_LSE is off
    (never read or written; a fixed tensor keeps CUDA-graph captures free of allocations)."""
    import torch
    key = str(device)
    if key not in _NO_LSE:
        _NO_LSE[key] = torch.empty((1, 1, 1), dtype=torch.float32, device=device)
    return _NO_LSE[key]


def check_like(name: str, t, *, shape, dtype, device, shape_is: str, dtype_is: str) -> None:
    """``t`` a torch tensor of ``shape`` and ``dtype`` on q's ``device`` (any strides);
    ``shape_is`` and ``dtype_is`` say in the messages what is asked. Raises TypeError or
    ValueError naming ``name``."""
    import torch
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have {shape_is}, got {tuple(t.shape)}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must {dtype_is}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}: one device")


def check_lse_out(q, lse, *, contiguous: bool = True) -> None:
    """``lse`` must be an fp32 (B, Hq, Nq) tensor on q's device, contiguous unless told not to
    (the backward copies it) (ValueError/TypeError)."""
    import torch
    B, Hq, Nq, _ = q.shape
    check_like("lse", lse, shape=(B, Hq, Nq), dtype=torch.float32, device=q.device,
               shape_is=f"shape (B, Hq, Nq) = {(B, Hq, Nq)}",
               dtype_is="be float32 (the forward's log-sum-exp)")
    if contiguous and not lse.is_contiguous():
        raise ValueError("lse must be contiguous (the kernel writes it in place)")


def fmha_args(q, k, v, out, step: Step, config: Config, *, causal: bool, scale: float,
              input_pos: int, lse=None, target=None):
    """(grid, kernel, args) for one launch of the fused kernel; with ``lse`` (fp32 (B, Hq, Nq))
    the kernel also writes each row's natural-log LSE there (WRITE_LSE)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    arrays = dict(Q=q, K=k, V=v, Out=out, Lse=_lse_stand_in(q.device) if lse is None else lse)
    hints = config.hints()
    device = q.device if target is None else target
    plan = fmha_plan(step, config, B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, head_dim=D, causal=causal,
                     scale=scale, input_pos=input_pos, write_lse=lse is not None,
                     sm_count=lambda: device_sm_count(device))
    args = plan.spec.args(arrays, plan.scalars, plan.constants)
    return plan.grid, hinted(plan.spec.kernel(), hints), args


def _naive(q, k, v, out, config: Config, *, causal, scale, input_pos) -> list:
    """The naive step's launches, (grid, kernel, args) each: scores, softmax and P @ V for
    as many (batch, head) pairs at once as ``NAIVE_SCRATCH_BYTES`` of S and P hold."""
    import torch
    from .kernels import NAIVE_ROW_TILE
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    per_bh = Nq * Nk * (4 + q.element_size())
    chunk = max(1, min(B * Hq, NAIVE_SCRATCH_BYTES // max(per_bh, 1)))
    S = torch.empty((chunk, Nq, Nk), dtype=torch.float32, device=q.device)
    P = torch.empty((chunk, Nq, Nk), dtype=q.dtype, device=q.device)
    sc, sm, pv = NAIVE["naive_scores"], NAIVE["naive_softmax"], NAIVE["naive_pv"]
    const = {n: naive_constants(n, config, head_dim=D, causal=causal) for n in NAIVE}
    launches = []
    for start in range(0, B * Hq, chunk):
        n = min(chunk, B * Hq - start)
        launches += [
            ((-(-Nq // config.TILE_M), -(-Nk // config.TILE_N), n), sc.kernel(),
             sc.args(dict(Q=q, K=k, S=S),
                     dict(qk_scale=scale, input_pos=input_pos, num_heads=Hq,
                          group_size=Hq // Hkv, bh_offset=start), const["naive_scores"])),
            ((-(-Nq // NAIVE_ROW_TILE), n), sm.kernel(),
             sm.args(dict(S=S, P=P), {}, const["naive_softmax"])),
            ((-(-Nq // config.TILE_M), n), pv.kernel(),
             pv.args(dict(P=P, V=v, Out=out),
                     dict(num_heads=Hq, group_size=Hq // Hkv, bh_offset=start),
                     const["naive_pv"]))]
    return launches


def launch(q, k, v, out, step: Step, config: Config, *, causal: bool, scale: float,
           input_pos: int = 0, lse=None, target=None):
    """Launch a step with an explicit configuration on validated, contiguous tensors.

    ``lse``: a contiguous fp32 (B, Hq, Nq) tensor to receive each query row's natural-log
    log-sum-exp (what ``launch_bwd.attention_backward`` takes); fused steps only. ``target``:
    the ``dispatch.Target`` of q's device, if the caller has it.
    """
    if lse is not None:
        check_lse_out(q, lse)
        if step.kernel == "naive":
            raise ValueError(f"step {step.name!r} (the naive kernels) does not write the LSE; "
                             "use a fused step")
    if step.kernel == "naive":
        launches = _naive(q, k, v, out, config, causal=causal, scale=scale, input_pos=input_pos)
    else:
        launches = [fmha_args(q, k, v, out, step, config, causal=causal, scale=scale,
                              input_pos=input_pos, lse=lse, target=target)]
    B, Hq, Nq, _ = q.shape
    passes = 2 if step.kernel == "naive" else 1      # the naive scores and P @ V visit each pair
    steps = lambda: passes * B * Hq * attention_steps(  # noqa: E731 (interpreted only)
        Nq, k.shape[2], config.TILE_M, config.TILE_N, causal=causal, offset=input_pos)
    device = q.device if target is None else target
    with on_device(device), expect(device, steps, lambda: f"flashattn.attention (step "
                                   f"{step.name!r}, {config.label()})"):
        for grid, kernel, args in launches:
            launch_kernel(device, grid, kernel, args, stream="current")
    return out
