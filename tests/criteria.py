"""What the GPU tests share: the FlashAttention test criterion (forward and decoding kernels) and
a seed per test case."""
import zlib

import torch


def seed_of(case_id: str) -> int:
    """A fixed seed per test case (``hash`` of a str changes between processes)."""
    return zlib.crc32(case_id.encode()) % (1 << 31)


def assert_flash_criterion(out, ref, pt, floor, *, seed):
    """Every element written and finite, and max |out - ref| <= 2 x PyTorch's own
    same-precision error (``pt``) + ``floor``. Returns (err, err_pt)."""
    assert not torch.isnan(out).any(), \
        f"seed {seed}: {torch.isnan(out).sum().item()} elements unwritten/NaN"
    assert torch.isfinite(out).all(), f"seed {seed}: infinite outputs"
    err = (out.float() - ref).abs().max().item()
    err_pt = (pt.float() - ref).abs().max().item()
    assert err <= 2 * err_pt + floor, \
        f"seed {seed}: max error {err:.3g} > 2 x torch {err_pt:.3g} + {floor}"
    return err, err_pt


def assert_close_to_reference(out, q, k, v, *, causal, input_pos=0, scale=None, floor=None,
                              seed=0):
    """The criterion against flashattn.reference.attention in fp64, PyTorch's own error being
    the same reference computed in the inputs' dtype (the interpreter's CPU tests)."""
    from flashattn import reference
    ref = reference.attention(q.double(), k.double(), v.double(), causal=causal,
                              input_pos=input_pos, scale=scale)
    pt = reference.attention(q.float(), k.float(), v.float(), causal=causal,
                             input_pos=input_pos, scale=scale).to(q.dtype)
    if floor is None:
        floor = 1e-3 if q.dtype == torch.float16 else 8e-3
    return assert_flash_criterion(out, ref.float(), pt, floor, seed=seed)
