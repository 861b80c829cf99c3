"""Shared test setup: the `gpu` marker skips where no CUDA GPU (or no cuTile) is usable."""
import os

# One BLAS thread: the emulation tests run many small matmuls; threads only contend on 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest

# Autotune searches compile every configuration; tests use the first one unless they opt in.
os.environ.setdefault("FLASHATTN_AUTOTUNE", "0")

# The book's package registers its ladder kernel: the tests run every step of the book through
# the library's launch (flashattn.attention(..., step=NAME)).
import flashbook  # noqa: E402,F401

# torch._dynamo imported whole now, in a clean process: some tests fake CUDA (torch.cuda patched),
# and a first import of torch._dynamo under those fakes (create_block_mask imports it lazily)
# left it half initialised for every later test in the process.
import torch._dynamo  # noqa: E402,F401


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls: thread hand-offs cost more than they save, worse on a busy machine.
    Modules of many small CPU matmuls use it (``pytestmark = pytest.mark.usefixtures(...)``)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _gpu_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    try:
        import cuda.tile  # noqa: F401
    except Exception as e:  # pragma: no cover
        return f"cuda.tile unusable: {e}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


