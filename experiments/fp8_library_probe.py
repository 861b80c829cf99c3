"""Does any attention kernel in the GPU bundle take FP8 inputs? (issue 26: "an FP8 library kernel
if one fits the carry")

The bundle (`../shared/gpu/make-bundle.sh`) carries torch and cuda-tile only, so the candidates
are PyTorch's own: ``scaled_dot_product_attention`` under each backend with float8_e4m3fn
q/k/v, and the cuDNN attention op directly. Each attempt prints whether it ran, and when it ran,
its largest difference from the fp32 reference of the dequantised inputs.

    python experiments/fp8_library_probe.py            # on the GPU machine, a few seconds
"""
import sys


def main() -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend
    if not torch.cuda.is_available():
        print("no GPU")
        return 2
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(1, 8, 512, 128, generator=g).cuda() for _ in range(3))
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q8.float(), k8.float(), v8.float())
    attempts = {f"sdpa[{b.name}]": (lambda b=b: _sdpa(b, q8, k8, v8)) for b in
                (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                 SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)}
    attempts["aten._scaled_dot_product_cudnn_attention"] = lambda: \
        torch.ops.aten._scaled_dot_product_cudnn_attention(q8, k8, v8, None, False, 0.0,
                                                           False, False)[0]
    ran = 0
    for name, fn in attempts.items():
        try:
            o = fn()
            torch.cuda.synchronize()
            err = (o.float() - ref).abs().max().item()
            print(f"{name}: ran, output {o.dtype}, max |diff| vs fp32 of the fp8 inputs {err:.3g}")
            ran += 1
        except Exception as e:            # the answer we are after: which refuse, and why
            print(f"{name}: refused: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}: "
          f"{ran} of {len(attempts)} ran with fp8 inputs")
    return 0


def _sdpa(backend, q, k, v):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v)


if __name__ == "__main__":
    sys.exit(main())
