"""Launching the kernels: a step and a configuration, on validated tensors.

    launch(q, k, v, out, step, config, causal=True, scale=D ** -0.5)
    launch(q, k, v, out, step, config, causal=True, scale=D ** -0.5, lse=lse)   # and the LSE

Which step and configuration to launch for given inputs is ``autotune.resolve``.

``flashattn.attention`` (in ``api``) validates inputs and calls these; the benchmarks, the
profiler target and autotune call them directly on inputs they made. Each launch goes through
``dispatch.launch_kernel``: ``ct.launch`` on the GPU, the interpreter for CPU tensors opted in.
"""
from __future__ import annotations

from .contract import check_like
from .dispatch import attention_steps, device_arch, device_sm_count, expect, launch_kernel
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
              input_pos: int, lse=None):
    """(grid, kernel, args) for one launch of the fused kernel; with ``lse`` (fp32 (B, Hq, Nq))
    the kernel also writes each row's natural-log LSE there (WRITE_LSE)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    plan = fmha_plan(step, config, B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, head_dim=D, causal=causal,
                     scale=scale, input_pos=input_pos, write_lse=lse is not None,
                     sm_count=lambda: device_sm_count(q.device))
    args = plan.spec.args(
        dict(Q=q, K=k, V=v, Out=out, Lse=_lse_stand_in(q.device) if lse is None else lse),
        plan.scalars, plan.constants)
    return plan.grid, hinted(plan.spec.kernel(), config.hints()), args


def _naive(q, k, v, out, config: Config, *, causal, scale, input_pos):
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
    for start in range(0, B * Hq, chunk):
        n = min(chunk, B * Hq - start)
        launch_kernel(q.device, (-(-Nq // config.TILE_M), -(-Nk // config.TILE_N), n),
                      sc.kernel(),
                      sc.args(dict(Q=q, K=k, S=S),
                              dict(qk_scale=scale, input_pos=input_pos, num_heads=Hq,
                                   group_size=Hq // Hkv, bh_offset=start),
                              const["naive_scores"]), stream="current")
        launch_kernel(q.device, (-(-Nq // NAIVE_ROW_TILE), n), sm.kernel(),
                      sm.args(dict(S=S, P=P), {}, const["naive_softmax"]), stream="current")
        launch_kernel(q.device, (-(-Nq // config.TILE_M), n), pv.kernel(),
                      pv.args(dict(P=P, V=v, Out=out),
                              dict(num_heads=Hq, group_size=Hq // Hkv, bh_offset=start),
                              const["naive_pv"]), stream="current")
    return out


def forward_steps(q, k, step: Step, config: Config, *, causal: bool, input_pos: int = 0) -> int:
    """(query tile, key tile) steps of a forward launch (``dispatch.expect``'s estimate): the
    naive step's scores and P @ V kernels count twice."""
    B, Hq, Nq, _ = q.shape
    pairs = B * Hq * attention_steps(Nq, k.shape[2], config.TILE_M, config.TILE_N,
                                     causal=causal, offset=input_pos)
    return 2 * pairs if step.kernel == "naive" else pairs


def launch(q, k, v, out, step: Step, config: Config, *, causal: bool, scale: float,
           input_pos: int = 0, lse=None):
    """Launch a step with an explicit configuration on validated, contiguous tensors.

    ``lse``: a contiguous fp32 (B, Hq, Nq) tensor to receive each query row's natural-log
    log-sum-exp (what ``launch_bwd.attention_backward`` takes); fused steps only.
    """
    if lse is not None:
        check_lse_out(q, lse)
        if step.kernel == "naive":
            raise ValueError(f"step {step.name!r} (the naive kernels) does not write the LSE; "
                             "use a fused step")
    with expect(q.device, lambda: forward_steps(q, k, step, config, causal=causal,
                                                input_pos=input_pos),
                lambda: f"flashattn.attention (step {step.name!r}, {config.label()})"):
        if step.kernel == "naive":
            return _naive(q, k, v, out, config, causal=causal, scale=scale,
                          input_pos=input_pos)
        grid, kernel, args = fmha_args(q, k, v, out, step, config, causal=causal, scale=scale,
                                       input_pos=input_pos, lse=lse)
        launch_kernel(q.device, grid, kernel, args, stream="current")
    return out
