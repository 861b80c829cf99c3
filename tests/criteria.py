"""The FlashAttention test criterion, shared by the GPU tests of the forward and decoding kernels."""
import torch


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
