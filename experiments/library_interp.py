"""Issue 35 (item 8): the shipped forward, backward, varlen and FP8 forward run in the interpreter
(no GPU) on fixed small inputs, every output saved, to check a refactor leaves them bit-identical.
Runs against whichever flashattn is on PYTHONPATH, old spelling of the API or new.
python experiments/library_interp.py OUT.pt; python experiments/library_interp.py --diff A.pt B.pt"""
import inspect
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common_interp import _qkv, diff  # noqa: E402


def _quantize_vt(quantize_fp8, v):
    """V quantised transposed, under either spelling of the keyword."""
    kw = "v_transposed" if "v_transposed" in inspect.signature(quantize_fp8).parameters else "transpose_v"
    return quantize_fp8(v, **{kw: True})


def run(out):
    import flashattn
    from flashattn import interpret
    from flashattn.fp8 import attention_fp8, quantize_fp8
    res = {}
    with interpret.enabled():
        for name, (Hq, Hkv, Nq, Nk, causal, pos, D) in {
                "causal": (2, 2, 70, 70, True, 0, 64), "full": (2, 2, 50, 77, False, 0, 64),
                "gqa_pos": (4, 2, 40, 70, True, 30, 64), "mqa": (4, 1, 65, 65, True, 0, 64),
                "d80": (2, 1, 33, 47, False, 0, 80)}.items():
            q, k, v = _qkv(len(res), 1, Hq, Hkv, Nq, Nk, D)
            res[f"fwd/{name}"] = flashattn.attention(q, k, v, causal=causal, input_pos=pos)
        for name, (Hq, Hkv, N, causal, dt) in {"causal": (2, 2, 45, True, torch.float16),
                                              "gqa_full": (4, 2, 38, False, torch.bfloat16)}.items():
            q, k, v = (t.requires_grad_() for t in _qkv(len(res), 1, Hq, Hkv, N, N, 32, dt))
            o = flashattn.attention(q, k, v, causal=causal)
            o.float().square().sum().backward()
            res[f"bwd/{name}/o"] = o.detach()
            for n, t in (("dq", q), ("dk", k), ("dv", v)):
                res[f"bwd/{name}/{n}"] = t.grad
        g = torch.Generator().manual_seed(7)
        lens_q, lens_k = [5, 33, 17], [9, 33, 40]
        cq = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
        ck = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
        q = torch.randn(sum(lens_q), 4, 64, generator=g).half()
        k = torch.randn(sum(lens_k), 2, 64, generator=g).half()
        v = torch.randn(sum(lens_k), 2, 64, generator=g).half()
        for causal in (True, False):
            res[f"varlen/{causal}"] = flashattn.attention_varlen(q, k, v, cq, ck, max(lens_q),
                                                                 max(lens_k), causal=causal)
        q, k, v = _qkv(41, 2, 4, 2, 40, 70, 64, torch.float32)
        q8, qd = quantize_fp8(q, num_kv_heads=2)
        k8, kd = quantize_fp8(k)
        v8, vd = quantize_fp8(v)
        v8t, vdt = _quantize_vt(quantize_fp8, v)
        res["fp8/v8t"], res["fp8/vdt"] = v8t.contiguous(), vdt
        for causal in (True, False):
            res[f"fp8/fwd/{causal}"] = attention_fp8(q8, k8, v8, causal=causal, q_descale=qd,
                                                     k_descale=kd, v_descale=vd)
            res[f"fp8/fwd_vt/{causal}"] = attention_fp8(q8, k8, v8t, causal=causal, q_descale=qd,
                                                        k_descale=kd, v_descale=vdt,
                                                        v_transposed=True)
        res["fp8/via_attention"] = flashattn.attention(q8, k8, v8, causal=True, q_descale=qd,
                                                       k_descale=kd, v_descale=vd)
    torch.save(res, out)
    print(len(res), "outputs")


if __name__ == "__main__":
    if sys.argv[1] == "--diff":
        diff(sys.argv[2], sys.argv[3])
    else:
        run(sys.argv[1])
