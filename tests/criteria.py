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
