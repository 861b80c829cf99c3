"""flashattn as a Hugging Face transformers attention implementation.

    import flashattn.integrations.transformers as fa_hf
    fa_hf.register()                                   # once per process: "cutile"
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16,
                                                 attn_implementation="cutile")

The name is ``"cutile"``: transformers takes a name containing "flash" for a flash-attn kernel
and loads one from the Hub. ``register()`` adds ``attention_forward`` to its
``AttentionInterface`` and ``sdpa_mask`` to its ``AttentionMaskInterface`` (without a mask
function a custom implementation gets no mask, and padding would be lost).

What a model passes (transformers 5.x): ``scaling`` -> ``scale``; unrepeated key/value heads ->
``enable_gqa``; ``sliding_window`` -> ``mods.sliding_window(sliding_window - 1)``; ``softcap``
-> ``mods.softcap``; ``s_aux`` / ``sinks`` -> ``sinks``; ``attention_mask`` None -> causal, a
causal or sliding-window boolean mask -> that structured mask, any other -> ``mods.dense_mask``
with a BlockMask built from it (a float mask of 0 and large negatives too; a bias, a
head-dependent mask, ``dropout`` > 0 or fp32 inputs raise). Rows that see no key give 0 where
eager attention gives the mean of the values: compare on the unpadded positions.
"""
from __future__ import annotations

import math

__all__ = ["register", "attention_forward", "NAME"]

NAME = "cutile"


def register(name: str = NAME) -> str:
    """Register flashattn as the attention implementation ``name`` (default "cutile") in
    transformers' AttentionInterface and AttentionMaskInterface; returns the name. The name
    must not contain "flash" (transformers would take it for a flash-attn kernel)."""
    if not isinstance(name, str) or not name or "flash" in name or name in (
            "eager", "sdpa", "flex_attention") or name.startswith("paged"):
        raise ValueError(f"name must be a new implementation name without 'flash' in it (which "
                         f"transformers reserves for flash-attn kernels), got {name!r}")
    try:
        # transformers reaches torch._dynamo through torch's lazy attributes while importing its
        # modeling utilities; imported that way, torch 2.13 can meet a partially initialised
        # torch._dynamo (seen in a pytest-xdist worker). Import it whole first.
        import torch._dynamo  # noqa: F401
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("flashattn.integrations.transformers needs the transformers package "
                          "(pip install transformers)") from e
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _block_size(device):
    from ..dispatch import device_arch
    from ..flex import DEFAULT_CONFIG, FLEX_CONFIGS
    cfg = FLEX_CONFIGS.get(device_arch(device), DEFAULT_CONFIG)
    return cfg.TILE_M, cfg.TILE_N


def _structured(allowed, Nq, Nk, window):
    """The causal / sliding-window MaskMod equal to ``allowed`` (B, Nq, Nk) (query row i at
    position Nk - Nq + i), or None if it is not one of them."""
    import torch
    from .. import mods
    offset = Nk - Nq
    if offset < 0:
        return None
    pos = torch.arange(Nq, device=allowed.device)[:, None] + offset
    kv = torch.arange(Nk, device=allowed.device)[None, :]
    lefts = [-1] + ([window - 1] if window else [])
    for left in lefts:
        want = kv <= pos
        if left >= 0:
            want = want & (pos - kv <= left)
        if bool((allowed == want).all()):
            return mods.sliding_window(left, 0, offset=offset)
    return None


def _mask_mod(attention_mask, *, B, Nq, Nk, causal, window):
    """(MaskMod or None, per_batch) for transformers' attention_mask and the layer's flags."""
    import torch
    from .. import mods
    if attention_mask is None:
        if not causal or Nq == 1:
            return None, False
        # SDPA's is_causal: top-left aligned (transformers skips the mask only where that is
        # the model's mask). The window (when given) can only be a no-op here; kept exact.
        return mods.sliding_window(window - 1 if window else -1, 0), False
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a tensor or None, got "
                        f"{type(attention_mask).__name__}")
    m = attention_mask
    if m.dim() == 2:                      # (Nq, Nk)
        m = m[None, None]
    if m.dim() != 4 or m.shape[-2:] != (Nq, Nk) or m.shape[0] not in (1, B):
        raise ValueError(f"attention_mask of shape {tuple(attention_mask.shape)}: expected "
                         f"(B or 1, 1, {Nq}, {Nk}) (transformers' 4D mask)")
    if m.shape[1] != 1:
        if not bool((m == m[:, :1]).all()):
            raise ValueError("a head-dependent attention_mask is not supported by flashattn's "
                             "transformers integration")
        m = m[:, :1]
    if m.dtype == torch.bool:
        allowed = m[:, 0]
    elif m.dtype.is_floating_point:
        allowed = m[:, 0] > torch.finfo(m.dtype).min / 2
        if bool((m[:, 0][allowed] != 0).any()):
            raise ValueError("attention_mask holds additive biases (values other than 0 and "
                             "-inf/min): flashattn's transformers integration takes masks "
                             "only; express a bias as a score_mod with flashattn.flex_attention")
    else:
        allowed = m[:, 0] != 0
    s = _structured(allowed, Nq, Nk, window)
    if s is not None:
        return s, False
    return mods.dense_mask(allowed.expand(B, Nq, Nk)), True


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, sliding_window: int | None = None,
                      softcap: float | None = None, s_aux=None, **kwargs):
    """transformers' attention-function signature on ``flashattn.flex_attention``.

    query (B, Hq, Nq, D), key/value (B, Hkv, Nk, D) float16/bfloat16; returns
    ``(out (B, Nq, Hq, D), None)`` (no attention weights)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask
    from .. import mods
    from ..flex import cached_block_mask, flex_attention
    if dropout:
        raise NotImplementedError(f"flashattn has no attention dropout (got dropout={dropout}); "
                                  "set attention_dropout=0 or use model.eval()")
    if query.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"flashattn runs float16/bfloat16 attention, got {query.dtype}: load the "
                        "model with dtype=torch.float16 or torch.bfloat16")
    sinks = s_aux if s_aux is not None else kwargs.get("sinks")
    if kwargs.get("position_bias") is not None:
        raise ValueError("position_bias (an additive bias) is not supported by flashattn's "
                         "transformers integration")
    if sliding_window is not None and (isinstance(sliding_window, bool) or
                                       not isinstance(sliding_window, int) or
                                       sliding_window < 1):
        raise ValueError(f"sliding_window must be a positive int or None, got "
                         f"{sliding_window!r}")
    B, Hq, Nq, D = query.shape
    Hkv, Nk = key.shape[1], key.shape[2]
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", True)
    mask, per_batch = _mask_mod(attention_mask, B=B, Nq=Nq, Nk=Nk, causal=bool(causal),
                                window=sliding_window)
    bm = None
    if mask is not None:
        block = _block_size(query.device)
        if per_batch:
            mask = mask.to(query.device)
            bm = create_block_mask(mask, B, None, Nq, Nk, device=query.device,
                                   BLOCK_SIZE=block)
        else:
            bm = cached_block_mask(mask, Nq, Nk, query.device, block)
    score = mods.softcap(float(softcap)) if softcap else None
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or sinks.shape != (Hq,):
            raise ValueError(f"s_aux (the sinks) must be a ({Hq},) tensor, got "
                             f"{getattr(sinks, 'shape', sinks)}")
    out = flex_attention(query, key, value, score_mod=score, block_mask=bm,
                         scale=float(scaling) if scaling is not None else
                         1.0 / math.sqrt(D), enable_gqa=Hq != Hkv, sinks=sinks)
    return out.transpose(1, 2).contiguous(), None
