"""Issue 21 item 3: the forward, ladder, flex and FP8 kernels run in the interpreter (no GPU) on
fixed small inputs, every output saved, to check that moving their math onto
``flashattn/kernels/common.py`` leaves them bit-identical.
python experiments/common_interp.py OUT.pt; python experiments/common_interp.py --diff A.pt B.pt"""
import sys

import torch


def _qkv(seed, B, Hq, Hkv, Nq, Nk, D, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, Nq, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Nk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Nk, D, generator=g).to(dtype))


def run(out):
    import flashattn
    import flashbook
    from flashattn import interpret, mods
    from flashattn.flex import flex_attention
    from flashattn.fp8 import attention_fp8, quantize_fp8
    from flashattn import decode as decode_fp8
    from torch.nn.attention.flex_attention import create_block_mask
    res = {}
    with interpret.enabled():
        # The shipped forward: causal, not, GQA, a ragged K, a prefill offset, the LSE (autograd).
        for name, (Hq, Hkv, Nq, Nk, causal, pos) in {
                "causal": (2, 2, 70, 70, True, 0), "full": (2, 2, 50, 77, False, 0),
                "gqa_pos": (4, 2, 40, 70, True, 30), "mqa": (4, 1, 65, 65, True, 0)}.items():
            q, k, v = _qkv(len(res), 1, Hq, Hkv, Nq, Nk, 64)
            res[f"fwd/{name}"] = flashattn.attention(q, k, v, causal=causal, input_pos=pos)
        q, k, v = _qkv(9, 1, 2, 2, 45, 45, 32)
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        o = flashattn.attention(q, k, v, causal=True)
        o.float().square().sum().backward()
        res["fwd+bwd/o"], res["fwd+bwd/dq"] = o.detach(), q.grad
        # The book's ladder: every step and experiment that runs the fused kernel.
        steps = [s for s, st in flashbook.STEPS.items() if st.kernel == "fmha"]
        for step in steps + list(flashbook.EXPERIMENTS):
            for causal in (True, False):
                q, k, v = _qkv(len(res), 1, 2, 2, 70, 90, 64)
                try:
                    res[f"ladder/{step}/{causal}"] = flashbook.attention(q, k, v, causal=causal,
                                                                          step=step)
                except Exception as e:                       # noqa: BLE001 - recorded as such
                    res[f"ladder/{step}/{causal}"] = repr(e)[:200]
        # Flex: mask mods, score mods, sinks, a ragged K, the LSE, the backward.
        q, k, v = _qkv(31, 1, 4, 2, 37, 45, 32)
        doc = torch.tensor([0] * 20 + [1] * 25, dtype=torch.int32)
        for name, (score, mask) in {
                "none": (None, None), "causal": (None, mods.causal()),
                "window": (None, mods.sliding_window(7)),
                "document": (None, mods.document(doc, causal=True)),
                "softcap_causal": (mods.softcap(2.0), mods.causal()),
                "alibi": (mods.alibi(mods.alibi_slopes(4)), None)}.items():
            bm = None if mask is None else create_block_mask(mask, None, None, 37, 45,
                                                             device="cpu", BLOCK_SIZE=(16, 32))
            ko = None if bm is not None else {"BLOCK_M": 16, "BLOCK_N": 32}
            o, lse = flex_attention(q, k, v, score_mod=score, block_mask=bm, enable_gqa=True,
                                    return_lse=True, kernel_options=ko)
            res[f"flex/{name}/o"], res[f"flex/{name}/lse"] = o, lse
        o = flex_attention(q, k, v, enable_gqa=True, sinks=torch.linspace(-1.0, 2.0, 4),
                           kernel_options={"BLOCK_M": 16, "BLOCK_N": 32})
        res["flex/sink"] = o
        bm = create_block_mask(mods.causal(), None, None, 37, 45, device="cpu",
                               BLOCK_SIZE=(16, 32))
        for name, score in (("causal", None), ("softcap", mods.softcap(2.0))):
            qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
            o = flex_attention(qg, kg, vg, score_mod=score, block_mask=bm, enable_gqa=True)
            o.float().square().sum().backward()
            for n, t in (("dq", qg), ("dk", kg), ("dv", vg)):
                res[f"flex_bwd/{name}/{n}"] = t.grad
        # FP8: the forward (causal, not, V transposed) and the decode split (contiguous, paged).
        q, k, v = _qkv(41, 2, 4, 2, 40, 70, 64, torch.float32)
        q8, qd = quantize_fp8(q, num_kv_heads=2)
        k8, kd = quantize_fp8(k)
        v8, vd = quantize_fp8(v)
        v8t, vdt = quantize_fp8(v, v_transposed=True)
        for causal in (True, False):
            res[f"fp8/fwd/{causal}"] = attention_fp8(q8, k8, v8, causal=causal, q_descale=qd,
                                                     k_descale=kd, v_descale=vd)
            res[f"fp8/fwd_vt/{causal}"] = attention_fp8(q8, k8, v8t, causal=causal,
                                                        q_descale=qd, k_descale=kd,
                                                        v_descale=vdt, v_transposed=True)
        qd_, kc, vc = _qkv(43, 2, 4, 2, 1, 96, 64)
        kc8, kcd = quantize_fp8(kc.float())
        vc8, vcd = quantize_fp8(vc.float())
        lens = torch.tensor([96, 37], dtype=torch.int32)
        res["fp8/decode"] = decode_fp8(qd_, kc8, vc8, lens, k_descale=kcd, v_descale=vcd,
                                       num_splits=3)
        # Paged: pages of 32 rows, the block table a permutation.
        kp = kc8.reshape(2, 2, 3, 32, 64).permute(0, 2, 1, 3, 4).reshape(6, 2, 32, 64)
        vp = vc8.reshape(2, 2, 3, 32, 64).permute(0, 2, 1, 3, 4).reshape(6, 2, 32, 64)
        table = torch.arange(6, dtype=torch.int32).reshape(2, 3)
        res["fp8/decode_paged"] = decode_fp8(qd_, kp, vp, lens, k_descale=kcd, v_descale=vcd,
                                             block_table=table, num_splits=2)
    torch.save(res, out)
    print(len(res), "outputs;", sum(isinstance(v, str) for v in res.values()), "errors")


def diff(a, b):
    A, B = torch.load(a), torch.load(b)
    same = 0
    for k in A:
        x, y = A[k], B.get(k)
        if isinstance(x, str) or isinstance(y, str):
            ok = x == y
        else:
            ok = (y is not None and x.dtype == y.dtype and x.shape == y.shape and
                  torch.equal(x.detach().contiguous().view(torch.uint8),
                              y.detach().contiguous().view(torch.uint8)))   # NaN bits too
        same += ok
        if not ok:
            print("DIFFERS", k)
    print(f"{same}/{len(A)} outputs bit-identical" + (f"; {len(set(B) - set(A))} only in {b}"
                                                     if set(B) - set(A) else ""))


if __name__ == "__main__":
    if sys.argv[1] == "--diff":
        diff(sys.argv[2], sys.argv[3])
    else:
        run(sys.argv[1])
