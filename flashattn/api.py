"""Public entry points: ``attention`` and the drop-in ``sdpa``.

Host-side work only: validate, choose the step's configuration, launch the cuTile kernels.
"""
from __future__ import annotations

import math

from .steps import Config, Step, get_step

_FLOAT_DTYPES = ("float16", "bfloat16")
MAX_HEAD_DIM = 256


def _torch():
    import torch
    return torch


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def tile_d_for(head_dim: int) -> int:
    """Head dims are padded to a power of two of at least 16 (the MMA's K granularity)."""
    return max(16, next_pow2(head_dim))


def arch_of(device) -> str:
    torch = _torch()
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------
def validate(q, k, v, *, causal: bool, scale, input_pos) -> None:
    """Raise TypeError/ValueError naming the problem; see ``attention`` for the contract."""
    torch = _torch()
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise ValueError(f"{name} must have 4 dimensions (B, H, N, D), got shape "
                             f"{tuple(t.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if str(t.dtype).replace("torch.", "") not in _FLOAT_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; flashattn kernels take float16 or "
                            "bfloat16 (cast with .half() or .bfloat16(); for float32 use "
                            "flashattn.reference.attention)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    # Shapes and arguments: the same rules as the CPU reference (one implementation).
    from .reference import check_shapes
    check_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape), causal=causal, scale=scale,
                 input_pos=input_pos)
    if scale is not None and scale <= 0:
        # The kernels scale after the row max (one multiply per row, chapter 3): that is
        # only the max of the scaled scores for a positive scale.
        raise ValueError(f"scale must be a finite positive number, got {scale}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type != "cuda":
        raise ValueError(f"flashattn kernels run on a CUDA GPU; the tensors are on {q.device}. "
                         "On a CPU use flashattn.reference.attention(q, k, v, causal=...)")


# ---------------------------------------------------------------------------------------------
# Kernel objects with hints are built once: replace_hints() in a loop recompiles every call.
# ---------------------------------------------------------------------------------------------
_HINTED: dict = {}


def hinted(kernel, config: Config):
    hints = config.hints()
    if not hints:
        return kernel
    key = (id(kernel), tuple(sorted(hints.items())))
    if key not in _HINTED:
        _HINTED[key] = kernel.replace_hints(**hints)
    return _HINTED[key]


def fmha_constants(step: Step, config: Config, *, head_dim: int, causal: bool,
                   even_k: bool) -> tuple:
    """The ``ct.Constant`` arguments of ``fmha_kernel``, in signature order.

    One list for the launch (``fmha_args``) and the ahead-of-time signature (``aot``), so the
    two cannot disagree on a flag or on the rule below.
    """
    f = step.flag_values()
    td = tile_d_for(head_dim)
    return (config.TILE_M, config.TILE_N, td, bool(causal), bool(even_k),
            f["FAST_MATH"], f["SPLIT_LOOP"], f["REMAP"], f["PAIR"], f["LAZY_RESCALE"],
            f["EXP_POLY"],
            # Unchecked loads only where every K/V tile is provably in bounds.
            f["UNCHECKED_KV"] and even_k and td == head_dim,
            f["K_LAT"], f["V_LAT"], f["PERSISTENT"])


def fmha_args(q, k, v, out, step: Step, config: Config, *, causal: bool, scale: float,
              input_pos: int):
    """(grid, kernel, args) for one launch of the fused kernel."""
    from .kernels.fmha import fmha_kernel
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    f = step.flag_values()
    num_m_blocks = -(-Nq // config.TILE_M)
    grid_x = -(-num_m_blocks // 2) if f["PAIR"] else num_m_blocks
    args = (q, k, v, out, float(scale), int(input_pos), Hq, Hq // Hkv, num_m_blocks,
            *fmha_constants(step, config, head_dim=D, causal=causal,
                            even_k=Nk % config.TILE_N == 0))
    if f["PERSISTENT"]:
        # One program per SM slot (SMs x occupancy), never more than there are work items.
        sms = _torch().cuda.get_device_properties(q.device).multi_processor_count
        return ((min(num_m_blocks * B * Hq, sms * (config.occupancy or 1)), 1, 1),
                hinted(fmha_kernel, config), args)
    return (grid_x, B * Hq, 1), hinted(fmha_kernel, config), args


NAIVE_SCRATCH_BYTES = 8 << 30   # S (fp32) + P for this many bytes of (batch, head) pairs at once


def _naive(q, k, v, out, config: Config, *, causal, scale, input_pos):
    import cuda.tile as ct
    from .kernels.naive import pv_kernel, scores_kernel, softmax_kernel
    torch = _torch()
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    TD, TM, TN, TR = tile_d_for(D), config.TILE_M, config.TILE_N, 16
    per_bh = Nq * Nk * (4 + q.element_size())
    chunk = max(1, min(B * Hq, NAIVE_SCRATCH_BYTES // max(per_bh, 1)))
    S = torch.empty((chunk, Nq, Nk), dtype=torch.float32, device=q.device)
    P = torch.empty((chunk, Nq, Nk), dtype=q.dtype, device=q.device)
    stream = torch.cuda.current_stream()
    for start in range(0, B * Hq, chunk):
        n = min(chunk, B * Hq - start)
        ct.launch(stream, (-(-Nq // TM), -(-Nk // TN), n), scores_kernel,
                  (q, k, S, float(scale), int(input_pos), Hq, Hq // Hkv, start, TM, TN, TD,
                   bool(causal)))
        ct.launch(stream, (-(-Nq // TR), n), softmax_kernel, (S, P, TR, TN))
        ct.launch(stream, (-(-Nq // TM), n), pv_kernel,
                  (P, v, out, Hq, Hq // Hkv, start, TM, TN, TD))
    return out


def launch(q, k, v, out, step: Step, config: Config, *, causal: bool, scale: float,
           input_pos: int = 0):
    """Launch a step with an explicit configuration on validated, contiguous tensors."""
    import cuda.tile as ct
    if step.kernel == "naive":
        return _naive(q, k, v, out, config, causal=causal, scale=scale, input_pos=input_pos)
    grid, kernel, args = fmha_args(q, k, v, out, step, config, causal=causal, scale=scale,
                                   input_pos=input_pos)
    ct.launch(_torch().cuda.current_stream(), grid, kernel, args)
    return out


def resolve(step: str, q, k, causal: bool) -> tuple[Step, Config]:
    """The Step object and the Config it runs with for these inputs on this GPU."""
    from . import autotune
    arch = arch_of(q.device)
    if step == "best":
        return autotune.best(arch, q, k, causal)
    s = get_step(step)
    if s.tuned:
        return s, autotune.choose(s, arch, q, k, causal)
    return s, s.config_for(arch)


def attention(q, k, v, *, causal: bool = False, scale: float | None = None,
              input_pos: int = 0, step: str = "best"):
    """Scaled dot-product attention with a cuTile FlashAttention kernel.

    Args:
        q: (B, Hq, Nq, D) float16 or bfloat16 CUDA tensor.
        k, v: (B, Hkv, Nk, D), same dtype and device; Hq % Hkv == 0 (GQA/MQA: query head h
            reads key/value head h // (Hq // Hkv)). Any strides (copied if not contiguous).
        causal: mask future keys. Query row i sits at absolute position input_pos + i and
            sees keys 0 .. input_pos + i::

                input_pos = 0, Nq = Nk = 4         input_pos = 2, Nq = 2, Nk = 4
                    k0 k1 k2 k3                        k0 k1 k2 k3
                q0   x  .  .  .                    q0   x  x  x  .
                q1   x  x  .  .                    q1   x  x  x  x
                q2   x  x  x  .
                q3   x  x  x  x

        scale: softmax scale, default 1/sqrt(D).
        input_pos: 0 (as scaled_dot_product_attention(is_causal=True)) up to Nk - Nq
            (a prefill appended to a KV cache of Nk - Nq tokens). Causal only.
        step: a name from flashattn.STEPS, or "best" for the fastest known one on this GPU.

    Returns:
        (B, Hq, Nq, D) tensor, dtype of q.

    Raises:
        TypeError, ValueError: bad shapes, dtypes, devices, or arguments (the message says
            which). NotImplementedError never; D up to 256 and any lengths >= 1 are supported.
    """
    torch = _torch()
    if isinstance(causal, torch.Tensor) or not isinstance(causal, (bool, int)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    causal = bool(causal)
    validate(q, k, v, causal=causal, scale=scale, input_pos=input_pos)
    if step != "best":
        get_step(step)  # unknown names fail before any work
    B, Hq, Nq, D = q.shape
    out = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    s, config = resolve(step, q, k, causal)
    with torch.cuda.device(q.device):
        launch(q, k, v, out, s, config, causal=causal, scale=float(scale), input_pos=input_pos)
    return out


def sdpa(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
         scale: float | None = None, enable_gqa: bool = False, *, step: str = "best"):
    """Drop-in for ``torch.nn.functional.scaled_dot_product_attention`` (4-D inputs).

    Raises NotImplementedError for what the kernels do not do (an attention mask tensor,
    dropout), and ValueError for different head counts without ``enable_gqa=True``, as PyTorch.
    """
    if attn_mask is not None:
        raise NotImplementedError("flashattn.sdpa does not support attn_mask; use is_causal=True "
                                  "for causal masking or torch's scaled_dot_product_attention")
    if dropout_p != 0.0:
        raise NotImplementedError(f"flashattn.sdpa does not support dropout (dropout_p="
                                  f"{dropout_p}); it is an inference kernel")
    if getattr(query, "ndim", 4) == 4 and getattr(key, "ndim", 4) == 4:
        if query.shape[1] != key.shape[1] and not enable_gqa:
            raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass "
                             "enable_gqa=True for grouped-query attention")
    return attention(query, key, value, causal=is_causal, scale=scale, step=step)
